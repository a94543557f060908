"""The matmul precision: "tf32" runs cuBLAS's products on the tensor cores (GPU), agrees
with NumPy on TF32-rounded inputs, and switches back to exact float32 with the knob."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import config
from gdnflow.testing import relative_error, round_to_tf32


def test_round_to_tf32_keeps_10_mantissa_bits_nearest_ties_to_even():
    ulp = 2.0 ** -10
    x = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2 ** -20, -(1 + ulp / 2),
                  np.inf, -np.inf, 0.0], np.float32)
    np.testing.assert_array_equal(round_to_tf32(x),
                                  [1, 1 + 2 * ulp, 1 + ulp, -1, np.inf, -np.inf, 0.0])
    rng = np.random.default_rng(0)
    y = rng.standard_normal(10_000).astype(np.float32)
    r = round_to_tf32(y)
    assert np.all(r.view(np.uint32) & 0x1FFF == 0)
    assert np.all(np.abs(r - y) <= np.abs(y) * 2.0 ** -11)
    assert np.isnan(round_to_tf32(np.array([np.nan], np.float32)))[0]


def test_the_precision_is_checked_and_set():
    with pytest.raises(ValueError, match="matmul precision 'bf16': expected one of fp32, tf32"):
        gf.set_matmul_precision("bf16")
    assert config.settings.matmul_precision == "fp32"
    try:
        gf.set_matmul_precision("tf32")
        assert config.settings.matmul_precision == "tf32"
    finally:
        gf.set_matmul_precision("fp32")


def test_a_training_config_checks_its_precision():
    from gdnflow.train import TrainConfig
    with pytest.raises(ValueError, match="one of fp32, tf32, bf16, fp16, got 'fp8'"):
        TrainConfig(precision="fp8").check()


def _matmul(a, b, precision):
    with config.override(matmul_precision=precision):
        return gf.ops.matmul(gf.tensor(a, device="cuda"), gf.tensor(b, device="cuda")).numpy()


@pytest.mark.gpu
def test_tf32_products_are_the_tensor_cores_and_switch_back(rng):
    a = rng.standard_normal((129, 301)).astype(np.float32)
    b = rng.standard_normal((301, 257)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    tf32_reference = round_to_tf32(a).astype(np.float64) @ round_to_tf32(b).astype(np.float64)
    fp32, tf32 = _matmul(a, b, "fp32"), _matmul(a, b, "tf32")
    assert relative_error(fp32, exact) <= 1e-5
    # TF32 rounds each input to 2^-11: the result moves by ~1e-4, far past float32's
    # error (so the tensor cores really ran), and matches the rounded inputs' product.
    assert relative_error(tf32, exact) > 10 * relative_error(fp32, exact)
    assert relative_error(tf32, tf32_reference) <= 1e-4
    np.testing.assert_array_equal(_matmul(a, b, "fp32"), fp32)     # exact again after


class _Im2colEverywhere:
    """A convolution planner that lowers every stage to im2col + cuBLAS GEMM."""

    def choose(self, g, stage):
        from gdnflow.ops.conv.algorithms.im2col import Im2colGemm
        return Im2colGemm


@pytest.mark.gpu
def test_a_tf32_convolution_matches_numpy_on_rounded_inputs(rng):
    x = rng.standard_normal((3, 37, 23, 29)).astype(np.float32)
    w = rng.standard_normal((45, 37, 3, 3)).astype(np.float32)

    def conv(precision):
        with config.override(matmul_precision=precision, conv_planner=_Im2colEverywhere()):
            return gf.ops.conv2d(gf.tensor(x, device="cuda"), gf.tensor(w, device="cuda"),
                                 padding=1).numpy()

    def reference(a, b):
        return gf.ops.conv2d(gf.tensor(a.astype(np.float64), device="numpy"),
                             gf.tensor(b.astype(np.float64), device="numpy"), padding=1).numpy()

    exact, fp32, tf32 = reference(x, w), conv("fp32"), conv("tf32")
    assert relative_error(tf32, exact) > 10 * relative_error(fp32, exact)
    assert relative_error(tf32, reference(round_to_tf32(x), round_to_tf32(w))) <= 1e-4


@pytest.mark.gpu
def test_inference_plans_keep_the_precision_they_were_built_with(rng):
    model = gf.nn.Sequential(gf.nn.Conv2d(16, 64, 3, padding=1, device="cuda"), gf.nn.ReLU(),
                             gf.nn.Conv2d(64, 32, 3, padding=1, device="cuda")).eval()
    x = gf.tensor(rng.standard_normal((4, 16, 24, 24)).astype(np.float32), device="cuda")
    compiled = gf.compile(model)
    fp32 = compiled(x).numpy()
    with config.override(matmul_precision="tf32"):
        tf32 = compiled(x).numpy()
    assert sorted(compiled.plans) == [((4, 16, 24, 24), "fp32"), ((4, 16, 24, 24), "tf32")]
    assert [p.precision for p in compiled.plans.values()] == ["fp32", "tf32"]
    with gf.no_grad():
        eager = model(x).numpy()
    assert relative_error(fp32, eager) <= 1e-5
    assert 1e-5 < relative_error(tf32, eager) <= 1e-2
