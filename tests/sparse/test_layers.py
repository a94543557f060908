"""SparseConv2d, sparsify, the dispatcher, pruned checkpoints and ``gdnflow prune``."""
import argparse
import contextlib

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import models, nn
from gdnflow.commandline import command_parser, run
from gdnflow.io import save_checkpoint
from gdnflow.ops.conv import conv_geometry
from gdnflow.sparse import (SparseConv2d, describe, describe_model, load_pruned, prune,
                            sparsify)
from gdnflow.sparse import dispatch
from gdnflow.sparse.cli import add_prune_parser
from gdnflow.sparse.prune import prunable_layers


class Tiny(nn.Module):
    """A small VGG-like model registered as a gdnflow model for the checkpoint tests."""

    def __init__(self, width=8, rng=None):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.config = {"name": "tiny", "width": width}
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, rng=rng), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, activation="relu", rng=rng),
            nn.Conv2d(2 * width, 2 * width, 3, padding=(0, 1, 1, 0), rng=rng))

    def forward(self, x):
        return self.features(x)


def tiny(width=8, device=None, rng=None):
    model = Tiny(width, rng)
    return model.to(device) if device else model


@pytest.fixture
def forced():
    """force(policy): the dispatcher's policy for the rest of the test (the knob sparse_policy)."""
    with contextlib.ExitStack() as stack:
        yield lambda policy: stack.enter_context(gf.config.override(sparse_policy=policy))


def _outputs(model, x):
    with gf.no_grad():
        return model(x).numpy()


@pytest.mark.parametrize("device", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sparsified_model_computes_the_same_function(device, rng, forced):
    model = tiny(rng=rng).to(device)
    prune(model, 0.8)
    x = gf.tensor(rng.standard_normal((2, 3, 9, 11)), device=device)
    forced("dense")
    dense = _outputs(model, x)
    order = [type(m).__name__ for m in model.features]
    names = sparsify(model)
    assert names == ["features.0", "features.2", "features.3"]
    assert [type(m).__name__ for m in model.features] == [
        "SparseConv2d" if n == "Conv2d" else n for n in order]
    assert all(isinstance(m, SparseConv2d) for _, m in prunable_layers(model))
    forced("sparse")
    np.testing.assert_allclose(_outputs(model, x), dense, rtol=1e-4, atol=1e-5)
    assert model.features[0].last_choice == "sparse"


def test_sparse_layer_trains_dense_and_keeps_parameter_names(rng, forced):
    forced("sparse")
    conv = nn.Conv2d(4, 6, 3, padding=1, rng=rng)
    prune(conv, 0.7)
    layer = SparseConv2d.from_conv(conv)
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias"]
    assert [n for n, _ in layer.named_buffers()] == ["weight_mask"]
    x = gf.tensor(rng.standard_normal((1, 4, 5, 5)))
    layer(x)                                   # weight requires grad: dense
    assert layer.last_choice == "dense"
    with gf.no_grad():
        layer(x)
    assert layer.last_choice == "sparse" and layer.density == pytest.approx(0.3, abs=0.02)


def test_new_sparse_layer_masks_its_nonzeros(rng):
    layer = SparseConv2d(3, 4, 3, padding=1, rng=rng)
    assert layer.weight_mask.numpy().all() and layer.density == 1.0


def test_weights_changed_rebuild_the_csr(rng, forced):
    forced("sparse")
    layer = SparseConv2d.from_conv(nn.Conv2d(2, 3, 3, padding=1, bias=False, rng=rng))
    x = gf.tensor(rng.standard_normal((1, 2, 4, 4)))
    first = _outputs(layer, x)
    layer.weight = nn.Parameter(2 * layer.weight.numpy())
    np.testing.assert_allclose(_outputs(layer, x), 2 * first, rtol=1e-5)


def test_dispatcher_on_numpy_is_dense_and_described(rng):
    chooser = dispatch.SparseDispatcher("auto")
    g = conv_geometry("t", (1, 8, 9, 9), (8, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert chooser.choose(g, 0.1, "numpy") == "dense"
    assert "1x8x9x9 -> 8, 3x3/1, density 0.10: dense" in chooser.describe()
    assert dispatch.SparseDispatcher("sparse").choose(g, 0.5, "numpy") == "sparse"
    with pytest.raises(ValueError, match="GDNFLOW_SPARSE"):
        dispatch.SparseDispatcher("fast")
    assert describe().startswith("sparse convolution")


def test_dispatcher_policy_from_the_knob_else_the_environment(monkeypatch):
    g = conv_geometry("t", (1, 8, 9, 9), (8, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    chooser = dispatch.SparseDispatcher()
    monkeypatch.setenv("GDNFLOW_SPARSE", "sparse")
    assert chooser.choose(g, 0.5, "numpy") == "sparse"
    with gf.config.override(sparse_policy="dense"):
        assert chooser.choose(g, 0.5, "numpy") == "dense"
        assert "forced dense" in chooser.describe()
        assert dispatch.SparseDispatcher("sparse").choose(g, 0.5, "numpy") == "sparse"
    monkeypatch.delenv("GDNFLOW_SPARSE")
    assert chooser.policy == "auto"
    with gf.config.override(sparse_policy="fast"), pytest.raises(ValueError, match="sparse_policy"):
        chooser.choose(g, 0.5, "numpy")


def test_describe_model_lists_each_sparse_layer(rng):
    model = tiny(rng=rng)
    prune(model, 0.9, per_layer=True)
    sparsify(model)
    text = describe_model(model, (1, 3, 8, 8))
    assert "features.2: density 0.100, runs dense" in text
    assert "sparse convolution" in text


@pytest.mark.gpu
def test_dispatcher_measures_both_on_the_gpu(rng):
    chooser = dispatch.SparseDispatcher("auto")
    g = conv_geometry("t", (1, 64, 28, 28), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    choice = chooser.choose(g, 0.1, "cuda")
    times = chooser.timings[(g, 0.1)]
    assert choice == min(times, key=times.get) and all(t > 0 for t in times.values())
    assert "sparse" in chooser.describe() and "ms" in chooser.describe()


# ----------------------------------------------------- checkpoints + CLI --
@pytest.fixture
def tiny_registered(monkeypatch):
    pytest.importorskip("h5py")
    monkeypatch.setitem(models.MODELS, "tiny", tiny)


def test_pruned_checkpoint_reloads_with_masks(tmp_path, rng, tiny_registered):
    model = tiny(rng=rng)
    prune(model, 0.75)
    save_checkpoint(tmp_path / "p.h5", model)
    loaded, checkpoint = load_pruned(tmp_path / "p.h5")
    assert isinstance(loaded, Tiny) and checkpoint["model_name"] == "Tiny"
    for (name, a), (_, b) in zip(prunable_layers(model), prunable_layers(loaded)):
        np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
        np.testing.assert_array_equal(a.weight_mask.numpy(), b.weight_mask.numpy())


@pytest.mark.parametrize("per_layer", [False, True])
def test_prune_command_writes_a_pruned_checkpoint(tmp_path, rng, tiny_registered, per_layer,
                                                  capsys):
    save_checkpoint(tmp_path / "model.h5", tiny(rng=rng), extra={"step": 7})
    parser = argparse.ArgumentParser()
    add_prune_parser(parser.add_subparsers(dest="command"))
    argv = ["prune", str(tmp_path / "model.h5"), "--sparsity", "0.9", "-o",
            str(tmp_path / "out.h5")] + (["--per-layer"] if per_layer else [])
    args = parser.parse_args(argv)
    assert args.run(args) == 0
    assert "all conv layers" in capsys.readouterr().out
    model, checkpoint = load_pruned(tmp_path / "out.h5")
    assert checkpoint["extra"]["step"] == 7
    assert checkpoint["extra"]["pruning"]["per_layer"] is per_layer
    counts = [(np.count_nonzero(m.weight.numpy() == 0), m.weight.size)
              for _, m in prunable_layers(model)]
    assert sum(z for z, _ in counts) == round(0.9 * sum(n for _, n in counts))
    if per_layer:
        assert all(z == round(0.9 * n) for z, n in counts)


def test_prune_command_rejects_bad_input(tmp_path, capsys):
    parser, subparsers = command_parser("gdnflow", "prune alone")
    add_prune_parser(subparsers)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["prune", "m.h5", "--sparsity", "1.5", "-o", "o.h5"])
    assert exited.value.code == 2
    assert "gdnflow prune: --sparsity: expected a number in [0, 1), got '1.5'" in (
        capsys.readouterr().err)
    assert run(parser, ["prune", str(tmp_path / "none.h5"), "--sparsity", "0.5",
                        "-o", str(tmp_path / "o.h5")]) == 1
    assert f"gdnflow prune: {tmp_path / 'none.h5'}: no such file" in capsys.readouterr().err
