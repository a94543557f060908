"""ONNX operators composed from gdnflow operators (gdnflow/io/onnx_ops.py): gradients
through the imported module, a small network against onnxruntime, and the onnx
package's light models (the node cases run in test_onnx.py)."""
import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import gdnflow as gf  # noqa: E402
from gdnflow.io.onnx import OnnxImportError, OnnxModule  # noqa: E402
from gdnflow.testing import gradcheck  # noqa: E402
from onnx_graphs import graph_model, node  # noqa: E402

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


# ------------------------------------ gradients through the imported module --
# name: (nodes, input shapes, constant initializers, opset, positive inputs)
GRADIENT_CASES = {
    "HardSigmoid": ([node("HardSigmoid", "x", alpha=0.3, beta=0.4)], {"x": (2, 3, 4)}, {}, 17,
                    False),
    "HardSwish": ([node("HardSwish", "x")], {"x": (2, 3, 4)}, {}, 17, False),
    "PRelu, slope per channel": ([node("PRelu", ["x", "slope"])],
                                 {"x": (2, 3, 2, 2), "slope": (3, 1, 1)}, {}, 17, False),
    "LeakyRelu": ([node("LeakyRelu", "x", alpha=0.2)], {"x": (3, 4)}, {}, 17, False),
    "Elu": ([node("Elu", "x", alpha=0.7)], {"x": (3, 4)}, {}, 17, False),
    "Softsign": ([node("Softsign", "x")], {"x": (3, 4)}, {}, 17, False),
    "Pow, constant exponent": ([node("Pow", ["x", "e"])], {"x": (3, 4)},
                               {"e": np.float32(3.0)}, 17, False),
    "Pow, exponent tensor": ([node("Pow", ["x", "e"])], {"x": (3, 4), "e": (4,)}, {}, 17, True),
    "Reciprocal": ([node("Reciprocal", "x")], {"x": (3, 4)}, {}, 17, True),
    "ReduceMean, attribute axes": ([node("ReduceMean", "x", axes=[1, -1], keepdims=0)],
                                   {"x": (2, 3, 4)}, {}, 17, False),
    "ReduceMean, axes input": ([node("ReduceMean", ["x", "axes"], keepdims=1)],
                               {"x": (2, 3, 4)}, {"axes": np.array([0, 2], np.int64)}, 18, False),
    "ReduceSum, all axes": ([node("ReduceSum", "x", keepdims=0)], {"x": (2, 3)}, {}, 13, False),
    "ReduceL2": ([node("ReduceL2", ["x", "axes"])], {"x": (2, 3, 4)},
                 {"axes": np.array([1], np.int64)}, 18, False),
    "Sum, broadcasting": ([node("Sum", ["a", "b", "c"])], {"a": (2, 3), "b": (3,), "c": (2, 1)},
                          {}, 13, False),
    "Mean": ([node("Mean", ["a", "b"])], {"a": (2, 3), "b": (2, 3)}, {}, 13, False),
    "Max, three inputs": ([node("Max", ["a", "b", "c"])], {"a": (2, 3), "b": (2, 3), "c": (3,)},
                          {}, 13, False),
    "Min": ([node("Min", ["a", "b"])], {"a": (2, 3), "b": (2, 3)}, {}, 13, False),
    "Split, then Sub": ([node("Split", ["x", "parts"], ["p", "q"], axis=1), node("Sub", "pq")],
                        {"x": (2, 4)}, {"parts": np.array([2, 2], np.int64)}, 13, False),
    "LRN": ([node("LRN", "x", size=3, alpha=0.5, beta=0.75, bias=2.0)], {"x": (2, 5, 2, 3)}, {},
            13, False),
    "LayerNormalization, axis 1, scale and bias": (
        [node("LayerNormalization", ["x", "s", "b"], axis=1, epsilon=1e-3)],
        {"x": (2, 3, 4), "s": (3, 4), "b": (4,)}, {}, 17, False),
    "LayerNormalization, last axis, no bias": ([node("LayerNormalization", ["x", "s"])],
                                               {"x": (3, 5), "s": (5,)}, {}, 17, False),
    "InstanceNormalization": ([node("InstanceNormalization", ["x", "s", "b"], epsilon=1e-3)],
                              {"x": (2, 3, 2, 3), "s": (3,), "b": (3,)}, {}, 17, False),
    "Gelu, tanh": ([node("Gelu", "x", approximate="tanh")], {"x": (3, 4)}, {}, 20, False),
    "Selu": ([node("Selu", "x", alpha=1.5, gamma=1.2)], {"x": (3, 4)}, {}, 17, False),
    "Celu": ([node("Celu", "x", alpha=0.8)], {"x": (3, 4)}, {}, 17, False),
    "Mish": ([node("Mish", "x")], {"x": (3, 4)}, {}, 18, False),
    "Resize nearest, scales 2 and 3": ([node("Resize", ["x", "", "scales"])], {"x": (1, 2, 2, 3)},
                                       {"scales": np.array([1, 1, 2, 3], np.float32)}, 19, False),
    "Upsample nearest": ([node("Upsample", ["x", "scales"])], {"x": (1, 2, 2, 2)},
                         {"scales": np.array([1, 1, 3, 2], np.float32)}, 9, False),
    "Tile": ([node("Tile", ["x", "repeats"])], {"x": (2, 3)},
             {"repeats": np.array([2, 3], np.int64)}, 13, False),
    "Expand, both ways": ([node("Expand", ["x", "shape"])], {"x": (3, 1)},
                          {"shape": np.array([2, 1, 4], np.int64)}, 13, False),
    "Where, constant condition": ([node("Where", ["c", "a", "b"])], {"a": (2, 3), "b": (3,)},
                                  {"c": np.array([[1, 0, 1], [0, 0, 1]], bool)}, 16, False),
    "Erf": ([node("Erf", "x")], {"x": (3, 4)}, {}, 13, False),
    "Gelu, exact": ([node("Gelu", "x")], {"x": (3, 4)}, {}, 20, False),
    "Sin, then Atan": ([node("Sin", "x", ["s"]), node("Atan", "s")], {"x": (3, 4)}, {}, 13, False),
    "Asinh": ([node("Asinh", "x")], {"x": (3, 4)}, {}, 13, False),
    "ThresholdedRelu": ([node("ThresholdedRelu", "x", alpha=0.3)], {"x": (3, 4)}, {}, 13, False),
    "Shrink": ([node("Shrink", "x", lambd=0.4, bias=0.2)], {"x": (3, 4)}, {}, 13, False),
    "LogSoftmax, opset 11 flattening": ([node("LogSoftmax", "x", axis=1)], {"x": (2, 3, 4)}, {},
                                        11, False),
    "ReduceMax over two axes": ([node("ReduceMax", "x", axes=[0, 2], keepdims=0)],
                                {"x": (2, 3, 4)}, {}, 13, False),
    "ReduceMin": ([node("ReduceMin", ["x", "axes"])], {"x": (2, 3, 4)},
                  {"axes": np.array([1], np.int64)}, 18, False),
    "ReduceProd, odd extent": ([node("ReduceProd", "x", axes=[1], keepdims=0)], {"x": (2, 7)}, {},
                               13, False),
    "ReduceLogSumExp": ([node("ReduceLogSumExp", "x", axes=[-1])], {"x": (3, 5)}, {}, 13, False),
    "GlobalMaxPool": ([node("GlobalMaxPool", "x")], {"x": (2, 3, 2, 3)}, {}, 13, False),
    "CumSum, exclusive, reversed, axis 0": (
        [node("CumSum", ["x", "axis"], exclusive=1, reverse=1)], {"x": (4, 3)},
        {"axis": np.array(0, np.int64)}, 14, False),
    "LpNormalization p=1 and p=2": ([node("LpNormalization", "x", ["n"], p=1, axis=0),
                                     node("LpNormalization", "n", p=2)], {"x": (3, 4)}, {}, 13,
                                    False),
    "GlobalLpPool p=3": ([node("GlobalLpPool", "x", p=3)], {"x": (2, 3, 2, 2)}, {}, 13, True),
    "MeanVarianceNormalization": ([node("MeanVarianceNormalization", "x")], {"x": (2, 3, 2, 2)},
                                  {}, 13, False),
    "GroupNormalization, scale per group (opset 18)": (
        [node("GroupNormalization", ["x", "s", "b"], num_groups=2)],
        {"x": (2, 4, 3), "s": (2,), "b": (2,)}, {}, 18, False),
    "RMSNormalization": ([node("RMSNormalization", ["x", "s"], axis=1)],
                         {"x": (2, 3, 4), "s": (3, 4)}, {}, 23, False),
    "GatherElements, shorter other axis": (
        [node("GatherElements", ["x", "i"], axis=1)], {"x": (3, 4)},
        {"i": np.array([[0, 3, -1], [2, 2, 1]], np.int64)}, 13, False),
    "TopK values": ([node("TopK", ["x", "k"], ["y", "indices"], axis=1)], {"x": (2, 5, 3)},
                    {"k": np.array([2], np.int64)}, 13, False),
    "DepthToSpace CRD, then SpaceToDepth": (
        [node("DepthToSpace", "x", ["d"], blocksize=2, mode="CRD"),
         node("SpaceToDepth", "d", blocksize=2)], {"x": (1, 8, 2, 3)}, {}, 13, False),
    "Trilu, lower, k=-1": ([node("Trilu", ["x", "k"], upper=0)], {"x": (2, 4, 3)},
                           {"k": np.array(-1, np.int64)}, 14, False),
    "Resize linear, downscaling by 0.6": (
        [node("Resize", ["x", "", "scales"], mode="linear")], {"x": (1, 2, 5, 4)},
        {"scales": np.array([1, 1, 0.6, 1.5], np.float32)}, 19, False),
    "Resize cubic, align_corners": (
        [node("Resize", ["x", "", "scales"], mode="cubic",
              coordinate_transformation_mode="align_corners")], {"x": (1, 1, 4, 3)},
        {"scales": np.array([1, 1, 2, 1.5], np.float32)}, 19, False),
    "Einsum, batched, broadcasting, summed subscript": (
        [node("Einsum", ["a", "b"], equation="bij,jkl->bik")], {"a": (2, 3, 4), "b": (4, 5, 2)},
        {}, 12, False),
}


@pytest.mark.parametrize("nodes, inputs, constants, opset, positive", GRADIENT_CASES.values(),
                         ids=GRADIENT_CASES.keys())
def test_gradients_through_the_imported_module(nodes, inputs, constants, opset, positive, rng):
    module = OnnxModule(graph_model(nodes, inputs, {"y": None}, constants, opset), device="numpy")
    arrays = [rng.standard_normal(shape) for shape in inputs.values()]
    if positive:
        arrays[0] = np.abs(arrays[0]) + 0.5
    gradcheck(module, arrays)


EINSUM_EQUATIONS = {
    "ij,jk->ik": ((3, 4), (4, 5)), "ij,kj": ((3, 4), (5, 4)), "i,i->": ((4,), (4,)),
    "bij,bjk->bik": ((2, 3, 4), (2, 4, 5)), "...ij,...jk->...ik": ((2, 1, 3, 4), (3, 4, 2)),
    "ij,ij->ji": ((3, 4), (3, 4)), "i,j->ij": ((3,), (4,)), "bhqd,bhkd->bhqk": (
        (2, 3, 4, 5), (2, 3, 6, 5)), "abc->cb": ((2, 3, 4),), "ij->": ((3, 4),),
}


@pytest.mark.parametrize("equation", EINSUM_EQUATIONS)
def test_einsum_on_tensors_matches_numpy(equation, rng):
    shapes = EINSUM_EQUATIONS[equation]
    names = "ab"[:len(shapes)]
    model = graph_model([node("Einsum", names, equation=equation)], dict(zip(names, shapes)),
                        {"y": None}, opset=12)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = OnnxModule(model, device="numpy")(*arrays).numpy()
    np.testing.assert_allclose(got, np.einsum(equation, *arrays), rtol=1e-5, atol=1e-5)


def test_einsum_with_a_diagonal_is_refused():
    model = graph_model([node("Einsum", ["a"], name="e1", equation="ii->i")], {"a": (3, 3)},
                        {"y": None}, opset=12)
    with pytest.raises(OnnxImportError, match=r"node e1 \(Einsum\): equation 'ii->i' \(only one "
                                              r"or two operands, no repeated subscript"):
        OnnxModule(model, device="numpy")(np.eye(3, dtype=np.float32))


def test_constant_node_weights_are_parameters():
    from onnx import numpy_helper
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    shape = np.array([2, -1], np.int64)
    nodes = [node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
             node("Constant", [], ["shape"], value=numpy_helper.from_array(shape)),
             node("Conv", ["x", "w"], ["c"]), node("Reshape", ["c", "shape"])]
    model = OnnxModule(graph_model(nodes, {"x": (2, 2, 5, 5)}, {"y": None}), device="numpy")
    (name, parameter), = model.state_dict().items()
    np.testing.assert_array_equal(parameter.numpy() if hasattr(parameter, "numpy") else parameter,
                                  w)
    x = rng.standard_normal((2, 2, 5, 5)).astype(np.float32)
    reference = gf.ops.conv2d(gf.tensor(x, device="numpy"), gf.tensor(w, device="numpy"))
    np.testing.assert_allclose(model(x).numpy(), reference.numpy().reshape(2, -1), rtol=1e-6)


# -------------------------------- a small network against onnxruntime --
@pytest.mark.parametrize("opset", [17, 18])
def test_conv_hardswish_reducemean_prelu_matches_onnxruntime(opset, rng):
    ort = pytest.importorskip("onnxruntime")
    reduce = (node("ReduceMean", ["h", "axes"], ["m"], keepdims=1) if opset >= 18 else
              node("ReduceMean", ["h"], ["m"], axes=[2, 3], keepdims=1))
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             node("HardSwish", ["c"], ["h"]), reduce,
             node("PRelu", ["m", "slope"], ["p"]),
             node("HardSigmoid", ["c"], ["s"], alpha=0.25, beta=0.45),
             node("Mul", ["s", "p"], ["sp"]),
             node("LRN", ["sp"], ["l"], size=3, alpha=1e-2, beta=0.75, bias=1.5),
             node("Split", ["l", "parts"], ["l1", "l2"], axis=1),
             node("Max", ["l1", "l2"], ["mx"]), node("Sum", ["l1", "l2", "mx"], ["sm"]),
             node("Pow", ["sm", "two"], ["sq"]),
             node("ReduceSum", ["sq", "axes_sum"], ["y"], keepdims=0)]
    constants = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.4,
                 "b": rng.standard_normal(8).astype(np.float32),
                 "slope": rng.uniform(0.1, 0.5, (8, 1, 1)).astype(np.float32),
                 "axes": np.array([2, 3], np.int64), "parts": np.array([4, 4], np.int64),
                 "two": np.float32(2.0), "axes_sum": np.array([1], np.int64)}
    model = graph_model(nodes, {"x": (2, 3, 7, 6)}, {"y": None}, constants, opset)
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    got = OnnxModule(model, device="numpy")(gf.tensor(x, device="numpy")).numpy()
    assert got.shape == expected.shape
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


RESIZE_MODES = {
    "opset 19 defaults (half_pixel, round_prefer_floor)": (19, {}, "scales"),
    "half_pixel, round_prefer_ceil": (19, dict(nearest_mode="round_prefer_ceil"), "scales"),
    "pytorch_half_pixel": (13, dict(coordinate_transformation_mode="pytorch_half_pixel"),
                           "scales"),
    "asymmetric, floor (PyTorch's export)": (13, dict(coordinate_transformation_mode="asymmetric",
                                                      nearest_mode="floor"), "scales"),
    "sizes": (13, {}, "sizes"),
    "opset 10": (10, {}, "scales"),
}


@pytest.mark.parametrize("factors", [(2, 2), (3, 2), (1, 4)])
@pytest.mark.parametrize("opset, attributes, given", RESIZE_MODES.values(),
                         ids=RESIZE_MODES.keys())
def test_resize_nearest_by_integer_factors_matches_onnxruntime(opset, attributes, given, factors,
                                                               rng):
    ort = pytest.importorskip("onnxruntime")
    shape = (2, 3, 4, 5)
    scales = np.array([1, 1, *factors], np.float32)
    sizes = np.array([2, 3, 4 * factors[0], 5 * factors[1]], np.int64)
    inputs = (["x", "scales"] if opset == 10 else
              ["x", "", "scales"] if given == "scales" else ["x", "", "", "sizes"])
    model = graph_model([node("Resize", inputs, mode="nearest", **attributes)], {"x": shape},
                        {"y": None}, {"scales": scales, "sizes": sizes}, opset)
    if given == "sizes":
        model.graph.initializer.pop(0)      # an unused scales is rejected by onnxruntime
    x = rng.standard_normal(shape).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    got = OnnxModule(model, device="numpy")(gf.tensor(x, device="numpy")).numpy()
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("opset", [18, 20])
def test_norms_activations_tile_expand_where_resize_match_onnxruntime(opset, rng):
    ort = pytest.importorskip("onnxruntime")
    gelu = (node("Gelu", ["i"], ["g"], approximate="tanh") if opset >= 20 else
            node("Mish", ["i"], ["g"]))
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             node("InstanceNormalization", ["c", "in_s", "in_b"], ["i"], epsilon=1e-4), gelu,
             node("Resize", ["g", "", "scales"], ["r"], mode="nearest",
                  coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             node("LayerNormalization", ["r", "ln_s", "ln_b"], ["l"], axis=1),
             node("Mish", ["l"], ["m"]), node("Selu", ["m"], ["s"]),
             node("Tile", ["s", "repeats"], ["t"]),
             node("Expand", ["row", "shape"], ["e"]),
             node("Where", ["mask", "t", "e"], ["wh"]),
             node("Celu", ["wh"], ["ce"], alpha=0.5),
             node("ReduceSum", ["ce", "axes"], ["y"], keepdims=0)]
    constants = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.4,
                 "b": rng.standard_normal(4).astype(np.float32),
                 "in_s": rng.uniform(0.5, 1.5, 4).astype(np.float32),
                 "in_b": rng.standard_normal(4).astype(np.float32),
                 "scales": np.array([1, 1, 2, 2], np.float32),
                 "ln_s": rng.uniform(0.5, 1.5, (4, 1, 12)).astype(np.float32),
                 "ln_b": rng.standard_normal((4, 10, 12)).astype(np.float32),
                 "repeats": np.array([1, 2, 1, 1], np.int64),
                 "row": rng.standard_normal((1, 12)).astype(np.float32),
                 "shape": np.array([2, 8, 10, 1], np.int64),
                 "mask": rng.uniform(size=(8, 10, 12)) > 0.3,
                 "axes": np.array([2, 3], np.int64)}
    model = graph_model(nodes, {"x": (2, 3, 5, 6)}, {"y": None}, constants, opset)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    got = OnnxModule(model, device="numpy")(gf.tensor(x, device="numpy")).numpy()
    assert got.shape == expected.shape == (2, 8)
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


REFUSED = {
    "antialiased Resize": ([node("Resize", ["x", "", "scales"], name="r1", mode="linear",
                                 antialias=1)], 19, r"node r1 \(Resize\): antialias=1 \(only 0\)"),
    "layer norm in double precision stash": (
        [node("LayerNormalization", ["x", "scales"], name="ln", stash_type=11)], 17,
        r"node ln \(LayerNormalization\): stash_type=11 \(only 1\)"),
}


@pytest.mark.parametrize("nodes, opset, message", REFUSED.values(), ids=REFUSED.keys())
def test_what_a_composed_operator_cannot_run_is_refused_at_load(nodes, opset, message):
    model = graph_model(nodes, {"x": (1, 1, 2, 2)}, {"y": None},
                        {"scales": np.array([1, 1, 2, 2], np.float32)}, opset)
    with pytest.raises(OnnxImportError, match=f"^m: {message}.* is not supported$"):
        OnnxModule(model, device="numpy", source="m")


RESAMPLING = {
    "linear, half_pixel, fractional": (dict(mode="linear"), [1, 1, 1.7, 0.6]),
    "linear, align_corners, downscaling": (dict(mode="linear",
                                                coordinate_transformation_mode="align_corners"),
                                           [1, 1, 0.5, 0.8]),
    "linear, asymmetric x2": (dict(mode="linear", coordinate_transformation_mode="asymmetric"),
                              [1, 1, 2, 2]),
    "cubic, pytorch_half_pixel": (dict(mode="cubic", cubic_coeff_a=-0.5,
                                       coordinate_transformation_mode="pytorch_half_pixel"),
                                  [1, 1, 2.5, 1.5]),
    "cubic, exclude_outside": (dict(mode="cubic", exclude_outside=1), [1, 1, 0.75, 3]),
    "nearest, fractional, round_prefer_ceil": (dict(nearest_mode="round_prefer_ceil"),
                                               [1, 1, 1.5, 0.5]),
}


@pytest.mark.parametrize("attributes, scales", RESAMPLING.values(), ids=RESAMPLING.keys())
def test_resize_by_interpolation_matrices_matches_onnxruntime(attributes, scales, rng):
    ort = pytest.importorskip("onnxruntime")
    model = graph_model([node("Resize", ["x", "", "scales"], **attributes)], {"x": (2, 3, 6, 5)},
                        {"y": None}, {"scales": np.array(scales, np.float32)}, 19)
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    got = OnnxModule(model, device="numpy")(gf.tensor(x, device="numpy")).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool_matches_onnxruntime(p, rng):
    """onnx has no node case of GlobalLpPool."""
    ort = pytest.importorskip("onnxruntime")
    model = graph_model([node("GlobalLpPool", "x", p=p)], {"x": (2, 3, 4, 5)}, {"y": None},
                        opset=13)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = OnnxModule(model, device="numpy")(gf.tensor(x, device="numpy")).numpy()
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5)


def test_where_computes_both_branches_so_an_inf_not_taken_still_gives_nan():
    """Where is c a + (1 - c) b: documented limitation, pinned here."""
    model = graph_model([node("Where", ["c", "a", "b"])], {"a": (2,), "b": (2,)}, {"y": None},
                        {"c": np.array([True, False])})
    with np.errstate(invalid="ignore"):     # 0 * inf
        y = OnnxModule(model, device="numpy")(np.array([1.0, np.inf], np.float32),
                                              np.array([2.0, 3.0], np.float32)).numpy()
    assert y[0] == 1.0 and np.isnan(y[1])


def test_dropout_mask_is_all_true_in_inference():
    model = graph_model([node("Dropout", ["x"], ["y", "mask"], seed=1)], {"x": (2, 3)},
                        {"y": (2, 3), "mask": (2, 3)})
    model.graph.output[1].type.tensor_type.elem_type = onnx.TensorProto.BOOL
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y, mask = OnnxModule(model, device="numpy")(x)
    np.testing.assert_array_equal(y.numpy(), x)
    assert mask.dtype == np.bool_ and mask.shape == (2, 3) and mask.all()


def test_prelu_slope_that_does_not_broadcast_to_the_input_is_refused():
    model = graph_model([node("PRelu", ["x", "slope"], name="pr")], {"x": (2, 3)}, {"y": None},
                        {"slope": np.ones((2, 1, 3), np.float32)})
    with pytest.raises(OnnxImportError, match=r"node pr \(PRelu\): a slope of shape \(2, 1, 3\)"):
        OnnxModule(model, device="numpy")(np.ones((2, 3), np.float32))


def test_unsupported_attribute_of_a_composed_operator_is_refused_at_load():
    model = graph_model([node("LeakyRelu", "x", name="lr", alpha=0.1)], {"x": (2, 3)}, {"y": None})
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("gamma", 2.0))
    with pytest.raises(OnnxImportError, match=r"^m: node lr \(LeakyRelu\): attribute gamma \(not "
                                              r"one of LeakyRelu-16's, opset 17\) is not "
                                              r"supported$"):
        OnnxModule(model, device="numpy", source="m")


# ------------------------------------------------- onnx's light models --
LIGHT_MODELS = sorted(p.stem for p in LIGHT.glob("light_*.onnx"))


def light_input(model):
    """The input onnx's backend runner feeds the light models: arange(n) / n."""
    initializers = {t.name for t in model.graph.initializer}
    value = next(i for i in model.graph.input if i.name not in initializers)
    shape = tuple(d.dim_value or 1 for d in value.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_its_reference_output(name):
    from onnx import numpy_helper
    model = onnx.load(str(LIGHT / f"{name}.onnx"))
    expected = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"{name}_output_0.pb")))
    got = OnnxModule(model, device="numpy", source=name)(light_input(model)).numpy()
    # onnx's runner compares these with rtol 1e-3 (2e-3 for densenet121), atol 1e-7.
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-7)


def light_model_with_random_weights(name, rng):
    """(model, input, onnxruntime's logits) of light model ``name`` with random weights.

    The light models' weights are constant fills (their reference output is a uniform
    softmax, 0.001 everywhere): here each fill is scaled elementwise by U(0.5, 1.5), and
    the graph ends at the logits (the Softmax's input, where there is one).
    """
    ort = pytest.importorskip("onnxruntime")
    from onnx import numpy_helper
    model = onnx.load(str(LIGHT / f"{name}.onnx"))
    shapes = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    kept, logits = [], model.graph.output[0].name      # DenseNet's ends at its logits
    for n in model.graph.node:
        if n.op_type == "ConstantOfShape":
            fill = numpy_helper.to_array(n.attribute[0].t).reshape(-1)[0]
            values = fill * rng.uniform(0.5, 1.5, shapes[n.input[0]])
            model.graph.initializer.append(numpy_helper.from_array(values.astype(np.float32),
                                                                    n.output[0]))
        elif n.op_type == "Softmax":
            logits = n.input[0]
        else:
            kept.append(n)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.output[0].name = logits
    x = light_input(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3      # the unused __SHAPE initializers are warned about
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert np.ptp(expected) > 1e-3 * np.max(np.abs(expected))      # not a constant output
    return model, x, expected


@pytest.mark.parametrize("name", ["light_inception_v1", "light_resnet50", "light_shufflenet"])
def test_light_model_with_random_weights_matches_onnxruntime(name, rng):
    """The logits of three light models with random weights against onnxruntime's. Covers
    LRN, Dropout's mask and Sum inside real graphs."""
    model, x, expected = light_model_with_random_weights(name, rng)
    got = OnnxModule(model, device="numpy", source=name)(x).numpy()
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_densenet_light_model_plan_reads_its_concatenations_in_place(rng):
    """DenseNet-121 (Caffe2's, random weights) through an inference plan on NumPy. Its
    layers concatenate incrementally (each concatenation feeds the next one and a batch
    norm + scale + ReLU), so only the four block outputs, read by the transitions alone,
    are read in place by their fused step (passes.fuse_concatenations); the other 54 are
    made. The logits match onnxruntime's."""
    from gdnflow import inference
    model, x, expected = light_model_with_random_weights("light_densenet121", rng)
    module = OnnxModule(model, device="numpy", source="light_densenet121").eval()
    plan = inference.compile(module, x.shape, device="numpy")
    built = plan.plans[next(iter(plan.plans))]
    assert built.stats["fused_concatenation"] == 4
    assert [step.name for step in built.program.steps].count("concat") == 54
    with gf.no_grad():
        got = plan(gf.tensor(x, device="numpy")).numpy()
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


# name: (node, constant initializers)
HOST_OPERATORS_OF_DATA = {
    "Mod": (node("Mod", ["x", "d"], fmod=1), {"d": np.float32(0.7)}),
    "GatherND": (node("GatherND", ["x", "i"]), {"i": np.array([[1], [0]], np.int64)}),
    "ScatterElements": (node("ScatterElements", ["x", "i", "u"]),
                        {"i": np.array([[1, 0, 1]], np.int64), "u": np.ones((1, 3), np.float32)}),
}


@pytest.mark.parametrize("op_node, constants", HOST_OPERATORS_OF_DATA.values(),
                         ids=HOST_OPERATORS_OF_DATA.keys())
def test_host_operators_with_a_gradient_refuse_data_that_needs_one(op_node, constants, rng):
    """Their result depends on x (unlike Floor's, Sign's), so computed on the host it would
    cut x's gradient off: refused, naming the node, where x requires one; run otherwise."""
    model = graph_model([op_node, node("Add", ["y0", "x"])], {"x": (2, 3)}, {"y": None},
                        constants, 16)
    model.graph.node[0].output[0] = "y0"
    module = OnnxModule(model, device="numpy")
    x = rng.standard_normal((2, 3))
    assert module(x.astype(np.float32)).shape == (2, 3)
    with pytest.raises(OnnxImportError, match=rf"node .* \({op_node.op_type}\): a gradient"):
        module(gf.tensor(x, device="numpy", requires_grad=True))
