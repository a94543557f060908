"""ONNX Resize and Upsample: every mode as one constant matrix per resized axis.

Nearest, linear and cubic sampling are each linear in the input and separable:
output element o of an axis of n inputs is sum_i W[o, i] x_i, W built here on
the host from the coordinate transformation (``half_pixel``,
``pytorch_half_pixel``, ``half_pixel_symmetric``, ``align_corners``,
``asymmetric``, ``tf_half_pixel_for_nn``) and the mode's weights (nearest: one 1 at the rounded
coordinate; linear: the two neighbours; cubic: four, Keys' kernel with
``cubic_coeff_a``, ``exclude_outside`` zeroing and renormalising those out
of range), neighbours beyond the edge clamped to it. Each axis is then one
matmul with W^T, so the result differentiates like any product. Integer
nearest upscaling, which replicates pixels, takes the cheaper broadcast path
of :mod:`gdnflow.io.onnx_ops` instead.
"""
import math

import numpy as np

from gdnflow import ops
from gdnflow.tensor import Tensor


def _source_coordinates(mode, out_size, in_size, scale):
    """The input coordinate sampled by each output index along one axis."""
    o = np.arange(out_size, dtype=np.float64)
    if mode == "align_corners":
        # ONNX divides by the unrounded output length in * scale.
        length = in_size * scale
        return o * (in_size - 1) / (length - 1) if length > 1 else np.zeros(out_size)
    if mode == "asymmetric":
        return o / scale
    if mode == "pytorch_half_pixel" and out_size == 1:
        return np.zeros(1)
    if mode == "tf_half_pixel_for_nn":       # Resize-11 only
        return (o + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adjustment = out_size / (scale * in_size)
        return in_size / 2 * (1 - adjustment) + (o + 0.5) / scale - 0.5
    return (o + 0.5) / scale - 0.5       # half_pixel, pytorch_half_pixel


_ROUNDING = {"round_prefer_floor": lambda x: np.ceil(x - 0.5),
             "round_prefer_ceil": lambda x: np.floor(x + 0.5), "floor": np.floor, "ceil": np.ceil}


def _cubic_weights(t, a):
    """Keys' cubic convolution weights of the neighbours at offsets -1, 0, 1, 2 from
    floor(x), t = x - floor(x)."""
    distances = np.stack([t + 1, t, 1 - t, 2 - t], axis=-1)
    near = ((a + 2) * distances - (a + 3)) * distances * distances + 1
    far = ((a * distances - 5 * a) * distances + 8 * a) * distances - 4 * a
    return np.where(distances <= 1, near, far)


def interpolation_matrix(node, mode, coordinates, in_size, out_size, scale):
    """W [out_size, in_size] of one axis (see the module docstring)."""
    x = _source_coordinates(coordinates, out_size, in_size, scale)
    rows = np.arange(out_size)[:, None]
    if mode == "nearest":
        # Before opset 11 (Resize-10, Upsample), as onnxruntime runs them: the coordinate
        # rounded down when upscaling, up when downscaling.
        rounding = (node.attr("nearest_mode", "round_prefer_floor") if node.opset >= 11
                    else "ceil" if scale < 1 else "floor")
        index = _ROUNDING[rounding](x)[:, None]
        offsets, weights = np.zeros((1,)), np.ones((out_size, 1))
    elif mode == "linear":
        index, t = np.floor(x)[:, None], (x - np.floor(x))[:, None]
        offsets, weights = np.arange(2), np.concatenate([1 - t, t], axis=1)
    else:
        index = np.floor(x)[:, None]
        offsets = np.arange(-1, 3)
        weights = _cubic_weights(x - np.floor(x), node.attr("cubic_coeff_a", -0.75))
    neighbours = (index + offsets).astype(np.int64)
    if mode == "cubic" and node.attr("exclude_outside", 0):
        weights = np.where((neighbours >= 0) & (neighbours < in_size), weights, 0.0)
        weights = weights / weights.sum(axis=1, keepdims=True)
    matrix = np.zeros((out_size, in_size))
    np.add.at(matrix, (np.broadcast_to(rows, neighbours.shape), np.clip(neighbours, 0, in_size - 1)),
              weights)
    return matrix


def resample(node, x, mode, coordinates, out_shape, scales):
    """x resized to ``out_shape``, axis by axis, by :func:`interpolation_matrix`."""
    for axis, (in_size, out_size, scale) in enumerate(zip(x.shape, out_shape, scales)):
        if in_size == out_size and scale == 1:
            continue
        matrix = interpolation_matrix(node, mode, coordinates, in_size, out_size, scale)
        order = [i for i in range(x.ndim) if i != axis] + [axis]
        moved = ops.transpose(x, order) if axis != x.ndim - 1 else x
        y = ops.matmul(moved, Tensor(np.ascontiguousarray(matrix.T), device=x.device,
                                     dtype=x.dtype))
        x = ops.transpose(y, list(np.argsort(order))) if axis != x.ndim - 1 else y
    return x


def output_shape(x_shape, factors, sizes):
    """The output shape: ``sizes`` where given, else floor(in * scale) per axis."""
    if sizes is not None:
        return tuple(sizes)
    return tuple(int(math.floor(n * f + 1e-9)) for n, f in zip(x_shape, factors))
