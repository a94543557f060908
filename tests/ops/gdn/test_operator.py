"""gdn (GDN, inverse GDN, simplified forms): forward against a naive loop over
pixels, gradients against finite differences, gamma's layout, errors, stored
(reparameterised) parameters against the composed operators, and CUDA
against NumPy on every GPU path (cuBLAS and fused, chunked, 4- and 16-byte).
The chunking itself: test_cuda_plan.py."""
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops, registry
from gdnflow.autograd import trace
from gdnflow.backends import cuda
from gdnflow.config import override
from gdnflow.nn import GDN
from gdnflow.ops.gdn import GDNOp
from gdnflow.ops.gdn.cuda_plan import FUSED_CHANNELS, cuda_plan
from gdnflow.ops.gdn.parametrize import (PEDESTAL, NonNegativeParametrizeOp,
                                         NonNegativeReparametrization)
from gdnflow.tensor import Tensor
from gdnflow.testing import assert_backends_match, gradcheck, relative_error

# (inverse, simplified)
VARIANTS = [(False, False), (True, False), (False, True), (True, True)]
VARIANT_IDS = ["gdn", "igdn", "gdn_simplified", "igdn_simplified"]
SHAPES = [(2, 3, 5, 7), (2, 7, 3, 5), (1, 1, 2, 3)]


def naive_gdn(x, beta, gamma, inverse, simplified):
    """Pixel by pixel and channel by channel, straight from the definition:
    norm_i = beta_i + sum_j gamma[i, j] s(x_j), y_i = x_i / sqrt(norm_i) (GDN),
    x_i * sqrt(norm_i) (inverse), x_i / norm_i or x_i * norm_i (simplified)."""
    batch, channels, height, width = x.shape
    y = np.empty_like(x)
    for n in range(batch):
        for h in range(height):
            for w in range(width):
                for i in range(channels):
                    norm = beta[i]
                    for j in range(channels):
                        xj = x[n, j, h, w]
                        norm += gamma[i, j] * (abs(xj) if simplified else xj * xj)
                    scale = norm if simplified else math.sqrt(norm)
                    y[n, i, h, w] = x[n, i, h, w] * scale if inverse else x[n, i, h, w] / scale
    return y


def sample(rng, shape):
    """x with |x| >= 0.05 (|x| has a kink at 0), beta in [0.5, 1.5], gamma >= 0
    and not symmetric."""
    x = rng.standard_normal(shape)
    x = np.sign(x) * (np.abs(x) + 0.05)
    channels = shape[1]
    return x, rng.uniform(0.5, 1.5, channels), rng.uniform(0.0, 0.5, (channels, channels))


def tensors(*arrays, device="numpy", dtype=np.float64, requires_grad=False):
    return [gf.tensor(a, device=device, dtype=dtype, requires_grad=requires_grad) for a in arrays]


def gdn_fn(inverse, simplified):
    return lambda x, beta, gamma: ops.gdn(x, beta, gamma, inverse=inverse, simplified=simplified)


# ---------------------------------------------------------------- forward --
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_naive_loop(variant, shape, rng):
    x, beta, gamma = sample(rng, shape)
    y = gdn_fn(*variant)(*tensors(x, beta, gamma))
    np.testing.assert_allclose(y.numpy(), naive_gdn(x, beta, gamma, *variant), rtol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_float32_forward(variant, rng):
    x, beta, gamma = sample(rng, (2, 3, 5, 7))
    y = gdn_fn(*variant)(*tensors(x, beta, gamma, dtype=np.float32))
    assert y.dtype == np.float32
    want = naive_gdn(*(a.astype(np.float32).astype(np.float64) for a in (x, beta, gamma)), *variant)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)


CLOSED_FORMS = {
    (False, False): lambda x: x / np.sqrt(1 + 0.1 * x ** 2),
    (True, False): lambda x: x * np.sqrt(1 + 0.1 * x ** 2),
    (False, True): lambda x: x / (1 + 0.1 * np.abs(x)),
    (True, True): lambda x: x * (1 + 0.1 * np.abs(x)),
}


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_closed_form_with_initial_parameters(variant, rng):
    # beta = 1, gamma = 0.1 I: every channel is normalised by itself alone.
    x = 3 * rng.standard_normal((2, 5, 3, 4))
    y = gdn_fn(*variant)(*tensors(x, np.ones(5), 0.1 * np.eye(5)))
    np.testing.assert_allclose(y.numpy(), CLOSED_FORMS[variant](x), rtol=1e-12)


def test_gamma_is_laid_out_out_channel_by_in_channel():
    # gamma[0, 2] = 1 alone: output channel 0 is divided by input channel 2's
    # energy; channel 2 is not touched by channel 0. Transposed, it would be
    # the other way round.
    gamma = np.zeros((3, 3))
    gamma[0, 2] = 1.0
    x = np.array([3.0, 5.0, 2.0]).reshape(1, 3, 1, 1)
    y = ops.gdn(*tensors(x, np.ones(3), gamma)).numpy().ravel()
    np.testing.assert_allclose(y, [3 / math.sqrt(1 + 4), 5.0, 2.0], rtol=1e-12)


def test_changing_gamma_row_i_changes_only_output_channel_i(rng):
    x, beta, gamma = sample(rng, (2, 4, 3, 3))
    before = ops.gdn(*tensors(x, beta, gamma)).numpy()
    gamma[1, :] += rng.uniform(0.1, 0.5, 4)
    after = ops.gdn(*tensors(x, beta, gamma)).numpy()
    changed = np.any(np.abs(after - before) > 1e-9, axis=(0, 2, 3))
    assert changed.tolist() == [False, True, False, False]


def test_registered_as_gdn():
    assert registry.get("gdn") is GDNOp


# --------------------------------------------------------------- backward --
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
def test_gradients(variant, shape, rng):
    gradcheck(gdn_fn(*variant), list(sample(rng, shape)), directions=4)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("wanted", [(True, False, False), (False, True, False),
                                    (False, False, True), (False, True, True)], ids=str)
def test_gradients_of_some_inputs_only(variant, wanted, rng):
    gradcheck(gdn_fn(*variant), list(sample(rng, (2, 3, 3, 5))), requires_grad=list(wanted))


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_backward_uses_the_cached_norm(variant, rng):
    # The backward has no use for beta except through the norm the forward
    # cached: changing beta's array after the forward must not change any gradient.
    x, beta, gamma = sample(rng, (2, 3, 4, 5))
    weight = rng.standard_normal(x.shape)
    grads = []
    for mutate in (False, True):
        inputs = tensors(x, beta, gamma, requires_grad=True)
        y = gdn_fn(*variant)(*inputs)
        if mutate:
            inputs[1].data[:] = 100.0
        y.backward(gf.tensor(weight, device="numpy", dtype=np.float64))
        grads.append([t.grad.numpy() for t in inputs])
    for g_plain, g_mutated in zip(*grads):
        np.testing.assert_array_equal(g_plain, g_mutated)


def test_nothing_is_kept_when_no_backward_can_follow(rng):
    x, beta, gamma = sample(rng, (1, 3, 2, 2))
    op = GDNOp()
    op(*tensors(x, beta, gamma))
    assert op.saved == ()
    op = GDNOp()
    with gf.no_grad():
        op(*tensors(x, beta, gamma, requires_grad=True))
    assert op.saved == ()


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_forward_without_a_graph_equals_the_recorded_one(variant, rng):
    """Under no_grad the NumPy forward writes y over its own D: the same float32 values."""
    x, beta, gamma = sample(rng, (2, 5, 3, 4))
    inputs = tensors(x, beta, gamma, dtype=np.float32, requires_grad=True)
    recorded = GDNOp(*variant)(*inputs).numpy()
    with gf.no_grad():
        plain = GDNOp(*variant)(*inputs).numpy()
    np.testing.assert_array_equal(plain, recorded)
    want = naive_gdn(*(a.astype(np.float32).astype(np.float64) for a in (x, beta, gamma)), *variant)
    np.testing.assert_allclose(plain, want, rtol=1e-5)


# ------------------------------------------------------ stored parameters --
# (beta_bound, gamma_bound, pedestal): gamma >= 0 as in the GDN layer, and
# beta >= 0.2 rather than its 1e-6, so that a beta held at its bound keeps
# the norm of O(1).
BETA_MIN = 0.2
BOUNDS = (NonNegativeReparametrization(BETA_MIN).bound, NonNegativeReparametrization(0.0).bound,
          PEDESTAL)


def stored(rng, beta, gamma, below=0.0):
    """The stored forms of effective ``beta`` and ``gamma``, with about a fraction
    ``below`` of each (at least one where below > 0) moved 0.05 to 0.5 under its
    bound: there the effective value is the minimum and the gradient passes only
    when negative. Nothing on the bound, where the function has a kink: the
    others are effective values at least 1e-6 above the minimum, stored at least
    ~1e-3 above the bound."""
    out = []
    for effective, minimum, bound in ((beta, BETA_MIN, BOUNDS[0]), (gamma, 0.0, BOUNDS[1])):
        p = NonNegativeReparametrization(minimum).init(np.maximum(effective, minimum + 1e-6))
        if below:
            mask = rng.uniform(size=p.shape) < below
            mask.flat[rng.integers(p.size)] = True
            p[mask] = bound - rng.uniform(0.05, 0.5, np.count_nonzero(mask))
        out.append(p)
    return out


def effective(p, bound):
    """max(p, bound)^2 - pedestal, spelled out."""
    return np.maximum(p, bound) ** 2 - PEDESTAL


def gdn_stored_fn(inverse, simplified):
    """gdn of x and the stored beta and gamma: the reparameterisation fused in."""
    return lambda x, beta, gamma: ops.gdn(x, beta, gamma, inverse=inverse, simplified=simplified,
                                          parametrized=BOUNDS)


def gdn_composed_fn(inverse, simplified):
    """The same as ``gdn_stored_fn`` from three operators: each parameter's
    reparameterisation, then gdn of the effective values."""
    def fn(x, beta, gamma):
        return ops.gdn(x, NonNegativeParametrizeOp(BOUNDS[0], PEDESTAL)(beta),
                       NonNegativeParametrizeOp(BOUNDS[1], PEDESTAL)(gamma),
                       inverse=inverse, simplified=simplified)
    return fn


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_stored_parameters_forward_matches_naive_loop(variant, rng):
    x, beta, gamma = sample(rng, (2, 3, 4, 5))
    beta_p, gamma_p = stored(rng, beta, gamma, below=0.3)
    y = gdn_stored_fn(*variant)(*tensors(x, beta_p, gamma_p))
    want = naive_gdn(x, effective(beta_p, BOUNDS[0]), effective(gamma_p, BOUNDS[1]), *variant)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
def test_stored_parameter_gradients(variant, shape, rng):
    # Every stored value above its bound: finite differences see the
    # function's derivative there. Below the bound the gradient is by design
    # not the derivative (0); the next tests check it there.
    x, beta, gamma = sample(rng, shape)
    gradcheck(gdn_stored_fn(*variant), [x, *stored(rng, beta, gamma)], directions=4)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_stored_parameters_below_the_bound_input_gradient(variant, rng):
    x, beta, gamma = sample(rng, (2, 3, 5, 7))
    gradcheck(gdn_stored_fn(*variant), [x, *stored(rng, beta, gamma, below=0.3)],
              requires_grad=[True, False, False], directions=4)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("wanted", [(False, True, False), (False, False, True),
                                    (True, True, False)], ids=str)
def test_stored_parameter_gradients_of_some_inputs_only(variant, wanted, rng):
    x, beta, gamma = sample(rng, (2, 3, 3, 5))
    gradcheck(gdn_stored_fn(*variant), [x, *stored(rng, beta, gamma)], requires_grad=list(wanted))


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_stored_parameters_equal_the_composed_operators(variant, rng):
    # A third of the stored values below their bounds, where the gradient
    # passes (2 bound dL/dv) only when dL/dv < 0: fused, composed and the
    # rule spelled out from the effective values' gradient must all agree.
    x, beta, gamma = sample(rng, (2, 6, 4, 5))
    beta_p, gamma_p = stored(rng, beta, gamma, below=0.35)
    weight = rng.standard_normal(x.shape)
    results = []
    for fn in (gdn_stored_fn(*variant), gdn_composed_fn(*variant)):
        inputs = tensors(x, beta_p, gamma_p, requires_grad=True)
        y = fn(*inputs)
        y.backward(gf.tensor(weight, device="numpy", dtype=np.float64))
        results.append([y.numpy()] + [t.grad.numpy() for t in inputs])
    for name, fused, composed in zip(["y", "gx", "gbeta", "ggamma"], *results):
        np.testing.assert_allclose(fused, composed, rtol=1e-12, atol=1e-15, err_msg=name)

    inputs = tensors(x, effective(beta_p, BOUNDS[0]), effective(gamma_p, BOUNDS[1]),
                     requires_grad=True)
    gdn_fn(*variant)(*inputs).backward(gf.tensor(weight, device="numpy", dtype=np.float64))
    below_signs = set()
    for p, bound, t, fused in ((beta_p, BOUNDS[0], inputs[1], results[0][2]),
                               (gamma_p, BOUNDS[1], inputs[2], results[0][3])):
        gv = t.grad.numpy()
        want = np.where((p >= bound) | (gv < 0), 2 * np.maximum(p, bound) * gv, 0.0)
        np.testing.assert_allclose(fused, want, rtol=1e-12, atol=1e-15)
        below_signs.update(np.sign(gv[p < bound]).tolist())
    assert below_signs == {-1.0, 1.0}, "the sample must hold both cases below the bound"


def test_stored_parameters_must_be_three_numbers():
    with pytest.raises(ValueError, match=r"gdn: parametrized must be \(beta_bound, gamma_bound, "
                                         r"pedestal\), got 2 values"):
        ops.gdn(*tensors(np.ones((1, 3, 2, 2)), np.ones(3), np.eye(3)), parametrized=(0.1, 0.0))


def test_stored_parameters_keep_nothing_when_no_backward_can_follow(rng):
    x, beta, gamma = sample(rng, (1, 3, 2, 2))
    op = GDNOp(parametrized=BOUNDS)
    with gf.no_grad():
        op(*tensors(x, *stored(rng, beta, gamma), requires_grad=True))
    assert op.saved == ()


# ----------------------------------------------------------------- errors --
def test_input_must_be_4d():
    with pytest.raises(gf.ShapeError,
                       match=r"gdn: x must be 4-D \(N, C, H, W\), got shape \(3, 5\)"):
        ops.gdn(*tensors(np.ones((3, 5)), np.ones(3), np.eye(3)))


def test_beta_must_have_one_value_per_channel():
    with pytest.raises(gf.ShapeError, match=r"igdn: beta must have shape \(3,\).*got \(4,\)"):
        ops.gdn(*tensors(np.ones((1, 3, 2, 2)), np.ones(4), np.eye(3)), inverse=True)


@pytest.mark.parametrize("gamma_shape", [(3, 4), (4, 4), (3,), (1, 3, 3)], ids=str)
def test_gamma_must_be_channels_by_channels(gamma_shape):
    with pytest.raises(gf.ShapeError,
                       match=r"gdn_simplified: gamma must have shape \(3, 3\) \[output channel, "
                             r"input channel\] for x of shape \(1, 3, 2, 2\), got "
                             + r"\(" + r",? ?".join(str(s) for s in gamma_shape)):
        ops.gdn(*tensors(np.ones((1, 3, 2, 2)), np.ones(3), np.ones(gamma_shape)), simplified=True)


# -------------------------------------------------------------------- GPU --
GPU_SHAPES = [(2, 3, 5, 7), (1, 7, 3, 5), (3, 5, 1, 1), (2, 192, 17, 19), (1, 192, 17, 19)]


def gpu_sample(rng, shape):
    """As ``sample``, with gamma scaled so that the norm stays O(1) at 192 channels."""
    x, beta, gamma = sample(rng, shape)
    return x, beta, gamma * (4.0 / shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_cuda_matches_numpy(variant, shape, rng):
    assert_backends_match(gdn_fn(*variant), list(gpu_sample(rng, shape)), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("wanted", ["x", "beta", "gamma"])
@pytest.mark.parametrize("parameters", ["effective", "stored"])
def test_cuda_gradient_of_one_input_only(variant, wanted, parameters, rng):
    # The other two are constants on the same device: the backward takes its
    # branches without the parameter GEMM, or without the input GEMM.
    if parameters == "stored":
        sample, fn = gpu_stored_sample(rng, (2, 5, 4, 9)), gdn_stored_fn(*variant)
    else:
        sample, fn = gpu_sample(rng, (2, 5, 7, 9)), gdn_fn(*variant)
    arrays = dict(zip(["x", "beta", "gamma"], sample))

    def only(t):
        args = {name: t if name == wanted else
                gf.tensor(a, device=t.device, dtype=t.dtype) for name, a in arrays.items()}
        return fn(args["x"], args["beta"], args["gamma"])

    assert_backends_match(only, [arrays[wanted]], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_cuda_forward_without_gradient(variant, rng):
    # Under no_grad the forward kernel writes y but not the cache.
    x, beta, gamma = gpu_sample(rng, (2, 9, 5, 7))
    with gf.no_grad():
        got = gdn_fn(*variant)(*tensors(x, beta, gamma, device="cuda", dtype=np.float32)).numpy()
    want = naive_gdn(*(a.astype(np.float32).astype(np.float64) for a in (x, beta, gamma)), *variant)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def gpu_stored_sample(rng, shape, below=0.3):
    """As ``gpu_sample``, with beta and gamma stored and some below their bounds."""
    x, beta, gamma = gpu_sample(rng, shape)
    return [x, *stored(rng, beta, gamma, below)]


# Odd sizes (4-byte kernels only), H*W % 4 == 0 (16-byte kernels), C = 192 both ways.
GPU_STORED_SHAPES = [(2, 3, 5, 7), (1, 7, 3, 5), (2, 6, 4, 8), (2, 192, 17, 19), (2, 192, 16, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("vectorize", [True, False], ids=["vec4", "scalar"])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("shape", GPU_STORED_SHAPES, ids=str)
def test_cuda_stored_parameters_match_numpy(shape, variant, vectorize, rng):
    with override(gdn_vectorize=vectorize):
        assert_backends_match(gdn_stored_fn(*variant), gpu_stored_sample(rng, shape), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_cuda_stored_parameters_equal_the_composed_operators(variant, rng):
    # Both in float32 on the GPU: the fused kernels compute what the separate
    # reparameterisation kernels did.
    arrays = gpu_stored_sample(rng, (2, 8, 6, 6))
    weight = rng.standard_normal(arrays[0].shape)
    results = []
    for fn in (gdn_stored_fn(*variant), gdn_composed_fn(*variant)):
        inputs = tensors(*arrays, device="cuda", dtype=np.float32, requires_grad=True)
        y = fn(*inputs)
        y.backward(gf.tensor(weight, device="cuda"))
        results.append([y.numpy()] + [t.grad.numpy() for t in inputs])
    for name, fused, composed in zip(["y", "gx", "gbeta", "ggamma"], *results):
        assert relative_error(fused, composed) <= 1e-6, name


# ------------------------------------------------- chunked GPU path (runs) --
# (shape, chunk count asked for): chunks that straddle images (3x5x4x4 in 4
# chunks of 12 pixels), K odd so only the 4-byte kernels run (3x7x9x11 in 9
# chunks of 33), C = 7 at batch 1, H*W % 4 != 0 with C = 192, a request whose
# nearest divisor (4 chunks of 18) would break the 16-byte kernels (3 of 24
# instead), "auto", and one chunk.
CHUNKED_CASES = [((3, 5, 4, 4), 4), ((3, 7, 9, 11), 9), ((1, 7, 8, 8), 4),
                 ((2, 192, 6, 7), 12), ((2, 6, 6, 6), 4), ((4, 192, 16, 16), "auto"),
                 ((2, 3, 5, 7), 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("vectorize", [True, False], ids=["vec4", "scalar"])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("shape,chunks", CHUNKED_CASES, ids=str)
def test_cuda_chunked_path_matches_numpy(shape, chunks, variant, vectorize, rng):
    with override(gdn_param_gemm_chunks=chunks, gdn_vectorize=vectorize):
        assert_backends_match(gdn_fn(*variant), list(gpu_sample(rng, shape)), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("shape,chunks", CHUNKED_CASES, ids=str)
def test_cuda_chunked_path_with_stored_parameters(shape, chunks, variant, rng):
    # The reduction over chunks is where the chain rule to the stored forms runs.
    with override(gdn_param_gemm_chunks=chunks):
        assert_backends_match(gdn_stored_fn(*variant), gpu_stored_sample(rng, shape), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("beta_sums", [True, False], ids=["segment sums", "ones row"])
@pytest.mark.parametrize("vectorize", [True, False], ids=["vec4", "scalar"])
@pytest.mark.parametrize("shape", [(3, 5, 16, 16), (2, 7, 8, 8)], ids=str)
def test_cuda_beta_gradient_both_ways(shape, vectorize, beta_sums, rng):
    # 16x16: segment sums at both widths (2 or 8 per row); 8x8: only at width 1.
    with override(gdn_beta_sums=beta_sums, gdn_vectorize=vectorize):
        assert_backends_match(gdn_stored_fn(False, False), gpu_stored_sample(rng, shape),
                              rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("channels", [6, 64], ids=["cuBLAS path", "fused path"])
def test_cuda_backward_twice_through_a_retained_graph(channels, fused_calls, rng):
    # The forward keeps S for dL/dgamma (segment sums at 16x16): the second
    # backward must find it as the first left it (the fused backward must
    # not write over it).
    x, beta, gamma = gpu_sample(rng, (2, channels, 16, 16))
    inputs = tensors(x, beta, gamma, device="cuda", dtype=np.float32, requires_grad=True)
    y = gdn_fn(False, False)(*inputs)
    weight = gf.tensor(rng.standard_normal(x.shape), device="cuda")
    y.backward(weight, retain_graph=True)
    first = [t.grad.numpy().copy() for t in inputs]
    for t in inputs:
        t.grad = None
    y.backward(weight)
    for name, before, again in zip(["gx", "gbeta", "ggamma"], first,
                                   [t.grad.numpy() for t in inputs]):
        np.testing.assert_allclose(again, before, rtol=1e-6, err_msg=name)
    fused = channels in FUSED_CHANNELS
    assert fused_calls() == {"forward": int(fused), "backward": 2 * int(fused)}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_cuda_unaligned_input_takes_the_4_byte_kernels(variant, rng):
    # x one float past a 16-byte boundary: the 16-byte kernels would fault or
    # read the wrong elements; the plan must fall back to the 4-byte ones.
    x, beta, gamma = gpu_sample(rng, (2, 6, 4, 8))
    x32 = x.astype(np.float32)
    base = cuda.get_runtime().from_numpy(np.concatenate([[np.float32(7.0)], x32.ravel()]))
    x_gpu = Tensor.wrap(base.offset(1, x.shape), "cuda", requires_grad=True)
    beta_gpu, gamma_gpu = tensors(beta, gamma, device="cuda", dtype=np.float32,
                                  requires_grad=True)
    y = gdn_fn(*variant)(x_gpu, beta_gpu, gamma_gpu)
    weight = rng.standard_normal(x.shape)
    y.backward(gf.tensor(weight, device="cuda"))
    ref = tensors(x32, beta.astype(np.float32), gamma.astype(np.float32), requires_grad=True)
    y_ref = gdn_fn(*variant)(*ref)
    y_ref.backward(gf.tensor(weight, device="numpy", dtype=np.float64))
    np.testing.assert_allclose(y.numpy(), y_ref.numpy(), rtol=1e-4, atol=1e-6)
    for got, want in zip((x_gpu, beta_gpu, gamma_gpu), ref):
        scale = np.max(np.abs(want.grad.numpy()))
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=0, atol=1e-4 * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_cuda_empty_batch_has_gradients_of_zeros(variant):
    inputs = tensors(np.zeros((0, 3, 2, 2)), np.ones(3), np.eye(3), device="cuda",
                     dtype=np.float32, requires_grad=True)
    y = gdn_fn(*variant)(*inputs)
    assert y.shape == (0, 3, 2, 2)
    y.backward(gf.tensor(np.zeros((0, 3, 2, 2)), device="cuda"))
    assert inputs[0].grad.shape == (0, 3, 2, 2)
    np.testing.assert_array_equal(inputs[1].grad.numpy(), np.zeros(3))
    np.testing.assert_array_equal(inputs[2].grad.numpy(), np.zeros((3, 3)))


# ------------------------------------------------------ fused GPU kernels --
# (shape, chunk count asked for), all with C in FUSED_CHANNELS and H*W % 4 == 0:
# one partial block of 60 pixels; 156 pixels (the third block partial); six
# whole blocks; blocks straddling chunks of 20 pixels.
FUSED_CASES = [((2, 64, 5, 12), "auto"), ((3, 128, 12, 13), "auto"), ((2, 192, 16, 24), "auto"),
               ((3, 64, 6, 10), 9)]


@pytest.fixture
def fused_calls():
    """A function giving how often the fused kernels ran, {"forward": n, "backward": n},
    summed over every GDN operator applied in the test (seen through autograd's trace)."""
    applied = []

    def record(op, inputs, output):
        if isinstance(op, GDNOp):
            applied.append(op)

    def counts():
        return {"forward": sum(op.fused_forward_runs for op in applied),
                "backward": sum(op.fused_backward_runs for op in applied)}

    with trace(record):
        yield counts


@pytest.mark.gpu
@pytest.mark.parametrize("parameters", ["effective", "stored"])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("shape,chunks", FUSED_CASES, ids=str)
def test_cuda_fused_kernels_match_numpy(shape, chunks, variant, parameters, fused_calls, rng):
    with override(gdn_param_gemm_chunks=chunks):
        if parameters == "stored":
            assert_backends_match(gdn_stored_fn(*variant), gpu_stored_sample(rng, shape),
                                  rtol=1e-4)
        else:
            assert_backends_match(gdn_fn(*variant), list(gpu_sample(rng, shape)), rtol=1e-4)
    calls = fused_calls()
    assert calls["forward"] >= 1 and calls["backward"] >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("wanted", ["x", "beta", "gamma"])
def test_cuda_fused_forward_gradient_of_one_input_only(wanted, fused_calls, rng):
    # Without dL/dx the backward is the unfused one, reading the fused forward's D.
    arrays = dict(zip(["x", "beta", "gamma"], gpu_sample(rng, (2, 64, 4, 9))))

    def only(t):
        args = {name: t if name == wanted else
                gf.tensor(a, device=t.device, dtype=t.dtype) for name, a in arrays.items()}
        return gdn_fn(False, False)(args["x"], args["beta"], args["gamma"])

    assert_backends_match(only, [arrays[wanted]], rtol=1e-4)
    calls = fused_calls()
    assert calls["forward"] >= 1
    assert calls["backward"] == (1 if wanted == "x" else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("forward_fused", [True, False], ids=["fused forward", "cuBLAS forward"])
def test_cuda_fused_and_unfused_halves_combine(variant, forward_fused, rng):
    # D and S are chunked on both paths: either backward reads either forward's.
    x, beta, gamma = gpu_sample(rng, (2, 128, 6, 10))
    weight = rng.standard_normal(x.shape)
    inputs = tensors(x, beta, gamma, device="cuda", dtype=np.float32, requires_grad=True)
    with override(gdn_fused=forward_fused):
        y = gdn_fn(*variant)(*inputs)
    with override(gdn_fused=not forward_fused):
        y.backward(gf.tensor(weight, device="cuda"))
    ref = tensors(x, beta, gamma, requires_grad=True)
    y_ref = gdn_fn(*variant)(*ref)
    y_ref.backward(gf.tensor(weight, device="numpy", dtype=np.float64))
    assert relative_error(y.numpy(), y_ref.numpy()) <= 1e-5
    for name, got, want in zip(["gx", "gbeta", "ggamma"], inputs, ref):
        assert relative_error(got.grad.numpy(), want.grad.numpy()) <= 1e-4, name


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_cuda_fused_forward_without_gradient(variant, fused_calls, rng):
    x, beta, gamma = gpu_sample(rng, (2, 192, 4, 9))
    with gf.no_grad():
        got = gdn_fn(*variant)(*tensors(x, beta, gamma, device="cuda", dtype=np.float32)).numpy()
    want = naive_gdn(*(a.astype(np.float32).astype(np.float64) for a in (x, beta, gamma)), *variant)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert fused_calls()["forward"] == 1


@pytest.mark.gpu
def test_cuda_channels_without_fused_kernels_take_cublas(fused_calls, rng):
    # C = 256 (and anything outside FUSED_CHANNELS): the cuBLAS path, same results.
    assert not cuda_plan("gdn", (1, 256, 4, 8)).fusable
    assert_backends_match(gdn_fn(False, False), list(gpu_sample(rng, (1, 256, 4, 8))), rtol=1e-4)
    assert fused_calls() == {"forward": 0, "backward": 0}


@pytest.mark.gpu
@pytest.mark.parametrize("channels", [6, 64], ids=["cuBLAS path", "fused path"])
def test_cuda_layer_memory_is_steady(channels, rng):
    # After the first calls every buffer comes back from the pool: neither the
    # training step nor the inference forward makes the pool grow.
    pool = cuda.get_runtime().pool
    layer = GDN(channels).to("cuda")
    x = gf.tensor(rng.standard_normal((2, channels, 16, 16)), device="cuda",
                  dtype=np.float32, requires_grad=True)
    gy = gf.tensor(rng.standard_normal((2, channels, 16, 16)), device="cuda", dtype=np.float32)

    def step():
        x.grad = None
        layer.zero_grad()
        layer(x).backward(gy)
        with gf.no_grad():
            layer(x)

    step()
    step()
    managed, active = pool.managed_bytes, pool.active_bytes
    for _ in range(5):
        step()
    assert (pool.managed_bytes, pool.active_bytes) == (managed, active)
