"""ONNX elementwise operators beyond gdnflow.io.onnx_ops: erf and trigonometry,
rounding, comparisons and logic, Mod, and the piecewise activations.

========================  ===================================================
Erf, Sin, Cos, Tan, Asin  the gdnflow operator of the same name
Acos, Atan, Sinh, Cosh,   (:mod:`gdnflow.ops.special`)
Asinh, Acosh, Atanh
Sign, Floor, Ceil, Round, NumPy on the host: piecewise constant, so no
IsNaN, IsInf, Equal,      gradient flows through them; a float result of a
Less(OrEqual), Greater    device tensor comes back as a constant tensor, a
(OrEqual), Not, And, Or,  bool or integer one as a host array (a mask, which
Xor, Bitwise*, BitShift   Where and the arithmetic take as 0/1)
Mod(fmod)                 NumPy's mod (fmod for fmod=1) on the host, no
                          gradient (refused where an input needs one): a - b
                          floor(a / b) would give NaN for an infinite b,
                          where ONNX gives a
ThresholdedRelu(alpha)    x m, m = [x > alpha] (a host mask)
Shrink(lambd, bias)       (x - bias) [x > lambd] + (x + bias) [x < -lambd]
Swish(alpha)              x sigmoid(alpha x)
LogSoftmax, Hardmax       as Softmax (flattened to 2-D at axis before opset
                          13); Hardmax is the one-hot of the first maximum,
                          on the host
========================  ===================================================
"""
import numpy as np

from gdnflow import ops
from gdnflow.autograd import grad_enabled
from gdnflow.io.onnx_ops import unary
from gdnflow.io.onnx_values import host
from gdnflow.tensor import Tensor


def on_host(function, has_gradient=False):
    """A handler computing ``function(node, *arrays)`` with NumPy on the inputs'
    host copies (None stays None). A float result of a device tensor becomes a
    constant tensor on ``device`` (no gradient: right for the piecewise-constant
    maps); other results stay host arrays. A map that ``has_gradient`` (Mod,
    the scatters, GatherND) refuses a tensor that requires one, which the
    constant would silently cut off."""
    def handler(node, inputs, device):
        if has_gradient and grad_enabled() and any(
                isinstance(v, Tensor) and v.requires_grad for v in inputs):
            node.fail("a gradient through it (gdnflow computes it on the host, without one; "
                      "freeze what feeds it or run under gdnflow.no_grad)")
        result = np.asarray(function(node, *[None if v is None else host(v) for v in inputs]))
        if result.dtype.kind == "f" and any(isinstance(v, Tensor) for v in inputs):
            return Tensor(result.astype(np.float32), device=device)
        return result
    return handler


def _elementwise(function):
    """:func:`on_host` for a NumPy function of the inputs alone."""
    return on_host(lambda node, *arrays: function(*arrays))


def _mask(x, predicate):
    """``predicate`` of x's host copy as 0/1 floats: a constant, which arithmetic
    with x turns into a tensor of x's type on x's device."""
    return predicate(host(x)).astype(np.float32)


def _is_inf(node, x):
    positive, negative = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    return (np.isposinf(x) & bool(positive)) | (np.isneginf(x) & bool(negative))


def _bit_shift(node, x, amount):
    return np.left_shift(x, amount) if node.attr("direction") == "LEFT" else np.right_shift(x, amount)


def _mod(node, a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b) if node.attr("fmod", 0) else np.mod(a, b)


def _thresholded_relu(node, inputs, device):
    x = inputs[0]
    alpha = node.attr("alpha", 1.0)
    return x * _mask(x, lambda v: v > alpha)


def _shrink(node, inputs, device):
    x = inputs[0]
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    return (_mask(x, lambda v: v > lambd) * (x - bias)
            + _mask(x, lambda v: v < -lambd) * (x + bias))


def _swish(node, inputs, device):
    x = inputs[0]
    return x * ops.sigmoid(x * node.attr("alpha", 1.0))


def softmax_handler(function):
    """A Softmax-like handler: ``function(x, axis)`` along ``axis`` (default -1);
    before opset 13 the input is flattened to 2-D at the axis and its rows
    normalised, the ONNX semantics of those opsets."""
    def handler(node, inputs, device):
        x = inputs[0]
        axis = node.attr("axis", -1 if node.opset >= 13 else 1) % x.ndim
        if node.opset < 13 and axis != x.ndim - 1:
            flat = ops.reshape(x, (int(np.prod(x.shape[:axis])), -1))
            return ops.reshape(function(flat, 1), x.shape)
        return function(x, axis)
    return handler


def _hardmax(x, axis):
    values = host(x)
    one_hot = np.zeros(values.shape, np.float32)
    np.put_along_axis(one_hot, np.expand_dims(np.argmax(values, axis=axis), axis), 1.0, axis=axis)
    return Tensor(one_hot, device=x.device)


HANDLERS = {
    "Erf": unary(ops.erf), "Sin": unary(ops.sin), "Cos": unary(ops.cos), "Tan": unary(ops.tan),
    "Asin": unary(ops.asin), "Acos": unary(ops.acos), "Atan": unary(ops.atan),
    "Sinh": unary(ops.sinh), "Cosh": unary(ops.cosh), "Asinh": unary(ops.asinh),
    "Acosh": unary(ops.acosh), "Atanh": unary(ops.atanh),
    "Sign": _elementwise(np.sign), "Floor": _elementwise(np.floor),
    "Ceil": _elementwise(np.ceil), "Round": _elementwise(np.round),
    "IsNaN": _elementwise(np.isnan), "IsInf": on_host(_is_inf),
    "Equal": _elementwise(np.equal), "Less": _elementwise(np.less),
    "LessOrEqual": _elementwise(np.less_equal), "Greater": _elementwise(np.greater),
    "GreaterOrEqual": _elementwise(np.greater_equal), "Not": _elementwise(np.logical_not),
    "And": _elementwise(np.logical_and), "Or": _elementwise(np.logical_or),
    "Xor": _elementwise(np.logical_xor), "BitwiseAnd": _elementwise(np.bitwise_and),
    "BitwiseOr": _elementwise(np.bitwise_or), "BitwiseXor": _elementwise(np.bitwise_xor),
    "BitwiseNot": _elementwise(np.invert), "BitShift": on_host(_bit_shift),
    "Mod": on_host(_mod, has_gradient=True), "ThresholdedRelu": _thresholded_relu, "Shrink": _shrink, "Swish": _swish,
    "LogSoftmax": softmax_handler(lambda x, axis: ops.log_softmax(x, axis=axis)),
    "Hardmax": softmax_handler(_hardmax),
}

#: Those of :data:`HANDLERS` that also compute on host arrays of any type.
HOST_OPS = {"Sign", "Floor", "Ceil", "Round", "IsNaN", "IsInf", "Equal", "Less", "LessOrEqual",
            "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "BitwiseAnd", "BitwiseOr",
            "BitwiseXor", "BitwiseNot", "BitShift", "Mod"}
