"""ONNX import: the onnx package's own node tests, a MobileNetV2 laid out as
torchvision's export against onnxruntime, and the errors for files gdnflow cannot run."""
import collections

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import gdnflow as gf  # noqa: E402
from onnx_mobilenet import mobilenet_v2_onnx  # noqa: E402
from onnx_node_cases import (ALL_CASES_PASS, REFUSED_NODE_CASES, node_test_cases,  # noqa: E402
                             run_case)
from gdnflow.io.onnx import HANDLERS, OnnxImportError, OnnxModule, load  # noqa: E402


@pytest.fixture(scope="module")
def mobilenet_file(tmp_path_factory):
    """A MobileNetV2 with random weights, as torch.onnx exports torchvision's (onnx_mobilenet)."""
    return mobilenet_v2_onnx(tmp_path_factory.mktemp("onnx") / "mobilenet_v2_random.onnx")


CASES = node_test_cases()
OUTCOMES = collections.defaultdict(collections.Counter)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_onnx_node_test_on_numpy(case):
    outcome = run_case(case, "numpy")
    for op in {n.op_type for n in case.model.graph.node}:
        OUTCOMES[op][outcome.split(":")[0]] += 1
    if outcome != "passed":
        assert "is not supported" in outcome or "not a valid" in outcome, outcome
    if {n.op_type for n in case.model.graph.node} & ALL_CASES_PASS:
        assert (outcome != "passed") == (case.name in REFUSED_NODE_CASES), (
            outcome if outcome != "passed" else f"{case.name} passes: drop it from "
            "REFUSED_NODE_CASES")


def test_every_supported_operator_passes_node_tests():
    # Runs after the parametrized cases (same module, file order).
    # onnx has no node case of GlobalLpPool: test_onnx_ops compares it with onnxruntime.
    missing = [op for op in HANDLERS if OUTCOMES[op]["passed"] == 0 and op != "GlobalLpPool"]
    assert not missing, f"no passing onnx node test for: {missing}"


def test_mobilenet_v2_export_matches_onnxruntime_on_numpy(rng, mobilenet_file):
    ort = pytest.importorskip("onnxruntime")
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    session = ort.InferenceSession(str(mobilenet_file), providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: x})[0]
    got = load(mobilenet_file, device="numpy")(gf.tensor(x, device="numpy")).numpy()
    scale = np.max(np.abs(expected))
    assert np.max(np.abs(got - expected)) <= 1e-4 * scale


@pytest.mark.gpu
def test_mobilenet_v2_export_matches_onnxruntime_on_cuda(rng, mobilenet_file):
    ort = pytest.importorskip("onnxruntime")
    x = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
    session = ort.InferenceSession(str(mobilenet_file), providers=["CPUExecutionProvider"])
    expected = np.concatenate([session.run(None, {session.get_inputs()[0].name: x[i:i + 1]})[0]
                               for i in range(2)])
    model = load(mobilenet_file, device="cuda")
    with gf.no_grad():
        got = model(gf.tensor(x, device="cuda")).numpy()
    assert np.max(np.abs(got - expected)) <= 1e-4 * np.max(np.abs(expected))


def test_all_unsupported_operators_are_reported_at_once(tmp_path):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("StringNormalizer", ["x"], ["a"], name="sn1"),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Unique", ["b"], ["y"], name="u1")]
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y])), str(path))
    with pytest.raises(OnnxImportError, match=r"unsupported ONNX operators: StringNormalizer "
                                              r"\(nodes sn1\); Unique \(nodes u1\)"):
        load(path)


def group_norm_18_model(opset, extra_nodes=()):
    """GroupNormalization-18 (scale and bias per group), the form onnx deprecated."""
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2),
             *extra_nodes]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3])],
        initializer=[numpy_helper.from_array(np.array([1.5, 0.5], np.float32), "s"),
                     numpy_helper.from_array(np.array([0.1, -0.2], np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [18, 20])
def test_a_form_onnx_deprecated_loads_and_matches_onnxruntime(opset, tmp_path, rng):
    # onnx's checker refuses GroupNormalization in opsets 18 to 20, where exporters wrote it.
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "group_norm.onnx"
    onnx.save(group_norm_18_model(opset), str(path))
    with pytest.raises(onnx.checker.ValidationError, match="deprecated"):
        onnx.checker.check_model(str(path))
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(load(path, device="numpy")(x).numpy(),
                               session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_the_rest_of_a_graph_with_a_deprecated_form_is_still_checked(tmp_path):
    from onnx import helper
    # Reads a value that nothing produces.
    path = tmp_path / "broken.onnx"
    onnx.save(group_norm_18_model(18, [helper.make_node("Relu", ["missing"], ["r"])]), str(path))
    with pytest.raises(OnnxImportError, match="broken.onnx is not a valid ONNX model: .*missing"):
        load(path, device="numpy")


def test_truncated_and_missing_files_are_named(tmp_path, mobilenet_file):
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes(mobilenet_file.read_bytes()[:100000])
    with pytest.raises(OnnxImportError, match="cut.onnx is not a valid ONNX model"):
        load(truncated)
    with pytest.raises(OnnxImportError, match="nope.onnx: no such file"):
        load(tmp_path / "nope.onnx")
    garbage = tmp_path / "text.onnx"
    garbage.write_text("this is not protobuf")
    with pytest.raises(OnnxImportError, match="text.onnx"):
        load(garbage)


def test_imported_weights_are_parameters_of_the_module(mobilenet_file):
    model = load(mobilenet_file, device="numpy")
    n = sum(p.size for p in model.parameters())
    assert 3_400_000 < n < 3_600_000        # MobileNetV2 has 3.5 M parameters
    assert set(model.state_dict()) == {name for name, _ in model.named_parameters()}


def test_unknown_custom_domain_op_is_reported(tmp_path):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("Mystery", ["x"], ["y"], domain="com.example", name="m1")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("com.example", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    with pytest.raises(OnnxImportError, match=r"com.example.Mystery \(nodes m1\)"):
        load(path)


def test_registered_operator_maps_a_custom_domain_op(tmp_path):
    from onnx import TensorProto, helper
    from gdnflow.autograd import Operator
    from gdnflow.registry import register, unregister

    @register("test_onnx_scale")
    class Scale(Operator):
        onnx_op = ("org.gdnflow.test", "Scale")

        def __init__(self, alpha=1.0):
            self.alpha = alpha

        def forward_numpy(self, x):
            return x * x.dtype.type(self.alpha)

    try:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
        node = helper.make_node("Scale", ["x"], ["y"], domain="org.gdnflow.test", alpha=2.5)
        model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                                  opset_imports=[helper.make_opsetid("", 17),
                                                 helper.make_opsetid("org.gdnflow.test", 1)])
        path = tmp_path / "scale.onnx"
        onnx.save(model, str(path))
        data = np.arange(6, dtype=np.float32).reshape(2, 3)
        got = load(path, device="numpy")(gf.tensor(data, device="numpy")).numpy()
        np.testing.assert_allclose(got, 2.5 * data)
    finally:
        unregister("test_onnx_scale")


# ------------------------------------- attributes, checked at load; eval mode --
def one_node_model(op_type, attributes, x_shape, w=None, outputs=("y",), opset=17, name="n1",
                   y_shape=None):
    """A model of one ``op_type`` node on input x (and weight initializer ``w``); the
    onnx checker (run by ``load``) needs ``y_shape``."""
    from onnx import TensorProto, helper, numpy_helper
    inputs = ["x"] + (["w"] if w is not None else [])
    node = helper.make_node(op_type, inputs, list(outputs), name=name, **attributes)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, y_shape) for o in outputs if o],
        initializer=[numpy_helper.from_array(w, "w")] if w is not None else [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


REFUSED_AT_LOAD = {
    "dilated pool": ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2]), None, (),
                     "dilations=[2, 2] (no dilation)"),
    "pool pads as large as the kernel": ("AveragePool", dict(kernel_shape=[2, 2],
                                                             pads=[2, 0, 0, 0]), None, (),
                                         "pads=[2, 0, 0, 0] (each smaller than kernel_shape"),
    "max pool indices": ("MaxPool", dict(kernel_shape=[2, 2]), None, ("y", "idx"),
                         "output idx (only the first output is computed)"),
    "transposed conv SAME": ("ConvTranspose", dict(auto_pad="SAME_UPPER", strides=[2, 2]),
                             np.ones((2, 3, 3, 3), np.float32), (),
                             "auto_pad=SAME_UPPER (only NOTSET or VALID)"),
    "transposed conv output_shape": ("ConvTranspose", dict(output_shape=[9, 9]),
                                     np.ones((2, 3, 3, 3), np.float32), (), "output_shape=[9, 9]"),
    "3-D conv kernel": ("Conv", dict(kernel_shape=[1, 1, 1]), np.ones((3, 2, 1, 1), np.float32),
                        (), "kernel_shape=[1, 1, 1] (2-D only)"),
    "3-D pool": ("AveragePool", dict(kernel_shape=[2, 2, 2]), None, (),
                 "kernel_shape=[2, 2, 2] (2-D only)"),
    "unknown pad mode": ("Pad", dict(mode="mirror", pads=[0, 0, 1, 1, 0, 0, 1, 1]), None, (),
                         "mode=mirror (only constant or edge or reflect or wrap)"),
    "spatial batch norm attribute at opset 9": (
        "BatchNormalization", dict(spatial=0), None, (),
        "attribute spatial (not one of BatchNormalization-9's, opset 9)"),
    "form of an older opset": ("Relu", dict(consumed_inputs=[0]), None, (),
                               "Relu-1 (the form of opsets 1 to 5; gdnflow reads the forms of "
                               "opset 7 and later: convert the model with onnx.version_converter)"),
}


@pytest.mark.parametrize("op_type, attributes, w, outputs, feature", REFUSED_AT_LOAD.values(),
                         ids=REFUSED_AT_LOAD.keys())
def test_what_a_node_cannot_run_is_refused_at_load(op_type, attributes, w, outputs, feature):
    model = one_node_model(op_type, attributes, (1, 2, 6, 6), w, outputs or ("y",), opset=9
                           if op_type in ("BatchNormalization", "Pad") else 17)
    if op_type == "Relu":
        model.opset_import[0].version = 5
    with pytest.raises(OnnxImportError) as caught:
        OnnxModule(model, device="numpy", source="m.onnx")
    message = str(caught.value)
    assert message.startswith(f"m.onnx: node n1 ({op_type}): ") and "\n" not in message
    assert feature in message and message.endswith("is not supported")


def test_unsupported_operators_and_attributes_are_reported_together(tmp_path):
    from onnx import TensorProto, helper
    nodes = [helper.make_node("MaxPool", ["x"], ["a"], name="pool1", kernel_shape=[2, 2],
                              dilations=[2, 2]),
             helper.make_node("StringNormalizer", ["a"], ["b"], name="sn1"),
             helper.make_node("AveragePool", ["b"], ["y"], name="pool2", kernel_shape=[2, 2],
                              strides=[1, 1, 1])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        initializer=[helper.make_tensor("p", TensorProto.INT64, [8], [0] * 8)])
    path = tmp_path / "mixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(OnnxImportError) as caught:
        load(path, device="numpy")
    assert str(caught.value) == (
        f"{path}: unsupported ONNX operators: StringNormalizer (nodes sn1); node pool1 (MaxPool): "
        "dilations=[2, 2] (no dilation) is not supported; node pool2 (AveragePool): "
        "strides=[1, 1, 1] (2-D only) is not supported")


ACCEPTED = {
    "grouped dilated conv, asymmetric pads": (
        "Conv", dict(group=2, dilations=[2, 1], pads=[1, 0, 2, 1], strides=[1, 2]),
        (1, 4, 9, 9), np.arange(4 * 2 * 3 * 3, dtype=np.float32).reshape(4, 2, 3, 3) / 50),
    "conv SAME_LOWER": ("Conv", dict(auto_pad="SAME_LOWER", strides=[2, 2]), (1, 2, 7, 6),
                        np.linspace(-1, 1, 3 * 2 * 2 * 2, dtype=np.float32).reshape(3, 2, 2, 2)),
    "max pool storage_order=1, SAME_UPPER": ("MaxPool", dict(kernel_shape=[2, 3], storage_order=1,
                                                             auto_pad="SAME_UPPER"),
                                             (1, 2, 5, 7), None),
    "average pool count_include_pad, asymmetric pads": (
        "AveragePool", dict(kernel_shape=[3, 3], pads=[0, 1, 2, 2], count_include_pad=1,
                            strides=[2, 1]), (1, 2, 6, 5), None),
    "transposed conv grouped, dilated, output_padding": (
        "ConvTranspose", dict(group=2, dilations=[1, 2], strides=[2, 2], output_padding=[1, 0],
                              pads=[1, 0, 0, 1]), (1, 4, 4, 5),
        np.linspace(-1, 1, 4 * 3 * 2 * 3, dtype=np.float32).reshape(4, 3, 2, 3)),
}


@pytest.mark.parametrize("op_type, attributes, x_shape, w", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_attributes_run_as_onnxruntime_does(op_type, attributes, x_shape, w, rng):
    ort = pytest.importorskip("onnxruntime")
    model = one_node_model(op_type, attributes, x_shape, w)
    x = rng.standard_normal(x_shape).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    got = OnnxModule(model, device="numpy")(gf.tensor(x, device="numpy")).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_loaded_modules_are_in_eval_mode(tmp_path):
    path = tmp_path / "relu.onnx"
    onnx.save(one_node_model("Relu", {}, (1, 3), y_shape=[1, 3]), str(path))
    model = load(path, device="numpy")
    assert model.training is False
    from gdnflow import inference
    plan = inference.compile(model, (1, 3), device="numpy")     # refused in training mode before
    np.testing.assert_array_equal(plan(gf.tensor([[-1.0, 0.0, 2.0]], device="numpy")).numpy(),
                                  [[0.0, 0.0, 2.0]])
