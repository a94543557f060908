"""gdnflow.ops.gaussian: erfc and Phi against math.erfc, the likelihood against a
per-element reference deep into the tails, gradients against finite differences
and the bound's rule, the kernels (on the host and on the GPU) against NumPy."""
import decimal
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.backends import cuda
from gdnflow.codec.tables import exact_exp
from gdnflow.errors import ShapeError
from gdnflow.ops import gaussian
from gdnflow.ops.gaussian import GaussianLikelihoodOp, erfc, gaussian_likelihood, normal_cdf
from gdnflow.testing import assert_backends_match, gradcheck
from host_kernels import HostArray, ShimDevice, host_builder

BOUND = 0.11


def t64(x, grad=False):
    return gf.tensor(x, device="numpy", dtype=np.float64, requires_grad=grad)


# ------------------------------------------------------------ references --
EXACT = decimal.Context(prec=50)       # 50 digits: far past what a float holds
SQRT2 = EXACT.sqrt(2)


def phi_reference(t):
    """Phi(t) for an exact t (a Decimal) from math.erfc.

    math.erfc takes z = -t/sqrt(2) rounded to a float, off by dz; in the
    tail that rounding alone moves erfc by 2 z^2 dz/z relative (up to 2e-13
    at z = 26), so it is corrected to first order: erfc(z + dz) = erfc(z) - 2/sqrt(pi) e^(-z^2) dz.
    """
    with decimal.localcontext(EXACT):
        z_exact = -t / SQRT2
        z = float(z_exact)
        dz = float(z_exact - decimal.Decimal(z))
    return 0.5 * (math.erfc(z) - 2 / math.sqrt(math.pi) * math.exp(-z * z) * dz)


def likelihood_reference(values, scales, bound=BOUND):
    """Phi((1/2 - |v|)/s) - Phi((-1/2 - |v|)/s), s = max(scale, bound), element by element."""
    out = np.empty(np.shape(values))
    half = decimal.Decimal("0.5")
    for i, (value, scale) in enumerate(zip(np.ravel(values), np.ravel(scales))):
        v, s = EXACT.abs(decimal.Decimal(float(value))), decimal.Decimal(max(float(scale), bound))
        out.flat[i] = (phi_reference(EXACT.divide(EXACT.subtract(half, v), s))
                       - phi_reference(EXACT.divide(EXACT.subtract(-half, v), s)))
    return out


def tail_inputs(rng, shape):
    """Values up to |v| = 40 (none 0) and scales 0.05..6 (some under the bound):
    likelihoods from near 1 down past 1e-300."""
    values = rng.uniform(-40, 40, shape) * rng.uniform(0, 1, shape) ** 2
    values[np.abs(values) < 1e-3] = 0.75
    scales = np.exp(rng.uniform(np.log(0.05), np.log(6.0), shape))
    return values, scales


# ------------------------------------------------------------------ erfc --
# A dense grid of [-6, 26] (erfc(26) = 5.7e-296; it underflows only past
# 26.5), and denser around 1, where erfc switches from 1 - erf's series to
# the continued fraction.
ERFC_GRID = np.concatenate([np.linspace(-6, 26, 320_001), np.linspace(0.9, 2.1, 40_001)])
# Measured: 2.4e-15 at worst (z = 0.99, exact_exp), 8.4e-16 for z >= 1.
ERFC_RTOL = 5e-15


@pytest.mark.parametrize("exp", [np.exp, exact_exp], ids=["numpy_exp", "exact_exp"])
def test_erfc_matches_math_erfc_on_a_dense_grid(exp):
    expected = np.array([math.erfc(x) for x in ERFC_GRID])
    got = erfc(ERFC_GRID, exp)
    assert got.dtype == np.float64 and got.shape == ERFC_GRID.shape
    relative = np.abs(got - expected) / expected
    assert relative.max() <= ERFC_RTOL, f"worst at x = {ERFC_GRID[np.argmax(relative)]}"
    assert relative[ERFC_GRID > 5].max() <= 2e-15         # measured 7.0e-16


def test_erfc_special_values():
    got = erfc(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 40.0, -40.0]))
    np.testing.assert_array_equal(got[:4], [1.0, 1.0, 0.0, 2.0])
    assert np.isnan(got[4]) and got[5] == 0.0 and got[6] == 2.0
    assert isinstance(erfc(0.5), np.float64) and erfc(0.5) == erfc(np.array([0.5]))[0]


def test_erfc_is_the_same_computation_for_every_element():
    # Fixed steps, no data-dependent loop: with a bit-reproducible exp, an
    # element's bits do not depend on its neighbours or on the array's size.
    x = np.concatenate([np.linspace(-6, 26, 401), [0.9999999999, 1.0, 1.0000000001, -1.0]])
    vectorised = erfc(x, exact_exp)
    one_by_one = np.array([erfc(v, exact_exp) for v in x])
    reversed_order = erfc(x[::-1].copy(), exact_exp)[::-1]
    assert vectorised.tobytes() == one_by_one.tobytes() == reversed_order.tobytes()


@pytest.mark.parametrize("exp", [np.exp, exact_exp], ids=["numpy_exp", "exact_exp"])
def test_normal_cdf_matches_math_erfc_into_the_far_left_tail(exp):
    # Down to Phi(-37.5) = 5e-308: past x = -26 a rounded x/sqrt(2) would already cost 1e-13.
    x = np.linspace(-37.5, 8.0, 45_501)
    expected = np.array([phi_reference(decimal.Decimal(v)) for v in x])
    relative = np.abs(normal_cdf(x, exp) - expected) / expected
    assert relative.max() <= ERFC_RTOL, f"worst at x = {x[np.argmax(relative)]}"
    assert normal_cdf(0.0) == 0.5


# ------------------------------------------------------------ likelihood --
def test_likelihood_matches_the_reference_deep_into_the_tails(rng):
    values, scales = tail_inputs(rng, (40, 50))
    expected = likelihood_reference(values, scales)
    got = gaussian_likelihood(t64(values), t64(scales)).numpy()
    assert got.dtype == np.float64
    assert (expected < 1e-30).sum() > 100 and (expected < 1e-200).any() and (expected > 0.1).any()
    normal = expected > 1e-300
    relative = np.abs(got - expected)[normal] / expected[normal]
    assert relative.max() <= 1e-12
    # Below 1e-300 (subnormal, or 0 past 5e-324): what is left is tiny, never negative.
    assert np.all(got[~normal] >= 0) and np.all(got[~normal] <= 1e-300)


def test_likelihood_in_float32_is_the_float64_result_rounded(rng):
    values, scales = (a.astype(np.float32) for a in tail_inputs(rng, (6, 7)))
    got = gaussian_likelihood(gf.tensor(values, device="numpy"),
                              gf.tensor(scales, device="numpy")).numpy()
    assert got.dtype == np.float32
    expected = likelihood_reference(values, scales, bound=float(np.float32(BOUND)))
    np.testing.assert_array_equal(got, expected.astype(np.float32))


def test_likelihoods_of_all_integers_sum_to_one():
    for scale in (0.11, 0.7, 3.0, 40.0):
        values = np.arange(-400.0, 401.0)
        total = math.fsum(gaussian_likelihood(t64(values), t64(np.full(801, scale))).numpy())
        assert abs(total - 1.0) <= 1e-14, scale


def test_scales_under_the_bound_act_as_the_bound(rng):
    values = rng.uniform(-3, 3, 20)
    small = rng.uniform(0.0, BOUND, 20)
    bounded = gaussian_likelihood(t64(values), t64(small)).numpy()
    at_bound = gaussian_likelihood(t64(values), t64(np.full(20, BOUND))).numpy()
    np.testing.assert_array_equal(bounded, at_bound)
    np.testing.assert_array_equal(
        gaussian_likelihood(t64(values), t64(small), scale_bound=0.5).numpy(),
        gaussian_likelihood(t64(values), t64(np.full(20, 0.5))).numpy())
    for no_bound in (0, None):
        unbounded = gaussian_likelihood(t64(values), t64(small), scale_bound=no_bound).numpy()
        np.testing.assert_allclose(unbounded, likelihood_reference(values, small, bound=0.0),
                                   rtol=1e-12, atol=1e-300)
        assert not np.allclose(unbounded, bounded)


def test_mismatched_shapes_raise_shape_error():
    with pytest.raises(ShapeError, match=r"gaussian_likelihood: .*\(2, 3\) and \(3, 2\)"):
        gaussian_likelihood(t64(np.ones((2, 3))), t64(np.ones((3, 2))))


@pytest.mark.parametrize("bound", [-0.1, float("inf"), float("nan")])
def test_a_bound_that_is_no_scale_is_refused(bound):
    with pytest.raises(ValueError, match="scale_bound"):
        GaussianLikelihoodOp(bound)


# ------------------------------------------------------------- gradients --
def smooth_inputs(rng, shape):
    """Values away from 0 (|v| 0.1..6, both signs), scales 0.3..4 (away from the bound)."""
    values = rng.uniform(0.1, 6.0, shape) * rng.choice([-1.0, 1.0], shape)
    return values, rng.uniform(0.3, 4.0, shape)


@pytest.mark.parametrize("bound", [BOUND, None])
def test_gradients_match_finite_differences(bound, rng):
    gradcheck(lambda v, s: gaussian_likelihood(v, s, bound), list(smooth_inputs(rng, (3, 5))))
    gradcheck(lambda v, s: gaussian_likelihood(v, s, bound), list(smooth_inputs(rng, (2, 3, 4, 5))))


def test_the_bound_passes_the_scale_gradient_as_lower_bound_does(rng):
    n = 400
    values = rng.uniform(-2, 2, n)
    scales = np.where(np.arange(n) % 2 == 0, rng.uniform(0.01, BOUND * 0.99, n),
                      rng.uniform(BOUND, 1.0, n))
    weight = rng.standard_normal(n)
    s = t64(scales, grad=True)
    gaussian_likelihood(t64(values), s).backward(t64(weight))
    # The gradient wrt s itself: the unbounded operator at max(scales, bound).
    s_free = t64(np.maximum(scales, BOUND), grad=True)
    gaussian_likelihood(t64(values), s_free, scale_bound=None).backward(t64(weight))
    g_s, got = s_free.grad.numpy(), s.grad.numpy()
    under = scales < BOUND
    np.testing.assert_array_equal(got[~under], g_s[~under])
    np.testing.assert_array_equal(got[under & (g_s < 0)], g_s[under & (g_s < 0)])
    assert np.all(got[under & (g_s > 0)] == 0)
    assert (under & (g_s < 0)).sum() > 20 and (under & (g_s > 0)).sum() > 20


def test_gradient_at_value_zero_is_zero():
    values = t64(np.array([0.0, -0.0, 0.0, 0.3]), grad=True)
    scales = t64(np.array([0.5, 2.0, 0.05, 0.5]), grad=True)
    gaussian_likelihood(values, scales).backward(t64(np.ones(4)))
    np.testing.assert_array_equal(values.grad.numpy()[:3], 0.0)
    assert values.grad.numpy()[3] < 0            # the mass falls as v leaves the mode
    assert np.all(scales.grad.numpy()[[0, 1]] < 0)      # ... and as the density widens


# ------------------------------------------------------------------ GPU --
GPU_SHAPE = (3, 5, 7, 9)


def check_tails_against_numpy(values, scales, bound=BOUND):
    """Elementwise, where the likelihood is above 1e-30: CUDA within 1e-5 relative
    (the rounding of erfcf's argument, amplified by the tail, 8e-6 at 1e-30) plus
    1e-6 of Phi(a), the larger CDF value (erfcf's 4 ulp, in a cancelling difference)."""
    values, scales = values.astype(np.float32), scales.astype(np.float32)
    on_gpu, expected = (gaussian_likelihood(gf.tensor(values, device=device),
                                            gf.tensor(scales, device=device), bound).numpy()
                        for device in ("cuda", "numpy"))      # NumPy: float64 inside
    expected = expected.astype(np.float64)
    s = np.maximum(scales, np.float32(bound or 0.0)).astype(np.float64)
    phi_a = normal_cdf((0.5 - np.abs(values.astype(np.float64))) / s)
    checked = expected > 1e-30
    assert checked.sum() > values.size // 2 and (expected[checked] < 1e-20).any()
    error = np.abs(on_gpu.astype(np.float64) - expected)
    assert np.all(error[checked] <= 1e-5 * expected[checked] + 1e-6 * phi_a[checked])
    assert np.all(on_gpu >= 0) and np.all(on_gpu[~checked] <= 1e-29)


@pytest.mark.gpu
@pytest.mark.parametrize("bound", [BOUND, None])
def test_gaussian_likelihood_cuda_matches_numpy(bound, rng):
    values, scales = tail_inputs(rng, GPU_SHAPE)
    values[0, 0, 0, :] = 0.0                        # the gradient's sign(0)
    assert_backends_match(lambda v, s: gaussian_likelihood(v, s, bound), [values, scales],
                          rtol=1e-5)
    check_tails_against_numpy(values, scales, bound)


@pytest.mark.gpu
def test_gaussian_likelihood_cuda_bound_gradient(rng):
    # Half the scales under the bound: their gradient passes only where it is negative.
    values = rng.uniform(-2, 2, (5, 111))
    scales = np.where(rng.uniform(size=(5, 111)) < 0.5, rng.uniform(0.01, 0.1, (5, 111)),
                      rng.uniform(0.12, 3.0, (5, 111)))
    assert_backends_match(gaussian_likelihood, [values, scales], rtol=1e-5)


# ------------------------------------------- the kernels, on the host --
# gaussian.cu's per-element functions run by a host loop with each kernel's
# parameters, so that the operator's forward_cuda and backward_cuda run
# unchanged on host memory (CI has nvcc, not a GPU).
HOST_SHIM = """
extern "C" void host_gaussian_likelihood_forward(const float* values, const float* scales,
                                                 float* likelihood, int n, float bound) {
    for (int i = 0; i < n; ++i) likelihood[i] = gaussian_likelihood_at(values[i], scales[i], bound);
}
extern "C" void host_gaussian_likelihood_backward(const float* values, const float* scales,
                                                  const float* gy, float* g_values,
                                                  float* g_scales, int n, float bound) {
    for (int i = 0; i < n; ++i)
        gaussian_likelihood_grads_at(values[i], scales[i], bound, gy[i], &g_values[i],
                                     &g_scales[i]);
}
"""
class HostFloatArray(HostArray):
    """A HostArray that says its dtype, as a CudaArray does."""

    dtype = np.dtype(np.float32)


@pytest.fixture(scope="module")
def host_library(tmp_path_factory):
    return host_builder(tmp_path_factory.mktemp("gaussian_host"), "gaussian.cu",
                        suffix=HOST_SHIM)()


@pytest.mark.parametrize("bound", [BOUND, None])
def test_cuda_kernels_compiled_for_the_host_match_numpy(bound, host_library, rng):
    n = 20_000
    values, scales = (a.astype(np.float32) for a in tail_inputs(rng, n))
    values[:50] = 0.0
    gy = rng.standard_normal(n).astype(np.float32)
    # gaussian.cu's host build as the kernels, HostFloatArrays (guarded) as memory
    device = ShimDevice(host_library, gaussian.SOURCE,
                        empty=lambda shape, dtype=np.float32: HostFloatArray(shape))
    op = GaussianLikelihoodOp(bound)
    inputs = [HostFloatArray((n,), a) for a in (values, scales)]
    with cuda.simulated(device):
        likelihood = op.forward_cuda(*inputs)
        grads = op.backward_cuda(HostFloatArray((n,), gy))
    assert device.launched == ["gaussian_likelihood_forward", "gaussian_likelihood_backward"]
    assert all(a.guards_untouched() for a in (likelihood,) + grads)

    # NumPy on the same float32 inputs (and so the float32 bound): float64 inside,
    # the likelihood rounded to float32, the gradients (from a float64 gy) in float64.
    reference = GaussianLikelihoodOp(bound)
    expected = reference.forward_numpy(values, scales).astype(np.float64)
    expected_grads = reference.backward_numpy(gy.astype(np.float64))
    got = likelihood.get()
    checked = expected > 1e-30
    assert checked.sum() > n // 2 and (expected[checked] < 1e-20).any()
    relative = np.abs(got[checked] - expected[checked]) / expected[checked]
    assert relative.max() <= 1e-5                       # measured 7.8e-6 (near 1e-30)
    assert np.all(got >= 0) and np.all(got[~checked] <= 1e-29)
    for g, g_expected in zip(grads, expected_grads):
        np.testing.assert_allclose(g.get(), g_expected, rtol=1e-5,      # a fifth of it used
                                   atol=1e-7 * np.abs(g_expected).max())
    np.testing.assert_array_equal(grads[0].get()[:50], 0.0)
