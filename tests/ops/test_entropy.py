"""Operators of gdnflow.ops.entropy: forward against formulas, gradients against
finite differences, the Philox generator against its published test vectors,
CUDA against NumPy."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.ops import entropy as eops
from gdnflow.testing import assert_backends_match, gradcheck


def t64(x, grad=False):
    return gf.tensor(x, device="numpy", dtype=np.float64, requires_grad=grad)


def away_from_zero(rng, shape):
    x = rng.uniform(-4, 4, shape)
    x[np.abs(x) < 0.05] = 0.5
    return x


UNARY = {
    "softplus": (eops.softplus, lambda x: np.log1p(np.exp(x)), lambda rng, s: rng.uniform(-8, 8, s)),
    "tanh": (eops.tanh, np.tanh, lambda rng, s: rng.uniform(-3, 3, s)),
    "abs": (eops.abs, np.abs, away_from_zero),
}


@pytest.mark.parametrize("name", UNARY)
def test_unary_forward_and_gradient(name, rng):
    fn, formula, sample = UNARY[name]
    x = sample(rng, (4, 7))
    np.testing.assert_allclose(fn(t64(x)).numpy(), formula(x), rtol=1e-12)
    gradcheck(fn, [sample(rng, (3, 5))])


def test_softplus_is_exact_far_out():
    x = np.array([-800.0, -30.0, 0.0, 30.0, 800.0])
    y = eops.softplus(t64(x)).numpy()
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, [0.0, np.exp(-30.0), np.log(2.0), 30.0, 800.0], rtol=1e-12, atol=0)


def test_abs_gradient_is_zero_at_zero():
    x = t64(np.array([-2.0, 0.0, 3.0]), grad=True)
    eops.abs(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [-1.0, 0.0, 1.0])


def test_round_halves_to_even_with_identity_gradient():
    x = t64(np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -0.51]), grad=True)
    y = eops.round(x)
    np.testing.assert_array_equal(y.numpy(), [-2, -2, -0, 0, 2, 2, 0, -1])
    weight = np.arange(8.0)
    y.backward(t64(weight))
    np.testing.assert_array_equal(x.grad.numpy(), weight)


# Random123's known-answer tests for Philox4x32-10 (kat_vectors).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", PHILOX_KAT)
def test_philox_matches_published_vectors(counter, key, expected):
    assert tuple(int(w) for w in eops.philox4x32(counter, key)) == expected


def test_uniform_noise_is_a_function_of_key_and_stream(rng):
    x = rng.standard_normal((2, 3, 8, 8))
    a = eops.uniform_noise(t64(x), key=7, stream=3).numpy() - x
    b = eops.uniform_noise(t64(x), key=7, stream=3).numpy() - x
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, eops.uniform_noise(t64(x), key=7, stream=4).numpy() - x)
    assert not np.array_equal(a, eops.uniform_noise(t64(x), key=8, stream=3).numpy() - x)
    assert a.min() >= -0.5 and a.max() < 0.5
    # 24-bit values: exact in float32, so the float32 noise equals the float64 noise.
    noise32 = eops.uniform_noise_values(x.shape, 7, 3, np.float32)
    noise64 = eops.uniform_noise_values(x.shape, 7, 3, np.float64)
    np.testing.assert_array_equal(noise32.astype(np.float64), noise64)


def test_a_batch_slice_draws_that_slice_of_the_whole_batch_noise(rng):
    # A data-parallel process holding samples 2 and 3 of a batch of 4.
    x = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    whole = eops.uniform_noise(gf.tensor(x), key=7, stream=3).numpy()
    with gf.config.override(noise_sample_offset=2):
        part = eops.uniform_noise(gf.tensor(x[2:]), key=7, stream=3).numpy()
    np.testing.assert_array_equal(part, whole[2:])
    with gf.config.override(noise_sample_offset=2 ** 31), pytest.raises(ValueError, match="2.32"):
        eops.uniform_noise(gf.tensor(x[2:]), key=7, stream=3)


def test_uniform_noise_statistics():
    u = eops.uniform_noise_values((200_000,), key=12345, stream=0, dtype=np.float64)
    assert abs(u.mean()) < 0.003
    assert abs(u.var() - 1 / 12) < 0.002
    counts, _ = np.histogram(u, bins=10, range=(-0.5, 0.5))
    assert counts.min() > 0.95 * len(u) / 10
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01


def test_uniform_noise_gradient_is_identity(rng):
    x = t64(rng.standard_normal((3, 4)), grad=True)
    weight = rng.standard_normal((3, 4))
    eops.uniform_noise(x, key=1, stream=2).backward(t64(weight))
    np.testing.assert_array_equal(x.grad.numpy(), weight)


def test_uniform_noise_rejects_keys_outside_64_bits():
    with pytest.raises(ValueError, match="key"):
        eops.UniformNoiseOp(2 ** 64)
    with pytest.raises(ValueError, match="stream"):
        eops.UniformNoiseOp(1, -1)


def ordered_logits(rng, shape, scale=4.0):
    """Pairs of logits lower < upper, on both sides of zero."""
    lower = rng.uniform(-scale, scale, shape)
    return lower, lower + rng.uniform(0.05, 2.0, shape)


def test_sigmoid_difference_forward(rng):
    lower, upper = ordered_logits(rng, (5, 6))
    expected = 1 / (1 + np.exp(-upper)) - 1 / (1 + np.exp(-lower))
    np.testing.assert_allclose(eops.sigmoid_difference(t64(lower), t64(upper)).numpy(), expected,
                               rtol=1e-12)


def test_sigmoid_difference_keeps_precision_in_the_tails():
    # Far in the upper tail, sigmoid(u) - sigmoid(l) rounds to 0 in float32;
    # the sign trick takes it where sigmoid is small.
    lower, upper = np.array([30.0, -31.0]), np.array([31.0, -30.0])
    expected = np.exp(-30.0) - np.exp(-31.0)      # to 1e-13 relative
    y = eops.sigmoid_difference(gf.tensor(lower, device="numpy"), gf.tensor(upper, device="numpy"))
    np.testing.assert_allclose(y.numpy(), [expected, expected], rtol=1e-5)


def test_sigmoid_difference_gradient(rng):
    gradcheck(eops.sigmoid_difference, list(ordered_logits(rng, (3, 4))))


# ------------------------------------------------------------------ GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("name", UNARY)
def test_unary_cuda_matches_numpy(name, rng):
    fn, _, sample = UNARY[name]
    assert_backends_match(fn, [sample(rng, (3, 5, 17, 19))])


@pytest.mark.gpu
def test_round_cuda_matches_numpy(rng):
    x = np.round(rng.uniform(-6, 6, (7, 333)) * 4) / 4     # many exact halves
    assert_backends_match(eops.round, [x], rtol=0, grad=False)      # values: exactly equal
    assert_backends_match(eops.round, [x], rtol=1e-6)       # the identity gradient


@pytest.mark.gpu
def test_uniform_noise_cuda_is_bit_identical(rng):
    x = rng.standard_normal((3, 5, 17, 19)).astype(np.float32)
    for key, stream in ((0, 0), (2 ** 64 - 1, 123), (987654321987, 2 ** 40 + 5)):
        on_gpu = eops.uniform_noise(gf.tensor(x, device="cuda"), key, stream).numpy()
        on_cpu = eops.uniform_noise(gf.tensor(x, device="numpy"), key, stream).numpy()
        np.testing.assert_array_equal(on_gpu, on_cpu)
    assert_backends_match(lambda t: eops.uniform_noise(t, 5, 6), [x])
    with gf.config.override(noise_sample_offset=1):     # a data-parallel process's slice
        assert_backends_match(lambda t: eops.uniform_noise(t, 5, 6), [x[1:]])


@pytest.mark.gpu
def test_sigmoid_difference_cuda_matches_numpy(rng):
    lower, upper = ordered_logits(rng, (4, 3, 33), scale=12.0)
    assert_backends_match(eops.sigmoid_difference, [lower, upper], rtol=1e-5)


# ------------------------------------------- the kernels, on the host --
HOST_HARNESS = r"""
// entropy.cu's kernels compiled as plain host functions: a grid-stride loop
// becomes a for loop, __umulhi a 64-bit product. Reads inputs, writes outputs.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define GRID_STRIDE_LOOP(i, n) for (int i = 0; i < (n); ++i)
static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
#include "entropy.cu"
int main(int argc, char** argv) {
    const int n = atoi(argv[1]);
    std::vector<float> x(n), l(n), u(n), gy(n), y(n), a(n), b(n);
    FILE* in = fopen("in.bin", "rb");
    for (std::vector<float>* v : {&x, &l, &u, &gy})
        if (fread(v->data(), 4, n, in) != (size_t)n) return 1;
    fclose(in);
    FILE* out = fopen("out.bin", "wb");
    uniform_noise_forward(x.data(), y.data(), n, 0u, 0x89abcdefu, 0x01234567u, 77u, 3u);
    fwrite(y.data(), 4, n, out);
    // The second half of the same noise, as a process holding it draws it.
    uniform_noise_forward(x.data(), y.data(), n / 2, n / 2, 0x89abcdefu, 0x01234567u, 77u, 3u);
    fwrite(y.data(), 4, n, out);
    softplus_forward(x.data(), y.data(), n);  fwrite(y.data(), 4, n, out);
    softplus_backward(x.data(), y.data(), gy.data(), a.data(), n);  fwrite(a.data(), 4, n, out);
    tanh_forward(x.data(), y.data(), n);  fwrite(y.data(), 4, n, out);
    tanh_backward(x.data(), y.data(), gy.data(), a.data(), n);  fwrite(a.data(), 4, n, out);
    abs_forward(x.data(), y.data(), n);  fwrite(y.data(), 4, n, out);
    abs_backward(x.data(), y.data(), gy.data(), a.data(), n);  fwrite(a.data(), 4, n, out);
    round_forward(x.data(), y.data(), n);  fwrite(y.data(), 4, n, out);
    sigmoid_difference_forward(l.data(), u.data(), y.data(), n);  fwrite(y.data(), 4, n, out);
    sigmoid_difference_backward(l.data(), u.data(), gy.data(), a.data(), b.data(), n);
    fwrite(a.data(), 4, n, out);  fwrite(b.data(), 4, n, out);
    fclose(out);
    return 0;
}
"""


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="g++ is not installed")
def test_cuda_kernels_compiled_for_the_host_match_numpy(tmp_path, rng):
    """Runs entropy.cu's kernel bodies on the CPU: CI has no GPU, but this checks
    their arithmetic (and the noise bit for bit) against the NumPy backend."""
    import shutil
    import subprocess
    from gdnflow.backends.cuda.sources import source_dir
    shutil.copy(source_dir() / "entropy.cu", tmp_path / "entropy.cu")
    (tmp_path / "gdnflow_common.cuh").write_text("// the harness defines what it needs\n")
    (tmp_path / "harness.cpp").write_text(HOST_HARNESS)
    built = subprocess.run(["g++", "-O2", "-std=c++17", "-I", str(tmp_path), "-o", "harness",
                            "harness.cpp"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    n = 2000
    x = rng.uniform(-30, 30, n).astype(np.float32)
    x[:100] = np.round(x[:100]) + 0.5               # exact halves for round
    x[100:110] = 0
    lower, upper = (v.astype(np.float32) for v in ordered_logits(rng, n, scale=15.0))
    gy = rng.standard_normal(n).astype(np.float32)
    np.concatenate([x, lower, upper, gy]).tofile(tmp_path / "in.bin")
    subprocess.run([str(tmp_path / "harness"), str(n)], cwd=tmp_path, check=True, timeout=60)
    out = iter(np.fromfile(tmp_path / "out.bin", np.float32).reshape(-1, n))

    noise = eops.uniform_noise_values((n,), (0x01234567 << 32) | 0x89ABCDEF, (3 << 32) | 77)
    np.testing.assert_array_equal(next(out), x + noise)
    np.testing.assert_array_equal(next(out)[:n // 2], x[:n // 2] + noise[n // 2:])

    def reference(fn, *inputs):
        tensors = [t64(v, grad=True) for v in inputs]
        y = fn(*tensors)
        y.backward(t64(gy))
        return [y.numpy()] + [t.grad.numpy() for t in tensors]

    for fn in (eops.softplus, eops.tanh, eops.abs):
        y, gx = reference(fn, x)
        np.testing.assert_allclose(next(out), y, rtol=1e-6, atol=1e-30)
        np.testing.assert_allclose(next(out), gx, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(next(out), np.rint(x))
    y, g_lower, g_upper = reference(eops.sigmoid_difference, lower, upper)
    np.testing.assert_allclose(next(out), y, rtol=1e-4)
    np.testing.assert_allclose(next(out), g_lower, rtol=1e-4, atol=1e-7 * np.abs(g_lower).max())
    np.testing.assert_allclose(next(out), g_upper, rtol=1e-4, atol=1e-7 * np.abs(g_upper).max())
