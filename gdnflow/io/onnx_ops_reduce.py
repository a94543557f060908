"""ONNX reductions and normalisations beyond gdnflow.io.onnx_ops, composed from
gdnflow operators (differentiable; host arrays reduce with NumPy).

=========================  ==================================================
ReduceMax, ReduceMin,      a max pool over the reduced axes, moved last and
GlobalMaxPool              flattened: x as [rows, 1, 1, r], kernel (1, r);
                           min is -max(-x); the gradient goes to the first
                           extremum. An empty reduction gives -inf (+inf)
ReduceProd                 the reduced elements as [rows, r], halves
                           multiplied until one column is left (padded
                           with 1 when odd): log2(r) products
ReduceLogSumExp            m + log(sum(exp(x - m))), m = ReduceMax (kept)
CumSum(exclusive,          x along the axis times a 0/1 triangular matrix
reverse)                   (a matmul; NumPy's cumsum on host arrays)
LpNormalization(axis, p)   x / sqrt(sum(x^2)) (p=2), x / sum(|x|) (p=1); a
                           zero vector gives 0 (the norm is clamped to the
                           smallest normal float)
GlobalLpPool(p)            (sum over H, W of |x|^p)^(1/p)
MeanVarianceNormalization  (x - mean) / (sqrt(var) + 1e-9) over ``axes``
GroupNormalization         layer normalisation of x as [N, G, rest], scale
                           and bias per channel (per group before opset 21)
RMSNormalization           x (mean of x^2 over the axes from ``axis`` +
                           epsilon)^-1/2 * scale
=========================  ==================================================
"""
import math

import numpy as np

from gdnflow import ops
from gdnflow.io.onnx_ops import normalized, operand, reduce_handler
from gdnflow.io.onnx_values import as_tensor, is_host, ints
from gdnflow.tensor import Tensor


def _reduced_shape(shape, axes, keep):
    return tuple(1 if i in axes else s for i, s in enumerate(shape) if keep or i not in axes)


def _as_rows(x, axes):
    """x with the ``axes`` moved last, as [rows, r] (r the product of their sizes)."""
    kept = [i for i in range(x.ndim) if i not in axes]
    order = kept + list(axes)
    moved = x if order == list(range(x.ndim)) else ops.transpose(x, order)
    return ops.reshape(moved, (math.prod(x.shape[i] for i in kept), math.prod(
        x.shape[i] for i in axes)))


def _maximum(x, axes, keep):
    rows = _as_rows(x, axes)
    pooled = ops.max_pool2d(ops.reshape(rows, (rows.shape[0], 1, 1, rows.shape[1])),
                            (1, rows.shape[1]))
    return ops.reshape(pooled, _reduced_shape(x.shape, axes, keep))


def _minimum(x, axes, keep):
    return ops.neg(_maximum(ops.neg(x), axes, keep))


def _product(x, axes, keep):
    rows = _as_rows(x, axes)
    while rows.shape[1] > 1:
        if rows.shape[1] % 2:
            rows = ops.pad(rows, [(0, 0), (0, 1)], 1.0)
        half = rows.shape[1] // 2
        rows = ops.slice_(rows, (slice(None), slice(0, half))) * ops.slice_(
            rows, (slice(None), slice(half, None)))
    return ops.reshape(rows, _reduced_shape(x.shape, axes, keep))


def _log_sum_exp(x, axes, keep):
    peak = _maximum(x, axes, True)
    total = ops.log(ops.sum(ops.exp(x - peak), axes, keep))
    return total + (peak if keep else ops.reshape(peak, total.shape))


def _reduction(function, host_function, empty):
    """A Reduce* handler: ``function`` on tensors, ``host_function`` (NumPy's) on
    host arrays, and ``empty`` (the reduction's identity) where the reduced
    axes hold no element."""
    def reduce(x, axes, keep):
        if any(x.shape[a] == 0 for a in axes):
            dtype = x.dtype if is_host(x) else np.dtype(np.float32)
            return np.full(_reduced_shape(x.shape, axes, keep), _identity(empty, dtype), dtype)
        if is_host(x):
            return host_function(x, axis=axes, keepdims=keep)
        return function(x, axes, keep)
    return reduce_handler(reduce)


def _identity(value, dtype):
    """A reduction's identity ``value`` (+-inf, 1) in ``dtype``: for bools,
    False for max and True for min; the extreme integers for integers."""
    if dtype.kind == "b":
        return value > 0
    if dtype.kind in "iu" and np.isinf(value):
        return np.iinfo(dtype).min if value < 0 else np.iinfo(dtype).max
    return value


def _host_log_sum_exp(x, axis, keepdims):
    return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))


def _cumsum(node, inputs, device):
    x, axis = inputs[0], ints(inputs[1])[0] % inputs[0].ndim
    exclusive, reverse = node.attr("exclusive", 0), node.attr("reverse", 0)
    if is_host(x):
        flipped = np.flip(x, axis) if reverse else x
        total = np.cumsum(flipped, axis=axis, dtype=x.dtype)
        if exclusive:
            total = np.concatenate([np.zeros_like(np.take(total, [0], axis)),
                                    np.take(total, range(x.shape[axis] - 1), axis)], axis)
        return np.flip(total, axis) if reverse else total
    n = x.shape[axis]
    source, target = np.indices((n, n))
    # Element ``source`` adds to ``target`` when it comes before it (after it, reversed).
    before = (source >= target) if reverse else (source <= target)
    triangle = (before & (source != target) if exclusive else before).astype(np.float32)
    order = [i for i in range(x.ndim) if i != axis] + [axis]
    moved = ops.transpose(x, order) if axis != x.ndim - 1 else x
    summed = ops.matmul(moved, Tensor(triangle, device=device, dtype=x.dtype))
    return ops.transpose(summed, list(np.argsort(order))) if axis != x.ndim - 1 else summed


def _lp_normalization(node, inputs, device):
    x = inputs[0]
    axis, p = node.attr("axis", -1) % x.ndim, node.attr("p", 2)
    if p == 1:
        return x / _nonzero(ops.sum(ops.abs(x), (axis,), True))
    if p != 2:
        node.fail(f"p={p} (only 1 or 2)")
    return x / _nonzero(ops.sqrt(ops.sum(x * x, (axis,), True)))


def _nonzero(norm):
    """``norm`` raised to the smallest normal float where it is 0, so that a zero
    vector normalises to 0, as in ONNX, rather than to NaN."""
    return ops.clamp(norm, float(np.finfo(np.float32).tiny), math.inf)


def _spatial(x):
    return tuple(range(2, x.ndim))


def _global_lp_pool(node, inputs, device):
    x = inputs[0]
    p = float(node.attr("p", 2))
    if p == 2:
        return ops.sqrt(ops.sum(x * x, _spatial(x), True))
    return ops.pow(ops.sum(ops.pow(ops.abs(x), p), _spatial(x), True), 1 / p)


def _mean_variance_normalization(node, inputs, device):
    x = inputs[0]
    axes = tuple(sorted(a % x.ndim for a in node.attr("axes", [0, 2, 3])))
    centred = x - ops.mean(x, axes, True)
    return centred / (ops.sqrt(ops.mean(centred * centred, axes, True)) + 1e-9)


def _group_normalization(node, inputs, device):
    x, scale, bias = inputs
    groups, channels = node.attr("num_groups"), x.shape[1]
    if channels % groups:
        node.fail(f"{channels} channels in {groups} groups (the groups must divide them)")
    grouped = ops.reshape(x, (x.shape[0], groups, -1))
    y = ops.reshape(normalized(grouped, (2,), node.attr("epsilon", 1e-5))[0], x.shape)
    per_channel = (channels,) + (1,) * (x.ndim - 2)
    # GroupNormalization-18 takes a scale and a bias per group, -21 per channel.
    count, what = (groups, "group") if node.opset < 21 else (channels, "channel")

    def channel_values(value):
        value = as_tensor(value, device)
        if tuple(value.shape) != (count,):
            node.fail(f"a scale or bias of shape {tuple(value.shape)} (opset {node.opset}: one "
                      f"per {what}, ({count},))")
        if count != channels:
            value = ops.broadcast_to(ops.reshape(value, (groups, 1)), (groups, channels // groups))
        return ops.reshape(value, per_channel)
    return y * channel_values(scale) + channel_values(bias)


def _rms_normalization(node, inputs, device):
    x, scale = inputs
    axes = tuple(range(node.attr("axis", -1) % x.ndim, x.ndim))
    inv_rms = ops.pow(ops.mean(x * x, axes, True) + node.attr("epsilon", 1e-5), -0.5)
    return x * inv_rms * operand(scale, device)


HANDLERS = {
    "ReduceMax": _reduction(_maximum, np.max, -np.inf),
    "ReduceMin": _reduction(_minimum, np.min, np.inf),
    "ReduceProd": _reduction(_product, np.prod, 1.0),
    "ReduceLogSumExp": _reduction(_log_sum_exp, _host_log_sum_exp, -np.inf),
    "GlobalMaxPool": lambda node, inputs, device: _maximum(inputs[0], _spatial(inputs[0]), True),
    "CumSum": _cumsum, "LpNormalization": _lp_normalization, "GlobalLpPool": _global_lp_pool,
    "MeanVarianceNormalization": _mean_variance_normalization,
    "GroupNormalization": _group_normalization, "RMSNormalization": _rms_normalization,
}

#: Those of :data:`HANDLERS` that also compute on host arrays.
HOST_OPS = {"ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp", "CumSum"}
