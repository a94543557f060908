"""Layers: each against its formula or functional operator, parameter and
buffer names, shape errors naming the layer, Sequential's container
behaviour, and a small classifier head trained one step on both backends."""
import copy

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import nn, ops


def t(a, requires_grad=False):
    return gf.tensor(a, device="numpy", requires_grad=requires_grad)


# ----------------------------------------------------------------- Linear --
def test_linear_computes_x_wT_plus_b(rng):
    layer = nn.Linear(5, 3, rng=rng).to("numpy")
    x = rng.standard_normal((4, 5)).astype(np.float32)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    np.testing.assert_allclose(layer(t(x)).numpy(), x @ w.T + b, rtol=1e-5)
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias"]
    assert w.shape == (3, 5) and b.shape == (3,)


def test_linear_initialisation_is_pytorchs_uniform_bound(rng):
    layer = nn.Linear(400, 300, rng=rng)
    w = layer.weight.numpy()
    assert np.abs(w).max() <= 1 / 20 and np.abs(w).max() > 0.95 / 20
    assert abs(w.std() - (1 / 20) / np.sqrt(3)) < 1e-3


def test_linear_without_bias(rng):
    layer = nn.Linear(3, 2, bias=False, rng=rng).to("numpy")
    assert [n for n, _ in layer.named_parameters()] == ["weight"]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(layer(t(x)).numpy(), x @ layer.weight.numpy().T, rtol=1e-5)


def test_linear_shape_error_names_layer_expected_and_actual():
    with pytest.raises(gf.ShapeError, match=r"Linear\(in_features=4, out_features=2, bias=True\): "
                                            r"expected input of shape \(\.\.\., 4\), got \(3, 5\)"):
        nn.Linear(4, 2)(t(np.zeros((3, 5))))


# ------------------------------------------------------------ BatchNorm2d --
def test_batch_norm_layer_parameters_buffers_and_state_dict():
    layer = nn.BatchNorm2d(3)
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias"]
    assert [n for n, _ in layer.named_buffers()] == ["running_mean", "running_var"]
    state = layer.state_dict()
    assert list(state) == ["weight", "bias", "running_mean", "running_var"]
    np.testing.assert_array_equal(state["running_mean"], np.zeros(3))
    np.testing.assert_array_equal(state["running_var"], np.ones(3))


def test_batch_norm_layer_trains_on_batch_statistics_and_infers_on_running_ones(rng):
    layer = nn.BatchNorm2d(2, momentum=0.25).to("numpy")
    x = (2 * rng.standard_normal((4, 2, 3, 5)) + 1).astype(np.float32)
    y = layer(t(x)).numpy()
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(y, (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5),
                               rtol=1e-4, atol=1e-5)
    # PyTorch's update, written out: 0.75 * old + 0.25 * batch (unbiased variance).
    np.testing.assert_allclose(layer.running_mean.numpy(), 0.25 * mean, rtol=1e-5)
    np.testing.assert_allclose(layer.running_var.numpy(), 0.75 + 0.25 * var * 60 / 59, rtol=1e-5)
    layer.eval()
    running = layer.running_mean.numpy().copy(), layer.running_var.numpy().copy()
    y = layer(t(x)).numpy()
    want = (x - running[0][:, None, None]) / np.sqrt(running[1][:, None, None] + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(layer.running_mean.numpy(), running[0])


def test_batch_norm_layer_shape_error():
    with pytest.raises(gf.ShapeError, match=r"BatchNorm2d\(4, eps=1e-05, momentum=0.1\): "
                                            r"expected input of shape \(N, 4, H, W\), got "
                                            r"\(2, 3, 5, 5\)"):
        nn.BatchNorm2d(4)(t(np.zeros((2, 3, 5, 5))))


# ------------------------------------------------- activations and pools --
def test_activations(rng):
    x = rng.uniform(-8, 8, (3, 4)).astype(np.float32)
    np.testing.assert_array_equal(nn.ReLU()(t(x)).numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(nn.ReLU6()(t(x)).numpy(), np.clip(x, 0, 6))


def test_pool_layers_call_their_operators(rng):
    x = t(rng.standard_normal((2, 3, 9, 7)))
    np.testing.assert_array_equal(nn.MaxPool2d(3, 2, 1)(x).numpy(),
                                  ops.max_pool2d(x, 3, 2, 1).numpy())
    np.testing.assert_array_equal(nn.AvgPool2d(2, padding=1, count_include_pad=False)(x).numpy(),
                                  ops.avg_pool2d(x, 2, 2, 1, False).numpy())
    assert nn.MaxPool2d(2)(x).shape == (2, 3, 4, 3)
    y = nn.GlobalAvgPool2d()(x)
    assert y.shape == (2, 3, 1, 1)
    np.testing.assert_allclose(y.numpy()[..., 0, 0], x.numpy().mean(axis=(2, 3)), rtol=1e-5)


@pytest.mark.parametrize("layer, name", [(nn.MaxPool2d(2), r"MaxPool2d\(kernel_size=2"),
                                         (nn.AvgPool2d(3), r"AvgPool2d\(kernel_size=3"),
                                         (nn.GlobalAvgPool2d(), r"GlobalAvgPool2d\(\)")])
def test_pool_layers_shape_errors(layer, name):
    with pytest.raises(gf.ShapeError, match=name + r".*: expected input of shape \(N, C, H, W\), "
                                                   r"got \(3, 8, 8\)"):
        layer(t(np.zeros((3, 8, 8))))


def test_pool_layer_with_bad_padding_fails_when_built():
    with pytest.raises(ValueError, match="max_pool2d: padding"):
        nn.MaxPool2d(2, padding=2)


# --------------------------------------------- flatten, dropout, softmax --
def test_flatten_identity_softmax(rng):
    x = t(rng.standard_normal((2, 3, 4, 5)))
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(2)(x).shape == (2, 3, 20)
    assert nn.Identity()(x) is x
    y = nn.Softmax(axis=1)(x).numpy()
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(nn.LogSoftmax(1)(x).numpy(), np.log(y), rtol=1e-4, atol=1e-5)
    with pytest.raises(gf.ShapeError, match=r"Softmax\(axis=4\): expected an input with an axis "
                                            r"4, got shape \(2, 3, 4, 5\)"):
        nn.Softmax(4)(x)


def test_dropout_layer_trains_with_its_own_seeded_generator_and_is_identity_in_eval(rng):
    x = t(np.ones((50, 40)))
    a, b = nn.Dropout(0.5, seed=1), nn.Dropout(0.5, seed=1)
    ya, yb = a(x).numpy(), b(x).numpy()
    np.testing.assert_array_equal(ya, yb)
    assert set(np.unique(ya)) == {0.0, 2.0}
    assert not np.array_equal(a(x).numpy(), ya)         # a new mask each call
    assert a.eval()(x) is x


# ------------------------------------------------------------- Sequential --
def test_sequential_indexing_names_and_state_dict(rng):
    model = nn.Sequential(nn.Linear(4, 3, rng=rng), nn.ReLU(), nn.Linear(3, 2, rng=rng))
    assert len(model) == 3
    assert isinstance(model[0], nn.Linear) and model[-1] is model[2]
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear"]
    head = model[1:]
    assert isinstance(head, nn.Sequential) and len(head) == 2 and head[1] is model[2]
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    x = t(rng.standard_normal((5, 4)))
    np.testing.assert_allclose(model(x).numpy(), model[2](model[1](model[0](x))).numpy())
    with pytest.raises(IndexError, match="index 3 out of range for 3 modules"):
        model[3]
    with pytest.raises(TypeError, match="expected a Module, got int"):
        model.append(3)


def test_sequential_repr_nests():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU6()))
    assert repr(model) == ("Sequential(\n  (0): Linear(in_features=2, out_features=2, bias=True)\n"
                           "  (1): Sequential(\n    (0): ReLU6()\n  )\n)")


def test_nested_sequential_state_dict_holds_buffers():
    model = nn.Sequential(nn.Sequential(nn.BatchNorm2d(2)), nn.ReLU())
    assert list(model.state_dict()) == ["0.0.weight", "0.0.bias", "0.0.running_mean",
                                        "0.0.running_var"]


# ----------------------------------------------------- a classifier head --
def classifier_head(rng):
    """MobileNetV2's head in miniature: BN, ReLU6, global pool, dropout, linear."""
    return nn.Sequential(nn.BatchNorm2d(6), nn.ReLU6(), nn.MaxPool2d(2), nn.GlobalAvgPool2d(),
                         nn.Flatten(), nn.Dropout(0.2, seed=3), nn.Linear(6, 4, rng=rng),
                         nn.LogSoftmax())


def one_step(model, x, device):
    """Forward, a loss of -mean(log p[class 0]), backward; returns (log p, {name: grad})."""
    out = model(gf.tensor(x, device=device))
    loss = -ops.mean(ops.reshape(out, (-1, 4)) * gf.tensor(np.eye(4)[[0] * len(x)], device=device))
    loss.backward()
    return out.numpy(), {n: p.grad.numpy() for n, p in model.named_parameters()}


def test_classifier_head_trains_one_step(rng):
    model = classifier_head(rng).to("numpy")
    out, grads = one_step(model, rng.standard_normal((3, 6, 9, 9)).astype(np.float32), "numpy")
    np.testing.assert_allclose(np.exp(out).sum(axis=1), 1, rtol=1e-5)
    assert set(grads) == {"0.weight", "0.bias", "6.weight", "6.bias"}
    assert all(np.any(g != 0) for g in grads.values())
    assert np.any(model[0].running_mean.numpy() != 0)


@pytest.mark.gpu
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_classifier_head_matches_across_backends(training, rng):
    model = classifier_head(rng).train(training).to("numpy")
    gpu_model = copy.deepcopy(model).to("cuda")
    x = rng.standard_normal((3, 6, 9, 9)).astype(np.float32)
    out, grads = one_step(model, x, "numpy")
    gpu_out, gpu_grads = one_step(gpu_model, x, "cuda")
    np.testing.assert_allclose(gpu_out, out, rtol=1e-4, atol=1e-5)
    for name in grads:
        np.testing.assert_allclose(gpu_grads[name], grads[name], rtol=1e-4, atol=1e-5)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(gpu_model.state_dict()[name], value, rtol=1e-5, atol=1e-6)
