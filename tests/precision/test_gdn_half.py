"""GDN on 16-bit data: the NumPy emulation against formulas written out here,
the dtype rules, and (GPU) the tensor-core kernels against the emulation.

What the 16-bit GDN computes (gdnflow/ops/gdn/operator.py, "16 bits"): float32
throughout, except that the channel products take operands rounded to
bfloat16 (gamma, s(x), U) and D is kept in the data's dtype.

GPU tolerances, per dtype (eps: 2^-7 bfloat16, 2^-10 float16), relative to
the largest reference magnitude: y and dL/dx within one eps (the float32 sums
run in another order, and a D on a 16-bit rounding boundary may round to the
other side); dL/dbeta and dL/dgamma within one eps too, for that D.
"""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops, precision
from gdnflow.errors import DTypeError
from gdnflow.ops.gdn.operator import GDNOp
from gdnflow.testing import (assert_half_backends_match, relative_error, round_to_bfloat16,
                             units_in_last_place)

HALF = ["bf16", "fp16"]
EPS = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -10}
VARIANTS = [(False, False), (True, False), (False, True), (True, True)]
PARAMETRIZED = (1e-6, 0.0, 2.0 ** -36)


def gdn_inputs(rng, shape, dtype):
    """x rounded to ``dtype``; positive beta and non-negative gamma in float32."""
    channels = shape[1]
    x = (rng.standard_normal(shape) * 1.5).astype(np.float32).astype(precision.as_dtype(dtype))
    beta = (rng.random(channels) + 0.5).astype(np.float32)
    gamma = (rng.random((channels, channels)) * 0.2).astype(np.float32)
    return x, beta, gamma


def written_out(x16, beta, gamma, gy16, inverse, simplified):
    """(y, dL/dx, dL/dbeta, dL/dgamma) as the 16-bit GDN defines them, in float64
    from the rounded operands; y and dL/dx rounded to the data's dtype."""
    storage = x16.dtype
    x = x16.astype(np.float64)
    gy = gy16.astype(np.float64)
    a = (1.0 if simplified else 0.5) * (1 if inverse else -1)

    def statistic(v):
        return np.abs(v) if simplified else v * v

    s = round_to_bfloat16(statistic(x).astype(np.float32)).astype(np.float64)
    g = round_to_bfloat16(gamma).astype(np.float64)
    norm = np.einsum("ij,njhw->nihw", g, s) + beta[:, None, None]
    d = norm ** a
    y = (x * d).astype(storage)
    d16 = d.astype(np.float32).astype(storage).astype(np.float64)     # the cached D
    u = a * gy * x * d16 ** ((a - 1) / a)
    ub = round_to_bfloat16(u.astype(np.float32)).astype(np.float64)
    slope = np.sign(x) if simplified else 2 * x
    gx = (gy * d16 + slope * np.einsum("ij,nihw->njhw", g, ub)).astype(storage)
    return y, gx, u.sum(axis=(0, 2, 3)), np.einsum("nihw,njhw->ij", ub, s)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("inverse,simplified", VARIANTS)
def test_numpy_emulation_rounds_the_operands_as_written(inverse, simplified, dtype, rng):
    x16, beta, gamma = gdn_inputs(rng, (2, 6, 5, 3), dtype)
    gy16 = rng.standard_normal(x16.shape).astype(np.float32).astype(x16.dtype)
    x = gf.tensor(x16, dtype=x16.dtype, requires_grad=True)
    b = gf.tensor(beta, requires_grad=True)
    g = gf.tensor(gamma, requires_grad=True)
    y = ops.gdn(x, b, g, inverse=inverse, simplified=simplified)
    y.backward(gf.tensor(gy16, dtype=gy16.dtype))
    want_y, want_gx, want_gbeta, want_ggamma = written_out(x16, beta, gamma, gy16, inverse,
                                                           simplified)
    assert y.dtype == x.grad.dtype == x16.dtype
    assert b.grad.dtype == g.grad.dtype == np.float32
    # One unit in the last place: NumPy's float32 sums and powers against float64.
    assert units_in_last_place(y.numpy(), want_y, x16.dtype) <= 1
    assert relative_error(x.grad.numpy().astype(np.float64), want_gx.astype(np.float64)) <= EPS[dtype]
    assert relative_error(b.grad.numpy(), want_gbeta) <= 1e-5
    assert relative_error(g.grad.numpy(), want_ggamma) <= 1e-5


def test_parametrized_16_bit_gdn_uses_the_effective_parameters(rng):
    x16, beta, gamma = gdn_inputs(rng, (2, 4, 3, 3), "bf16")
    x = gf.tensor(x16, dtype="bf16")
    stored = ops.gdn(x, gf.tensor(np.sqrt(beta + PARAMETRIZED[2])),
                     gf.tensor(np.sqrt(gamma + PARAMETRIZED[2])), parametrized=PARAMETRIZED)
    plain = ops.gdn(x, gf.tensor(beta), gf.tensor(gamma))
    assert units_in_last_place(stored.numpy(), plain.numpy(), x16.dtype) <= 1


def test_16_bit_data_with_float32_parameters_is_the_rule_outside_autocast(rng):
    x16, beta, gamma = gdn_inputs(rng, (1, 4, 2, 2), "bf16")
    x, b, g = gf.tensor(x16, dtype="bf16"), gf.tensor(beta), gf.tensor(gamma)
    with pytest.raises(DTypeError, match="gdn: input 1 is bfloat16, but beside 16-bit data"):
        ops.gdn(x, b.astype("bf16"), g)
    with pytest.raises(DTypeError, match="input 0 is float32 but input 2 is bfloat16"):
        ops.gdn(x.astype("float32"), b, g.astype("bf16"))


def test_autocast_keeps_the_data_dtype_and_widens_16_bit_parameters(rng):
    x16, beta, gamma = gdn_inputs(rng, (1, 4, 2, 2), "fp16")
    x, b = gf.tensor(x16, dtype="fp16"), gf.tensor(beta, requires_grad=True)
    g = gf.tensor(gamma, requires_grad=True)
    with gf.autocast("bf16"):
        y = ops.gdn(x, b, g)
        wide = ops.gdn(x.astype("float32"), b, g)
        from_half_params = ops.gdn(x, b.astype("bf16"), g)
    assert (y.dtype, wide.dtype, from_half_params.dtype) == (np.float16, np.float32, np.float16)
    ops.cast(y, "float32").sum().backward()
    assert b.grad.dtype == g.grad.dtype == np.float32


# ----------------------------------------------------------------- GPU --
GPU_SHAPES = [(3, 64, 5, 8), (2, 128, 7, 8), (1, 192, 16, 16), (2, 192, 9, 24)]
WIDENED_SHAPES = [(2, 192, 9, 9), (2, 40, 4, 6)]    # H*W % 8 != 0; a C without kernels


def gpu_gdn(inverse, simplified, parametrized=None):
    """fn(x, beta, gamma) for assert_half_backends_match."""
    def fn(x, beta, gamma):
        return ops.gdn(x, beta, gamma, inverse=inverse, simplified=simplified,
                       parametrized=parametrized)
    return fn


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", GPU_SHAPES + WIDENED_SHAPES)
@pytest.mark.parametrize("inverse,simplified", VARIANTS)
def test_16_bit_gdn_on_the_gpu_matches_the_emulation(inverse, simplified, shape, dtype, rng):
    x16, beta, gamma = gdn_inputs(rng, shape, dtype)
    # The widened path skips the operand rounding: it may differ by a rounding of them.
    rtol = EPS[dtype] * (1 if shape in GPU_SHAPES else 4)
    assert_half_backends_match(gpu_gdn(inverse, simplified), [x16, beta, gamma], dtype,
                               rtol=rtol, float32_inputs=(1, 2), names=("x", "beta", "gamma"))


@pytest.mark.gpu
@pytest.mark.parametrize("chunks", ["auto", 3])
def test_16_bit_gdn_blocks_walking_many_tiles_and_chunked_caches(chunks, rng):
    # 8 x 64 tiles of 64 pixels: more than the grid's blocks (2 per SM), so blocks
    # reuse their shared tiles; 3 chunks put D, U and S at offsets K < P.
    x16, beta, gamma = gdn_inputs(rng, (8, 64, 64, 64), "bf16")
    with gf.config.override(gdn_param_gemm_chunks=chunks):
        assert_half_backends_match(gpu_gdn(False, False), [x16, beta, gamma], "bf16",
                                   rtol=EPS["bf16"], float32_inputs=(1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
def test_parametrized_16_bit_gdn_on_the_gpu_matches_the_emulation(dtype, rng):
    x16, beta, gamma = gdn_inputs(rng, (2, 128, 12, 12), dtype)
    stored = [np.sqrt(beta + PARAMETRIZED[2]), np.sqrt(gamma + PARAMETRIZED[2])]
    assert_half_backends_match(gpu_gdn(False, False, PARAMETRIZED), [x16] + stored, dtype,
                               rtol=EPS[dtype], float32_inputs=(1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,fused", [(GPU_SHAPES[0], True), (GPU_SHAPES[3], True),
                                         (WIDENED_SHAPES[0], False), (WIDENED_SHAPES[1], False)])
def test_16_bit_kernels_run_where_they_apply(shape, fused, rng):
    x16, beta, gamma = gdn_inputs(rng, shape, "bf16")
    x = gf.tensor(x16, device="cuda", dtype="bf16", requires_grad=True)
    op = GDNOp()
    y = op(x, gf.tensor(beta, device="cuda"), gf.tensor(gamma, device="cuda"))
    # The 16-bit kernels keep the 16-bit x and D; the float32 path (whose fused
    # kernels the counters count too) keeps widened ones.
    kept = (op.saved.x.dtype, op.saved.d.dtype)
    assert kept == ((precision.BFLOAT16,) * 2 if fused else (np.float32,) * 2)
    y.backward(gf.tensor(np.ones(shape, np.float32), device="cuda", dtype="bf16"))
    if fused:
        assert op.fused_backward_runs == 1
    assert y.dtype == x.grad.dtype == precision.BFLOAT16


@pytest.mark.gpu
def test_16_bit_gdn_parameter_gradients_alone_and_a_misaligned_gradient(rng):
    # Only the parameters ask for gradients (the kernel skips dL/dx); the
    # output gradient is a view 2 bytes past an aligned address.
    x16, beta, gamma = gdn_inputs(rng, (2, 64, 8, 8), "bf16")
    gy16 = rng.standard_normal(x16.size + 1).astype(np.float32).astype(x16.dtype)
    grads = {}
    for device in ("numpy", "cuda"):
        b = gf.tensor(beta, device=device, requires_grad=True)
        g = gf.tensor(gamma, device=device, requires_grad=True)
        y = ops.gdn(gf.tensor(x16, device=device, dtype="bf16"), b, g)
        flat = gf.tensor(gy16, device=device, dtype="bf16").data
        gy = gf.Tensor.wrap(flat[1:].reshape(x16.shape) if device == "numpy" else
                            flat.offset(1, x16.shape), device)
        assert device == "numpy" or gy.data.ptr % 16 == 2
        y.backward(gy)
        grads[device] = (b.grad.numpy(), g.grad.numpy())
    for gpu, cpu in zip(grads["cuda"], grads["numpy"]):
        assert relative_error(gpu, cpu) <= EPS["bf16"]
