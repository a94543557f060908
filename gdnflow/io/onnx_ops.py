"""ONNX operators that the importer runs as compositions of gdnflow operators.

Each handler here builds its node's result from existing operators (relu,
clamp, affine, pow, exp, log, sum, mean, avg_pool2d, slice...), so it runs on
both backends and differentiates through their verified kernels; none has a
kernel of its own. The compositions, with x the node's first input:

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
========================  ===================================================

Tanh, Abs, Sqrt, Neg, Exp, Log and Softplus map to the gdnflow operator of
the same name. Max, Min, Sum and Split also compute on host arrays (shape
arithmetic), with NumPy.
"""
import functools
import math

import numpy as np

from gdnflow import ops
from gdnflow.io.onnx_values import as_tensor, ints, is_host


def _operand(value, device):
    """A one-element host constant as a Python float, anything else as a tensor."""
    if is_host(value) and value.size == 1:
        return float(value.reshape(()))
    return as_tensor(value, device)


def _unary(function):
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
    x, slope = inputs[0], _operand(inputs[1], device)
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
        values = [present[first]] + [_operand(v, device) for i, v in enumerate(present) if i != first]
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
def _reduce(function, axes_input_from=18):
    """A Reduce* handler: ``function(x, axes, keepdims)``; axes an attribute
    before opset ``axes_input_from``, the optional second input from it on."""
    def handler(node, inputs, device):
        x = inputs[0]
        if node.opset < axes_input_from:
            axes = node.attr("axes")
        else:
            axes = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return x
            axes = range(x.ndim)
        return function(x, tuple(sorted({a % x.ndim for a in axes})),
                        bool(node.attr("keepdims", 1)))
    return handler


REDUCTIONS = {
    "ReduceSum": _reduce(ops.sum, axes_input_from=13),
    "ReduceMean": _reduce(ops.mean),
    "ReduceSumSquare": _reduce(lambda x, axes, keep: ops.sum(x * x, axes, keep)),
    "ReduceL1": _reduce(lambda x, axes, keep: ops.sum(ops.abs(x), axes, keep)),
    "ReduceL2": _reduce(lambda x, axes, keep: ops.sqrt(ops.sum(x * x, axes, keep))),
    "ReduceLogSum": _reduce(lambda x, axes, keep: ops.log(ops.sum(x, axes, keep))),
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


HANDLERS = {
    "Tanh": _unary(ops.tanh), "Abs": _unary(ops.abs), "Sqrt": _unary(ops.sqrt),
    "Neg": _unary(ops.neg), "Exp": _unary(ops.exp), "Log": _unary(ops.log),
    "Softplus": _unary(ops.softplus), "Reciprocal": _unary(lambda x: ops.pow(x, -1.0)),
    "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish, "PRelu": _prelu,
    "LeakyRelu": _leaky_relu, "Elu": _elu, "Softsign": _softsign, "Pow": _pow,
    "Sum": _sum, "Mean": _mean,
    "Max": _fold(_max, np.maximum), "Min": _fold(_min, np.minimum),
    **REDUCTIONS, "Split": _split, "LRN": _lrn,
}

#: Those of :data:`HANDLERS` that also compute on host arrays (shape arithmetic).
HOST_OPS = {"Sum", "Max", "Min", "Split"}
