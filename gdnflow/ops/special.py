"""The error function and the trigonometric and hyperbolic maps, elementwise.
CUDA kernels: ``cuda_src/elementwise.cu`` (one line each in ``UNARY_OPERATORS``).

``erf sin cos tan asin acos atan sinh cosh asinh acosh atanh``: y has x's
shape, y_i = f(x_i), with the usual derivatives::

    erf'   = 2/sqrt(pi) e^(-x^2)     sin'  = cos x       cos'  = -sin x
    tan'   = 1 + tan^2 x             asin' = 1/sqrt(1 - x^2)
    acos'  = -1/sqrt(1 - x^2)        atan' = 1/(1 + x^2)
    sinh'  = cosh x                  cosh' = sinh x      asinh' = 1/sqrt(x^2 + 1)
    acosh' = 1/sqrt(x^2 - 1)         atanh' = 1/(1 - x^2)

The NumPy forms are NumPy's own, except erf: :func:`gdnflow.ops.gaussian.erf`
(float64, within 1e-15 relative), as NumPy has none.
"""
import numpy as np

from gdnflow.ops.elementwise import UnaryOp
from gdnflow.ops.gaussian import erf as erf_float64
from gdnflow.registry import register

_TWO_OVER_SQRT_PI = 1.1283791670955126


@register("erf")
class ErfOp(UnaryOp):
    """y = erf(x) = 2/sqrt(pi) * integral of e^(-t^2) from 0 to x."""
    kernel = "erf"
    def f(self, x): return erf_float64(x.astype(np.float64))
    def df(self, x, y, gy): return gy * _TWO_OVER_SQRT_PI * np.exp(-x * x)


@register("sin")
class SinOp(UnaryOp):
    """y = sin x."""
    kernel = "sin"
    def f(self, x): return np.sin(x)
    def df(self, x, y, gy): return gy * np.cos(x)


@register("cos")
class CosOp(UnaryOp):
    """y = cos x."""
    kernel = "cos"
    def f(self, x): return np.cos(x)
    def df(self, x, y, gy): return -gy * np.sin(x)


@register("tan")
class TanOp(UnaryOp):
    """y = tan x."""
    kernel, saves = "tan", ("y",)
    def f(self, x): return np.tan(x)
    def df(self, x, y, gy): return gy * (1 + y * y)


@register("asin")
class AsinOp(UnaryOp):
    """y = arcsin x, for -1 <= x <= 1."""
    kernel = "asin"
    def f(self, x): return np.arcsin(x)
    def df(self, x, y, gy): return gy / np.sqrt(1 - x * x)


@register("acos")
class AcosOp(UnaryOp):
    """y = arccos x, for -1 <= x <= 1."""
    kernel = "acos"
    def f(self, x): return np.arccos(x)
    def df(self, x, y, gy): return -gy / np.sqrt(1 - x * x)


@register("atan")
class AtanOp(UnaryOp):
    """y = arctan x."""
    kernel = "atan"
    def f(self, x): return np.arctan(x)
    def df(self, x, y, gy): return gy / (1 + x * x)


@register("sinh")
class SinhOp(UnaryOp):
    """y = sinh x."""
    kernel = "sinh"
    def f(self, x): return np.sinh(x)
    def df(self, x, y, gy): return gy * np.cosh(x)


@register("cosh")
class CoshOp(UnaryOp):
    """y = cosh x."""
    kernel = "cosh"
    def f(self, x): return np.cosh(x)
    def df(self, x, y, gy): return gy * np.sinh(x)


@register("asinh")
class AsinhOp(UnaryOp):
    """y = arsinh x."""
    kernel = "asinh"
    def f(self, x): return np.arcsinh(x)
    def df(self, x, y, gy): return gy / np.sqrt(x * x + 1)


@register("acosh")
class AcoshOp(UnaryOp):
    """y = arcosh x, for x >= 1."""
    kernel = "acosh"
    def f(self, x): return np.arccosh(x)
    def df(self, x, y, gy): return gy / np.sqrt((x - 1) * (x + 1))


@register("atanh")
class AtanhOp(UnaryOp):
    """y = artanh x, for -1 < x < 1."""
    kernel = "atanh"
    def f(self, x): return np.arctanh(x)
    def df(self, x, y, gy): return gy / (1 - x * x)


def erf(x):
    """The error function, elementwise."""
    return ErfOp()(x)


def sin(x):
    """sin x, elementwise."""
    return SinOp()(x)


def cos(x):
    """cos x, elementwise."""
    return CosOp()(x)


def tan(x):
    """tan x, elementwise."""
    return TanOp()(x)


def asin(x):
    """arcsin x, elementwise."""
    return AsinOp()(x)


def acos(x):
    """arccos x, elementwise."""
    return AcosOp()(x)


def atan(x):
    """arctan x, elementwise."""
    return AtanOp()(x)


def sinh(x):
    """sinh x, elementwise."""
    return SinhOp()(x)


def cosh(x):
    """cosh x, elementwise."""
    return CoshOp()(x)


def asinh(x):
    """arsinh x, elementwise."""
    return AsinhOp()(x)


def acosh(x):
    """arcosh x, elementwise."""
    return AcoshOp()(x)


def atanh(x):
    """artanh x, elementwise."""
    return AtanhOp()(x)
