"""The Gaussian conditional likelihood of the scale hyperprior (Ballé et al. 2018).
CUDA kernels: ``gaussian_likelihood_forward`` and ``gaussian_likelihood_backward``
in ``cuda_src/gaussian.cu``.

``gaussian_likelihood(values, scales, scale_bound=0.11)``
    the mass that a zero-mean normal density of standard deviation
    s = max(scales, scale_bound) gives to the unit bin around each value,
    for ``values`` and ``scales`` of one shape (CompressAI's
    ``GaussianConditional._likelihood`` with no means)::

        likelihood = Phi((1/2 - |v|) / s) - Phi((-1/2 - |v|) / s)

    Phi the standard normal CDF. The density is symmetric, so the bin of v
    holds the mass of the bin of -v; with |v| both CDF arguments lie left of
    1/(2 s), where Phi is small and a tiny mass is the difference of two
    small numbers (float32 keeps its relative precision) instead of two
    numbers near 1 (at v = 12 s, Phi((v + 1/2)/s) = 1 - 1e-33 rounds to 1,
    and the mass to 0).
    Gradients, with a = (1/2 - |v|)/s, b = (-1/2 - |v|)/s and phi the
    standard normal density::

        d likelihood / d values = sign(values) (phi(b) - phi(a)) / s     (0 at 0)
        d likelihood / d s      = -(a phi(a) - b phi(b)) / s

    The bound passes the gradient on to ``scales`` as
    :class:`gdnflow.ops.bound.LowerBoundOp` does: where scales >= scale_bound,
    and below the bound only where the gradient with respect to s is
    negative (descent then raises the scale back toward the bound); elsewhere
    it is 0. ``scale_bound`` None or 0: no bound, s = scales.

    The NumPy backend computes in float64 with :func:`normal_cdf` (float32
    inputs are widened, the result rounded back): within 2e-13 relative down
    to likelihoods of 1e-300 (what is left is the rounding of (1/2 - |v|)/s,
    which the tail amplifies), the reference for the float32 kernels, which
    stay within 1e-5 relative down to 1e-30 (erfcf's argument is computed in
    double; see gaussian.cu).

``erfc(x, exp=np.exp)``, ``erf(x, exp=np.exp)``, ``normal_cdf(x, exp=np.exp)``
    float64, vectorised, within 2.5e-15 relative (see :func:`erfc`), with
    +, -, *, / and one ``exp`` per element in a fixed sequence whatever the
    value: called with a bit-reproducible ``exp``
    (:func:`gdnflow.codec.tables.exact_exp`) they give the same bits on
    every machine, so entropy-coding tables can be built from them.
"""
import math

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.registry import register

SOURCE = "gaussian.cu"

# ----------------------------------------------------------------- erfc --
# Measured against math.erfc (tests/ops/test_gaussian.py) on 320,001 points
# of [-6, 26] and 40,001 of [0.9, 2.1], with numpy.exp and with exact_exp:
# relative error at most 2.4e-15 (at z = 0.99, where 1 - erf(z) amplifies
# erf's rounding 5.4 times), 8.4e-16 for z >= 1. Fewer steps cost accuracy
# near z = 1: 80 continued-fraction levels 3.0e-15, 70 2.7e-14, 60 3.2e-13;
# 16 series terms 3.8e-15, 14 4.8e-13.
_SERIES_TERMS = 20          # erf(z) for 2 z^2 < 2: the last term is below 1e-19 of the sum
_FRACTION_LEVELS = 90       # erfc(z) for 2 z^2 >= 2, each level two of Laplace's fraction
_LARGEST = 60.0             # |y| clipped: erfc(z) is 0 in float64 past z = 27.3 anyway
_SPLIT = 134217729.0        # 2^27 + 1 (Veltkamp): y = high + low, high with 26 bits
_TWO_OVER_SQRT_PI = 1.1283791670955126          # 2/sqrt(pi)
_SQRT_TWO_OVER_PI = 0.7978845608028654          # 2/sqrt(2 pi): the same for z = y/sqrt 2
_INV_SQRT_TWO_PI = 0.3989422804014327           # 1/sqrt(2 pi), phi's factor


def _erfc(y, halved, exp, complement=True):
    """erfc(z) of z = y (``halved`` False) or z = y / sqrt(2) (True), from y itself;
    erf(z) instead with ``complement`` False (the series side then keeps its
    relative precision near 0, which 1 - erfc would lose).

    Taking y rather than a rounded z keeps the only error that the tail
    amplifies out: erfc(z) ~ e^(-z^2) changes by 2 z^2 times the relative
    error of z (up to 1.5e-13 at z = 26). Here z^2 = c y^2 (c = 1 or 1/2,
    exact) with y^2 = high^2 + low as two floats, high^2 exact, so e^(-z^2)
    = exp(-c high^2) e^(-c low), the second factor by a cubic (|c low| < 1e-4).
    With w = 2 z^2 and q = 2 z e^(-z^2) / sqrt(pi):

        2 z^2 <  2:  erf(z) = q sum_n w^n / (1 3 5 ... (2n+1)),  erfc = 1 - erf
        2 z^2 >= 2:  erfc(z) = q / (w + 1 - 1*2/(w + 5 - 3*4/(w + 9 - 5*6/(...))))

    The series has only positive terms (no cancellation); the continued
    fraction is the even part of Laplace's e^(-z^2)/sqrt(pi) / (z + (1/2)/(z +
    1/(z + (3/2)/(z + ...)))), two of its levels per division, evaluated
    backward from a fixed depth. Both run a fixed number of steps; each
    element takes one of them, chosen by a comparison. For z < 0, erfc(z) =
    2 - erfc(-z), i.e. 1 + erf(-z) on the series side.
    """
    y = np.asarray(y, dtype=np.float64)
    c = 0.5 if halved else 1.0
    t = np.minimum(np.abs(y), _LARGEST)             # NaN stays NaN
    product = _SPLIT * t
    high = product - (product - t)
    d = c * ((t - high) * (t + high))                # c (y^2 - high^2), tiny
    e = exp(-(c * (high * high))) * (1.0 - d * (1.0 - d * 0.5 * (1.0 - d / 3.0)))
    w = (2.0 * c) * (t * t)
    q = (_SQRT_TWO_OVER_PI if halved else _TWO_OVER_SQRT_PI) * t * e
    negative = y < 0
    out = np.empty_like(t)

    series = w < 2.0
    ws = w[series]
    p = np.ones_like(ws)
    for n in range(_SERIES_TERMS, 0, -1):
        p = 1.0 + p * ws / (2 * n + 1)
    erf = q[series] * p
    if complement:
        out[series] = np.where(negative[series], 1.0 + erf, 1.0 - erf)
    else:
        out[series] = np.where(negative[series], -erf, erf)

    fraction = ~series
    wf = w[fraction]
    denominator = wf + (4 * _FRACTION_LEVELS + 1)
    level = np.empty_like(wf)
    for k in range(_FRACTION_LEVELS, 0, -1):
        np.add(wf, 4 * k - 3, out=level)
        np.divide((2 * k - 1) * (2 * k), denominator, out=denominator)
        np.subtract(level, denominator, out=denominator)
    tail = q[fraction] / denominator
    if complement:
        out[fraction] = np.where(negative[fraction], 2.0 - tail, tail)
    else:
        out[fraction] = np.where(negative[fraction], tail - 1.0, 1.0 - tail)
    return out[()]                                  # a 0-d input gives a scalar


def erfc(x, exp=np.exp):
    """The complementary error function 1 - erf(x) of a float64 array, elementwise.

    Relative error below 2.5e-15 (measured against math.erfc; 8.4e-16 for
    x >= 1) where the result is a normal float: it underflows past x = 26.5
    and is 0 past 27.3. :func:`_erfc` describes the method. ``exp`` is a
    vectorised e**x: with a bit-reproducible one
    (:func:`gdnflow.codec.tables.exact_exp`) the result has the same bits on
    every machine, since every other step is an IEEE-exact operation in a
    fixed order. A 0-d input gives a scalar.
    """
    return _erfc(x, False, exp)


def erf(x, exp=np.exp):
    """The error function of a float64 array, elementwise: the series of
    :func:`_erfc` below |x| = 1 (relative precision kept down to 0), 1 - erfc
    above, where erf > 0.84 and the subtraction loses nothing."""
    return _erfc(x, False, exp, complement=False)


def normal_cdf(x, exp=np.exp):
    """The standard normal CDF Phi(x) = erfc(-x / sqrt(2)) / 2 of a float64 array.

    As accurate and as reproducible as :func:`erfc`: x / sqrt(2) is never
    rounded into the exponent (see :func:`_erfc`), so the left tail keeps
    2e-15 relative down to Phi(-37.5) = 5e-308.
    """
    return 0.5 * _erfc(np.negative(x), True, exp)


def _normal_pdf(t):
    return _INV_SQRT_TWO_PI * np.exp(-0.5 * (t * t))


# ------------------------------------------------------------- operator --
@register("gaussian_likelihood")
class GaussianLikelihoodOp(Operator):
    """Mass of the unit bin around each of ``values`` under N(0, max(scales, bound)^2).

    ``values`` and ``scales`` of one shape; the output has that shape. The
    formula, its gradients and the bound's gradient are in the module
    docstring. ``scale_bound``: a number >= 0, or None; 0 and None mean no bound.
    """

    def __init__(self, scale_bound=0.11):
        bound = 0.0 if scale_bound is None else float(scale_bound)
        if not 0.0 <= bound < math.inf:
            raise ValueError(f"gaussian_likelihood: scale_bound must be a finite number >= 0 "
                             f"or None, got {scale_bound!r}")
        self.scale_bound = bound
        # With no bound, max(scales, -inf) = scales and every gradient passes.
        self.floor = bound if bound > 0.0 else -math.inf

    def check(self, values, scales):
        if values.shape != scales.shape:
            raise ShapeError(f"{self.label}: values and scales must have one shape, got "
                             f"{values.shape} and {scales.shape}")

    def _bounded(self, scales):
        """(s = max(scales, bound) in float64, where the bound lets the gradient through)."""
        floor = scales.dtype.type(self.floor)       # 0.11 rounded as the kernels round it
        return np.maximum(scales, floor).astype(np.float64), scales >= floor

    def forward_numpy(self, values, scales):
        self.save(values=values, scales=scales)
        s, _ = self._bounded(scales)
        v = np.abs(values.astype(np.float64))
        likelihood = normal_cdf((0.5 - v) / s) - normal_cdf((-0.5 - v) / s)
        return likelihood.astype(values.dtype)

    def forward_cuda(self, values, scales):
        likelihood = cuda.empty(values.shape, values.dtype)
        if likelihood.size:
            cuda.kernel(SOURCE, "gaussian_likelihood_forward", "PPPif").launch(
                likelihood.size, values.ptr, scales.ptr, likelihood.ptr, likelihood.size,
                self.floor)
        self.save(values=values, scales=scales)
        return likelihood

    def backward(self, grad_output):
        return tuple(self.wrap(g) for g in self.dispatch("backward", grad_output.data))

    def backward_numpy(self, gy):
        values, scales = self.saved.values, self.saved.scales
        s, above = self._bounded(scales)
        v = np.abs(values.astype(np.float64))
        a, b = (0.5 - v) / s, (-0.5 - v) / s
        phi_a, phi_b = _normal_pdf(a), _normal_pdf(b)
        g_values = gy * np.sign(values) * ((phi_b - phi_a) / s)
        g_s = gy * (-(a * phi_a - b * phi_b) / s)
        g_scales = np.where(above | (g_s < 0), g_s, 0.0)
        return g_values.astype(gy.dtype), g_scales.astype(gy.dtype)

    def backward_cuda(self, gy):
        values, scales = self.saved.values, self.saved.scales
        g_values, g_scales = cuda.empty(gy.shape, gy.dtype), cuda.empty(gy.shape, gy.dtype)
        if gy.size:
            cuda.kernel(SOURCE, "gaussian_likelihood_backward", "PPPPPif").launch(
                gy.size, values.ptr, scales.ptr, gy.ptr, g_values.ptr, g_scales.ptr, gy.size,
                self.floor)
        return g_values, g_scales


def gaussian_likelihood(values, scales, scale_bound=0.11):
    """``Phi((1/2 - |values|)/s) - Phi((-1/2 - |values|)/s)``, s = max(scales, scale_bound).

    The probability of each integer bin [values - 1/2, values + 1/2] under a
    zero-mean normal of standard deviation s, elementwise; ``values`` and
    ``scales`` must have one shape (the output's). The scale hyperprior's
    rate term is -sum(log2(likelihood)). ``scale_bound`` None or 0: no
    bound. Gradients flow to both inputs; see :mod:`gdnflow.ops.gaussian`.
    """
    return GaussianLikelihoodOp(scale_bound)(values, scales)
