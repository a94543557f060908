"""The factorized-prior autoencoder and its entropy bottleneck: shapes and names,
the density's sanity (masses over the integers sum to one), gradients of the
density, of the auxiliary loss and of the whole rate-distortion loss in
float64, CompressAI weight conversion, and (GPU) a training step against NumPy."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.models.entropy_bottleneck import EntropyBottleneck
from gdnflow.models.factorized_prior import FactorizedPrior, load_compressai_state_dict
from gdnflow.testing import gradcheck
from gdnflow.train.losses import RateDistortionLoss
from gdnflow.train.numerics import cast_module
from model_kit import assert_cuda_training_step_matches_numpy, parameters_replaced, randomize


def t64(x, grad=False):
    return gf.tensor(x, device="numpy", dtype=np.float64, requires_grad=grad)


# ----------------------------------------------------------- structure --
def test_shapes_and_compressai_names(rng):
    model = FactorizedPrior(8, 12, seed=0, device="numpy")
    x = gf.tensor(rng.random((2, 3, 32, 48)), device="numpy")
    out = model(x, noise_key=1)
    assert out["x_hat"].shape == (2, 3, 32, 48)
    assert out["y_hat"].shape == out["likelihoods"]["y"].shape == (2, 12, 2, 3)
    names = set(model.state_dict())
    expected = {"g_a.0.weight", "g_a.0.bias", "g_a.1.beta", "g_a.1.gamma", "g_a.6.weight",
                "g_s.0.weight", "g_s.5.gamma", "g_s.6.bias", "entropy_bottleneck.quantiles",
                "entropy_bottleneck.target", "entropy_bottleneck.matrices.4",
                "entropy_bottleneck.biases.4", "entropy_bottleneck.factors.3"}
    assert expected <= names
    assert "entropy_bottleneck.factors.4" not in names
    assert model.state_dict()["g_s.0.weight"].shape == (12, 8, 5, 5)      # [in, out, kh, kw]
    assert model.config == {"model": "factorized_prior", "N": 8, "M": 12}
    assert len(model.aux_parameters()) == 1
    assert len(model.main_parameters()) == len(model.parameters()) - 1


def test_same_seed_same_model():
    a = FactorizedPrior(4, 6, seed=3, device="numpy").state_dict()
    b = FactorizedPrior(4, 6, seed=3, device="numpy").state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_rejects_sizes_not_multiple_of_16():
    with pytest.raises(gf.ShapeError, match="multiples of 16"):
        model = FactorizedPrior(4, 6, seed=0, device="numpy")
        model(gf.tensor(np.zeros((1, 3, 24, 32)), device="numpy"))


def test_initial_entropy_bottleneck_matches_compressai_formulas():
    eb = EntropyBottleneck(5, rng=np.random.default_rng(0), device="numpy")
    state = eb.state_dict()
    scale = 10 ** (1 / 5)
    np.testing.assert_allclose(np.log1p(np.exp(state["matrices.0"])), 1 / scale / 3, rtol=1e-6)
    np.testing.assert_allclose(np.log1p(np.exp(state["matrices.4"])), 1 / scale, rtol=1e-6)
    assert state["matrices.1"].shape == (5, 3, 3) and state["matrices.4"].shape == (5, 1, 3)
    assert np.all(state["factors.2"] == 0) and np.all(np.abs(state["biases.0"]) <= 0.5)
    np.testing.assert_allclose(state["quantiles"][:, 0], np.tile([-10, 0, 10], (5, 1)))
    np.testing.assert_allclose(state["target"], [-np.log(2e9 - 1), 0, np.log(2e9 - 1)], rtol=1e-6)


# ------------------------------------------------------------- density --
def test_likelihoods_over_the_integers_sum_to_one(rng):
    eb = randomize(EntropyBottleneck(4, rng=rng, device="numpy"), rng)
    cast_module(eb, np.float64)
    values = np.arange(-400, 401, dtype=np.float64)
    p = eb.likelihood(t64(np.tile(values, (4, 1, 1)))).numpy()[:, 0]
    assert np.all(p >= 0)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-6)
    # The cumulative is increasing: masses of wider bins add up.
    assert np.all(p.max(axis=1) < 1)


def test_density_gradients(rng):
    eb = randomize(EntropyBottleneck(2, filters=(3, 2), rng=rng, device="numpy"), rng)
    cast_module(eb, np.float64)
    params = eb.parameters()

    def likelihood(values, *tensors):
        with parameters_replaced(eb, tensors):
            return eb.likelihood(values)

    values = rng.uniform(-3, 3, (2, 1, 5))
    gradcheck(likelihood, [values] + [p.numpy() for p in params], full_jacobian_max=0)


def test_aux_loss_gradient_reaches_only_the_quantiles(rng):
    eb = randomize(EntropyBottleneck(3, rng=rng, device="numpy"), rng)
    cast_module(eb, np.float64)
    eb.loss().backward()
    for name, p in eb.named_parameters():
        assert (p.grad is not None) == (name == "quantiles"), name

    def aux(quantiles):
        with parameters_replaced(eb, [quantiles] + eb.parameters()[1:]):
            return eb.loss()

    quantiles = eb.quantiles.numpy() + rng.uniform(-1, 1, eb.quantiles.shape)
    gradcheck(aux, [quantiles])


def test_aux_loss_learns_the_quantiles(rng):
    eb = randomize(EntropyBottleneck(3, rng=rng, device="numpy"), rng)
    opt = gf.optim.Adam([eb.quantiles], lr=1.0)     # the tails lie ~100 units out
    first = eb.loss().item()
    for _ in range(400):
        opt.zero_grad()
        eb.loss().backward()
        opt.step()
    assert eb.loss().item() < 0.01 * first
    # The CDF logits at the quantiles reach their targets: -t, 0 (the median), +t.
    logits = eb.logits_cumulative(eb.quantiles).numpy()[:, 0]
    np.testing.assert_allclose(logits, np.tile(eb.target.numpy(), (3, 1)), atol=0.3)


def test_evaluation_rounds_around_the_medians(rng):
    eb = EntropyBottleneck(3, rng=rng, device="numpy")
    medians = np.array([0.3, -0.25, 0.0])
    state = eb.state_dict()
    state["quantiles"][:, 0, 1] = medians
    eb.load_state_dict(state)
    eb.eval()
    y = gf.tensor(rng.normal(0, 3, (2, 3, 4, 4)), device="numpy", requires_grad=True)
    y_hat, likelihoods = eb(y)
    offsets = y_hat.numpy() - medians.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(offsets, np.round(offsets), atol=1e-5)
    assert np.all(np.abs(y_hat.numpy() - y.numpy()) <= 0.5 + 1e-5)
    y_hat.sum().backward()                       # rounding passes the gradient straight through
    np.testing.assert_array_equal(y.grad.numpy(), 1.0)
    assert likelihoods.shape == y.shape


def test_training_noise_follows_the_key(rng):
    eb = EntropyBottleneck(3, rng=rng, device="numpy")
    y = gf.tensor(rng.normal(0, 3, (2, 3, 4, 4)), device="numpy")
    a, _ = eb(y, noise_key=5, noise_stream=9)
    b, _ = eb(y, noise_key=5, noise_stream=9)
    c, _ = eb(y, noise_key=5, noise_stream=10)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())
    assert np.all(np.abs(a.numpy() - y.numpy()) <= 0.5)


# -------------------------------------------------------- whole model --
def test_rate_distortion_loss_gradient_of_the_whole_model(rng):
    model = randomize(FactorizedPrior(3, 4, rng=rng, device="numpy"), rng)
    cast_module(model, np.float64)
    criterion = RateDistortionLoss(lmbda=0.01)

    def loss(x, *tensors):
        with parameters_replaced(model, tensors):
            return criterion(model(x, noise_key=42, noise_stream=7), x)["loss"]

    x = rng.random((2, 3, 16, 16))
    gradcheck(loss, [x] + [p.numpy() for p in model.parameters()], directions=1,
              full_jacobian_max=0, rtol=1e-5)


def test_load_compressai_state_dict(rng):
    source = randomize(FactorizedPrior(4, 6, rng=rng, device="numpy"), rng)
    state = source.state_dict()
    # CompressAI's extra buffers and its pre-1.2 entropy-bottleneck names.
    state["g_a.1.beta_reparam.pedestal"] = np.array([2.0 ** -36])
    state["entropy_bottleneck._quantized_cdf"] = np.zeros((6, 10), np.int32)
    state["entropy_bottleneck._matrix2"] = state.pop("entropy_bottleneck.matrices.2")
    target = FactorizedPrior(4, 6, seed=1, device="numpy")
    skipped = load_compressai_state_dict(target, state)
    assert sorted(skipped) == ["entropy_bottleneck._quantized_cdf", "g_a.1.beta_reparam.pedestal"]
    loaded = target.state_dict()
    for name, value in source.state_dict().items():
        np.testing.assert_array_equal(loaded[name], value.astype(np.float32))


# ------------------------------------------------------------------ GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("n, m, side", [(8, 12, 32), (64, 96, 64)])
def test_cuda_training_step_matches_numpy(n, m, side, rng):
    """Loss and every gradient of a training step (same batch, same noise) on
    CUDA (float32) against NumPy (float64), within 1e-4 relative."""
    source = randomize(FactorizedPrior(n, m, rng=rng, device="numpy"), rng)
    assert_cuda_training_step_matches_numpy(FactorizedPrior, source, rng, side)
