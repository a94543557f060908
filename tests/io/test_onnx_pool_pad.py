"""ceil_mode pooling and Pad's edge, reflect and wrap modes as the importer composes
them (gdnflow/io/onnx_ops_core.py), against onnxruntime on small odd-sized inputs:
the forms SqueezeNet, GoogLeNet and image-to-image exports use."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import gdnflow as gf  # noqa: E402
from gdnflow.io.onnx import OnnxImportError, OnnxModule  # noqa: E402
from gdnflow.testing import gradcheck  # noqa: E402
from onnx_graphs import graph_model, node  # noqa: E402


def onnxruntime_output(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def gdnflow_output(model, x, device="numpy"):
    with gf.no_grad():
        return OnnxModule(model, device=device)(gf.tensor(x, device=device)).numpy()


# name: (op type, attributes, input height and width)
CEIL_POOLS = {
    # The ceil window reaches one cell past the input (SqueezeNet's, GoogLeNet's form).
    "max 3x3/2, no pads": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2]), (7, 8)),
    # ceil would add a window starting in the end padding: dropped (one fewer than ceil).
    "max 2x2/2, pads 1, last window dropped": (
        "MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]), (5, 5)),
    "max 3x2, strides 3 and 2, uneven pads": (
        "MaxPool", dict(kernel_shape=[3, 2], strides=[3, 2], pads=[1, 0, 2, 1]), (8, 7)),
    "average, padding not counted": (
        "AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0]), (6, 7)),
    "average, padding counted, ceil cells not": (
        "AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 2, 0, 1],
                            count_include_pad=1), (6, 7)),
    "average, padding counted, last window dropped": (
        "AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1],
                            count_include_pad=1), (5, 5)),
    "average, no pads, counted": ("AveragePool", dict(kernel_shape=[2, 3], strides=[2, 2],
                                                      count_include_pad=1), (5, 6)),
    # VALID is no padding; onnxruntime applies ceil_mode to it.
    "max, VALID": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID"), (7, 8)),
    # SAME padding already gives ceil(size / stride) windows.
    "average, SAME_UPPER": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                                auto_pad="SAME_UPPER"), (7, 8)),
}


@pytest.mark.parametrize("opset", [10, 17])
@pytest.mark.parametrize("op_type, attributes, size", CEIL_POOLS.values(), ids=CEIL_POOLS.keys())
def test_ceil_mode_pooling_matches_onnxruntime(op_type, attributes, size, opset, rng):
    model = graph_model([node(op_type, "x", ceil_mode=1, **attributes)], {"x": (2, 3, *size)},
                        {"y": None}, opset=opset)
    x = rng.standard_normal((2, 3, *size)).astype(np.float32)
    expected = onnxruntime_output(model, x)
    got = gdnflow_output(model, x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_ceil_mode_changes_the_output_size_where_floor_would_drop_cells(rng):
    # Guards the cases above against passing by floor_mode: 7 rows, kernel 3, stride 2.
    floor = graph_model([node("MaxPool", "x", kernel_shape=[3, 3], strides=[2, 2])],
                        {"x": (1, 1, 7, 8)}, {"y": None})
    ceil = graph_model([node("MaxPool", "x", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
                       {"x": (1, 1, 7, 8)}, {"y": None})
    x = rng.standard_normal((1, 1, 7, 8)).astype(np.float32)
    assert gdnflow_output(floor, x).shape == (1, 1, 3, 3)
    assert gdnflow_output(ceil, x).shape == (1, 1, 3, 4)
    # The last column's window holds input columns 6 and 7 only.
    np.testing.assert_array_equal(gdnflow_output(ceil, x)[0, 0, 0, 3], x[0, 0, :3, 6:].max())


# name: (mode, pads [begin..., end...] of a [2, 3, 5, 4] input, opset)
PAD_MODES = {
    "edge": ("edge", [0, 0, 2, 1, 0, 0, 1, 3], 13),
    "edge, channels too": ("edge", [0, 1, 0, 2, 0, 2, 3, 0], 13),
    "reflect": ("reflect", [0, 0, 1, 2, 0, 0, 2, 1], 13),
    "reflect, the widest (size - 1)": ("reflect", [0, 0, 4, 3, 0, 0, 4, 3], 17),
    "reflect, opset 2 attribute": ("reflect", [0, 0, 1, 1, 0, 0, 3, 2], 9),
    "wrap": ("wrap", [0, 0, 2, 4, 0, 0, 5, 1], 19),
}


@pytest.mark.parametrize("mode, pads, opset", PAD_MODES.values(), ids=PAD_MODES.keys())
def test_pad_modes_match_onnxruntime(mode, pads, opset, rng):
    if opset < 11:
        model = graph_model([node("Pad", "x", mode=mode, pads=pads)], {"x": (2, 3, 5, 4)},
                            {"y": None}, opset=opset)
    else:
        model = graph_model([node("Pad", ["x", "pads"], mode=mode)], {"x": (2, 3, 5, 4)},
                            {"y": None}, {"pads": np.array(pads, np.int64)}, opset)
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    expected = onnxruntime_output(model, x)
    np.testing.assert_array_equal(gdnflow_output(model, x), expected)


def test_pad_modes_of_the_axes_given_match_onnxruntime(rng):
    # Opset 18's axes input: pads of the last two axes only.
    model = graph_model([node("Pad", ["x", "pads", "", "axes"], mode="reflect")],
                        {"x": (1, 2, 3, 5)}, {"y": None},
                        {"pads": np.array([2, 1, 1, 4], np.int64),
                         "axes": np.array([-2, -1], np.int64)}, 18)
    x = rng.standard_normal((1, 2, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(gdnflow_output(model, x), onnxruntime_output(model, x))


def test_reflect_pads_as_wide_as_the_axis_are_refused_naming_the_axis(rng):
    model = graph_model([node("Pad", ["x", "pads"], mode="reflect")], {"x": (1, 1, 3, 4)},
                        {"y": None}, {"pads": np.array([0, 0, 3, 0, 0, 0, 0, 0], np.int64)}, 13)
    with pytest.raises(OnnxImportError, match=r"reflect pads 3, 0 on axis 2 of size 3 \(at most 2\)"):
        gdnflow_output(model, rng.standard_normal((1, 1, 3, 4)).astype(np.float32))


GRADIENT_CASES = {
    "Pad reflect": ([node("Pad", ["x", "pads"], mode="reflect")], (1, 2, 3, 4),
                    {"pads": np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)}),
    "Pad edge": ([node("Pad", ["x", "pads"], mode="edge")], (1, 2, 3, 2),
                 {"pads": np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)}),
    "AveragePool ceil_mode, padding counted": (
        [node("AveragePool", "x", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
              ceil_mode=1, count_include_pad=1)], (1, 2, 6, 5), {}),
    "MaxPool ceil_mode": ([node("MaxPool", "x", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
                          (1, 2, 5, 6), {}),
}


@pytest.mark.parametrize("nodes, shape, constants", GRADIENT_CASES.values(),
                         ids=GRADIENT_CASES.keys())
def test_gradients_through_ceil_pools_and_pad_modes(nodes, shape, constants, rng):
    module = OnnxModule(graph_model(nodes, {"x": shape}, {"y": None}, constants, 13),
                        device="numpy")
    gradcheck(module, [rng.standard_normal(shape)])


@pytest.mark.gpu
@pytest.mark.parametrize("op_type, attributes, size", CEIL_POOLS.values(), ids=CEIL_POOLS.keys())
def test_ceil_mode_pooling_matches_onnxruntime_on_cuda(op_type, attributes, size, rng):
    model = graph_model([node(op_type, "x", ceil_mode=1, **attributes)], {"x": (2, 3, *size)},
                        {"y": None})
    x = rng.standard_normal((2, 3, *size)).astype(np.float32)
    np.testing.assert_allclose(gdnflow_output(model, x, "cuda"), onnxruntime_output(model, x),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("mode, pads, opset", PAD_MODES.values(), ids=PAD_MODES.keys())
def test_pad_modes_match_onnxruntime_on_cuda(mode, pads, opset, rng):
    model = graph_model([node("Pad", ["x", "pads"], mode=mode)], {"x": (2, 3, 5, 4)},
                        {"y": None}, {"pads": np.array(pads, np.int64)}, max(opset, 13))
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(gdnflow_output(model, x, "cuda"), onnxruntime_output(model, x))
