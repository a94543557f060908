"""Elementwise operators. CUDA kernels: ``cuda_src/elementwise.cu``.

Unary operators (``neg exp log sqrt pow relu relu6 sigmoid clamp affine``)
map each element and have one fused backward kernel each. Binary arithmetic
(``add sub mul div``) broadcasts NumPy-style; the CUDA kernels handle any
broadcast that merges into six index dimensions, which covers scalars,
per-channel vectors against NCHW tensors, rows and columns.
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.errors import ShapeError
from gdnflow.backends import cuda
from gdnflow.backends.numpy_backend import contiguous
from gdnflow.ops.broadcast import broadcast_shape, kernel_layout, reduced_axes
from gdnflow.registry import register

SOURCE = "elementwise.cu"


# ------------------------------------------------------------------ unary --
class UnaryOperator(Operator):
    """y = f(x) elementwise, with up to two scalar parameters ``self.params``.

    Subclasses name their CUDA kernel pair (``kernel``: ``<kernel>_forward``
    and ``<kernel>_backward`` in elementwise.cu), give the NumPy forms
    ``f(x)`` and ``df(x, y, gy)``, and say which of x and y the backward
    needs (``saves``) so the other can be freed.
    """

    kernel = None
    saves = ("x",)
    params = (0.0, 0.0)

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
        self.saved = (x if "x" in self.saves else None, y if "y" in self.saves else None)

    def forward_numpy(self, x):
        y = np.asarray(self.f(x), dtype=x.dtype)
        self._save(x, y)
        return y

    def forward_cuda(self, x):
        y = cuda.empty(x.shape, x.dtype)
        cuda.kernel(SOURCE, self.forward_kernel, "PPiff").launch(
            x.size, x.ptr, y.ptr, x.size, *self.params)
        self._save(x, y)
        return y

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gy):
        x, y = self.saved
        return np.asarray(self.df(x, y, gy), dtype=gy.dtype)

    def backward_cuda(self, gy):
        # The kernel does not read what the operator did not save: any valid
        # pointer can stand in for it.
        x, y = (a if a is not None else gy for a in self.saved)
        gx = cuda.empty(gy.shape, gy.dtype)
        cuda.kernel(SOURCE, self.backward_kernel, "PPPPiff").launch(
            gy.size, x.ptr, y.ptr, gy.ptr, gx.ptr, gy.size, *self.params)
        return gx


@register("neg")
class Neg(UnaryOperator):
    """y = -x."""
    kernel, saves = "neg", ()
    def f(self, x): return -x
    def df(self, x, y, gy): return -gy


@register("exp")
class Exp(UnaryOperator):
    """y = e^x."""
    kernel, saves = "exp", ("y",)
    def f(self, x): return np.exp(x)
    def df(self, x, y, gy): return gy * y


@register("log")
class Log(UnaryOperator):
    """y = ln x (natural logarithm)."""
    kernel = "log"
    def f(self, x): return np.log(x)
    def df(self, x, y, gy): return gy / x


@register("sqrt")
class Sqrt(UnaryOperator):
    """y = sqrt(x)."""
    kernel, saves = "sqrt", ("y",)
    def f(self, x): return np.sqrt(x)
    def df(self, x, y, gy): return gy * 0.5 / y


@register("pow")
class Pow(UnaryOperator):
    """y = x^exponent for a constant exponent."""
    kernel = "pow"

    def __init__(self, exponent):
        self.exponent = float(exponent)
        self.params = (self.exponent, 0.0)

    def f(self, x): return np.power(x, x.dtype.type(self.exponent))
    def df(self, x, y, gy): return gy * self.exponent * np.power(x, x.dtype.type(self.exponent - 1))


@register("relu")
class ReLU(UnaryOperator):
    """y = max(x, 0); the gradient at 0 is taken as 0."""
    kernel = "relu"
    def f(self, x): return np.maximum(x, 0)
    def df(self, x, y, gy): return np.where(x > 0, gy, 0)


@register("relu6")
class ReLU6(UnaryOperator):
    """y = min(max(x, 0), 6); the gradient passes for 0 < x < 6."""
    kernel = "relu6"
    def f(self, x): return np.clip(x, 0, 6)
    def df(self, x, y, gy): return np.where((x > 0) & (x < 6), gy, 0)


@register("sigmoid")
class Sigmoid(UnaryOperator):
    """y = 1 / (1 + e^-x)."""
    kernel, saves = "sigmoid", ("y",)
    def f(self, x): return 1 / (1 + np.exp(-x))
    def df(self, x, y, gy): return gy * y * (1 - y)


@register("clamp")
class Clamp(UnaryOperator):
    """y = min(max(x, low), high); the gradient passes for low <= x <= high."""
    kernel = "clamp"

    def __init__(self, low, high):
        if not low <= high:
            raise ValueError(f"clamp: low ({low}) must not exceed high ({high})")
        self.params = (float(low), float(high))

    def f(self, x): return np.clip(x, *self.params)
    def df(self, x, y, gy): return np.where((x >= self.params[0]) & (x <= self.params[1]), gy, 0)


@register("affine")
class Affine(UnaryOperator):
    """y = scale * x + shift, for constants: arithmetic with a Python number."""
    kernel, saves = "affine", ()

    def __init__(self, scale, shift):
        self.params = (float(scale), float(shift))

    def f(self, x): return x * x.dtype.type(self.params[0]) + x.dtype.type(self.params[1])
    def df(self, x, y, gy): return gy * gy.dtype.type(self.params[0])


# ----------------------------------------------------------------- binary --
class BinaryOperator(Operator):
    """out = a OP b with NumPy broadcasting; ``kernel`` names the CUDA pair.

    Subclasses give ``grads(gy)``: the gradients at the broadcast shape; the
    base class sums each back to its input's shape.
    """

    kernel = None
    numpy_function = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.same_kernel, cls.broadcast_kernel = f"{cls.kernel}_same", f"{cls.kernel}_broadcast"

    def check(self, a, b):
        self.out_shape = broadcast_shape(self.label, a.shape, b.shape)

    def forward_numpy(self, a, b):
        self._save(a, b)
        return type(self).numpy_function(a, b)

    def forward_cuda(self, a, b):
        out = cuda.empty(self.out_shape, a.dtype)
        n = out.size
        if a.shape == b.shape:
            cuda.kernel(SOURCE, self.same_kernel, "PPPi").launch(
                n, a.ptr, b.ptr, out.ptr, n)
        else:
            dims, (sa, sb) = kernel_layout(self.out_shape, a.shape, b.shape)
            cuda.kernel(SOURCE, self.broadcast_kernel, "PPPi" + "i" * 17).launch(
                n, a.ptr, b.ptr, out.ptr, n, *dims, *sa, *sb)
        self._save(a, b)
        return out

    def _save(self, a, b):
        """Keep what the backward needs (nothing, by default)."""

    def backward(self, gy):
        return tuple(None if g is None else sum_to(g, shape)
                     for g, shape in zip(self.grads(gy), self.input_shapes))

    def grads(self, gy):
        """Gradients with respect to a and b at the output's (broadcast) shape."""
        raise NotImplementedError


@register("add")
class Add(BinaryOperator):
    """a + b."""
    kernel, numpy_function = "add", np.add

    def grads(self, gy):
        return gy, gy


@register("sub")
class Sub(BinaryOperator):
    """a - b."""
    kernel, numpy_function = "sub", np.subtract

    def grads(self, gy):
        return gy, (-gy if self.needs_grad[1] else None)


@register("mul")
class Mul(BinaryOperator):
    """a * b."""
    kernel, numpy_function = "mul", np.multiply

    def _save(self, a, b):
        self.saved = (a, b)

    def grads(self, gy):
        a, b = (self.wrap(x) for x in self.saved)
        return (gy * b if self.needs_grad[0] else None,
                gy * a if self.needs_grad[1] else None)


@register("div")
class Div(BinaryOperator):
    """a / b."""
    kernel, numpy_function = "div", np.divide

    def _save(self, a, b):
        self.saved = (a, b)

    def grads(self, gy):
        a, b = (self.wrap(x) for x in self.saved)
        ga = gy / b if self.needs_grad[0] else None
        gb = -(gy * a) / (b * b) if self.needs_grad[1] else None
        return ga, gb


@register("broadcast_to")
class BroadcastTo(Operator):
    """Repeat x along its size-1 (or missing leading) dimensions to ``shape``."""

    def __init__(self, shape):
        self.shape = tuple(shape)

    def check(self, x):
        if broadcast_shape(self.label, x.shape, self.shape) != self.shape:
            raise ShapeError(f"broadcast_to: cannot broadcast shape {x.shape} to {self.shape}")

    def forward_numpy(self, x):
        return contiguous(np.broadcast_to(x, self.shape))

    def forward_cuda(self, x):
        out = cuda.empty(self.shape, x.dtype)
        dims, (strides,) = kernel_layout(self.shape, x.shape)
        cuda.kernel(SOURCE, "broadcast_copy", "PPi" + "i" * 11).launch(
            out.size, x.ptr, out.ptr, out.size, *dims, *strides)
        return out

    def backward(self, gy):
        return (sum_to(gy, self.input_shapes[0]),)


def sum_to(t, shape):
    """Sum ``t`` over the dimensions along which ``shape`` was broadcast to t's shape."""
    if t.shape == tuple(shape):
        return t
    from gdnflow.ops.reduction import Sum
    from gdnflow.ops.shape import Reshape
    return Reshape(shape)(Sum(reduced_axes(t.shape, shape), keepdims=True)(t))
