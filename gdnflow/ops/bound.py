"""A lower bound whose gradient also passes below the bound when it is negative.

``lower_bound(x, bound)`` = max(x, bound), as CompressAI's ``LowerBound``
(the entropy bottleneck bounds its likelihoods with it). Its gradient passes
where x >= bound, and also where x < bound if the incoming gradient is
negative: gradient descent then raises x back toward the bound, instead of
x being stuck under it with a zero gradient. Elsewhere the gradient is 0.

CUDA kernels: ``lower_bound_forward`` and ``lower_bound_backward`` in
``cuda_src/parametrize.cu``.
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.registry import register

SOURCE = "parametrize.cu"


@register("lower_bound")
class LowerBoundOp(Operator):
    """y = max(x, bound) for a constant ``bound``, any shape.

    The gradient passes where x >= bound, and also where x < bound if the
    incoming gradient is negative (see the module docstring); elsewhere it is 0.
    """

    def __init__(self, bound):
        self.bound = float(bound)

    def forward_numpy(self, x):
        self.save(x=x)
        return np.maximum(x, x.dtype.type(self.bound))

    def forward_cuda(self, x):
        y = cuda.empty(x.shape, x.dtype)
        cuda.kernel(SOURCE, "lower_bound_forward", "PPif").launch(
            x.size, x.ptr, y.ptr, x.size, self.bound)
        self.save(x=x)
        return y

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gy):
        x = self.saved.x
        passes = (x >= x.dtype.type(self.bound)) | (gy < 0)
        return np.where(passes, gy, gy.dtype.type(0))

    def backward_cuda(self, gy):
        x = self.saved.x
        gx = cuda.empty(gy.shape, gy.dtype)
        cuda.kernel(SOURCE, "lower_bound_backward", "PPPif").launch(
            gy.size, x.ptr, gy.ptr, gx.ptr, gy.size, self.bound)
        return gx


def lower_bound(x, bound):
    """max(x, bound), with the gradient of :class:`LowerBoundOp`."""
    return LowerBoundOp(bound)(x)
