"""One-operator ONNX models at every version that each operator gdnflow runs has in
opsets 7 to 21, built with onnx.helper: one or more cases per version (a case per
form where a version has several: an attribute or the input that replaced it,
Softmax's axis before and after opset 13...), each at the first opset of its
version, with random inputs of odd shapes. :func:`assert_case_matches` runs one in gdnflow
(NumPy) and compares it with :func:`reference`: onnxruntime, or what stands in
where onnxruntime refuses the form. The builders of the elementwise, reduction,
shape and indexing operators are in tests/onnx_opset_forms.py, those of the
layers here. tests/io/test_onnx_opsets.py runs the cases;
tests/fixtures/make_onnx_coverage.py tabulates them by operator and opset.
"""
import collections
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import gdnflow as gf
from gdnflow.io.onnx import OnnxModule
from gdnflow.io.onnx_opsets import schema, versions
import onnx_opset_forms
from onnx_opset_forms import Data, f32, i64, node, variant

#: One case: ``op`` at ``opset`` (the first of one of its versions), ``label`` naming
#: the form, the model and the values fed to its inputs.
Case = collections.namedtuple("Case", "op opset label model feeds")


# ----------------------------------------------------- networks' layers --
def _conv(op, opset, d):
    return [variant("grouped, strided, dilated, padded", node(
        op, "x w b", group=2, strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 1]),
        {"x": d.normal(1, 4, 7, 6)}, {"w": d.normal(6, 2, 3, 3), "b": d.normal(6)}),
        variant("SAME_UPPER, no bias", node(op, "x w", auto_pad="SAME_UPPER", strides=[2, 2]),
                {"x": d.normal(1, 2, 5, 6)}, {"w": d.normal(3, 2, 2, 3)})]


def _conv_transpose(op, opset, d):
    return [variant("strided, output_padding", node(
        op, "x w b", strides=[2, 2], output_padding=[1, 0], pads=[1, 0, 0, 1]),
        {"x": d.normal(1, 4, 4, 5)}, {"w": d.normal(4, 3, 3, 3), "b": d.normal(3)})]


def _gemm(op, opset, d):
    cases = [variant("transB, alpha, beta, C", node(op, "a w c", transB=1, alpha=0.5, beta=2.0),
                     {"a": d.normal(3, 4)}, {"w": d.normal(5, 4), "c": d.normal(5)}),
             variant("transA, C broadcast", node(op, "a w c", transA=1),
                     {"a": d.normal(4, 3)}, {"w": d.normal(4, 5), "c": d.normal(3, 1)})]
    if opset >= 11:     # C optional from Gemm-11
        cases.append(variant("no C", node(op, "a w"), {"a": d.normal(3, 4)}, {"w": d.normal(4, 5)}))
    return cases


def _matmul(op, opset, d):
    return [variant("batched, broadcasting", node(op, "a b"), {"a": d.normal(2, 1, 3, 4),
                                                              "b": d.normal(5, 4, 2)}),
            variant("weight", node(op, "a w"), {"a": d.normal(3, 4)}, {"w": d.normal(4, 5)})]


def _pool(op, opset, d):
    extra = {"count_include_pad": 1} if op == "AveragePool" else {}
    return [variant("padded, strided", node(op, "x", kernel_shape=[3, 2], pads=[1, 0, 1, 1],
                                            strides=[2, 1], **extra), {"x": d.normal(1, 2, 7, 6)}),
            variant("SAME_LOWER", node(op, "x", kernel_shape=[2, 2], auto_pad="SAME_LOWER"),
                    {"x": d.normal(1, 2, 5, 5)})] + ([
        variant("ceil_mode, padded", node(op, "x", kernel_shape=[3, 3], pads=[1, 0, 0, 1],
                                          strides=[2, 2], ceil_mode=1, **extra),
                {"x": d.normal(1, 2, 6, 7)})] if opset >= 10 else [])


def _global_pool(op, opset, d):
    attributes = {"p": 3} if op == "GlobalLpPool" else {}
    return [variant("", node(op, "x", **attributes), {"x": d.normal(2, 3, 4, 5)})]


def _batch_norm(op, opset, d):
    def statistics(*shape):
        return {"s": d.uniform(0.5, 1.5, *shape), "b": d.normal(*shape), "m": d.normal(*shape),
                "v": d.uniform(0.5, 1.5, *shape)}
    cases = [variant("inference", node(op, "x s b m v", epsilon=1e-3), {"x": d.normal(2, 3, 4, 5)},
                     statistics(3))]
    if opset < 9:
        cases.append(variant("spatial=0", node(op, "x s b m v", spatial=0),
                             {"x": d.normal(2, 3, 4, 5)}, statistics(3, 4, 5)))
    if opset >= 14:
        cases.append(variant("training_mode=0", node(op, "x s b m v", training_mode=0),
                             {"x": d.normal(2, 3, 4)}, statistics(3)))
    return cases


def _instance_norm(op, opset, d):
    return [variant("", node(op, "x s b", epsilon=1e-3), {"x": d.normal(2, 3, 4, 5)},
                    {"s": d.uniform(0.5, 1.5, 3), "b": d.normal(3)})]


def _lrn(op, opset, d):
    # Odd sizes: onnxruntime refuses even ones (tests/io/test_onnx_opsets.py checks one).
    return [variant(f"size={size}", node(op, "x", size=size, alpha=0.5, beta=0.75, bias=2.0),
                    {"x": d.normal(2, 5, 3, 2)}) for size in (3, 5)]


def _layer_norm(op, opset, d):
    return [variant("axis=1, bias", node(op, "x s b", axis=1, epsilon=1e-3),
                    {"x": d.normal(2, 3, 4)}, {"s": d.normal(3, 4), "b": d.normal(4)}),
            variant("last axis, no bias", node(op, "x s"), {"x": d.normal(3, 5)},
                    {"s": d.normal(5)})]


def _group_norm(op, opset, d):
    per = 2 if opset < 21 else 6        # scale and bias: per group before opset 21, per channel
    return [variant(f"scale and bias per {'group' if per == 2 else 'channel'}",
                    node(op, "x s b", num_groups=2, epsilon=1e-3), {"x": d.normal(2, 6, 3, 2)},
                    {"s": d.uniform(0.5, 1.5, per), "b": d.normal(per)})]


def _mean_variance_norm(op, opset, d):
    return [variant("default axes", node(op, "x"), {"x": d.normal(2, 3, 4, 5)}),
            variant("axes [1, 3]", node(op, "x", axes=[1, 3]), {"x": d.normal(2, 3, 4, 5)})]


def _lp_norm(op, opset, d):
    return [variant("p=1, axis 0", node(op, "x", p=1, axis=0), {"x": d.normal(3, 4)}),
            variant("p=2", node(op, "x"), {"x": d.normal(3, 4)})]


def _dropout(op, opset, d):
    # The mask (all true in inference) is compared from opset 12 on: onnxruntime gives
    # all false before (tests/io/test_onnx_opsets.py checks gdnflow's there).
    if opset < 12:
        return [variant("ratio attribute", node(op, "x", ratio=0.3), {"x": d.normal(3, 4)})]
    return [variant("ratio input, mask", node(op, "x r", "y mask"), {"x": d.normal(3, 4)},
                    {"r": np.float32(0.3)}, outputs=("y", "mask")),
            variant("training_mode false", node(op, "x r t"), {"x": d.normal(3, 4)},
                    {"r": np.float32(0.3), "t": np.array(False)})]


def _clip(op, opset, d):
    if opset < 11:
        return [variant("min and max attributes", node(op, "x", min=-0.5, max=0.7),
                        {"x": d.normal(3, 4)}),
                variant("min attribute only", node(op, "x", min=0.1), {"x": d.normal(3, 4)})]
    return [variant("min and max inputs", node(op, "x lo hi"), {"x": d.normal(3, 4)},
                    {"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
            variant("max input only", node(op, ["x", "", "hi"]), {"x": d.normal(3, 4)},
                    {"hi": np.float32(0.2)}),
            variant("0 to 6", node(op, "x lo hi"), {"x": d.normal(3, 4) * 5},
                    {"lo": np.float32(0), "hi": np.float32(6)})]


def softmax(op, opset, d):
    axes = [None, 0, 2] + ([-1, -3] if opset >= 11 else [])
    return [variant(f"axis={axis}", node(op, "x", **({} if axis is None else {"axis": axis})),
                    {"x": d.normal(3, 4, 5) * 2}) for axis in axes]


def _resize(op, opset, d):
    x = lambda: d.normal(1, 2, 5, 7)  # noqa: E731
    scales = lambda *s: {"scales": f32(1, 1, *s)}  # noqa: E731
    if opset < 11:
        return [variant(f"{mode}, scales input", node(op, "x scales", mode=mode), {"x": x()},
                        scales(*s))
                for mode, s in (("nearest", (0.6, 1.5)), ("nearest", (2, 3)), ("linear", (2, 0.5)))]
    if opset < 13:      # roi and scales required; an empty scales with sizes
        return [variant("nearest, half_pixel", node(op, "x roi scales"), {"x": x()},
                        {"roi": f32(), **scales(1.7, 0.6)}),
                variant("linear, sizes", node(op, "x roi scales sizes", mode="linear"), {"x": x()},
                        {"roi": f32(), "scales": f32(), "sizes": i64(1, 2, 8, 4)}),
                variant("tf_half_pixel_for_nn", node(
                    op, "x roi scales", coordinate_transformation_mode="tf_half_pixel_for_nn"),
                    {"x": x()}, {"roi": f32(), **scales(1.7, 0.6)}),
                # Integer output lengths: for others onnxruntime's align_corners differs from
                # onnx's reference (whose node cases gdnflow passes).
                variant("cubic, align_corners", node(
                    op, "x roi scales", mode="cubic",
                    coordinate_transformation_mode="align_corners"),
                    {"x": x()}, {"roi": f32(), **scales(2, 2)})]
    cases = [variant("nearest, scales, no roi", node(op, ["x", "", "scales"]), {"x": x()},
                     scales(1.7, 0.6)),
             variant("linear, pytorch_half_pixel, sizes", node(
                 op, ["x", "", "", "sizes"], mode="linear",
                 coordinate_transformation_mode="pytorch_half_pixel"), {"x": x()},
                 {"sizes": i64(1, 2, 8, 4)}),
             variant("nearest, asymmetric, floor, x2", node(
                 op, ["x", "", "scales"], coordinate_transformation_mode="asymmetric",
                 nearest_mode="floor"), {"x": x()}, scales(2, 2))]
    if opset >= 18:
        cases += [variant("axes", node(op, ["x", "", "scales"], mode="linear", axes=[3, 2]),
                          {"x": x()}, {"scales": f32(0.6, 1.5)})]
        cases += [variant(f"keep_aspect_ratio_policy={policy}", node(
            op, ["x", "", "", "sizes"], mode="linear", axes=[2, 3],
            keep_aspect_ratio_policy=policy), {"x": x()}, {"sizes": i64(9, 9)})
            for policy in ("not_larger", "not_smaller")]
    if opset >= 19:
        cases.append(variant("half_pixel_symmetric", node(
            op, ["x", "", "scales"], mode="linear",
            coordinate_transformation_mode="half_pixel_symmetric"), {"x": x()}, scales(1.7, 0.6)))
    return cases


def _upsample(op, opset, d):
    x = lambda: d.normal(1, 2, 3, 4)  # noqa: E731
    if opset < 9:
        return [variant(f"{mode}, scales attribute",
                        node(op, "x", mode=mode, scales=[1.0, 1.0, 2.0, s]), {"x": x()})
                for mode, s in (("nearest", 3.0), ("linear", 1.5))]
    return [variant(f"{mode}, scales input", node(op, "x scales", mode=mode), {"x": x()},
                    {"scales": f32(1, 1, 2, s)}) for mode, s in (("nearest", 3), ("linear", 1.5))]


def recurrent(op, opset, d):
    gates, hidden = {"RNN": 1, "GRU": 3, "LSTM": 4}[op], 5

    def weights(directions):
        return {"w": d.normal(directions, gates * hidden, 4) * 0.5,
                "r": d.normal(directions, gates * hidden, hidden) * 0.5,
                "b": d.normal(directions, 2 * gates * hidden) * 0.5}
    outputs = ("y", "y_h") + (("y_c",) if op == "LSTM" else ())
    cases = [variant("forward", node(op, "x w r b", outputs, hidden_size=hidden),
                     {"x": d.normal(3, 2, 4)}, weights(1), outputs=outputs),
             variant("bidirectional", node(op, "x w r b", outputs, hidden_size=hidden,
                                           direction="bidirectional"),
                     {"x": d.normal(3, 2, 4)}, weights(2), outputs=outputs)]
    if opset >= 14:
        cases.append(variant("layout=1", node(op, "x w r b", outputs, hidden_size=hidden, layout=1),
                             {"x": d.normal(2, 3, 4)}, weights(1), outputs=outputs))
    return cases


def _branch(nodes, output):
    return helper.make_graph(nodes, "branch", [], [helper.make_tensor_value_info(
        output, TensorProto.FLOAT, None)])


def _if(op, opset, d):
    then_branch = _branch([node("Relu", "x", "t")], "t")
    else_branch = _branch([node("Neg", "x", "e")], "e")
    return [variant(f"condition {flag}", node(op, "c", then_branch=then_branch,
                                              else_branch=else_branch),
                    {"x": d.normal(2, 3)}, {"c": np.array(flag)}) for flag in (True, False)]


def _loop(op, opset, d):
    body = helper.make_graph(
        [node("Identity", "cond", "cond_out"), node("Mul", "v k", "scaled"),
         node("Add", "scaled x", "v_out"), node("Identity", "v_out", "scan")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, None)])
    return [variant("trip count, carried and scan outputs", node(op, "m c v0", "y s", body=body),
                    {"x": d.normal(2, 3), "v0": d.normal(2, 3)},
                    {"m": np.int64(3), "c": np.array(True), "k": np.float32(1.5)},
                    outputs=("y", "s"))]


def _dequantize(op, opset, d):
    w = d.integers(-128, 127, 4, 6, dtype=np.int8)
    def dequantized(label, scale, zero, **attributes):
        return variant(label, [node(op, "w scale zero", "wf", **attributes),
                               node("MatMul", "x wf")], {"x": d.normal(3, 4)},
                       {"w": w, "scale": scale, "zero": zero})
    cases = [dequantized("per tensor", np.float32(0.05), np.int8(3))]
    if opset >= 13:
        cases.append(dequantized("per axis", d.uniform(0.01, 0.1, 6),
                                 d.integers(-5, 5, 6, dtype=np.int8), axis=1))
    if opset >= 21:
        cases.append(dequantized("blocked", d.uniform(0.01, 0.1, 2, 6),
                                 d.integers(-5, 5, 2, 6, dtype=np.int8), axis=0, block_size=2))
    return cases


#: op type -> builder of its cases, for every operator gdnflow runs at some opset 7 to 21.
BUILDERS = {
    **onnx_opset_forms.BUILDERS,
    "Conv": _conv, "ConvTranspose": _conv_transpose, "Gemm": _gemm, "MatMul": _matmul,
    "MaxPool": _pool, "AveragePool": _pool,
    **{op: _global_pool for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")},
    "BatchNormalization": _batch_norm, "InstanceNormalization": _instance_norm, "LRN": _lrn,
    "LayerNormalization": _layer_norm, "GroupNormalization": _group_norm,
    "MeanVarianceNormalization": _mean_variance_norm, "LpNormalization": _lp_norm,
    "Dropout": _dropout, "Clip": _clip,
    **{op: softmax for op in ("Softmax", "LogSoftmax", "Hardmax")},
    "Resize": _resize, "Upsample": _upsample, **{op: recurrent for op in ("RNN", "GRU", "LSTM")},
    "If": _if, "Loop": _loop, "DequantizeLinear": _dequantize,
}


# ---------------------------------------------------------------- running --
def model_of(nodes, feeds, constants, outputs, opset):
    """A model of ``nodes`` at ``opset``, its inputs typed after ``feeds``, its outputs
    after onnx's shape inference (float where it infers nothing or fails: a model that
    is not valid, made to be refused)."""
    typed = lambda name, array: helper.make_tensor_value_info(  # noqa: E731
        name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
    graph = helper.make_graph(
        nodes, "case", [typed(n, a) for n, a in feeds.items()],
        [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in constants.items()])
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=max(helper.find_min_ir_version_for(opsets), 7))
    try:
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
    except onnx.shape_inference.InferenceError:
        inferred = {}
    for value in model.graph.output:
        known = inferred.get(value.name)
        value.CopyFrom(known if known is not None and known.type.HasField("tensor_type")
                       else helper.make_tensor_value_info(value.name, TensorProto.FLOAT, None))
    return model


def opset_cases(seed=0):
    """Every case of every operator gdnflow runs, at the first opset of each of its
    versions in opsets 7 to 21."""
    data = Data(np.random.default_rng(seed))
    cases = []
    for op in sorted(BUILDERS):
        for opset in versions(op).values():
            for label, nodes, feeds, constants, outputs in BUILDERS[op](op, opset, data):
                model = model_of(nodes, feeds, constants, outputs, opset)
                cases.append(Case(op, opset, label, model, feeds))
    return cases


def deprecated(case):
    """Whether the case's operator version is deprecated (the onnx checker refuses it)."""
    return schema(case.op, case.opset).deprecated


#: (op, opset) of a deprecated form -> the operator of the same form that onnxruntime runs.
SAME_FORM = {("Upsample", 10): "Resize", ("Scatter", 11): "ScatterElements"}


def reference(case):
    """(the case's expected outputs, the name of what computed them): onnxruntime
    (without graph optimisations, which fuse DequantizeLinear into quantised products);
    for a deprecated form, onnxruntime on the operator of the same form
    (:data:`SAME_FORM`); onnx's reference evaluator where onnxruntime has no kernel
    (recurrent layout=1, LRN of even size). Raises where the model is not valid ONNX."""
    import onnxruntime as ort
    model, source = case.model, "onnxruntime"
    if (case.op, case.opset) in SAME_FORM:
        model = onnx.ModelProto()
        model.CopyFrom(case.model)
        model.graph.node[0].op_type = SAME_FORM[case.op, case.opset]
        source = f"onnxruntime, as {model.graph.node[0].op_type}"
    if model.graph.node[0].op_type != case.op or not deprecated(case):
        # Each node has its version's form (attributes, inputs) in the case's opset
        # (those with subgraphs, which read outer names, onnxruntime checks alone).
        context = onnx.checker.C.CheckerContext()
        context.ir_version, context.opset_imports = model.ir_version, {"": case.opset}
        for each in model.graph.node:
            if not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for a in each.attribute):
                onnx.checker.check_node(each, context)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    except Exception:       # onnxruntime lacks this form
        from onnx.reference import ReferenceEvaluator
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ReferenceEvaluator(model).run(None, case.feeds), "onnx reference"
    return session.run(None, case.feeds), source


def assert_case_matches(case):
    """The name of the reference gdnflow matched (raises AssertionError where it did not,
    OnnxImportError where it refused the case)."""
    expected, source = reference(case)
    with np.errstate(all="ignore"):
        got = OnnxModule(case.model, device="numpy", source=f"{case.op} opset {case.opset}")(
            *case.feeds.values())
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for name, g, e in zip([o.name for o in case.model.graph.output], got, expected):
        g = g.numpy() if isinstance(g, gf.Tensor) else np.asarray(g)
        where = f"{case.op} at opset {case.opset}, {case.label}: output {name}"
        assert g.shape == e.shape, f"{where}: shape {g.shape}, {source} {e.shape}"
        assert g.dtype == e.dtype, f"{where}: {g.dtype}, {source} {e.dtype}"
        if e.dtype.kind == "f":
            scale = float(np.max(np.abs(e[np.isfinite(e)]), initial=1.0))
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * scale, err_msg=where)
        else:
            np.testing.assert_array_equal(g, e, err_msg=where)
    return source

