"""ONNX graphs beyond plain operators (gdnflow/io/onnx_control.py, onnx_ops_quant.py):
If on shapes and constants, subgraphs checked at load, quantised graphs refused in one
line, weight-only quantisation and ConstantOfShape fills as parameters."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from gdnflow.io.onnx import OnnxImportError, OnnxModule  # noqa: E402
from onnx_graphs import graph_model, node  # noqa: E402


def branch(nodes, output, initializers=()):
    """A subgraph of ``nodes`` with one float output ``output`` (shape left open)."""
    return helper.make_graph(
        nodes, "branch", [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in dict(initializers).items()])


def then_branch_of(model):
    """The then_branch of the model's last node (an If)."""
    return next(a.g for a in model.graph.node[-1].attribute if a.name == "then_branch")


def if_on(condition_nodes, name="if1", condition="c"):
    """x -> If(condition) then Relu(x) * w else Neg(x)."""
    then_branch = branch([node("Relu", ["x"], ["r"]), node("Mul", ["r", "w"], ["t"])], "t",
                         {"w": np.array([1.0, 2.0, 3.0], np.float32)})
    else_branch = branch([node("Neg", ["x"], ["e"])], "e")
    nodes = condition_nodes + [node("If", [condition], ["y"], name=name, then_branch=then_branch,
                                    else_branch=else_branch)]
    return graph_model(nodes, {"x": (2, 3)}, {"y": None})


def test_if_on_the_input_shape_runs_the_taken_branch(rng):
    shape_test = [node("Shape", ["x"], ["s"]), node("Size", ["s"], ["n"]),
                  node("Constant", [], ["two"], value=numpy_helper.from_array(np.int64(2))),
                  node("Equal", ["n", "two"], ["c"])]
    module = OnnxModule(if_on(shape_test), device="numpy")
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(module(x).numpy(), np.maximum(x, 0) * [1, 2, 3], rtol=1e-6)
    negated = OnnxModule(if_on(shape_test + [node("Not", ["c"], ["nc"])], condition="nc"),
                         device="numpy")
    np.testing.assert_allclose(negated(x).numpy(), -x, rtol=1e-6)


def test_if_on_a_constant_folds_at_load_and_its_weights_are_parameters(rng):
    model = if_on([node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True)))])
    then_branch_of(model).node[0].input[0] = "w0"     # then: Relu(w0) * w
    model.graph.node.insert(0, node("Constant", [], ["w0"], value=numpy_helper.from_array(
        np.array([-1.0, 2.0, 3.0], np.float32))))
    model.graph.node.append(node("Add", ["x", "y"], ["z"]))
    model.graph.output[0].name = "z"
    module = OnnxModule(model, device="numpy")
    assert [step.op_type for step in module._nodes] == ["Add"]
    (parameter,) = module.state_dict().values()
    np.testing.assert_array_equal(np.asarray(parameter), [0.0, 4.0, 9.0])
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(module(x).numpy(), x + [0.0, 4.0, 9.0], rtol=1e-6)


def test_if_on_float_data_is_refused_at_load_in_one_line():
    model = if_on([node("ReduceSum", ["x"], ["total"], keepdims=0),
                   node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0))),
                   node("Greater", ["total", "zero"], ["c"])])
    with pytest.raises(OnnxImportError, match=r"^m: node if1 \(If\): an If condition computed "
                                              r"from float data \(.*\) is not supported$"):
        OnnxModule(model, device="numpy", source="m")


def test_operators_inside_subgraphs_are_checked_at_load():
    model = if_on([node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True)))])
    then_branch = then_branch_of(model)
    then_branch.node[0].op_type = "Frobnicate"
    then_branch.node[0].name = "fro"
    then_branch.node.append(node("Scan", ["r"], ["s"], name="scan1", body=branch(
        [node("Wobble", ["x"], ["q"], name="wob")], "q")))
    with pytest.raises(OnnxImportError, match=r"^m: unsupported ONNX operators: Frobnicate \(nodes "
                                              r"if1/then_branch: fro\); Scan \(nodes if1/"
                                              r"then_branch: scan1\); Wobble \(nodes if1/"
                                              r"then_branch: scan1/body: wob\)$"):
        OnnxModule(model, device="numpy", source="m")


def test_quantised_graph_is_refused_in_one_line_naming_its_operators():
    nodes = [node("QuantizeLinear", ["x", "scale"], ["q"], name="quant"),
             node("MatMulInteger", ["q", "w"], ["m"], name="mm"),
             node("Cast", ["m"], ["y"], to=TensorProto.FLOAT)]
    model = graph_model(nodes, {"x": (2, 3)}, {"y": None},
                        {"scale": np.float32(0.1), "w": np.ones((3, 2), np.uint8)}, opset=13)
    with pytest.raises(OnnxImportError, match=r"^m: quantised graph: MatMulInteger \(nodes mm\); "
                                              r"QuantizeLinear \(nodes quant\) is not supported; "
                                              r"gdnflow runs float32 models"):
        OnnxModule(model, device="numpy", source="m")


def test_weight_only_quantisation_is_dequantised_at_load(rng):
    w = rng.integers(-128, 127, (3, 4)).astype(np.int8)
    scale = np.array([0.5, 0.25, 0.125, 1.0], np.float32)
    zero = np.array([1, -2, 0, 3], np.int8)
    nodes = [node("DequantizeLinear", ["w", "scale", "zero"], ["wf"], axis=1),
             node("MatMul", ["x", "wf"])]
    module = OnnxModule(graph_model(nodes, {"x": (2, 3)}, {"y": None},
                                    {"w": w, "scale": scale, "zero": zero}, opset=13),
                        device="numpy")
    weight = (w.astype(np.float32) - zero) * scale
    (parameter,) = module.state_dict().values()
    np.testing.assert_array_equal(np.asarray(parameter), weight)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(module(x).numpy(), x @ weight, rtol=1e-5)


def test_constant_of_shape_fills_are_parameters():
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.25])
    nodes = [node("ConstantOfShape", ["shape"], ["w"], value=fill), node("MatMul", ["x", "w"])]
    module = OnnxModule(graph_model(nodes, {"x": (2, 3)}, {"y": None},
                                    {"shape": np.array([3, 4], np.int64)}), device="numpy")
    (parameter,) = module.state_dict().values()
    np.testing.assert_array_equal(np.asarray(parameter), np.full((3, 4), 0.25, np.float32))


def test_info_says_up_front_what_does_not_run_subgraphs_and_data_steered_if_included(tmp_path):
    from gdnflow.classify.description import describe
    model = if_on([node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True)))])
    then_branch_of(model).node[0].op_type = "Frobnicate"
    onnx.save(model, str(tmp_path / "sub.onnx"))
    lines = describe(tmp_path / "sub.onnx")
    assert lines[1] == ("runs in gdnflow: no: unsupported ONNX operators: Frobnicate (nodes "
                        "if1/then_branch: (unnamed))")
    assert lines[4] == "operators (2 nodes, 3 more in subgraphs): Constant 1, If 1"
    steered = if_on([node("ReduceSum", ["x"], ["total"], keepdims=0),
                     node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0))),
                     node("Greater", ["total", "zero"], ["c"])])
    onnx.save(steered, str(tmp_path / "steered.onnx"))
    assert describe(tmp_path / "steered.onnx")[1].startswith(
        "runs in gdnflow: no: node if1 (If): an If condition computed from float data")


def test_info_counts_weights_computed_at_load(tmp_path):
    from gdnflow.classify.description import describe
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.25])
    nodes = [node("ConstantOfShape", ["shape"], ["w"], value=fill), node("MatMul", ["x", "w"])]
    onnx.save(graph_model(nodes, {"x": (2, 3)}, {"y": None}, {"shape": np.array([3, 4], np.int64)}),
              str(tmp_path / "fill.onnx"))
    lines = describe(tmp_path / "fill.onnx")
    assert lines[1] == "runs in gdnflow: yes"
    assert lines[-1] == "parameters: 12 in 1 tensors (as gdnflow loads them)"


def test_a_weight_tied_through_identity_is_one_parameter(rng):
    """Exporters write a weight shared by two nodes as an Identity of it: one parameter."""
    w = rng.standard_normal((4, 4)).astype(np.float32)
    module = OnnxModule(graph_model(
        [node("Identity", ["w"], ["w_tied"]), node("MatMul", ["x", "w"], ["a"]),
         node("MatMul", ["x", "w_tied"], ["b"]), node("Add", ["a", "b"])],
        {"x": (2, 4)}, {"y": None}, {"w": w}, 17), device="numpy")
    assert len(module.state_dict()) == 1
    x = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(module(x).numpy(), 2 * x @ w, rtol=1e-5)


def test_an_error_while_folding_at_load_names_the_file_and_node():
    model = graph_model([node("Reshape", ["c", "s"], ["r"], name="bad_reshape"),
                         node("Add", ["x", "r"])], {"x": (2, 3)}, {"y": None},
                        {"c": np.ones(6, np.float32), "s": np.array([4], np.int64)}, 17)
    with pytest.raises(ValueError, match=r"^m\.onnx: node bad_reshape \(Reshape\): cannot reshape"):
        OnnxModule(model, device="numpy", source="m.onnx")
