"""The softshrink plugin: forward against a loop, gradients, CUDA against NumPy, discovery."""
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import plugins, registry
from gdnflow.errors import ShapeError
from gdnflow.testing import assert_backends_match, gradcheck

import gdnflow_softshrink
from gdnflow_softshrink import SoftShrink, SoftShrinkOp, soft_shrink

TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "train_denoiser.py"


def training_example():
    """train_denoiser.py, beside the package (a script, not part of it)."""
    spec = importlib.util.spec_from_file_location("train_denoiser", TRAIN_SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def naive_soft_shrink(x, theta):
    y = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        magnitude = abs(x[index]) - theta[index[1]]
        y[index] = np.sign(x[index]) * magnitude if magnitude > 0 else 0.0
    return y


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 2), (1, 4, 7)])
def test_forward_matches_a_loop(shape):
    rng = np.random.default_rng(len(shape))
    x, theta = rng.standard_normal(shape), rng.uniform(0, 1, shape[1])
    y = soft_shrink(gf.tensor(x, device="numpy", dtype=np.float64),
                    gf.tensor(theta, device="numpy", dtype=np.float64))
    np.testing.assert_allclose(y.numpy(), naive_soft_shrink(x, theta), rtol=1e-12)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 2), (1, 4, 7)])
def test_gradients_match_finite_differences(shape):
    rng = np.random.default_rng(10 + len(shape))
    # Thresholds of either sign: a negative one lets everything through, shifted.
    gradcheck(soft_shrink, [rng.standard_normal(shape), rng.uniform(-0.3, 0.8, shape[1])])
    gradcheck(soft_shrink, [rng.standard_normal(shape), rng.uniform(0.1, 0.8, shape[1])],
              requires_grad=[True, False])


def test_plugin_check_passes():
    lines = plugins.check_operator(SoftShrinkOp)
    assert lines[0].startswith("gradcheck (numpy, float64): passed")


def test_shapes_are_checked():
    x = gf.zeros((2, 3, 4, 4), device="numpy")
    with pytest.raises(ShapeError, match=r"theta \(C,\).*theta \(4,\)"):
        soft_shrink(x, gf.zeros((4,), device="numpy"))


def test_layer_learns_its_thresholds():
    layer = SoftShrink(3, threshold=0.5, device="numpy")
    x = gf.tensor(np.random.default_rng(0).standard_normal((2, 3, 4, 4)), device="numpy")
    layer(x).sum().backward()
    assert [name for name, _ in layer.named_parameters()] == ["theta"]
    assert layer.theta.grad.shape == (3,) and np.any(layer.theta.grad.numpy() != 0)


def test_training_example_reduces_the_loss():
    example = training_example()
    losses = example.train(steps=30, log=None)
    assert losses[-1] < 0.5 * losses[0], losses


def test_installed_plugin_is_discovered():
    records = {p.name: p for p in plugins.load_installed()}
    assert "softshrink" in records, f"entry point missing; found {sorted(records)}"
    plugin = records["softshrink"]
    assert plugin.loaded, plugin.error
    assert plugin.operators() == ["softshrink"]
    assert registry.get("softshrink") is SoftShrinkOp
    # The kernel ships as package data, beside the module that loads it.
    package = Path(gdnflow_softshrink.__file__).resolve().parent
    assert [p.name for p in plugin.sources()] == ["softshrink.cu"]
    assert (package / "softshrink.cu").is_file()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_kernels_compile():
    assert [p.name for p in plugins.compile_check("softshrink")] == ["softshrink.cu"]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 16, 33, 17), (3, 2), (1, 300, 1, 1)])
def test_cuda_matches_numpy(shape):
    rng = np.random.default_rng(sum(shape))
    assert_backends_match(soft_shrink, [rng.standard_normal(shape), rng.uniform(0, 1, shape[1])])


@pytest.mark.gpu
def test_training_example_runs_on_cuda():
    example = training_example()
    losses = example.train(steps=30, device="cuda", log=None)
    assert losses[-1] < 0.5 * losses[0], losses


def test_imports_from_onnx_custom_domain(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from gdnflow.io.onnx import load

    rng = np.random.default_rng(5)
    theta = rng.uniform(0.1, 0.5, 3).astype(np.float32)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 4])
    node = helper.make_node("SoftShrink", ["x", "theta"], ["s"], domain="org.gdnflow.examples")
    relu = helper.make_node("Relu", ["s"], ["y"])
    graph = helper.make_graph([node, relu], "g", [x_info], [y_info],
                              initializer=[numpy_helper.from_array(theta, "theta")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("org.gdnflow.examples", 1)])
    path = tmp_path / "softshrink.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    got = load(path, device="numpy")(gf.tensor(x, device="numpy")).numpy()
    np.testing.assert_allclose(got, np.maximum(naive_soft_shrink(x, theta), 0), rtol=1e-6)
