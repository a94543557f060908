"""Non-negative reparameterisation, for GDN's beta and gamma.
CUDA kernels: ``cuda_src/parametrize.cu``.

A value v that must stay at or above a minimum m is trained in a stored form
p and used as::

    pedestal = (2^-18)^2          bound = sqrt(m + pedestal)
    p        = sqrt(max(v + pedestal, pedestal))          (stored, at initialisation)
    v        = max(p, bound)^2 - pedestal                 (effective, at every use)

the reparameterisation of CompressAI's ``NonNegativeParametrizer`` and
tensorflow-compression, so that weights trained there load here unchanged.
Training p instead of v scales the step a gradient makes on v with sqrt(v)
(small values move slowly, as GDN needs for stability), and the bound keeps
v >= m. The max is :class:`LowerBound`, whose gradient also passes *below*
the bound when it is negative: gradient descent then raises p (and so v) back
toward the bound, instead of p being stuck under it with a zero gradient.

:func:`nonnegative_value` and :func:`nonnegative_value_grad` are the two
formulas on NumPy arrays; :class:`NonNegativeParametrize` applies them as an
operator of its own, and the GDN operator (:mod:`gdnflow.ops.gdn`) inside its
own forward and backward when given stored parameters.
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.registry import register

SOURCE = "parametrize.cu"

#: (2^-18)^2, as in CompressAI and tensorflow-compression.
PEDESTAL = (2.0 ** -18) ** 2


def nonnegative_value(p, bound, pedestal):
    """v = max(p, bound)^2 - pedestal of a stored NumPy array ``p``, in p's dtype."""
    kind = p.dtype.type
    return np.maximum(p, kind(bound)) ** 2 - kind(pedestal)


def nonnegative_value_grad(p, gv, bound):
    """dL/dp from gv = dL/dv for v = max(p, bound)^2 - pedestal (NumPy arrays).

    2 max(p, bound) gv where the gradient passes the bound (p >= bound, or
    gv < 0: see the module docstring), 0 elsewhere.
    """
    bound = p.dtype.type(bound)
    passes = (p >= bound) | (gv < 0)
    return np.where(passes, 2 * np.maximum(p, bound) * gv, gv.dtype.type(0))


@register("lower_bound")
class LowerBound(Operator):
    """y = max(x, bound) for a constant ``bound``.

    The gradient passes where x >= bound, and also where x < bound if the
    incoming gradient is negative (see the module docstring); elsewhere it is 0.
    """

    def __init__(self, bound):
        self.bound = float(bound)

    def forward_numpy(self, x):
        self.saved = (x,)
        return np.maximum(x, x.dtype.type(self.bound))

    def forward_cuda(self, x):
        y = cuda.empty(x.shape, x.dtype)
        cuda.kernel(SOURCE, "lower_bound_forward", "PPif").launch(
            x.size, x.ptr, y.ptr, x.size, self.bound)
        self.saved = (x,)
        return y

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gy):
        (x,) = self.saved
        passes = (x >= x.dtype.type(self.bound)) | (gy < 0)
        return np.where(passes, gy, gy.dtype.type(0))

    def backward_cuda(self, gy):
        (x,) = self.saved
        gx = cuda.empty(gy.shape, gy.dtype)
        cuda.kernel(SOURCE, "lower_bound_backward", "PPPif").launch(
            gy.size, x.ptr, gy.ptr, gx.ptr, gy.size, self.bound)
        return gx


def lower_bound(x, bound):
    """max(x, bound), with the gradient of :class:`LowerBound`."""
    return LowerBound(bound)(x)


@register("nonnegative_parametrize")
class NonNegativeParametrize(Operator):
    """v = max(p, bound)^2 - pedestal: :class:`LowerBound`, square and shift in one pass.

    The gradient is that of the three composed: dv/dp = 2 max(p, bound), kept
    where p >= bound or where the incoming gradient is negative (the sign of
    LowerBound's incoming gradient, 2 max(p, bound) > 0 times it). One
    kernel each way instead of three: at ~10 µs of Python per launch the
    composed form cost more than the GDN kernels' own small-layer time. (The
    GDN layer's forward goes further and folds these formulas into the GDN
    operator itself, ``ops.gdn(..., parametrized=...)``; this operator gives
    its ``effective_beta`` and ``effective_gamma``.)
    """

    def __init__(self, bound, pedestal):
        self.bound = float(bound)
        self.pedestal = float(pedestal)

    def forward_numpy(self, p):
        self.saved = (p,)
        return nonnegative_value(p, self.bound, self.pedestal)

    def forward_cuda(self, p):
        v = cuda.empty(p.shape, p.dtype)
        cuda.kernel(SOURCE, "nonnegative_forward", "PPiff").launch(
            p.size, p.ptr, v.ptr, p.size, self.bound, self.pedestal)
        self.saved = (p,)
        return v

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gv):
        (p,) = self.saved
        return nonnegative_value_grad(p, gv, self.bound)

    def backward_cuda(self, gv):
        (p,) = self.saved
        gp = cuda.empty(gv.shape, gv.dtype)
        cuda.kernel(SOURCE, "nonnegative_backward", "PPPif").launch(
            gv.size, p.ptr, gv.ptr, gp.ptr, gv.size, self.bound)
        return gp


class NonNegativeParametrizer:
    """Maps stored values p to effective values v >= ``minimum`` and back.

    ``init(v)`` gives the stored form of initial values v (a NumPy array);
    calling the parametrizer on a stored Tensor p gives the effective Tensor
    ``max(p, bound)^2 - pedestal``, differentiable with respect to p. See the
    module docstring for the formulas and why.
    """

    def __init__(self, minimum=0.0, pedestal=PEDESTAL):
        self.minimum = float(minimum)
        self.pedestal = float(pedestal)
        self.bound = (self.minimum + self.pedestal) ** 0.5

    def init(self, value):
        """The stored form sqrt(max(v + pedestal, pedestal)) of ``value`` (float64 NumPy)."""
        value = np.asarray(value, dtype=np.float64)
        return np.sqrt(np.maximum(value + self.pedestal, self.pedestal))

    def __call__(self, stored):
        """The effective value max(stored, bound)^2 - pedestal, as a Tensor."""
        return NonNegativeParametrize(self.bound, self.pedestal)(stored)

    def __repr__(self):
        return f"NonNegativeParametrizer(minimum={self.minimum:g})"
