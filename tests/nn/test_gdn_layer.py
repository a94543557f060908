"""The GDN layer: initialisation (CompressAI's stored values and the closed
form), shape errors, gradients through the reparameterisation (fused into the
GDN operator, and against the composed operators), and the comparison with
CompressAI's GDN where PyTorch and CompressAI are installed."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.nn import GDN
from gdnflow.ops.gdn import GDNOp
from gdnflow.ops.gdn.parametrize import PEDESTAL
from gdnflow.testing import assert_backends_match, gradcheck, relative_error

VARIANTS = [(False, False), (True, False), (False, True), (True, True)]
VARIANT_IDS = ["gdn", "igdn", "gdn_simplified", "igdn_simplified"]
DEVICES = ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)]

CLOSED_FORMS = {
    (False, False): lambda x: x / np.sqrt(1 + 0.1 * x ** 2),
    (True, False): lambda x: x * np.sqrt(1 + 0.1 * x ** 2),
    (False, True): lambda x: x / (1 + 0.1 * np.abs(x)),
    (True, True): lambda x: x * (1 + 0.1 * np.abs(x)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_closed_form_at_initialisation(variant, device, rng):
    layer = GDN(6, inverse=variant[0], simplified=variant[1]).to(device)
    x = 3 * rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    y = layer(gf.tensor(x, device=device)).numpy()
    np.testing.assert_allclose(y, CLOSED_FORMS[variant](x.astype(np.float64)), rtol=1e-5)


def test_parameters_are_stored_as_compressai_stores_them():
    layer = GDN(4).to("numpy")
    assert [name for name, _ in layer.named_parameters()] == ["beta", "gamma"]
    beta, gamma = layer.beta.numpy(), layer.gamma.numpy()
    assert beta.shape == (4,) and gamma.shape == (4, 4)
    assert beta.dtype == gamma.dtype == np.float32
    np.testing.assert_allclose(beta, np.sqrt(1 + PEDESTAL), rtol=1e-7)
    np.testing.assert_allclose(np.diag(gamma), np.sqrt(0.1 + PEDESTAL), rtol=1e-7)
    off_diagonal = gamma[~np.eye(4, dtype=bool)]
    assert np.all(off_diagonal == np.float32(2.0 ** -18))


def test_effective_parameters_at_initialisation():
    layer = GDN(4, gamma_init=0.25).to("numpy")
    np.testing.assert_allclose(layer.effective_beta.numpy(), np.ones(4), rtol=1e-6)
    gamma = layer.effective_gamma.numpy()
    np.testing.assert_allclose(np.diag(gamma), 0.25, rtol=1e-6)
    assert np.all(gamma[~np.eye(4, dtype=bool)] == 0.0)


def test_beta_min_bounds_the_effective_beta():
    layer = GDN(3, beta_min=0.5).to("numpy")
    layer.load_state_dict({"beta": np.array([0.0, 0.1, 2.0]), "gamma": layer.gamma.numpy()})
    np.testing.assert_allclose(layer.effective_beta.numpy(), [0.5, 0.5, 4.0 - PEDESTAL], rtol=1e-6)


def test_wrong_channel_count_names_layer_and_shapes():
    layer = GDN(3, inverse=True).to("numpy")
    with pytest.raises(gf.ShapeError, match=r"GDN\(3, inverse=True\): expected input of shape "
                                            r"\(N, 3, H, W\), got \(2, 4, 5, 5\)"):
        layer(gf.zeros((2, 4, 5, 5), device="numpy"))


def test_non_4d_input_names_layer_and_shapes():
    layer = GDN(3).to("numpy")
    with pytest.raises(gf.ShapeError, match=r"GDN\(3\): expected input of shape \(N, 3, H, W\), "
                                            r"got \(3, 5, 5\)"):
        layer(gf.zeros((3, 5, 5), device="numpy"))


def test_channels_must_be_positive():
    with pytest.raises(ValueError, match="channels"):
        GDN(0)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_gradients_through_the_reparameterisation(variant, rng):
    # The layer's own computation, in float64: its parametrizers, then gdn.
    layer = GDN(3, inverse=variant[0], simplified=variant[1])

    def fn(x, stored_beta, stored_gamma):
        return ops.gdn(x, layer.beta_reparam(stored_beta), layer.gamma_reparam(stored_gamma),
                       inverse=variant[0], simplified=variant[1])

    x = rng.standard_normal((2, 3, 5, 7))
    x = np.sign(x) * (np.abs(x) + 0.05)
    gradcheck(fn, [x, rng.uniform(0.5, 1.5, 3), rng.uniform(0.05, 0.7, (3, 3))], directions=4)


def layer_fn(layer):
    """What the layer's forward computes, as a function of x and the stored
    beta and gamma: the GDN operator with the reparameterisation fused in."""
    bounds = (layer.beta_reparam.bound, layer.gamma_reparam.bound, PEDESTAL)
    return lambda x, beta, gamma: ops.gdn(x, beta, gamma, inverse=layer.inverse,
                                          simplified=layer.simplified, parametrized=bounds)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_gradients_through_the_fused_reparameterisation(variant, rng):
    layer = GDN(3, inverse=variant[0], simplified=variant[1])
    x = rng.standard_normal((2, 3, 5, 7))
    x = np.sign(x) * (np.abs(x) + 0.05)
    gradcheck(layer_fn(layer), [x, rng.uniform(0.5, 1.5, 3), rng.uniform(0.05, 0.7, (3, 3))],
              directions=4)


def test_forward_is_one_operator_on_the_stored_parameters(rng):
    # One autograd node per layer: the GDN operator reads the parameters
    # themselves, not reparameterised copies.
    layer = GDN(4, simplified=True).to("numpy")
    y = layer(gf.tensor(rng.standard_normal((1, 4, 3, 3)), device="numpy", requires_grad=True))
    op = y.creator
    assert type(op) is GDNOp and op.variant == "gdn_simplified"
    assert op.parametrized == (layer.beta_reparam.bound, layer.gamma_reparam.bound, PEDESTAL)
    assert op.parents[1] is layer.beta and op.parents[2] is layer.gamma


def below_the_bounds(layer, rng):
    """A state dict with beta and gamma away from initialisation, about a third of
    each stored below its bound (where the gradient passes only when negative)."""
    channels = layer.channels
    beta = layer.beta_reparam.init(rng.uniform(0.5, 1.5, channels))
    gamma = layer.gamma_reparam.init(rng.uniform(0.0, 2.0 / channels, (channels, channels)))
    for p, bound in ((beta, layer.beta_reparam.bound), (gamma, layer.gamma_reparam.bound)):
        mask = rng.uniform(size=p.shape) < 0.3
        p[mask] = bound - rng.uniform(0.05, 0.5, np.count_nonzero(mask))
    return {"beta": beta, "gamma": gamma}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_layer_equals_the_composed_operators(variant, device, rng):
    # The layer's output and gradients are those of its parametrizers
    # followed by gdn (the layer's forward before the fusion).
    channels = 7
    layer = GDN(channels, inverse=variant[0], simplified=variant[1], beta_min=0.1).to(device)
    layer.load_state_dict(below_the_bounds(layer, rng))
    x = rng.standard_normal((2, channels, 4, 6)).astype(np.float32)
    gy = gf.tensor(rng.standard_normal(x.shape), device=device)
    results = []
    for composed in (False, True):
        layer.zero_grad()
        xt = gf.tensor(x, device=device, requires_grad=True)
        if composed:
            y = ops.gdn(xt, layer.effective_beta, layer.effective_gamma,
                        inverse=variant[0], simplified=variant[1])
        else:
            y = layer(xt)
        y.backward(gy)
        results.append([y.numpy(), xt.grad.numpy(), layer.beta.grad.numpy(),
                        layer.gamma.grad.numpy()])
    for name, fused, composed in zip(["output", "input gradient", "stored beta gradient",
                                      "stored gamma gradient"], *results):
        error = relative_error(fused, composed)
        assert error <= 1e-6, f"{name}: relative error {error:.3g}"


def test_backward_reaches_the_stored_parameters(rng):
    layer = GDN(5).to("numpy")
    x = gf.tensor(rng.standard_normal((2, 5, 3, 4)), device="numpy", requires_grad=True)
    layer(x).sum().backward()
    assert layer.beta.grad.shape == (5,)
    assert layer.gamma.grad.shape == (5, 5)
    assert x.grad.shape == (2, 5, 3, 4)
    # At initialisation the off-diagonal gamma sits on its bound; it still
    # gets the (negative) gradients that move it up off the bound.
    assert np.all(np.isfinite(layer.gamma.grad.numpy()))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_layer_cuda_matches_numpy(variant, rng):
    layer = GDN(192, inverse=variant[0], simplified=variant[1])
    beta = layer.beta_reparam.init(rng.uniform(0.5, 1.5, 192))
    gamma = layer.gamma_reparam.init(rng.uniform(0.0, 0.02, (192, 192)))

    def fn(x, stored_beta, stored_gamma):
        return ops.gdn(x, layer.beta_reparam(stored_beta), layer.gamma_reparam(stored_gamma),
                       inverse=variant[0], simplified=variant[1])

    assert_backends_match(fn, [rng.standard_normal((2, 192, 17, 19)), beta, gamma], rtol=1e-4)
    assert_backends_match(layer_fn(layer), [rng.standard_normal((2, 192, 17, 19)), beta, gamma],
                          rtol=1e-4)


# ------------------------------------------------------------- CompressAI --
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inverse", [False, True], ids=["gdn", "igdn"])
@pytest.mark.parametrize("channels", [7, 192])
# 9 x 11: the cuBLAS path on the GPU; 12 x 20 (H*W % 4 == 0) at C = 192: the
# fused kernels, the last block of each image partly past its end.
@pytest.mark.parametrize("size", [(9, 11), (12, 20)], ids=["9x11", "12x20"])
def test_matches_compressai(size, channels, inverse, device, rng):
    torch = pytest.importorskip("torch")
    compressai_layers = pytest.importorskip("compressai.layers")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch_device = "cuda" if device == "cuda" else "cpu"

    ours = GDN(channels, inverse=inverse).to(device)
    # Away from the initialisation: random beta, non-symmetric gamma with
    # some entries on their bound (0).
    gamma = rng.uniform(0.0, 2.0 / channels, (channels, channels))
    gamma[rng.uniform(size=gamma.shape) < 0.2] = 0.0
    ours.load_state_dict({"beta": ours.beta_reparam.init(rng.uniform(0.5, 1.5, channels)),
                          "gamma": ours.gamma_reparam.init(gamma)})
    theirs = compressai_layers.GDN(channels, inverse=inverse, beta_min=1e-6, gamma_init=0.1)
    with torch.no_grad():       # the same stored values give the same effective ones
        theirs.beta.copy_(torch.from_numpy(ours.beta.numpy()))
        theirs.gamma.copy_(torch.from_numpy(ours.gamma.numpy()))
    theirs.to(torch_device)
    with torch.no_grad():
        np.testing.assert_allclose(theirs.beta_reparam(theirs.beta).cpu().numpy(),
                                   ours.effective_beta.numpy(), rtol=1e-6)
        np.testing.assert_allclose(theirs.gamma_reparam(theirs.gamma).cpu().numpy(),
                                   ours.effective_gamma.numpy(), rtol=1e-6, atol=1e-12)

    x = rng.standard_normal((2, channels, *size)).astype(np.float32)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    x_ours = gf.tensor(x, device=device, requires_grad=True)
    ours(x_ours).backward(gf.tensor(gy, device=device))
    y_ours = ours(gf.tensor(x, device=device)).numpy()
    x_theirs = torch.tensor(x, device=torch_device, requires_grad=True)
    y_theirs = theirs(x_theirs)
    y_theirs.backward(torch.tensor(gy, device=torch_device))

    for name, got, want in [
            ("output", y_ours, y_theirs.detach().cpu().numpy()),
            ("input gradient", x_ours.grad.numpy(), x_theirs.grad.cpu().numpy()),
            ("stored beta gradient", ours.beta.grad.numpy(), theirs.beta.grad.cpu().numpy()),
            ("stored gamma gradient", ours.gamma.grad.numpy(), theirs.gamma.grad.cpu().numpy())]:
        error = relative_error(got, want)
        assert error <= 1e-4, f"{name}: relative error {error:.3g}"
