"""Quantised ONNX graphs: what the importer runs of them, and what it refuses.

gdnflow computes in float32. A graph that quantises its activations
(QuantizeLinear, DynamicQuantizeLinear) or computes on integers (QLinearConv,
QLinearMatMul, ConvInteger, MatMulInteger) is refused at load, in one line
naming those operators (:func:`gdnflow.io.onnx.unsupported`). Weight-only
quantisation runs: DequantizeLinear computes on the host,
y = (x - zero_point) * scale per tensor, per axis or per block, so the
DequantizeLinear of a constant integer weight folds at load into a float32
weight, which becomes a parameter of the module like any other.
"""
import numpy as np

from gdnflow.io.onnx_values import host

#: Quantisation operators refused together, in one line.
QUANTISED = {"QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
             "ConvInteger", "MatMulInteger"}

_INTEGERS = (np.int8, np.uint8, np.int16, np.uint16, np.int32)


def _per_axis(value, x, axis, block):
    """A scale or zero point broadcast to x: a scalar as is; a 1-D one along
    ``axis``; a blocked one (``block`` > 0) repeated over each block of ``axis``."""
    value = host(value)
    if value.size == 1 and not block:
        return value.reshape(())
    if block:
        return np.repeat(value, block, axis=axis)[(slice(None),) * axis + (slice(0, x.shape[axis]),)]
    shape = [1] * x.ndim
    shape[axis] = value.size
    return value.reshape(shape)


def _dequantize_linear(node, inputs, device):
    x, scale, zero_point = (list(inputs) + [None, None])[:3]
    x = host(x)
    if x.dtype not in _INTEGERS:
        node.fail(f"{x.dtype} quantised data (only 8-, 16- and 32-bit integers)")
    if host(scale).dtype != np.float32:
        node.fail(f"a {host(scale).dtype} scale (gdnflow computes in float32)")
    axis = node.attr("axis", 1) % max(x.ndim, 1)
    block = node.attr("block_size", 0)
    y = x.astype(np.float32)
    if zero_point is not None:
        y = y - _per_axis(zero_point, x, axis, block).astype(np.float32)
    return (y * _per_axis(scale, x, axis, block)).astype(np.float32)


HANDLERS = {"DequantizeLinear": _dequantize_linear}

#: Those of :data:`HANDLERS` that compute on host arrays (folded at load for constant weights).
HOST_OPS = {"DequantizeLinear"}
