"""Elementwise maps of one tensor. CUDA kernels: ``cuda_src/elementwise.cu``.

``neg exp log sqrt pow relu relu6 sigmoid clamp affine``: y has x's shape,
y_i = f(x_i), and each operator has one fused backward kernel computing
gx_i = df(x_i, y_i, gy_i). The binary arithmetic with broadcasting, whose
kernels share the file, is :mod:`gdnflow.ops.arithmetic`.
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.precision import emulate
from gdnflow.registry import register

SOURCE = "elementwise.cu"


# ------------------------------------------------------------------ unary --
class UnaryOp(Operator):
    """y = f(x) elementwise, with up to two scalar parameters ``self.params``.

    Subclasses name their CUDA kernel pair (``kernel``: ``<kernel>_forward``
    and ``<kernel>_backward`` in elementwise.cu), give the NumPy forms
    ``f(x)`` and ``df(x, y, gy)``, and say which of x and y the backward
    needs (``saves``) so the other can be freed. The kernels of elementwise.cu
    also read and write 16-bit tensors (``autocast = "same"``); a subclass
    whose ``forward_cuda`` launches kernels of its own sets ``autocast =
    "float32"`` unless those do too.
    """

    kernel = None
    saves = ("x",)
    params = (0.0, 0.0)
    autocast = "same"       # 16-bit kernels: elementwise.cu built for 16-bit storage

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Kernel names are looked up on every call: build the strings once.
        cls.forward_kernel, cls.backward_kernel = f"{cls.kernel}_forward", f"{cls.kernel}_backward"

    def f(self, x):
        """The NumPy forward."""
        raise NotImplementedError

    def df(self, x, y, gy):
        """The NumPy backward: the gradient with respect to x."""
        raise NotImplementedError

    def _save(self, x, y):
        """Keep x and y as ``self.saved.x`` / ``.y``, each None unless ``saves`` names it;
        nothing unless a backward may follow."""
        if self.recording:
            self.save(x=x if "x" in self.saves else None, y=y if "y" in self.saves else None)

    def forward_numpy(self, x):
        y = emulate(self.f, x, dtype=x.dtype)
        self._save(x, y)
        return y

    def forward_cuda(self, x):
        y = cuda.empty(x.shape, x.dtype)
        cuda.kernel(SOURCE, self.forward_kernel, "PPiff", cuda.storage_defines(x.dtype)).launch(
            x.size, x.ptr, y.ptr, x.size, *self.params)
        self._save(x, y)
        return y

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gy):
        return emulate(lambda g, x, y: self.df(x, y, g), gy, self.saved.x, self.saved.y,
                       dtype=gy.dtype)

    def backward_cuda(self, gy):
        # The kernel does not read what the operator did not save: any valid
        # pointer can stand in for it.
        x, y = (a if a is not None else gy for a in (self.saved.x, self.saved.y))
        gx = cuda.empty(gy.shape, gy.dtype)
        cuda.kernel(SOURCE, self.backward_kernel, "PPPPiff", cuda.storage_defines(gy.dtype)).launch(
            gy.size, x.ptr, y.ptr, gy.ptr, gx.ptr, gy.size, *self.params)
        return gx


@register("neg")
class NegOp(UnaryOp):
    """y = -x."""
    kernel, saves = "neg", ()
    def f(self, x): return -x
    def df(self, x, y, gy): return -gy


@register("exp")
class ExpOp(UnaryOp):
    """y = e^x."""
    kernel, saves = "exp", ("y",)
    def f(self, x): return np.exp(x)
    def df(self, x, y, gy): return gy * y


@register("log")
class LogOp(UnaryOp):
    """y = ln x (natural logarithm)."""
    kernel = "log"
    def f(self, x): return np.log(x)
    def df(self, x, y, gy): return gy / x


@register("sqrt")
class SqrtOp(UnaryOp):
    """y = sqrt(x)."""
    kernel, saves = "sqrt", ("y",)
    def f(self, x): return np.sqrt(x)
    def df(self, x, y, gy): return gy * 0.5 / y


@register("pow")
class PowOp(UnaryOp):
    """y = x^exponent for a constant exponent."""
    kernel = "pow"

    def __init__(self, exponent):
        self.exponent = float(exponent)
        self.params = (self.exponent, 0.0)

    def f(self, x): return np.power(x, x.dtype.type(self.exponent))
    def df(self, x, y, gy): return gy * self.exponent * np.power(x, x.dtype.type(self.exponent - 1))


@register("relu")
class ReLUOp(UnaryOp):
    """y = max(x, 0); the gradient at 0 is taken as 0."""
    kernel = "relu"
    def f(self, x): return np.maximum(x, 0)
    def df(self, x, y, gy): return np.where(x > 0, gy, 0)


@register("relu6")
class ReLU6Op(UnaryOp):
    """y = min(max(x, 0), 6); the gradient passes for 0 < x < 6."""
    kernel = "relu6"
    def f(self, x): return np.clip(x, 0, 6)
    def df(self, x, y, gy): return np.where((x > 0) & (x < 6), gy, 0)


@register("sigmoid")
class SigmoidOp(UnaryOp):
    """y = 1 / (1 + e^-x)."""
    kernel, saves = "sigmoid", ("y",)
    def f(self, x): return 1 / (1 + np.exp(-x))
    def df(self, x, y, gy): return gy * y * (1 - y)


@register("clamp")
class ClampOp(UnaryOp):
    """y = min(max(x, low), high); the gradient passes for low <= x <= high."""
    kernel = "clamp"

    def __init__(self, low, high):
        if not low <= high:
            raise ValueError(f"clamp: low ({low}) must not exceed high ({high})")
        self.params = (float(low), float(high))

    def f(self, x): return np.clip(x, *self.params)
    def df(self, x, y, gy): return np.where((x >= self.params[0]) & (x <= self.params[1]), gy, 0)


@register("affine")
class AffineOp(UnaryOp):
    """y = scale * x + shift, for constants: arithmetic with a Python number."""
    kernel, saves = "affine", ()

    def __init__(self, scale, shift):
        self.params = (float(scale), float(shift))

    def f(self, x): return x * x.dtype.type(self.params[0]) + x.dtype.type(self.params[1])
    def df(self, x, y, gy): return gy * gy.dtype.type(self.params[0])


def neg(x):
    """-x."""
    return NegOp()(x)



def exp(x):
    """e^x, elementwise."""
    return ExpOp()(x)



def log(x):
    """Natural logarithm, elementwise."""
    return LogOp()(x)



def sqrt(x):
    """Square root, elementwise."""
    return SqrtOp()(x)



def pow(x, exponent):
    """x ** exponent for a constant exponent."""
    return PowOp(exponent)(x)



def relu(x):
    """max(x, 0)."""
    return ReLUOp()(x)



def relu6(x):
    """min(max(x, 0), 6)."""
    return ReLU6Op()(x)



def sigmoid(x):
    """1 / (1 + e^-x)."""
    return SigmoidOp()(x)



def clamp(x, low, high):
    """x limited to [low, high]."""
    return ClampOp(low, high)(x)



def affine(x, scale, shift):
    """scale * x + shift for constants scale, shift."""
    return AffineOp(scale, shift)(x)
