"""Generalized divisive normalization: GDN, inverse GDN and their simplified
forms, as one operator (:class:`GDNOp`, registered as ``"gdn"``).

The GPU path is :mod:`gdnflow.ops.gdn.cuda_plan`; the reparameterisation of
stored parameters is :mod:`gdnflow.ops.gdn.parametrize`. ``docs/gdn.md`` has
the derivation, the design of the GPU path and its measurements.

Forward
-------
Per pixel (image n, row h, column w), over the channels of an NCHW ``x``::

    n_i = beta_i + sum_j gamma[i, j] s(x_j)          y_i = x_i * n_i^a

``gamma[i, j]`` is laid out [output channel i, input channel j]: row i holds
the weights with which output channel i is normalised. This is CompressAI's
layout (its 1x1 convolution weight), though its docstring writes the
transpose; tensorflow-compression stores the transpose (its norm is
``square(x) @ gamma``), so its gamma loads transposed. ``tests/ops/gdn/test_operator.py``
pins the layout down. The variants differ in the pixel statistic s and the
exponent a:

    ==================  =======  ======  ===========================
    variant             s(x)     a       D = n^a, cached
    ==================  =======  ======  ===========================
    gdn                 x^2      -1/2    n^-1/2   (Ballé et al. 2016)
    igdn (inverse)      x^2      +1/2    n^1/2
    gdn_simplified      |x|      -1      1/n      (Johnston et al. 2019)
    igdn_simplified     |x|      +1      n
    ==================  =======  ======  ===========================

Stored parameters. With ``parametrized=(beta_bound, gamma_bound, pedestal)``
the operator's beta and gamma inputs are the stored forms p that the GDN
layer trains (:mod:`gdnflow.ops.gdn.parametrize`), and the normalisation
uses the effective values, computed inside the operator::

    beta  = max(p_beta,  beta_bound)^2  - pedestal
    gamma = max(p_gamma, gamma_bound)^2 - pedestal

Backward
--------
With U = dL/dn = a gy x n^(a-1), and s' = 2x for the square, sign(x) for
|x| (sign(0) = 0)::

    gx = gy D + s'(x) gamma^T U          (per pixel: gamma^T applied to U)
    gbeta_i = sum U_i                    ggamma[i, j] = sum U_i s(x_j)

the sums running over images and pixels. n^(a-1) = D^((a-1)/a) (D^3, 1/D,
D^2 or 1), so the cached D is all the backward needs: the norm is never
recomputed. With stored parameters the chain rule through
v = max(p, bound)^2 - pedestal follows::

    dL/dp = 2 max(p, bound) dL/dv    where p >= bound or dL/dv < 0, else 0

(the gradient of :class:`~gdnflow.ops.gdn.parametrize.NonNegativeParametrizeOp`).
Only the gradients asked for are computed.

16 bits
-------
x (and so y, gy, gx) may be float16 or bfloat16; beta and gamma stay float32
(``autocast = "data"``). Everything is computed in float32 except the three
channel products (gamma s(x), gamma^T U and the pixel sum of U s(x)^T), whose
operands are rounded to bfloat16 and summed in float32, as the tensor cores
do (bfloat16 for float16 tensors too: x^2 may pass float16's largest value,
never bfloat16's). D is cached in x's dtype; y and gx are rounded once. The
NumPy path rounds the same values, so it is the GPU kernels' oracle. On the
GPU the 16-bit kernels run where the fused float32 ones would, H*W is a
multiple of 8 and the GPU has bfloat16 tensor cores (sm_80 on) with enough
shared memory; elsewhere the operator computes in float32 between two
conversions (no operand rounding).

Cache
-----
Kept from the forward to the backward, only when a backward can follow
(:attr:`~gdnflow.autograd.Operator.recording`): x, gamma (with stored
parameters, the effective gamma the forward computed, and the stored beta
and gamma too) and D = n^a; on the GPU also the plan and, where the
parameter gradients will read it as it is, S = s(x) (see
:mod:`gdnflow.ops.gdn.cuda_plan`). Under ``no_grad``, or when no input
requires a gradient, nothing is kept and the GPU forward does not write D.
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.config import settings
from gdnflow.errors import ShapeError
from gdnflow.ops.cast import cast_array
from gdnflow.precision import BFLOAT16, FLOAT32, is_half
from gdnflow.ops.gdn.cuda_plan import cuda_plan
from gdnflow.ops.gdn.parametrize import (NonNegativeParametrizeOp, nonnegative_value,
                                         nonnegative_value_grad)
from gdnflow.registry import register

#: (inverse, simplified) -> (name of the variant, which prefixes its kernels; exponent a)
VARIANTS = {
    (False, False): ("gdn", -0.5),
    (True, False): ("igdn", 0.5),
    (False, True): ("gdn_simplified", -1.0),
    (True, True): ("igdn_simplified", 1.0),
}


def bfloat16_operand(array):
    """``array`` (float32) rounded to bfloat16 and back: a 16-bit GDN's product operand."""
    return array.astype(BFLOAT16).astype(FLOAT32)


def as_is(array):
    """``array`` unchanged: a float32 or float64 GDN's product operand."""
    return array


def power_in_place(norm, exponent):
    """norm <- norm^exponent for the exponents of :data:`VARIANTS` (+-1/2, +-1); returns norm.

    By square root and reciprocal: the same values to float rounding as
    np.power, several times faster (np.power with a float exponent runs
    exp and log per element).
    """
    if abs(exponent) == 0.5:
        np.sqrt(norm, out=norm)
    if exponent < 0:
        np.reciprocal(norm, out=norm)
    return norm


@register("gdn")
class GDNOp(Operator):
    """y = x * n^a with n = beta + gamma s(x) per pixel (see the module docstring).

    Inputs: ``x`` (N, C, H, W), ``beta`` (C,) and ``gamma`` (C, C), laid out
    [output channel, input channel]. Output: the shape of x. ``inverse``
    selects a = +1/2 (inverse GDN) over -1/2; ``simplified`` uses ``s = |x|`` and
    a = -1 (or +1 inverse) instead of s = x^2. beta should be positive and
    gamma non-negative; the operator itself does not enforce it, unless
    ``parametrized`` = (beta_bound, gamma_bound, pedestal) is given: beta and
    gamma are then stored forms p, used as max(p, bound)^2 - pedestal
    (:mod:`gdnflow.ops.gdn.parametrize`), and their gradients are with
    respect to p.

    On the GPU, :attr:`fused_forward_runs` and :attr:`fused_backward_runs`
    count how often this application ran the fused kernels (the forward at
    most once; the backward once per backward pass through it): which path
    a call took, for tests and benchmarks. Raises :class:`ShapeError` for
    inputs of the wrong shapes.
    """

    autocast = "data"       # 16-bit x (gdn.cu's tensor-core kernels); beta and gamma float32

    #: How often this application's forward ran a fused kernel (float32 or 16-bit).
    fused_forward_runs = 0
    #: How often this application's backward ran a fused kernel (float32 or 16-bit).
    fused_backward_runs = 0

    def __init__(self, inverse=False, simplified=False, parametrized=None):
        self.inverse = bool(inverse)
        self.simplified = bool(simplified)
        self.variant, self.exponent = VARIANTS[self.inverse, self.simplified]
        if parametrized is not None:
            parametrized = tuple(float(v) for v in parametrized)
            if len(parametrized) != 3:
                raise ValueError(f"{self.label}: parametrized must be (beta_bound, gamma_bound, "
                                 f"pedestal), got {len(parametrized)} values")
        self.parametrized = parametrized

    @property
    def label(self):
        """The variant's name (``gdn``, ``igdn``, ``gdn_simplified``, ``igdn_simplified``)."""
        return self.variant

    def check(self, x, beta, gamma):
        if x.ndim != 4:
            raise ShapeError(f"{self.label}: x must be 4-D (N, C, H, W), got shape {x.shape}")
        c = x.shape[1]
        if beta.shape != (c,):
            raise ShapeError(f"{self.label}: beta must have shape ({c},), one value per channel "
                             f"of x {x.shape}, got {beta.shape}")
        if gamma.shape != (c, c):
            raise ShapeError(f"{self.label}: gamma must have shape ({c}, {c}) [output channel, "
                             f"input channel] for x of shape {x.shape}, got {gamma.shape}")

    def fold_parameters(self, beta, gamma):
        """(operator, effective beta, effective gamma) from stored beta and gamma Tensors.

        The operator computes the same normalisation from the effective
        values; for inference plans, which evaluate the reparameterisation
        of constant weights once (``gdnflow.inference.passes.fold_constants``).
        Only for a ``parametrized`` operator.
        """
        beta_bound, gamma_bound, pedestal = self.parametrized
        return (GDNOp(self.inverse, self.simplified),
                NonNegativeParametrizeOp(beta_bound, pedestal)(beta),
                NonNegativeParametrizeOp(gamma_bound, pedestal)(gamma))

    # ------------------------------------------------------------- NumPy --
    def statistic(self, x):
        """s(x): x^2, or ``|x|`` for the simplified variants (NumPy)."""
        return np.abs(x) if self.simplified else x * x

    def statistic_grad(self, x):
        """s'(x): 2x, or sign(x) for the simplified variants (NumPy)."""
        return np.sign(x) if self.simplified else 2 * x

    def forward_numpy(self, x, beta, gamma):
        storage = x.dtype if is_half(x.dtype) else None
        operand = as_is
        if storage is not None:     # as the 16-bit kernels compute (see "16 bits" above)
            x, operand = x.astype(FLOAT32), bfloat16_operand
        stored = None
        if self.parametrized is not None:
            beta_bound, gamma_bound, pedestal = self.parametrized
            stored = (beta, gamma)
            beta = nonnegative_value(beta, beta_bound, pedestal)
            gamma = nonnegative_value(gamma, gamma_bound, pedestal)
        gamma = operand(gamma)
        batch, channels, height, width = x.shape
        s = operand(self.statistic(x)).reshape(batch, channels, height * width)
        norm = np.matmul(gamma, s).reshape(x.shape)
        norm += beta[:, None, None]
        d = power_in_place(norm, self.exponent)
        if storage is not None:
            with np.errstate(over="ignore"):    # past float16's largest: infinity, as on the GPU
                if self.recording:
                    self.save(x=x, gamma=gamma, d=d.astype(storage).astype(FLOAT32),
                              stored=stored, storage=storage)
                return (x * d).astype(storage)
        if self.recording:
            self.save(x=x, gamma=gamma, d=d, stored=stored, storage=None)
            return x * d
        return np.multiply(x, d, out=d)

    def backward(self, grad_output):
        return tuple(None if g is None else self.wrap(g)
                     for g in self.dispatch("backward", grad_output.data))

    def backward_numpy(self, gy):
        saved = self.saved
        x, gamma, d, stored, storage = saved.x, saved.gamma, saved.d, saved.stored, saved.storage
        operand = as_is if storage is None else bfloat16_operand
        if storage is not None:
            gy = gy.astype(FLOAT32)
        a = self.exponent
        batch, channels, height, width = x.shape
        # dL/dn = a gy x n^(a-1), with n^(a-1) = D^((a-1)/a) from the cache.
        u = a * gy * x * np.power(d, x.dtype.type((a - 1) / a))
        u3 = operand(u.reshape(batch, channels, height * width))
        need_x, need_beta, need_gamma = self.needs_grad
        gx = gbeta = ggamma = None
        if need_x:
            gx = gy * d + self.statistic_grad(x) * (gamma.T @ u3).reshape(x.shape)
            if storage is not None:
                with np.errstate(over="ignore"):
                    gx = gx.astype(storage)
        if need_beta:
            gbeta = u.sum(axis=(0, 2, 3))   # U's own values: the kernels add them in float32
        if need_gamma:
            s3 = operand(self.statistic(x)).reshape(batch, channels, height * width)
            ggamma = np.tensordot(u3, s3, axes=([0, 2], [0, 2]))
        if stored is not None:      # gradients of the stored forms
            beta_bound, gamma_bound, _ = self.parametrized
            if need_beta:
                gbeta = nonnegative_value_grad(stored[0], gbeta, beta_bound)
            if need_gamma:
                ggamma = nonnegative_value_grad(stored[1], ggamma, gamma_bound)
        return gx, gbeta, ggamma

    # -------------------------------------------------------------- CUDA --
    def forward_cuda(self, x, beta, gamma):
        if is_half(x.dtype):
            return self.forward_half(x, beta, gamma)
        y = cuda.empty(x.shape, x.dtype)
        keep = self.recording
        stored = None if self.parametrized is None else (beta, gamma)
        if x.size == 0:
            if keep:
                self.save(x=x, gamma=gamma, d=None, s=None, plan=None, stored=stored)
            return y
        plan = cuda_plan(self.variant, x.shape, settings.gdn_param_gemm_chunks)
        if plan.fused(x, y, gamma):
            return self.forward_fused(plan, x, beta, gamma, y, stored)
        vec = plan.vectorized(x, y)
        s = plan.empty(plan.channels)
        plan.statistic(x, s, vec)
        if stored is not None:
            # After the statistic: the GPU runs that while Python queues this.
            beta = cuda.empty(beta.shape, beta.dtype)
            gamma = cuda.empty(gamma.shape, gamma.dtype)
            plan.effective_params(*stored, beta, gamma, self.parametrized)
        norm = plan.empty(plan.channels)
        plan.norm_gemm(gamma, s, norm)
        # S is dL/dgamma's right-hand side too: kept when that product will
        # read it as it is (segment sums for dL/dbeta), else back to the pool
        # (stream order keeps the GEMM's reads first).
        keep_s = (keep and any(self.needs_grad[1:]) and settings.gdn_beta_sums
                  and plan.beta_segments(vec) > 0)
        plan.forward(x, norm, beta, y, keep, vec)
        if keep:    # norm holds D
            self.save(x=x, gamma=gamma, d=norm, s=s if keep_s else None, plan=plan,
                      stored=stored)
        return y

    def forward_fused(self, plan, x, beta, gamma, y, stored):
        """The forward as one fused kernel (after the parameters' transform)."""
        keep = self.recording
        gamma_t = cuda.empty(gamma.shape, gamma.dtype)
        if stored is not None:
            beta = cuda.empty(beta.shape, beta.dtype)
            gamma = cuda.empty(gamma.shape, gamma.dtype)
            plan.effective_params(*stored, beta, gamma, self.parametrized, gamma_t)
        else:
            plan.transpose_gamma(gamma, gamma_t)
        d = plan.empty(plan.channels) if keep else None
        # S for dL/dgamma's product, written as the kernel reads x anyway.
        s = plan.empty(plan.channels) if keep and any(self.needs_grad[1:]) else None
        plan.fused_forward(x, gamma_t, beta, y, d, s)
        self.fused_forward_runs += 1
        if keep:
            self.save(x=x, gamma=gamma, d=d, s=s, plan=plan, stored=stored)
        return y

    def forward_half(self, x, beta, gamma):
        """The forward of a 16-bit x: the tensor-core kernel where it runs (after
        rounding gamma to bfloat16), else in float32 between two conversions."""
        plan = cuda_plan(self.variant, x.shape, settings.gdn_param_gemm_chunks) if x.size else None
        if plan is None or not plan.half_fused(x):     # (a new y is aligned: only x is checked)
            return cast_array(self.forward_cuda(cast_array(x, FLOAT32), beta, gamma), x.dtype)
        y = cuda.empty(x.shape, x.dtype)
        keep = self.recording
        stored = None if self.parametrized is None else (beta, gamma)
        gamma_half = cuda.empty(gamma.shape, BFLOAT16)
        beta_eff = None if stored is None else cuda.empty(beta.shape, beta.dtype)
        plan.half_params(beta, gamma, beta_eff, gamma_half, self.parametrized, x.dtype)
        d = plan.empty(plan.channels, x.dtype) if keep else None
        plan.half_forward(x, gamma_half, beta if beta_eff is None else beta_eff, y, d)
        self.fused_forward_runs += 1
        if keep:
            self.save(x=x, gamma=gamma_half, d=d, s=None, plan=plan, stored=stored)
        return y

    def backward_half(self, gy):
        """The backward of a 16-bit forward: the tensor-core kernel, then dL/dgamma's
        product of its bfloat16 U and S; in float32 where the forward was."""
        saved = self.saved
        x, gamma_half, d, plan = saved.x, saved.gamma, saved.d, saved.plan
        if not is_half(x.dtype):    # the forward ran in float32: so does the backward
            gx, gbeta, ggamma = self.backward_cuda(cast_array(gy, FLOAT32))
            return (None if gx is None else cast_array(gx, gy.dtype)), gbeta, ggamma
        if gy.ptr & 15:             # a view: the kernel reads 16 bytes at a time
            gy = cuda.get_runtime().copy(gy)
        need_x, need_beta, need_gamma = self.needs_grad
        gx = cuda.empty(x.shape, x.dtype) if need_x else None
        u = s = beta_sums = None
        if need_beta or need_gamma:
            u = plan.empty(plan.channels, BFLOAT16)
            s = plan.empty(plan.channels, BFLOAT16)
            beta_sums = cuda.empty((x.shape[0] * plan.channels * plan.half_segments,), FLOAT32)
        plan.half_backward(x, gy, d, gamma_half, u, s, beta_sums, gx)
        self.fused_backward_runs += 1
        if u is None:
            return gx, None, None
        gbeta, ggamma = self.param_grads(plan, u, s, plan.channels, beta_sums)
        return gx, gbeta if need_beta else None, ggamma if need_gamma else None

    def backward_cuda(self, gy):
        if is_half(gy.dtype):
            return self.backward_half(gy)
        saved = self.saved
        x, gamma, d, kept_s, plan = saved.x, saved.gamma, saved.d, saved.s, saved.plan
        channels = x.shape[1]
        need_x, need_beta, need_gamma = self.needs_grad
        need_params = need_beta or need_gamma
        if x.size == 0:
            return (cuda.empty(x.shape, x.dtype) if need_x else None,
                    cuda.zeros((channels,), x.dtype) if need_beta else None,
                    cuda.zeros((channels, channels), x.dtype) if need_gamma else None)
        gx = cuda.empty(x.shape, x.dtype) if need_x else None
        if need_x and plan.fused(x, gy, gx, gamma):
            return self.backward_fused(gy, gx)
        vec = plan.vectorized(x, gy, *([gx] if need_x else []))
        u = plan.empty(channels)
        s1 = beta_sums = written = None
        if need_params:
            segments = plan.beta_segments(vec) if settings.gdn_beta_sums else 0
            columns = channels if segments else channels + 1
            if segments and kept_s is not None:
                s1 = kept_s         # the forward's S, already in place
            else:
                s1 = written = plan.empty(columns)
            if segments:
                beta_sums = cuda.empty((x.shape[0] * channels * segments,), x.dtype)
        plan.backward_norm(x, gy, d, u, written, beta_sums, vec)
        gbeta, ggamma = (self.param_grads(plan, u, s1, columns, beta_sums) if need_params
                         else (None, None))
        del beta_sums
        if need_x:
            # S1 written here is free once the GEMM above has read it (same
            # stream): G goes there, saving an M-float allocation at the
            # backward's peak. (Not the kept S: a retained graph reads it again.)
            g = written if written is not None else plan.empty(channels)
            plan.input_gemm(gamma, u, g)
            plan.backward_input(x, gy, d, g, gx, vec)
        return (gx, gbeta if need_beta else None, ggamma if need_gamma else None)

    def backward_fused(self, gy, gx):
        """The backward with dL/dx from one fused kernel, which also writes U
        (and S, unless the forward kept it) for the parameter gradients."""
        saved = self.saved
        x, gamma, d, kept_s, plan = saved.x, saved.gamma, saved.d, saved.s, saved.plan
        _, need_beta, need_gamma = self.needs_grad
        u = s = beta_sums = None
        if need_beta or need_gamma:
            u = plan.empty(plan.channels)
            s = None if kept_s is not None else plan.empty(plan.channels)
            beta_sums = cuda.empty((x.shape[0] * plan.channels * plan.fused_segments,), x.dtype)
        plan.fused_backward(x, gy, d, gamma, u, s, beta_sums, gx)
        self.fused_backward_runs += 1
        if u is None:
            return gx, None, None
        gbeta, ggamma = self.param_grads(plan, u, kept_s if s is None else s, plan.channels,
                                         beta_sums)
        return gx, gbeta if need_beta else None, ggamma if need_gamma else None

    def param_grads(self, plan, u, s1, columns, beta_sums):
        """(dL/dbeta, dL/dgamma) from U and S (or S1, ``columns`` = C + 1) through
        the chunked product and its reduction; with stored parameters, with
        respect to the stored forms."""
        stored = self.saved.stored
        channels = plan.channels
        partial = cuda.empty((plan.chunks, channels, columns), FLOAT32)
        plan.param_gemm(u, s1, partial, columns)
        ggamma = cuda.empty((channels, channels), FLOAT32)
        gbeta = cuda.empty((channels,), FLOAT32)
        plan.reduce_param_grads(partial, beta_sums, ggamma, gbeta,
                                None if stored is None else stored + self.parametrized[:2])
        return gbeta, ggamma


def gdn(x, beta, gamma, inverse=False, simplified=False, parametrized=None):
    """Generalized divisive normalization of NCHW ``x``: y = x * (beta + gamma s(x))^a per pixel.

    gamma is (C, C), laid out [output channel, input channel]; beta is (C,).
    s(x) = x^2 and a = -1/2 (GDN) or +1/2 (``inverse``); ``simplified`` uses
    ``s(x) = |x|`` and a = -1 or +1. With ``parametrized`` = (beta_bound,
    gamma_bound, pedestal), beta and gamma are stored forms p used as
    max(p, bound)^2 - pedestal, as the GDN layer trains them (the
    reparameterisation of :mod:`gdnflow.ops.gdn.parametrize` fused into the
    operator), and their gradients are with respect to p.
    """
    return GDNOp(inverse, simplified, parametrized)(x, beta, gamma)
