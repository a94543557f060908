"""ONNX operators that the importer runs as compositions of gdnflow operators.

Each handler here builds its node's result from existing operators (relu,
clamp, affine, pow, exp, log, sum, mean, avg_pool2d, slice, broadcast_to,
reshape...), so it runs on both backends and differentiates through their
verified kernels; none has a kernel of its own. The compositions, with x the node's first input:

========================  ===================================================
HardSigmoid(alpha, beta)  clamp(alpha x + beta, 0, 1)
HardSwish                 x * clamp(x / 6 + 1/2, 0, 1)
PRelu(slope)              relu(x) - slope * relu(-x)   (slope broadcasts to x)
LeakyRelu(alpha)          relu(x) - alpha * relu(-x)
Elu(alpha)                relu(x) + alpha (exp(-relu(-x)) - 1)
Softsign                  x / (1 + |x|)
Pow(x, y)                 pow(x, y) for a one-element constant y; else
                          exp(y log x) (real only for x > 0, NaN elsewhere)
Reciprocal                pow(x, -1)
Sum, Mean                 a + b + ... (broadcasting); Mean then scales by 1/n
Max, Min                  a + relu(b - a), a - relu(a - b), folded over inputs
ReduceSum, ReduceMean     sum, mean over the axes (all when none are given)
ReduceSumSquare, ReduceL1 sum(x * x), sum(|x|)
ReduceL2, ReduceLogSum    sqrt(sum(x * x)), log(sum(x))
Split                     one slice per output
LRN(size, alpha, beta,    x / (bias + alpha * mean of x^2 over the ``size``
bias)                     channels around each one)^beta; the window mean is
                          an average pool of x^2 seen as [N, 1, C, rest]
LayerNormalization(axis,  (x - m) * (v + epsilon)^-1/2 * scale + bias, m and v
epsilon)                  the mean and variance over the axes from ``axis``
                          on (means of x and of (x - m)^2); its Mean and
                          InvStdDev outputs are m and (v + epsilon)^-1/2
InstanceNormalization     the same over the spatial axes, scale and bias per
                          channel
Gelu                      x/2 (1 + erf(x / sqrt(2))); approximate="tanh":
                          x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
Selu(alpha, gamma)        gamma (relu(x) + alpha (exp(-relu(-x)) - 1))
Celu(alpha)               relu(x) + alpha (exp(-relu(-x) / alpha) - 1)
Mish                      x * tanh(softplus(x))
Expand(x, shape)          broadcast_to(x, broadcast of x.shape and shape)
Tile(x, repeats)          x as [1, d0, 1, d1, ...], broadcast_to [r0, d0, r1,
                          d1, ...], reshaped to [r0 d0, r1 d1, ...]
Where(c, a, b)            c a + (1 - c) b with c as 0/1: both branches are
                          computed, so an inf or NaN in the one not taken
                          gives NaN where ONNX gives the other branch's value
Resize, Upsample          nearest by integer factors s: x as [..., d, 1, ...],
                          broadcast_to [..., d, s, ...], reshaped: each pixel
                          replicated, where that is nearest sampling; other
                          factors, roundings and modes (linear, cubic) by
                          one interpolation matrix per axis (onnx_resize)
========================  ===================================================

Tanh, Abs, Sqrt, Neg, Exp, Log and Softplus map to the gdnflow operator of
the same name. More families: :mod:`gdnflow.io.onnx_ops_math` (erf,
trigonometry, comparisons, rounding), :mod:`gdnflow.io.onnx_ops_reduce`
(reductions, arg-extrema, normalisations) and :mod:`gdnflow.io.onnx_ops_index`
(indexing, rearrangement, Einsum, Resize beyond nearest). Max, Min, Sum, Split, Expand, Tile and Where also compute on
host arrays (shape arithmetic), with NumPy.
"""
import functools
import math

import numpy as np

from gdnflow import ops
from gdnflow.io import onnx_resize
from gdnflow.io.onnx_values import as_tensor, host, ints, is_host
from gdnflow.tensor import Tensor


def operand(value, device):
    """A one-element host constant as a Python float, anything else as a tensor."""
    if is_host(value) and value.size == 1:
        return float(value.reshape(()))
    return as_tensor(value, device)


def unary(function):
    """A handler applying a one-tensor ``function`` to the node's first input."""
    def handler(node, inputs, device):
        return function(as_tensor(inputs[0], device))
    return handler


# ------------------------------------------------------------ activations --
def _hard_sigmoid(node, inputs, device):
    return ops.clamp(ops.affine(inputs[0], node.attr("alpha", 0.2), node.attr("beta", 0.5)), 0, 1)


def _hard_swish(node, inputs, device):
    x = inputs[0]
    return x * ops.clamp(ops.affine(x, 1 / 6, 0.5), 0, 1)


def _negative_part(x):
    """relu(-x) = max(-x, 0): what ``x - relu(x)`` is, negated, with exact zeros."""
    return ops.relu(ops.neg(x))


def _prelu(node, inputs, device):
    x, slope = inputs[0], operand(inputs[1], device)
    if not isinstance(slope, float):
        # ONNX broadcasts the slope to x only (unidirectionally).
        if np.broadcast_shapes(slope.shape, x.shape) != x.shape:
            node.fail(f"a slope of shape {slope.shape} for an input of shape {x.shape} "
                      "(the slope must broadcast to the input)")
    return ops.relu(x) - slope * _negative_part(x)


def _leaky_relu(node, inputs, device):
    x = inputs[0]
    return ops.relu(x) - node.attr("alpha", 0.01) * _negative_part(x)


def _elu(node, inputs, device):
    x = inputs[0]
    return ops.relu(x) + node.attr("alpha", 1.0) * (ops.exp(ops.neg(_negative_part(x))) - 1.0)


def _softsign(node, inputs, device):
    x = inputs[0]
    return x / (ops.abs(x) + 1.0)


def _selu(node, inputs, device):
    x = inputs[0]
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    return gamma * (ops.relu(x) + alpha * (ops.exp(ops.neg(_negative_part(x))) - 1.0))


def _celu(node, inputs, device):
    x = inputs[0]
    alpha = node.attr("alpha", 1.0)
    return ops.relu(x) + alpha * (ops.exp(_negative_part(x) * (-1.0 / alpha)) - 1.0)


def _mish(node, inputs, device):
    x = inputs[0]
    return x * ops.tanh(ops.softplus(x))


def _gelu(node, inputs, device):
    x = inputs[0]
    if node.attr("approximate", "none") == "tanh":
        inner = (x + 0.044715 * ops.pow(x, 3.0)) * math.sqrt(2 / math.pi)
        return (x * 0.5) * (ops.tanh(inner) + 1.0)
    return (x * 0.5) * (ops.erf(x * math.sqrt(0.5)) + 1.0)


# ------------------------------------------------------------ arithmetic --
def _pow(node, inputs, device):
    x, exponent = inputs[0], inputs[1]
    if is_host(exponent) and exponent.size == 1:
        value = float(exponent.reshape(()))
        return x if value == 1.0 else ops.pow(x, value)
    # An exponent computed by the graph (or one per element): x^y = e^(y ln x),
    # which is real only for positive x; elsewhere the result is NaN.
    return ops.exp(as_tensor(exponent, device) * ops.log(x))


def _fold(function, host_function):
    """A variadic handler: ``function`` folded over the inputs, left to right."""
    def handler(node, inputs, device):
        present = [v for v in inputs if v is not None]
        if all(is_host(v) for v in present):
            return functools.reduce(host_function, present)
        # A tensor leads, so that arithmetic with numbers stays on tensors.
        first = next(i for i, v in enumerate(present) if not is_host(v))
        values = [present[first]] + [operand(v, device) for i, v in enumerate(present) if i != first]
        return functools.reduce(function, values)
    return handler


def _sum_inputs(a, b):
    return a + b


def _max(a, b):
    return a + ops.relu(b - a)


def _min(a, b):
    return a - ops.relu(a - b)


_sum = _fold(_sum_inputs, np.add)


def _mean(node, inputs, device):
    count = sum(v is not None for v in inputs)
    total = _sum(node, inputs, device)
    return total / count if is_host(total) else total * (1.0 / count)


# ------------------------------------------------------------ reductions --
def reduce_handler(function, axes_input_from=18, elementwise=None):
    """A Reduce* handler: ``function(x, axes, keepdims)``; axes an attribute
    before opset ``axes_input_from``, the optional second input from it on.
    Without axes and with noop_with_empty_axes (from that opset), nothing is
    reduced: the result is ``elementwise(x)``, the reduction's map of each
    element (x * x for ReduceSumSquare, as onnxruntime and onnx's reference
    compute it), or x where None."""
    def handler(node, inputs, device):
        x = inputs[0]
        if node.opset < axes_input_from:
            axes = node.attr("axes")
        else:
            axes = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return x if elementwise is None else elementwise(x)
            axes = range(x.ndim)
        return function(x, tuple(sorted({a % x.ndim for a in axes})),
                        bool(node.attr("keepdims", 1)))
    return handler


REDUCTIONS = {
    "ReduceSum": reduce_handler(ops.sum, axes_input_from=13),
    "ReduceMean": reduce_handler(ops.mean),
    "ReduceSumSquare": reduce_handler(lambda x, axes, keep: ops.sum(x * x, axes, keep),
                                      elementwise=lambda x: x * x),
    "ReduceL1": reduce_handler(lambda x, axes, keep: ops.sum(ops.abs(x), axes, keep),
                               elementwise=ops.abs),
    "ReduceL2": reduce_handler(lambda x, axes, keep: ops.sqrt(ops.sum(x * x, axes, keep)),
                               elementwise=ops.abs),
    "ReduceLogSum": reduce_handler(lambda x, axes, keep: ops.log(ops.sum(x, axes, keep)),
                                   elementwise=ops.log),
}


# ------------------------------------------------------------------ shape --
def _split(node, inputs, device):
    x = inputs[0]
    axis = node.attr("axis", 0) % len(x.shape)
    size = x.shape[axis]
    if node.opset < 13:
        sizes = node.attr("split")
    else:
        sizes = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    if sizes is None:
        # Equal parts; from opset 18 (num_outputs) the last may be smaller.
        count = node.attr("num_outputs", len(node.outputs))
        chunk = -(-size // count)
        sizes = [max(min(chunk, size - i * chunk), 0) for i in range(count)]
    if sum(sizes) != size or len(sizes) != len(node.outputs):
        node.fail(f"splitting {size} along axis {axis} into {list(sizes)} "
                  f"for {len(node.outputs)} outputs")
    lead = [slice(None)] * axis
    pieces, start = [], 0
    for length in sizes:
        index = tuple(lead + [slice(start, start + length)])
        pieces.append(x[index].copy() if is_host(x) else ops.slice_(x, index))
        start += length
    return pieces


def _repeat(x, factors, each):
    """x repeated ``factors[i]`` times along each axis i: every element in place
    (``each``: nearest upsampling) or the whole extent (Tile). One broadcast_to
    between reshapes, so the backward is broadcast_to's: a sum over the copies."""
    if all(f == 1 for f in factors):
        return x
    split, spread = [], []
    for size, factor in zip(x.shape, factors):
        split += [size, 1] if each else [1, size]
        spread += [size, factor] if each else [factor, size]
    return ops.reshape(ops.broadcast_to(ops.reshape(x, tuple(split)), tuple(spread)),
                       tuple(s * f for s, f in zip(x.shape, factors)))


def _tile(node, inputs, device):
    x, repeats = inputs[0], ints(inputs[1])
    if len(repeats) != x.ndim:
        node.fail(f"{len(repeats)} repeats for a {x.ndim}-D input")
    return np.tile(x, repeats) if is_host(x) else _repeat(x, repeats, each=False)


def _expand(node, inputs, device):
    x, shape = inputs[0], tuple(ints(inputs[1]))
    # ONNX broadcasts both ways: a 1 in ``shape`` keeps x's size there.
    out = np.broadcast_shapes(tuple(x.shape), shape)
    if is_host(x):
        return np.broadcast_to(x, out).copy()
    return x if out == x.shape else ops.broadcast_to(x, out)


def _where(node, inputs, device):
    condition, a, b = inputs
    if all(is_host(v) for v in inputs):
        return np.where(condition, a, b)
    # c a + (1 - c) b with c the condition as 0/1: both branches are computed,
    # so an inf or NaN in the branch not taken still makes a NaN (0 * inf).
    like = a if not is_host(a) else b
    c = (condition if not is_host(condition) else as_tensor(condition, device) if is_host(like)
         else Tensor(condition, device=device, dtype=like.dtype))
    return c * operand(a, device) + (1.0 - c) * operand(b, device)


def _present(inputs, index):
    """The input at ``index`` as a host array, or None when omitted or empty."""
    value = inputs[index] if len(inputs) > index else None
    value = None if value is None else host(value)
    return value if value is not None and value.size else None


def _resize(node, inputs, device):
    """Resize and Upsample: integer nearest upscaling where it replicates each
    pixel (asymmetric coordinates with floor, half_pixel with round_prefer_*),
    every other case by :func:`gdnflow.io.onnx_resize.resample`."""
    x = inputs[0]
    if node.op_type == "Upsample":
        scales, sizes = (node.attr("scales") if node.opset < 9 else _present(inputs, 1)), None
    else:
        scales = _present(inputs, 1 if node.opset < 11 else 2)
        sizes = _present(inputs, 3) if node.opset >= 11 else None
    axes = [a % x.ndim for a in node.attr("axes", range(x.ndim))]
    factors, out_sizes = [1.0] * x.ndim, list(x.shape) if sizes is not None else None
    given = [int(v) for v in sizes.reshape(-1)] if sizes is not None else [
        float(v) for v in np.asarray(scales).reshape(-1)]
    for axis, value in zip(axes, given):
        factors[axis] = value / x.shape[axis] if sizes is not None else value
        if sizes is not None:
            out_sizes[axis] = value
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if sizes is not None and policy != "stretch":
        # Opset 18: one scale for every resized axis, the smallest (not_larger) or the
        # largest (not_smaller) of sizes / input sizes; the sizes rounded half up from it.
        scale = (min if policy == "not_larger" else max)(factors[a] for a in axes)
        for axis in axes:
            factors[axis], out_sizes[axis] = scale, int(scale * x.shape[axis] + 0.5)
    mode = node.attr("mode", "nearest")
    # Before opset 11 (and in Upsample) sampling is asymmetric, nearest rounding down.
    coordinates = (node.attr("coordinate_transformation_mode", "half_pixel") if node.opset >= 11
                   and node.op_type == "Resize" else "asymmetric")
    rounding = node.attr("nearest_mode", "round_prefer_floor") if node.opset >= 11 else "floor"
    # Output o of an s-times upscaling samples input o // s under asymmetric (o / s)
    # with floor, and under half_pixel ((o + 1/2) / s - 1/2, never half-way) with
    # either round_prefer_*; not under other combinations.
    replicates = (mode == "nearest" and all(f == int(f) and f >= 1 for f in factors) and (
        (coordinates, rounding) == ("asymmetric", "floor") or (
            coordinates in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric")
            and rounding.startswith("round_prefer"))))
    if replicates:
        return _repeat(x, [int(f) for f in factors], each=True)
    return onnx_resize.resample(node, x, mode, coordinates,
                                onnx_resize.output_shape(x.shape, factors, out_sizes), factors)


# -------------------------------------------------------- normalisation --
def _lrn(node, inputs, device):
    x = inputs[0]
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    shape = x.shape
    # ONNX's window over channels c - floor((size-1)/2) ... c + ceil((size-1)/2),
    # summed and scaled by alpha / size: the mean of an average pool that
    # counts the zero padding, over x^2 seen as [N, 1, C, everything else].
    rest = math.prod(shape[2:])
    squares = ops.reshape(x * x, (shape[0], 1, shape[1], rest))
    window = ops.avg_pool2d(squares, (size, 1), stride=1,
                            padding=((size - 1) // 2, size // 2, 0, 0), count_include_pad=True)
    scale = ops.affine(ops.reshape(window, shape), alpha, bias)
    return x * ops.pow(scale, -beta)


def normalized(x, axes, epsilon):
    """(x - mean) / sqrt(var + epsilon) over ``axes``, with the mean and
    1 / sqrt(var + epsilon) (reduced axes kept)."""
    mean = ops.mean(x, axes, True)
    centred = x - mean
    inv_std = ops.pow(ops.mean(centred * centred, axes, True) + epsilon, -0.5)
    return centred * inv_std, mean, inv_std


def _layer_norm(node, inputs, device):
    x, scale, bias = (list(inputs) + [None, None])[:3]
    axis = node.attr("axis", -1) % x.ndim
    epsilon = node.attr("epsilon", 1e-5)
    normalized_shape = x.shape[axis:]
    if not any(node.outputs[1:]) and all(t is None or np.shape(t) == normalized_shape
                                         for t in (scale, bias)):
        # One operator where only y is asked for and scale and bias have the axes' shape.
        bias = (Tensor(np.zeros(normalized_shape), device=device, dtype=x.dtype)
                if bias is None else as_tensor(bias, device))
        return [ops.layer_norm(x, as_tensor(scale, device), bias, axis, epsilon), None, None]
    y, mean, inv_std = normalized(x, tuple(range(axis, x.ndim)), epsilon)
    y = y * operand(scale, device)
    return [y if bias is None else y + operand(bias, device), mean, inv_std]


def _instance_norm(node, inputs, device):
    x, scale, bias = inputs
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    y, _, _ = normalized(x, tuple(range(2, x.ndim)), node.attr("epsilon", 1e-5))
    return (y * ops.reshape(as_tensor(scale, device), per_channel)
            + ops.reshape(as_tensor(bias, device), per_channel))


HANDLERS = {
    "Tanh": unary(ops.tanh), "Abs": unary(ops.abs), "Sqrt": unary(ops.sqrt),
    "Neg": unary(ops.neg), "Exp": unary(ops.exp), "Log": unary(ops.log),
    "Softplus": unary(ops.softplus), "Reciprocal": unary(lambda x: ops.pow(x, -1.0)),
    "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish, "PRelu": _prelu,
    "LeakyRelu": _leaky_relu, "Elu": _elu, "Softsign": _softsign, "Pow": _pow,
    "Sum": _sum, "Mean": _mean,
    "Max": _fold(_max, np.maximum), "Min": _fold(_min, np.minimum),
    **REDUCTIONS, "Split": _split, "LRN": _lrn,
    "LayerNormalization": _layer_norm, "InstanceNormalization": _instance_norm,
    "Gelu": _gelu, "Selu": _selu, "Celu": _celu, "Mish": _mish,
    "Expand": _expand, "Tile": _tile, "Where": _where,
    "Resize": _resize, "Upsample": _resize,
}

#: Those of :data:`HANDLERS` that also compute on host arrays (shape arithmetic).
HOST_OPS = {"Sum", "Max", "Min", "Split", "Expand", "Tile", "Where"}
