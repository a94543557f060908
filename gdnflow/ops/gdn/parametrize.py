"""Non-negative reparameterisation, for GDN's beta and gamma.
CUDA kernels: ``cuda_src/parametrize.cu``.

A value v that must stay at or above a minimum m is trained in a stored form
p and used as::

    pedestal = (2^-18)^2          bound = sqrt(m + pedestal)
    p        = sqrt(max(v + pedestal, pedestal))          (stored, at initialisation)
    v        = max(p, bound)^2 - pedestal                 (effective, at every use)

the reparameterisation of CompressAI's ``NonNegativeParametrizer`` and
tensorflow-compression, so that weights trained there load here unchanged.
The max is a lower bound (:class:`~gdnflow.ops.bound.LowerBoundOp`) whose
gradient also passes *below* the bound when it is negative, so that
gradient descent raises p (and so v) back toward the bound.

Two names, two jobs:

- :class:`NonNegativeReparametrization` describes how one parameter is
  stored (its minimum, pedestal and bound): ``init(v)`` gives the stored
  form of initial values, and calling it on a stored Tensor gives the
  effective Tensor. The GDN layer holds one per parameter
  (``beta_reparam``, ``gamma_reparam``). It is not an operator.
- :class:`NonNegativeParametrizeOp` is the operator (registered as
  ``"nonnegative_parametrize"``) that computes v from p, with its gradient.

:func:`nonnegative_value` and :func:`nonnegative_value_grad` are the two
formulas on NumPy arrays; the operator applies them, and so does the GDN
operator (:mod:`gdnflow.ops.gdn.operator`) inside its own forward and
backward when given stored parameters. ``docs/gdn.md`` says why GDN trains
the stored form.
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


@register("nonnegative_parametrize")
class NonNegativeParametrizeOp(Operator):
    """v = max(p, bound)^2 - pedestal, elementwise, any shape: lower bound,
    square and shift in one pass.

    The gradient is that of the three composed: dv/dp = 2 max(p, bound), kept
    where p >= bound or where the incoming gradient is negative (the sign of
    the lower bound's incoming gradient, 2 max(p, bound) > 0 times it). One
    kernel each way instead of three. The GDN layer's forward folds these
    formulas into the GDN operator itself (``ops.gdn(..., parametrized=...)``);
    this operator gives its ``effective_beta`` and ``effective_gamma``.
    """

    def __init__(self, bound, pedestal):
        self.bound = float(bound)
        self.pedestal = float(pedestal)

    def forward_numpy(self, p):
        self.save(p=p)
        return nonnegative_value(p, self.bound, self.pedestal)

    def forward_cuda(self, p):
        v = cuda.empty(p.shape, p.dtype)
        cuda.kernel(SOURCE, "nonnegative_forward", "PPiff").launch(
            p.size, p.ptr, v.ptr, p.size, self.bound, self.pedestal)
        self.save(p=p)
        return v

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gv):
        return nonnegative_value_grad(self.saved.p, gv, self.bound)

    def backward_cuda(self, gv):
        p = self.saved.p
        gp = cuda.empty(gv.shape, gv.dtype)
        cuda.kernel(SOURCE, "nonnegative_backward", "PPPif").launch(
            gv.size, p.ptr, gv.ptr, gp.ptr, gv.size, self.bound)
        return gp


class NonNegativeReparametrization:
    """How one parameter is stored so that its value stays >= ``minimum``:
    stored values p map to effective values v and back (not an operator).

    ``init(v)`` gives the stored form of initial values v (a NumPy array);
    calling it on a stored Tensor p gives the effective Tensor
    ``max(p, bound)^2 - pedestal`` through :class:`NonNegativeParametrizeOp`,
    differentiable with respect to p. ``bound`` = sqrt(minimum + pedestal).
    See the module docstring for the formulas. (CompressAI calls this object
    ``NonNegativeParametrizer``.)
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
        return NonNegativeParametrizeOp(self.bound, self.pedestal)(stored)

    def __repr__(self):
        return f"NonNegativeReparametrization(minimum={self.minimum:g})"
