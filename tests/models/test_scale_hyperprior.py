"""The scale hyperprior: shapes and CompressAI's names, the Gaussian conditional's
likelihoods against a formula written independently, evaluation rounding, the
noise of y and z, the gradient of the whole rate-distortion loss in float64,
and (GPU) a training step against NumPy. CompressAI's weights:
test_hyperprior_compressai.py."""
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.models import CODEC_MODELS, ScaleHyperprior
from gdnflow.models.gaussian_conditional import GaussianConditional
from gdnflow.testing import gradcheck
from gdnflow.train.losses import RateDistortionLoss
from gdnflow.train.numerics import cast_module
from model_kit import assert_cuda_training_step_matches_numpy, parameters_replaced, randomize


def hyperprior(n, m, rng, device="numpy"):
    """A ScaleHyperprior with randomized weights, latents spanning several integers
    and scales well above the bound."""
    model = randomize(ScaleHyperprior(n, m, rng=rng, device=device), rng)
    state = model.state_dict()
    state["g_a.6.weight"] = state["g_a.6.weight"] * 20
    state["h_s.4.bias"] = rng.uniform(0.5, 1.5, state["h_s.4.bias"].shape)
    model.load_state_dict(state)
    return model


def test_shapes_and_compressai_names(rng):
    model = ScaleHyperprior(8, 12, seed=0, device="numpy")
    x = gf.tensor(rng.random((2, 3, 64, 128)), device="numpy")
    out = model(x, noise_key=1)
    assert out["x_hat"].shape == (2, 3, 64, 128)
    assert out["y_hat"].shape == out["scales"].shape == out["likelihoods"]["y"].shape \
        == (2, 12, 4, 8)
    assert out["z_hat"].shape == out["likelihoods"]["z"].shape == (2, 8, 1, 2)
    shapes = {name: value.shape for name, value in model.state_dict().items()}
    assert shapes["h_a.0.weight"] == (8, 12, 3, 3) and shapes["h_a.4.weight"] == (8, 8, 5, 5)
    assert shapes["h_s.0.weight"] == (8, 8, 5, 5) and shapes["h_s.4.weight"] == (12, 8, 3, 3)
    assert shapes["entropy_bottleneck.quantiles"] == (8, 1, 3)
    assert {"g_a.6.weight", "g_s.5.gamma", "h_a.2.bias", "h_s.2.bias"} <= set(shapes)
    assert not any(name.startswith("gaussian_conditional") for name in shapes)
    assert model.config == {"model": "hyperprior", "N": 8, "M": 12}
    assert CODEC_MODELS["hyperprior"] is ScaleHyperprior and model.downsampling == 64
    assert len(model.aux_parameters()) == 1
    assert len(model.main_parameters()) == len(model.parameters()) - 1


def test_rejects_sizes_not_multiple_of_64():
    model = ScaleHyperprior(4, 6, seed=0, device="numpy")
    with pytest.raises(gf.ShapeError, match="multiples of 64"):
        model(gf.tensor(np.zeros((1, 3, 64, 80)), device="numpy"))


def reference_likelihood(y, scale, bound=0.11, floor=1e-9):
    """The Gaussian mass of [y - 1/2, y + 1/2] under N(0, max(scale, bound)), per element."""
    s = max(scale, bound)
    phi = lambda t: 0.5 * math.erfc(-t / math.sqrt(2))   # noqa: E731
    return max(phi((abs(y) + 0.5) / s) - phi((abs(y) - 0.5) / s), floor)


def test_evaluation_rounds_and_likelihoods_are_the_gaussian_masses(rng):
    model = hyperprior(4, 6, rng)
    cast_module(model, np.float64)
    model.eval()
    x = gf.tensor(rng.random((1, 3, 64, 64)), device="numpy", dtype=np.float64)
    out = model(x)
    y_hat, z_hat = out["y_hat"].numpy(), out["z_hat"].numpy()
    np.testing.assert_array_equal(y_hat, np.rint(y_hat))
    medians = model.entropy_bottleneck.quantiles.numpy()[:, 0, 1].reshape(1, -1, 1, 1)
    np.testing.assert_allclose(z_hat - medians, np.rint(z_hat - medians), atol=1e-12)
    assert np.abs(y_hat).max() >= 1        # not all zeros: the check below means something
    scales = out["scales"].numpy()
    expected = np.vectorize(reference_likelihood)(y_hat, scales)
    np.testing.assert_allclose(out["likelihoods"]["y"].numpy(), expected, rtol=1e-10)


def test_scales_below_the_bound_use_the_bound(rng):
    conditional = GaussianConditional()
    y = gf.tensor(np.array([0.0, 1.0, -2.0]), device="numpy", dtype=np.float64)
    low = gf.tensor(np.array([0.01, 0.05, 0.11]), device="numpy", dtype=np.float64)
    bound = gf.tensor(np.full(3, 0.11), device="numpy", dtype=np.float64)
    _, p_low = conditional(y, low, training=False)
    _, p_bound = conditional(y, bound, training=False)
    np.testing.assert_allclose(p_low.numpy(), p_bound.numpy(), rtol=1e-12)
    assert p_low.numpy()[2] == 1e-9          # 2 is 18 sigma out: the likelihood bound


def test_noise_of_y_and_z_follows_the_key_and_differs(rng):
    model = ScaleHyperprior(4, 4, seed=0, device="numpy")
    x = gf.tensor(rng.random((1, 3, 64, 64)), device="numpy")
    a, b = model(x, noise_key=5, noise_stream=9), model(x, noise_key=5, noise_stream=9)
    c = model(x, noise_key=5, noise_stream=10)
    for key in ("y_hat", "z_hat"):
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
        assert not np.array_equal(a[key].numpy(), c[key].numpy())
    # z's noise is not y's noise at the same positions (the keys differ).
    y = model.g_a(x)
    y_noise = (a["y_hat"] - y).numpy().ravel()
    z_noise = (a["z_hat"] - model.h_a(gf.ops.abs(y))).numpy().ravel()
    assert not np.allclose(y_noise[:z_noise.size], z_noise)
    assert np.all(np.abs(y_noise) <= 0.5) and np.all(np.abs(z_noise) <= 0.5)


def test_rate_distortion_loss_gradient_of_the_whole_model(rng):
    model = hyperprior(3, 4, rng)
    cast_module(model, np.float64)
    criterion = RateDistortionLoss(lmbda=0.01)

    def loss(x, *tensors):
        with parameters_replaced(model, tensors):
            out = model(x, noise_key=42, noise_stream=7)
            return criterion(out, x)["loss"]

    x = rng.random((1, 3, 64, 64))
    gradcheck(loss, [x] + [p.numpy() for p in model.parameters()], directions=1,
              full_jacobian_max=0, rtol=1e-5)


# ------------------------------------------------------------------ GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("n, m, side", [(8, 12, 64), (32, 48, 128)])
def test_cuda_training_step_matches_numpy(n, m, side, rng):
    """Loss and every gradient of a training step (same batch, same noise) on
    CUDA (float32) against NumPy (float64), within 1e-4 relative."""
    source = hyperprior(n, m, rng)
    assert_cuda_training_step_matches_numpy(ScaleHyperprior, source, rng, side)
