"""Fault cases of the core (issue #30, items 6 and 8): an ONNX file whose nodes gdnflow
cannot run is refused when read by ``gdnflow convert`` (one line naming the node, its
operator and the attribute) and ``gdnflow info`` says so; complex data is refused by name."""
import subprocess
import sys

import pytest

from fault_kit import assert_one_line_error, fingerprint

onnx = pytest.importorskip("onnx")


@pytest.fixture
def dilated_pool_onnx(tmp_path):
    """A small valid ONNX classifier head whose MaxPool 'pool1' is dilated (gdnflow's
    pooling is not)."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu1"),
             helper.make_node("MaxPool", ["a"], ["y"], name="pool1", kernel_shape=[2, 2],
                              strides=[2, 2], dilations=[2, 2])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 2, 2])])
    path = tmp_path / "dilated.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_convert_refuses_a_dilated_pool_naming_the_node(cli, tmp_path, dilated_pool_onnx):
    before = fingerprint(tmp_path)
    result = cli("convert", dilated_pool_onnx, tmp_path / "out.h5")
    assert_one_line_error(result, "convert", "dilated.onnx", "node pool1 (MaxPool)",
                          "dilations=[2, 2]")
    assert fingerprint(tmp_path) == before          # nothing written, the input unchanged


def test_info_says_a_dilated_pool_does_not_run_naming_the_node(cli, tmp_path, dilated_pool_onnx):
    before = fingerprint(tmp_path)
    result = cli("info", dilated_pool_onnx)
    assert result.returncode == 0 and not result.stderr, result.stderr     # a description
    assert ("runs in gdnflow: no: node pool1 (MaxPool): dilations=[2, 2] (no dilation) is not "
            "supported" in result.stdout.splitlines())
    assert fingerprint(tmp_path) == before


def test_complex_data_is_refused_by_dtype_in_a_new_process(tmp_path):
    script = ("import numpy as np, gdnflow as gf\n"
              "t = gf.tensor([1.0, 2.0], device='numpy')\n"
              "for make in (lambda: gf.tensor([1 + 2j]), lambda: t + np.array([1j, 0])):\n"
              "    try:\n"
              "        make()\n"
              "    except gf.DTypeError as exc:\n"
              "        print(exc)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={"GDNFLOW_DEVICE": "numpy",
                                                         "PATH": "/usr/bin:/bin"})
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and len(lines) == 2, result.stderr
    assert all("complex data (dtype complex128)" in line for line in lines)
