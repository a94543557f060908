"""Binary arithmetic with NumPy broadcasting: ``add sub mul div``.

CUDA kernels: the ``<op>_same`` and ``<op>_broadcast`` pairs of
``cuda_src/elementwise.cu``. out has the broadcast of the two shapes
(:func:`gdnflow.ops.broadcast.broadcast_shape`, a ShapeError naming the
operator if there is none); the CUDA kernels handle any broadcast that
merges into six index dimensions, which covers scalars, per-channel vectors
against NCHW tensors, rows and columns. Gradients are computed at the
broadcast shape and summed back to each input's shape
(:func:`gdnflow.ops.reduction.sum_to`)::

    add: ga = gy,      gb = gy            mul: ga = gy b,   gb = gy a
    sub: ga = gy,      gb = -gy           div: ga = gy / b, gb = -gy a / b^2
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.ops.broadcast import broadcast_shape, kernel_layout
from gdnflow.precision import emulate
from gdnflow.ops.reduction import sum_to
from gdnflow.registry import register
from gdnflow.tensor import Tensor

SOURCE = "elementwise.cu"       # the binary kernels sit beside the unary ones


class BinaryOp(Operator):
    """out = a OP b with NumPy broadcasting; ``kernel`` names the CUDA pair.

    Subclasses give ``grads(gy)``: the gradients at the broadcast shape; the
    base class sums each back to its input's shape.
    """

    kernel = None
    numpy_function = None
    autocast = "same"       # 16-bit kernels: elementwise.cu built for 16-bit storage

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.same_kernel, cls.broadcast_kernel = f"{cls.kernel}_same", f"{cls.kernel}_broadcast"

    def check(self, a, b):
        self.out_shape = broadcast_shape(self.label, a.shape, b.shape)

    def forward_numpy(self, a, b):
        self._save(a, b)
        return emulate(type(self).numpy_function, a, b)

    def forward_cuda(self, a, b):
        out = cuda.empty(self.out_shape, a.dtype)
        n = out.size
        defines = cuda.storage_defines(a.dtype)
        if a.shape == b.shape:
            cuda.kernel(SOURCE, self.same_kernel, "PPPi", defines).launch(
                n, a.ptr, b.ptr, out.ptr, n)
        else:
            dims, (sa, sb) = kernel_layout(self.out_shape, a.shape, b.shape)
            cuda.kernel(SOURCE, self.broadcast_kernel, "PPPi" + "i" * 17, defines).launch(
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
class AddOp(BinaryOp):
    """a + b."""
    kernel, numpy_function = "add", np.add

    def grads(self, gy):
        return gy, gy


@register("sub")
class SubOp(BinaryOp):
    """a - b."""
    kernel, numpy_function = "sub", np.subtract

    def grads(self, gy):
        return gy, (-gy if self.needs_grad[1] else None)


@register("mul")
class MulOp(BinaryOp):
    """a * b."""
    kernel, numpy_function = "mul", np.multiply

    def _save(self, a, b):
        self.save(a=a, b=b)

    def grads(self, gy):
        a, b = self.wrap(self.saved.a), self.wrap(self.saved.b)
        return (gy * b if self.needs_grad[0] else None,
                gy * a if self.needs_grad[1] else None)


@register("div")
class DivOp(BinaryOp):
    """a / b."""
    kernel, numpy_function = "div", np.divide

    def _save(self, a, b):
        self.save(a=a, b=b)

    def grads(self, gy):
        a, b = self.wrap(self.saved.a), self.wrap(self.saved.b)
        ga = gy / b if self.needs_grad[0] else None
        gb = -(gy * a) / (b * b) if self.needs_grad[1] else None
        return ga, gb


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
