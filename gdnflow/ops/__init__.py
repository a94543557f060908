"""gdnflow's operators as functions of tensors.

Each function builds one operator (see :mod:`gdnflow.registry`) and applies
it. Arithmetic accepts Python numbers and NumPy arrays on either side: a
number becomes the constant of an ``affine`` operator, an array a constant
tensor on the other operand's device.
"""
from gdnflow.ops.conv import conv2d, conv_transpose2d
from gdnflow.ops.elementwise import (Affine, BroadcastTo, Clamp, Exp, Log, Neg, Pow, ReLU, ReLU6,
                                     Sigmoid, Sqrt, sum_to)
from gdnflow.ops.entropy import abs, round, sigmoid_difference, softplus, tanh, uniform_noise  # noqa: A004
from gdnflow.ops.gdn import GDNOperator
from gdnflow.ops.bound import lower_bound
from gdnflow.ops.linear import linear, matmul
from gdnflow.ops.pool import avg_pool2d, global_avg_pool2d, max_pool2d
from gdnflow.ops.reduction import Mean, Sum
from gdnflow.ops.shape import Concat, Pad, Reshape, Slice, Transpose, flatten
from gdnflow.ops.softmax import log_softmax, softmax
from gdnflow.ops.batchnorm import batch_norm, fold_batch_norm
from gdnflow.ops.dropout import dropout
from gdnflow.tensor import Tensor

__all__ = ["add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "pow", "relu", "relu6",
           "sigmoid", "clamp", "affine", "reshape", "flatten", "sum", "mean", "broadcast_to",
           "sum_to", "transpose", "slice_", "concat", "pad"]
__all__ += ["softplus", "tanh", "abs", "round", "uniform_noise", "sigmoid_difference"]
__all__ += ["linear", "matmul", "max_pool2d", "avg_pool2d", "global_avg_pool2d", "batch_norm",
            "fold_batch_norm", "softmax", "log_softmax", "dropout"]


# Arithmetic with numbers and NumPy arrays is defined once, by Tensor's
# operators (gdnflow.tensor); these functions are the same operations by name.
def add(a, b):
    """a + b, broadcasting (a number or a NumPy array on either side)."""
    return a + b if isinstance(a, Tensor) else b.__radd__(a)


def sub(a, b):
    """a - b, broadcasting (a number or a NumPy array on either side)."""
    return a - b if isinstance(a, Tensor) else b.__rsub__(a)


def mul(a, b):
    """a * b, broadcasting (a number or a NumPy array on either side)."""
    return a * b if isinstance(a, Tensor) else b.__rmul__(a)


def div(a, b):
    """a / b, broadcasting (a number or a NumPy array on either side)."""
    return a / b if isinstance(a, Tensor) else b.__rtruediv__(a)


def neg(x):
    """-x."""
    return Neg()(x)


def exp(x):
    """e^x, elementwise."""
    return Exp()(x)


def log(x):
    """Natural logarithm, elementwise."""
    return Log()(x)


def sqrt(x):
    """Square root, elementwise."""
    return Sqrt()(x)


def pow(x, exponent):
    """x ** exponent for a constant exponent."""
    return Pow(exponent)(x)


def relu(x):
    """max(x, 0)."""
    return ReLU()(x)


def relu6(x):
    """min(max(x, 0), 6)."""
    return ReLU6()(x)


def sigmoid(x):
    """1 / (1 + e^-x)."""
    return Sigmoid()(x)


def clamp(x, low, high):
    """x limited to [low, high]."""
    return Clamp(low, high)(x)


def affine(x, scale, shift):
    """scale * x + shift for constants scale, shift."""
    return Affine(scale, shift)(x)


def reshape(x, shape):
    """The same elements in another shape (one -1 allowed)."""
    return Reshape(shape)(x)


def sum(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.sum)
    """Sum over all elements or over ``axis``."""
    return Sum(axis, keepdims)(x)


def mean(x, axis=None, keepdims=False):
    """Mean over all elements or over ``axis``."""
    return Mean(axis, keepdims)(x)


def broadcast_to(x, shape):
    """x repeated along broadcast dimensions to ``shape``."""
    return BroadcastTo(shape)(x)


def gdn(x, beta, gamma, inverse=False, simplified=False, parametrized=None):
    """Generalized divisive normalization of NCHW ``x``: y = x * (beta + gamma s(x))^a per pixel.

    gamma is (C, C), laid out [output channel, input channel]; beta is (C,).
    s(x) = x^2 and a = -1/2 (GDN) or +1/2 (``inverse``); ``simplified`` uses
    s(x) = |x| and a = -1 or +1. With ``parametrized`` = (beta_bound,
    gamma_bound, pedestal), beta and gamma are stored forms p used as
    max(p, bound)^2 - pedestal, as the GDN layer trains them (the
    reparameterisation of :mod:`gdnflow.ops.gdn.parametrize` fused into the
    operator), and their gradients are with respect to p. See
    :mod:`gdnflow.ops.gdn`.
    """
    return GDNOperator(inverse, simplified, parametrized)(x, beta, gamma)


def transpose(x, perm):
    """Permute dimensions like numpy.transpose (a copy)."""
    return Transpose(perm)(x)


def slice_(x, index):
    """x[index] for basic slicing: a tuple of Python slices, one per leading dimension."""
    return Slice(index if isinstance(index, (tuple, list)) else (index,))(x)


def concat(tensors, axis=0):
    """Join tensors along ``axis``."""
    return Concat(axis)(*tensors)


def pad(x, pads, value=0.0):
    """Constant padding: one (before, after) pair per leading dimension."""
    return Pad(pads, value)(x)


# Registers the "sparse_conv2d" operator (gdnflow.sparse: pruned networks).
from gdnflow.sparse.conv import sparse_conv2d  # noqa: E402
