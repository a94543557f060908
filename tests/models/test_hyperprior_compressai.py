"""The scale hyperprior against CompressAI's (1.2.8): its state dict loads, and the
evaluation-mode forward gives CompressAI's outputs, on NumPy and on CUDA.

The reference is a committed fixture, written where PyTorch and CompressAI are
installed by tests/fixtures/make_hyperprior_fixture.py (its docstring says
what it holds): ScaleHyperprior(8, 12) with its weights moved off their
initialisation, one 64x128 image, CompressAI's outputs.
"""
from pathlib import Path

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.models import ScaleHyperprior
from gdnflow.models.compression import load_compressai_state_dict
from gdnflow.ops.gdn.parametrize import PEDESTAL
from gdnflow.testing import relative_error
from gdnflow.train.losses import RateDistortionLoss

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "hyperprior"
           / "compressai_scale_hyperprior.npz")
DEVICES = ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)]
GDN_LAYERS = ("g_a.1", "g_a.3", "g_a.5", "g_s.1", "g_s.3", "g_s.5")
#: CompressAI 1.2.8's buffers without a gdnflow counterpart: each GDN's
#: NonNegativeParametrizer constants, each entropy model's LowerBound
#: constants and coder tables (empty before ``update()``), the Gaussian
#: conditional's scale table and bound.
SKIPPED = sorted(
    [f"{layer}.{param}_reparam.{buffer}" for layer in GDN_LAYERS for param in ("beta", "gamma")
     for buffer in ("pedestal", "lower_bound.bound")]
    + [f"entropy_bottleneck.{buffer}" for buffer in
       ("_offset", "_quantized_cdf", "_cdf_length", "likelihood_lower_bound.bound")]
    + [f"gaussian_conditional.{buffer}" for buffer in
       ("_offset", "_quantized_cdf", "_cdf_length", "likelihood_lower_bound.bound",
        "lower_bound_scale.bound", "scale_table", "scale_bound")])
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference():
    """The fixture's arrays; its CompressAI state dict under "state" (names without the prefix)."""
    if not FIXTURE.exists():
        pytest.skip(f"{FIXTURE.relative_to(Path(__file__).resolve().parents[2])} is missing: "
                    "run tests/fixtures/make_hyperprior_fixture.py where torch and CompressAI are")
    with np.load(FIXTURE) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["state"] = {name[len("state/"):]: arrays.pop(name) for name in list(arrays)
                       if name.startswith("state/")}
    return arrays


def loaded_model(reference, device):
    """ScaleHyperprior(8, 12) on ``device`` holding the fixture's weights, and the skipped names."""
    model = ScaleHyperprior(8, 12, seed=0, device=device)
    skipped = load_compressai_state_dict(model, reference["state"])
    return model, skipped


def test_skipped_buffers_are_the_constants_gdnflow_fixes(reference):
    model, skipped = loaded_model(reference, "numpy")
    assert sorted(skipped) == SKIPPED, f"fixture from CompressAI {reference['compressai_version']}"
    state = reference["state"]
    for layer in GDN_LAYERS:
        transform, index = layer.split(".")
        gdn = getattr(model, transform)[int(index)]
        for param in ("beta", "gamma"):
            reparam = getattr(gdn, f"{param}_reparam")
            np.testing.assert_allclose(state[f"{layer}.{param}_reparam.pedestal"], [PEDESTAL],
                                       rtol=1e-6)
            np.testing.assert_allclose(state[f"{layer}.{param}_reparam.lower_bound.bound"],
                                       [reparam.bound], rtol=1e-6)
    for name in ("entropy_bottleneck", "gaussian_conditional"):
        bound = getattr(model, name).likelihood_bound
        np.testing.assert_allclose(state[f"{name}.likelihood_lower_bound.bound"], [bound],
                                   rtol=1e-6)
        for table in ("_offset", "_quantized_cdf", "_cdf_length"):
            assert state[f"{name}.{table}"].size == 0, f"{name}.{table}"
    scale_bound = model.gaussian_conditional.scale_bound
    np.testing.assert_allclose(state["gaussian_conditional.lower_bound_scale.bound"], [scale_bound],
                               rtol=1e-6)
    np.testing.assert_allclose(state["gaussian_conditional.scale_bound"], [scale_bound], rtol=1e-6)
    assert state["gaussian_conditional.scale_table"].size == 0


def test_fixture_is_not_trivial(reference):
    """The weights are off their initialisation and the outputs exercise what they should."""
    y_hat, scales = reference["y_hat"], reference["scales"]
    assert np.abs(y_hat).max() >= 3 and np.mean(y_hat != 0) > 0.3
    assert np.mean(scales > 0.11) > 0.9
    quantiles = reference["state"]["entropy_bottleneck.quantiles"][:, 0]
    assert np.all(quantiles[:, 1] != 0)
    z_offsets = reference["z_hat"] - quantiles[:, 1].reshape(1, -1, 1, 1)
    assert len(np.unique(np.rint(z_offsets))) >= 3
    assert not np.allclose(quantiles[:, 1] - quantiles[:, 0], quantiles[:, 2] - quantiles[:, 1])
    assert np.any(reference["state"]["g_a.1.gamma"] < 0)     # effective gammas of 0


@pytest.mark.parametrize("device", DEVICES)
def test_evaluation_forward_matches_compressai(reference, device):
    model, _ = loaded_model(reference, device)
    model.eval()
    x = gf.tensor(reference["x"], device=device)
    with gf.no_grad():
        out = model(x)
        terms = RateDistortionLoss()(out, x)
    # Rounding: the fixture keeps y and z - median away from the rounding boundaries.
    np.testing.assert_array_equal(out["y_hat"].numpy(), reference["y_hat"])
    np.testing.assert_array_equal(out["z_hat"].numpy(), reference["z_hat"])
    for key in ("scales", "x_hat"):
        err = relative_error(out[key].numpy(), reference[key])
        assert err <= TOLERANCE, f"{key}: relative error {err:.2e}"
    for key in ("bpp", "mse"):
        ours, theirs = terms[key].item(), float(reference[key])
        assert abs(ours - theirs) <= TOLERANCE * abs(theirs), f"{key}: {ours} against {theirs}"
    # CompressAI's entropy bottleneck takes sigmoid(upper) - sigmoid(lower) in float32, so
    # its z likelihoods are good to a few float32 steps of 1 only, where gdnflow takes the
    # difference in the tail (gdnflow.ops.entropy.sigmoid_difference): 2^-22 absolute for z.
    for key, atol in (("y", 0.0), ("z", 2.0 ** -22)):
        ours, theirs = out["likelihoods"][key].numpy(), reference[f"{key}_likelihoods"]
        above = theirs > 1e-8
        assert above.mean() > 0.5, key
        np.testing.assert_allclose(ours[above], theirs[above], rtol=TOLERANCE, atol=atol,
                                   err_msg=f"{key} likelihoods")
