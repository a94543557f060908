"""gdnflow's operators as functions of tensors (each defined beside its operator class).

Each function builds one operator (see :mod:`gdnflow.registry`) and applies
it. Arithmetic accepts Python numbers and NumPy arrays on either side: a
number becomes the constant of an ``affine`` operator, an array a constant
tensor on the other operand's device.
"""
from gdnflow.ops.conv import conv2d, conv_transpose2d
from gdnflow.ops.arithmetic import add, div, mul, sub
from gdnflow.ops.cast import cast
from gdnflow.ops.elementwise import (affine, clamp, exp, log, neg, pow, relu, relu6,  # noqa: A004
                                     sigmoid, sqrt)
from gdnflow.ops.entropy import abs, round, sigmoid_difference, softplus, tanh, uniform_noise  # noqa: A004
from gdnflow.ops.gaussian import gaussian_likelihood
from gdnflow.ops.special import (acos, acosh, asin, asinh, atan, atanh, cos, cosh, erf, sin,
                                 sinh, tan)
from gdnflow.ops.gdn import gdn
from gdnflow.ops.bound import lower_bound
from gdnflow.ops.linear import linear, matmul
from gdnflow.ops.pool import avg_pool2d, global_avg_pool2d, max_pool2d
from gdnflow.ops.reduction import broadcast_to, mean, sum, sum_to  # noqa: A004
from gdnflow.ops.shape import concat, flatten, pad, reshape, slice_, transpose
from gdnflow.ops.softmax import log_softmax, softmax
from gdnflow.ops.batchnorm import batch_norm, fold_batch_norm
from gdnflow.ops.layernorm import layer_norm
from gdnflow.ops.dropout import dropout

__all__ = ["add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "pow", "relu", "relu6",
           "sigmoid", "clamp", "affine", "reshape", "flatten", "sum", "mean", "broadcast_to",
           "sum_to", "transpose", "slice_", "concat", "pad", "cast"]
__all__ += ["softplus", "tanh", "abs", "round", "uniform_noise", "sigmoid_difference",
            "gaussian_likelihood"]
__all__ += ["linear", "matmul", "max_pool2d", "avg_pool2d", "global_avg_pool2d", "batch_norm",
            "fold_batch_norm", "layer_norm", "softmax", "log_softmax", "dropout"]
__all__ += ["erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
            "atanh"]
