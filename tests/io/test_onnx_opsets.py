"""ONNX opsets 7 to 21: every version of every operator gdnflow runs against
onnxruntime (the cases of tests/onnx_opset_cases.py), what the importer refuses
for a model's opset, and whole graphs taken through onnx's version converter."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper, version_converter  # noqa: E402

from gdnflow.io.onnx import HANDLERS, OnnxImportError, OnnxModule  # noqa: E402
from gdnflow.io.onnx_opsets import versions  # noqa: E402
from onnx_mobilenet import mobilenet_v2_onnx  # noqa: E402
from onnx_opset_cases import assert_case_matches, model_of, opset_cases  # noqa: E402
from onnx_opset_forms import Data, node  # noqa: E402

CASES = opset_cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.op}-{c.opset}-{c.label}")
def test_operator_version_matches_onnxruntime(case):
    assert_case_matches(case)


def test_every_version_of_every_operator_has_a_case():
    checked = {(c.op, c.opset) for c in CASES}
    every = {(op, opset) for op in HANDLERS for opset in versions(op).values()}
    assert sorted(every - checked) == []


def test_dropout_mask_before_opset_12_is_all_kept_of_its_version_type(rng):
    """The mask of an inference Dropout is all true; before opset 10 it has the data's
    type (float), from 10 it is bool. (onnxruntime gives all false before opset 12;
    onnx's reference evaluator all true.)"""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    for opset, dtype in ((7, np.float32), (10, np.bool_)):
        model = model_of([node("Dropout", "x", "y mask", ratio=0.3)], {"x": x}, {}, ("y", "mask"),
                         opset)
        y, mask = OnnxModule(model, device="numpy")(x)
        np.testing.assert_array_equal(y.numpy(), x)
        assert mask.dtype == dtype and mask.shape == x.shape and np.all(mask == 1)


def test_lrn_of_even_size_matches_the_spec_window():
    """onnxruntime refuses an even size; ONNX sums the squares of channels
    c - floor((size - 1) / 2) to c + ceil((size - 1) / 2)."""
    d = Data(np.random.default_rng(3))
    x = d.normal(2, 6, 3, 2)
    size, alpha, beta, bias = 4, 0.5, 0.75, 2.0
    model = model_of([node("LRN", "x", size=size, alpha=alpha, beta=beta, bias=bias)], {"x": x}, {},
                     ("y",), 13)
    expected = np.empty_like(x)
    for c in range(x.shape[1]):
        window = x[:, max(0, c - 1):min(x.shape[1], c + 3)]     # c - 1 ... c + 2
        expected[:, c] = x[:, c] / (bias + alpha / size * np.sum(window ** 2, axis=1)) ** beta
    got = OnnxModule(model, device="numpy")(x).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# name: (nodes, opset, the phrase naming what is refused)
REFUSED = {
    "operator newer than the opset": (
        [node("Gelu", "x", name="g")], 17,
        "node g (Gelu): Gelu in opset 17 (ONNX added it in opset 20) is not supported"),
    "form older than opset 7": (
        [node("Add", "x x", name="a", broadcast=1)], 6,
        "node a (Add): Add-6 (the form of opset 6; gdnflow reads the forms of opset 7 and "
        "later: convert the model with onnx.version_converter) is not supported"),
    "attribute that became an input": (
        [node("ReduceMean", "x", name="r", axes=[1])], 18,
        "node r (ReduceMean): attribute axes (not one of ReduceMean-18's, opset 18) is not "
        "supported"),
    "input of a later version": (
        [node("Dropout", "x ratio", name="d")], 10,
        "node d (Dropout): 2 inputs (Dropout-10, opset 10, takes at most 1) is not supported"),
    "attribute of an older version and an input missing": (
        [node("Reshape", "x", name="re", shape=[3, 1])], 7,
        "node re (Reshape): attribute shape (not one of Reshape-5's, opset 7), 1 input "
        "(Reshape-5, opset 7, takes at least 2) is not supported"),
    "Squeeze axes attribute at opset 13, with Softmax's at 12 accepted": (
        [node("Softmax", "x", "s", axis=1), node("Squeeze", "s", name="sq", axes=[0])], 13,
        "node sq (Squeeze): attribute axes (not one of Squeeze-13's, opset 13) is not supported"),
}


@pytest.mark.parametrize("nodes, opset, message", REFUSED.values(), ids=REFUSED.keys())
def test_a_form_that_is_not_its_opsets_is_refused_at_load(nodes, opset, message):
    model = model_of(nodes, {"x": np.ones((1, 3), np.float32)},
                     {"ratio": np.float32(0.5)} if "ratio" in nodes[0].input else {}, ("y",), opset)
    with pytest.raises(OnnxImportError) as caught:
        OnnxModule(model, device="numpy", source="m")
    assert str(caught.value) == f"m: {message}"


def test_a_form_of_an_older_opset_kept_at_opset_7_runs():
    """Relu-6 is also opset 7's Relu: a model of opset 6 using it runs."""
    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    model = model_of([node("Relu", "x")], {"x": x}, {}, ("y",), 6)
    np.testing.assert_array_equal(OnnxModule(model, device="numpy")(x).numpy(), [[0, 0.5, 2]])


# ----------------------------------------------- onnx's version converter --
def _assert_matches_onnxruntime(model, feeds):
    import onnxruntime as ort
    expected = ort.InferenceSession(model.SerializeToString(), providers=[
        "CPUExecutionProvider"]).run(None, feeds)[0]
    got = OnnxModule(model, device="numpy")(*feeds.values()).numpy()
    assert got.shape == expected.shape
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def _converted(model, opset):
    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as exc:    # the converter lacks an adapter: its limit, not gdnflow's
        pytest.skip(f"onnx's version converter cannot take the graph to opset {opset}: "
                    f"{str(exc).strip().splitlines()[-1]}")
    assert converted.opset_import[0].version == opset
    return converted


def opset_9_graph(d):
    """Old forms: Upsample, Clip's, Slice's, Pad's, Split's and the reductions' attributes,
    Softmax flattening to 2-D at axis 1, BatchNormalization, Dropout, Gemm."""
    nodes = [node("Conv", "x w b", "c", pads=[1, 1, 1, 1]),
             node("BatchNormalization", "c s o m v", "n"), node("Clip", "n", "r", min=0.0, max=6.0),
             node("Upsample", "r up", "u", mode="nearest"),
             node("MaxPool", "u", "mp", kernel_shape=[2, 2], strides=[2, 2]),
             node("Slice", "mp", "sl", starts=[0, 1], ends=[1000, -1], axes=[1, 3]),
             node("Pad", "sl", "pd", pads=[0, 0, 1, 0, 0, 0, 0, 1], value=0.5),
             node("Split", "pd", "p q", axis=1, split=[2, 4]),
             node("ReduceMean", "p", "rm", axes=[1]), node("Mul", "q rm", "qm"),
             node("Softmax", "qm", "sm", axis=1), node("Dropout", "sm", "dr", ratio=0.2),
             node("Squeeze", "dr", "sq", axes=[0]), node("Unsqueeze", "sq", "us", axes=[0]),
             node("ReduceSum", "us", "rs", axes=[2], keepdims=0), node("Flatten", "rs", "fl"),
             node("Gemm", "fl gw gb", "y", transB=1)]
    constants = {"w": d.normal(6, 3, 3, 3) * 0.3, "b": d.normal(6), "s": d.uniform(0.5, 1.5, 6),
                 "o": d.normal(6), "m": d.normal(6), "v": d.uniform(0.5, 1.5, 6),
                 "up": np.array([1, 1, 2, 2], np.float32), "gw": d.normal(4, 16), "gb": d.normal(4)}
    x = d.normal(1, 3, 5, 5)
    return model_of(nodes, {"x": x}, constants, ("y",), 9), {"x": x}


@pytest.mark.parametrize("opset", range(7, 22))
def test_an_opset_9_graph_converted_to_each_opset_matches_onnxruntime(opset):
    model, feeds = opset_9_graph(Data(np.random.default_rng(5)))
    _assert_matches_onnxruntime(_converted(model, opset), feeds)


def mobilenet_v2_of_opset_7(path):
    """MobileNetV2 (tests/onnx_mobilenet.py) on 32 x 32 inputs, its Clip bounds as
    attributes (the form before opset 11: onnx's converter has no adapter down to it),
    at opset 7."""
    model = onnx.load(str(mobilenet_v2_onnx(path)))
    for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.dim_value = 32
    bounds = {n.output[0]: float(numpy_helper.to_array(n.attribute[0].t))
              for n in model.graph.node if n.op_type == "Constant"}
    nodes = [helper.make_node("Clip", n.input[:1], n.output, name=n.name, min=bounds[n.input[1]],
                              max=bounds[n.input[2]]) if n.op_type == "Clip" else n
             for n in model.graph.node if n.op_type != "Constant"]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.opset_import[0].version = 7
    return model


@pytest.fixture(scope="module")
def mobilenet_v2_7(tmp_path_factory):
    return mobilenet_v2_of_opset_7(tmp_path_factory.mktemp("opsets") / "mobilenet_v2.onnx")


@pytest.mark.parametrize("opset", [7, 9, 11, 13, 17, 21])
def test_mobilenet_v2_converted_to_each_opset_matches_onnxruntime(opset, mobilenet_v2_7, rng):
    model = mobilenet_v2_7 if opset == 7 else _converted(mobilenet_v2_7, opset)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    _assert_matches_onnxruntime(model, {"input": x})
