"""One-operator ONNX models at every version that each operator gdnflow runs has in
opsets 7 to 21, built with onnx.helper: one or more cases per version (a case per
form where a version has several: an attribute or the input that replaced it,
Softmax's axis before and after opset 13...), each at the first opset of its
version, with random inputs of odd shapes. :func:`run_case` runs one in gdnflow
(NumPy) and in onnxruntime, or in onnx's reference evaluator for the deprecated
forms onnxruntime refuses (Upsample-10, Scatter-11). tests/io/test_onnx_opsets.py
runs them; tests/fixtures/make_onnx_coverage.py tabulates them by operator and opset.
"""
import collections
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import gdnflow as gf
from gdnflow.io.onnx import HANDLERS, OnnxModule
from gdnflow.io.onnx_opsets import schema, versions

#: One case: ``op`` at ``opset`` (the first of one of its versions), ``label`` naming
#: the form, the model and the values fed to its inputs.
Case = collections.namedtuple("Case", "op opset label model feeds")


class Data:
    """Random inputs for one case: float32 unless named otherwise."""

    def __init__(self, rng):
        self.rng = rng

    def normal(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def uniform(self, low, high, *shape):
        return self.rng.uniform(low, high, shape).astype(np.float32)

    def away_from_zero(self, *shape):
        return self.uniform(0.5, 2.0, *shape) * np.where(self.rng.random(shape) < 0.5, -1, 1).astype(
            np.float32)

    def integers(self, low, high, *shape, dtype=np.int64):
        return self.rng.integers(low, high, shape).astype(dtype)

    def flags(self, *shape):
        return self.rng.random(shape) < 0.5


def node(op_type, inputs, outputs="y", **attributes):
    """A node: ``inputs`` and ``outputs`` as lists of names or one space-separated string."""
    split = lambda names: names.split(" ") if isinstance(names, str) else list(names)  # noqa: E731
    return helper.make_node(op_type, split(inputs), split(outputs), **attributes)


def variant(label, nodes, feeds, constants=None, outputs=("y",)):
    """One form of an operator: nodes, the arrays fed to the graph inputs, the constant
    initializers and the graph outputs."""
    return label, nodes if isinstance(nodes, list) else [nodes], feeds, constants or {}, outputs


def i64(*values):
    return np.array(values, np.int64)


def f32(*values):
    return np.array(values, np.float32)


# ------------------------------------------------------------ builders --
# Each builder takes (op, opset, data) and returns the variants of ``op`` at ``opset``.
def unary(domain="normal", **attributes):
    draw = {"normal": lambda d: d.normal(3, 5, 2), "positive": lambda d: d.uniform(0.5, 2, 3, 5, 2),
            "unit": lambda d: d.uniform(-0.9, 0.9, 3, 5, 2),
            "above1": lambda d: d.uniform(1.1, 3, 3, 5, 2)}[domain]

    def build(op, opset, d):
        return [variant(", ".join(f"{k}={v}" for k, v in attributes.items()),
                        node(op, "x", **attributes), {"x": draw(d)})]
    return build


def _gelu(op, opset, d):
    return [variant("exact", node(op, "x"), {"x": d.normal(3, 5)}),
            variant("tanh", node(op, "x", approximate="tanh"), {"x": d.normal(3, 5)})]


def _special_values(op, opset, d):
    x = d.normal(3, 5)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    cases = [variant("", node(op, "x"), {"x": x})]
    if op == "IsInf":
        cases.append(variant("detect_negative=0", node(op, "x", detect_negative=0), {"x": x}))
    return cases


def _logical_unary(op, opset, d):
    return [variant("bool", node(op, "x"), {"x": d.flags(3, 4)})]


def binary(op, opset, d):
    b = d.away_from_zero(5, 1) if op == "Div" else d.normal(5, 1)
    cases = [variant("float, broadcasting", node(op, "a b"), {"a": d.normal(2, 5, 3), "b": b})]
    if op == "Div":
        cases.append(variant("int64, truncating", node(op, "a b"), {
            "a": d.integers(-20, 20, 2, 5), "b": d.integers(1, 6, 5) * np.where(
                d.flags(5), -1, 1)}))
    return cases


def _pow(op, opset, d):
    cases = [variant("float exponent tensor", node(op, "x e"), {"x": d.uniform(0.5, 2, 2, 3, 4),
                                                               "e": d.normal(4)}),
             variant("constant exponent", node(op, "x e"), {"x": d.normal(2, 3, 4)},
                     {"e": np.float32(3.0)})]
    if opset >= 12:     # integer exponents from Pow-12
        cases.append(variant("int64 exponent", node(op, "x e"), {"x": d.normal(2, 3, 4)},
                             {"e": np.int64(2)}))
    return cases


def _prelu(op, opset, d):
    return [variant("slope per channel", node(op, "x slope"), {"x": d.normal(2, 3, 2, 5)},
                    {"slope": d.uniform(0.1, 0.5, 3, 1, 1)})]


def _mod(op, opset, d):
    return [variant("fmod=1, float", node(op, "a b", fmod=1),
                    {"a": d.normal(3, 4) * 4, "b": d.away_from_zero(4)}),
            variant("fmod=0, int64", node(op, "a b"), {"a": d.integers(-20, 20, 3, 4),
                                                       "b": i64(3, -4, 5, -7)})]


def comparison(op, opset, d):
    rounded = lambda *shape: np.round(d.normal(*shape) * 2)  # noqa: E731   (ties occur)
    if op == "Equal" and opset < 11:    # Equal-7: integers and bool only
        return [variant("int32", node(op, "a b"), {"a": rounded(3, 4).astype(np.int32),
                                                   "b": rounded(4).astype(np.int32)})]
    return [variant("float, broadcasting", node(op, "a b"), {"a": rounded(3, 4), "b": rounded(4)})]


def _logical(op, opset, d):
    return [variant("bool, broadcasting", node(op, "a b"), {"a": d.flags(3, 4), "b": d.flags(4)})]


def _bitwise(op, opset, d):
    if op == "BitwiseNot":
        return [variant("int32", node(op, "x"), {"x": d.integers(-100, 100, 3, 4, dtype=np.int32)})]
    return [variant("int32", node(op, "a b"), {"a": d.integers(-100, 100, 3, 4, dtype=np.int32),
                                               "b": d.integers(-100, 100, 4, dtype=np.int32)})]


def _bit_shift(op, opset, d):
    feeds = {"x": d.integers(0, 60, 3, 4, dtype=np.uint8), "s": d.integers(0, 3, 4, dtype=np.uint8)}
    return [variant(direction, node(op, "x s", direction=direction), feeds)
            for direction in ("LEFT", "RIGHT")]


def variadic(op, opset, d):
    if opset < 8:       # before opset 8 the inputs have one shape
        return [variant("same shapes", node(op, "a b c"), {k: d.normal(2, 3) for k in "abc"})]
    cases = [variant("broadcasting", node(op, "a b c"),
                     {"a": d.normal(2, 3), "b": d.normal(3), "c": d.normal(2, 1)})]
    if op in ("Max", "Min") and opset >= 12:
        cases.append(variant("int32", node(op, "a b"), {
            "a": d.integers(-9, 9, 2, 3, dtype=np.int32), "b": d.integers(-9, 9, 3, dtype=np.int32)}))
    return cases


def _where(op, opset, d):
    return [variant("broadcasting", node(op, "c a b"),
                    {"c": d.flags(2, 3), "a": d.normal(2, 3), "b": d.normal(3)})]


#: op type -> the first opset whose version takes the axes as an input.
AXES_INPUT_FROM = {"ReduceSum": 13}


def reduction(op, opset, d):
    draw = {"ReduceLogSum": lambda: d.uniform(0.5, 2, 3, 4, 5),
            "ReduceProd": lambda: d.uniform(0.5, 1.5, 3, 4, 5)}.get(op, lambda: d.normal(3, 4, 5))
    if opset < AXES_INPUT_FROM.get(op, 18):
        cases = [variant("axes attribute", node(op, "x", axes=[1]), {"x": draw()}),
                 variant("axes attribute, keepdims=0", node(op, "x", axes=[0, 2], keepdims=0),
                         {"x": draw()}),
                 variant("every axis", node(op, "x", keepdims=0), {"x": draw()})]
        if opset >= 11:     # negative axes from opset 11
            cases.append(variant("negative axes", node(op, "x", axes=[-1, 0]), {"x": draw()}))
    else:
        cases = [variant("axes input", node(op, "x axes", keepdims=0), {"x": draw()},
                         {"axes": i64(-1, 0)}),
                 variant("no axes: every axis", node(op, "x"), {"x": draw()}),
                 variant("no axes, noop_with_empty_axes", node(op, "x", noop_with_empty_axes=1),
                         {"x": draw()})]
    if op in ("ReduceMax", "ReduceMin") and opset in (12, 20):
        ints = d.integers(-9, 9, 3, 4, 5, dtype=np.int32)
        x = ints if opset == 12 else ints > 0       # int8.. from 12, bool from 20
        axes = {"axes": [1]} if opset < 18 else {}
        cases.append(variant(f"{x.dtype}", node(op, "x axes" if opset >= 18 else "x", **axes),
                             {"x": x}, {"axes": i64(1)} if opset >= 18 else None))
    return cases


def arg_extremum(op, opset, d):
    x = lambda: np.round(d.normal(3, 4, 5))  # noqa: E731   (ties occur)
    cases = [variant("axis=1", node(op, "x", axis=1), {"x": x()}),
             variant("keepdims=0", node(op, "x", axis=2, keepdims=0), {"x": x()})]
    if opset >= 11:
        cases.append(variant("negative axis", node(op, "x", axis=-2), {"x": x()}))
    if opset >= 12:
        cases.append(variant("select_last_index", node(op, "x", axis=1, select_last_index=1),
                             {"x": x()}))
    return cases


# ---------------------------------------------------------------- shapes --
def _concat(op, opset, d):
    feeds = {"a": d.normal(2, 1, 3), "b": d.normal(2, 3, 3), "c": d.normal(2, 2, 3)}
    axis = -2 if opset >= 11 else 1
    return [variant(f"axis={axis}", node(op, "a b c", axis=axis), feeds)]


def _flatten(op, opset, d):
    axes = [None, 0, 2, 4] + ([-1] if opset >= 11 else [])
    return [variant(f"axis={axis}", node(op, "x", **({} if axis is None else {"axis": axis})),
                    {"x": d.normal(2, 3, 4, 5)}) for axis in axes]


def _reshape(op, opset, d):
    cases = [variant("0 and -1", node(op, "x shape"), {"x": d.normal(2, 3, 4)}, {"shape": i64(0, -1)}),
             variant("-1 inside", node(op, "x shape"), {"x": d.normal(2, 3, 4)},
                     {"shape": i64(4, -1, 2)})]
    if opset >= 14:
        cases.append(variant("allowzero=1", node(op, "x shape", allowzero=1), {"x": d.normal(2, 3, 4)},
                             {"shape": i64(4, 6)}))
    return cases


def _transpose(op, opset, d):
    return [variant("perm", node(op, "x", perm=[2, 0, 1]), {"x": d.normal(2, 3, 4)}),
            variant("reversed", node(op, "x"), {"x": d.normal(2, 3, 4)})]


def _squeeze(op, opset, d):
    x = lambda: d.normal(2, 1, 3, 1)  # noqa: E731
    if opset < 13:
        axes = [1, -1] if opset >= 11 else [1]
        return [variant(f"axes attribute {axes}", node(op, "x", axes=axes), {"x": x()}),
                variant("every axis of size 1", node(op, "x"), {"x": x()})]
    return [variant("axes input", node(op, "x axes"), {"x": x()}, {"axes": i64(1, -1)}),
            variant("every axis of size 1", node(op, "x"), {"x": x()})]


def _unsqueeze(op, opset, d):
    if opset < 13:
        axes = [-1, 1] if opset >= 11 else [0, 3]
        return [variant(f"axes attribute {axes}", node(op, "x", axes=axes), {"x": d.normal(2, 3)})]
    return [variant("axes input", node(op, "x axes"), {"x": d.normal(2, 3)}, {"axes": i64(-1, 1)})]


def _split(op, opset, d):
    x = lambda: d.normal(2, 7)  # noqa: E731
    axis = -1 if opset >= 11 else 1
    if opset < 13:
        cases = [variant("split attribute", node(op, "x", "p q", axis=axis, split=[3, 4]), {"x": x()},
                         outputs=("p", "q"))]
    else:
        cases = [variant("split input", node(op, "x parts", "p q", axis=axis), {"x": x()},
                         {"parts": i64(3, 4)}, outputs=("p", "q"))]
    if opset < 18:      # from opset 18, split or num_outputs is required
        cases.append(variant("equal parts", node(op, "x", "p q", axis=0), {"x": x()},
                             outputs=("p", "q")))
    else:
        cases.append(variant("num_outputs, last smaller", node(op, "x", "p q r", axis=1, num_outputs=3),
                             {"x": x()}, outputs=("p", "q", "r")))
    return cases


def _slice(op, opset, d):
    x = lambda: d.normal(4, 5, 6)  # noqa: E731
    if opset < 10:
        return [variant("attributes", node(op, "x", starts=[1, -4], ends=[1000, -1], axes=[0, 2]),
                        {"x": x()}),
                variant("no axes", node(op, "x", starts=[0, 1], ends=[2, 4]), {"x": x()})]
    cases = [variant("inputs, steps", node(op, "x starts ends axes steps"), {"x": x()},
                     {"starts": i64(1, 0), "ends": i64(1000, 5), "axes": i64(0, 2),
                      "steps": i64(2, 2)}),
             variant("inputs, no axes", node(op, "x starts ends"), {"x": x()},
                     {"starts": i64(0, 1), "ends": i64(2, 4)})]
    if opset >= 11:
        cases.append(variant("negative axes and step", node(op, "x starts ends axes steps"),
                             {"x": x()}, {"starts": i64(-1, 4), "ends": i64(-1000, 0),
                                          "axes": i64(-1, 1), "steps": i64(-2, -1)}))
    return cases


def _pad(op, opset, d):
    x = lambda: d.normal(2, 3, 4)  # noqa: E731
    if opset < 11:
        return [variant("pads and value attributes", node(op, "x", pads=[0, 1, 2, 1, 0, 3], value=1.5),
                        {"x": x()})]
    cases = [variant("pads and constant_value inputs", node(op, "x pads value"), {"x": x()},
                     {"pads": i64(0, 1, 2, 1, 0, 3), "value": np.float32(-0.5)}),
             variant("no constant_value", node(op, "x pads"), {"x": x()},
                     {"pads": i64(1, 0, 0, 0, 2, 1)})]
    if opset >= 18:
        cases.append(variant("axes input", node(op, "x pads value axes"), {"x": x()},
                             {"pads": i64(1, 2, 3, 0), "value": np.float32(2.0), "axes": i64(-1, 1)}))
    return cases


def _tile(op, opset, d):
    return [variant("repeats", node(op, "x repeats"), {"x": d.normal(2, 3)}, {"repeats": i64(2, 3)})]


def _expand(op, opset, d):
    return [variant("both ways", node(op, "x shape"), {"x": d.normal(3, 1)}, {"shape": i64(2, 1, 4)})]


def _gather(op, opset, d):
    cases = [variant("axis=1, 2-D indices", node(op, "x i", axis=1), {"x": d.normal(4, 5)},
                     {"i": i64(0, 2, 3, 1).reshape(2, 2)})]
    if opset >= 11:
        cases.append(variant("negative indices", node(op, "x i"), {"x": d.normal(4, 5)},
                             {"i": i64(-1, 0, -3)}))
    return cases


def _gather_elements(op, opset, d):
    return [variant("negative indices", node(op, "x i", axis=1), {"x": d.normal(3, 4)},
                    {"i": i64(0, 3, -1, 2, 2, 1).reshape(2, 3)})]


def _gather_nd(op, opset, d):
    cases = [variant("", node(op, "x i"), {"x": d.normal(3, 4, 2)}, {"i": i64(1, 2, 0, 3).reshape(2, 2)})]
    if opset >= 12:
        cases.append(variant("batch_dims=1", node(op, "x i", batch_dims=1), {"x": d.normal(2, 4, 3)},
                             {"i": i64(1, 3, 0, 2).reshape(2, 2, 1)}))
    return cases


def _scatter(op, opset, d):
    constants = {"i": i64(1, 0, 2, 0, 2, 1).reshape(2, 3), "u": d.normal(2, 3)}
    cases = [variant("axis=1", node(op, "x i u", axis=1), {"x": d.normal(3, 3)}, constants)]
    if op == "ScatterElements" and opset >= 16:
        duplicates = {"i": i64(1, 1, 0, 0, 2, 2).reshape(2, 3), "u": d.normal(2, 3)}
        for reduction in ("add", "mul") + (("max", "min") if opset >= 18 else ()):
            cases.append(variant(f"reduction={reduction}", node(op, "x i u", reduction=reduction),
                                 {"x": d.normal(3, 3)}, duplicates))
    return cases


def _shape(op, opset, d):
    cases = [variant("", node(op, "x"), {"x": d.normal(2, 3, 4)})]
    if opset >= 15:
        cases.append(variant("start and end", node(op, "x", start=1, end=-1),
                             {"x": d.normal(2, 3, 4, 5)}))
    return cases


def _cast(op, opset, d):
    return [variant("int32 to float", node(op, "x", to=TensorProto.FLOAT),
                    {"x": d.integers(-9, 9, 3, 4, dtype=np.int32)}),
            variant("float to float", node(op, "x", to=TensorProto.FLOAT), {"x": d.normal(3, 4)}),
            variant("bool to int64", node(op, "x", to=TensorProto.INT64), {"x": d.flags(3, 4)})]


def _constant(op, opset, d):
    value = d.normal(3, 4)
    cases = [variant("value", [node(op, [], "c", value=numpy_helper.from_array(value)),
                               node("Add", "x c")], {"x": d.normal(3, 4)})]
    if opset >= 12:
        cases.append(variant("value_floats", [node(op, [], "c", value_floats=[0.5, -1.0, 2.0, 3.0]),
                                              node("Add", "x c")], {"x": d.normal(3, 4)}))
    return cases


def _constant_of_shape(op, opset, d):
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [2.5])
    return [variant("float fill", [node(op, "shape", "c", value=fill), node("Mul", "x c")],
                    {"x": d.normal(3, 4)}, {"shape": i64(3, 4)}),
            variant("default fill", [node(op, "shape", "c"), node("Add", "x c")],
                    {"x": d.normal(3, 4)}, {"shape": i64(4)})]


def _depth_to_space(op, opset, d):
    modes = ["DCR", "CRD"] if opset >= 11 else [None]
    return [variant(f"mode={mode}", node(op, "x", blocksize=2, **({"mode": mode} if mode else {})),
                    {"x": d.normal(1, 8, 2, 3)}) for mode in modes]


def _space_to_depth(op, opset, d):
    return [variant("blocksize=2", node(op, "x", blocksize=2), {"x": d.normal(1, 2, 4, 6)})]


def _trilu(op, opset, d):
    return [variant("upper, k=1", node(op, "x k"), {"x": d.normal(2, 3, 4)}, {"k": np.int64(1)}),
            variant("lower, no k", node(op, "x", upper=0), {"x": d.normal(2, 4, 3)})]


def _eye_like(op, opset, d):
    return [variant("k=1", node(op, "x", k=1), {"x": d.normal(3, 4)}),
            variant("dtype int32", node(op, "x", dtype=TensorProto.INT32, k=-1), {"x": d.normal(4, 3)})]


def _one_hot(op, opset, d):
    cases = [variant("", node(op, "i depth values"), {"i": i64(0, 2, 1, 3, 3, 0).reshape(2, 3)},
                     {"depth": np.float32(4), "values": f32(-1.0, 2.5)})]
    if opset >= 11:
        cases.append(variant("negative indices, axis=0", node(op, "i depth values", axis=0),
                             {"i": i64(-1, 2, -4)}, {"depth": np.int64(4), "values": f32(0, 1)}))
    return cases


def _non_zero(op, opset, d):
    x = d.normal(3, 4)
    x[x < 0.3] = 0
    return [variant("float", node(op, "x"), {"x": x})]


def _range(op, opset, d):
    return [variant("int64", node(op, "start limit delta"), {},
                    {"start": np.int64(-3), "limit": np.int64(10), "delta": np.int64(4)}),
            variant("float", node(op, "start limit delta"), {},
                    {"start": np.float32(0.5), "limit": np.float32(-2), "delta": np.float32(-0.75)})]


def _cumsum(op, opset, d):
    return [variant("axis 1", node(op, "x axis"), {"x": d.normal(3, 4)}, {"axis": np.int64(1)}),
            variant("exclusive, reverse, axis 0", node(op, "x axis", exclusive=1, reverse=1),
                    {"x": d.normal(3, 4)}, {"axis": np.int64(0)})]


def _einsum(op, opset, d):
    return [variant("batched matmul", node(op, "a b", equation="bij,bjk->bik"),
                    {"a": d.normal(2, 3, 4), "b": d.normal(2, 4, 5)})]


def _top_k(op, opset, d):
    if opset < 10:
        return [variant("k attribute", node(op, "x", "y i", k=2, axis=1), {"x": d.normal(2, 5, 3)},
                        outputs=("y", "i"))]
    cases = [variant("K input", node(op, "x k", "y i"), {"x": d.normal(2, 3, 5)}, {"k": i64(3)},
                     outputs=("y", "i"))]
    if opset >= 11:
        cases.append(variant("smallest, negative axis", node(op, "x k", "y i", axis=-2, largest=0),
                             {"x": d.normal(2, 5, 3)}, {"k": i64(2)}, outputs=("y", "i")))
    return cases


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
                    {"x": d.normal(1, 2, 5, 5)})]


def _global_pool(op, opset, d):
    attributes = {"p": 3} if op == "GlobalLpPool" else {}
    return [variant("", node(op, "x", **attributes), {"x": d.normal(2, 3, 4, 5)})]


def _batch_norm(op, opset, d):
    statistics = lambda *shape: {"s": d.uniform(0.5, 1.5, *shape), "b": d.normal(*shape),  # noqa: E731
                                 "m": d.normal(*shape), "v": d.uniform(0.5, 1.5, *shape)}
    cases = [variant("inference", node(op, "x s b m v", epsilon=1e-3), {"x": d.normal(2, 3, 4, 5)},
                     statistics(3))]
    if opset < 9:
        cases.append(variant("spatial=0", node(op, "x s b m v", spatial=0), {"x": d.normal(2, 3, 4, 5)},
                             statistics(3, 4, 5)))
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
    return [variant("axis=1, bias", node(op, "x s b", axis=1, epsilon=1e-3), {"x": d.normal(2, 3, 4)},
                    {"s": d.normal(3, 4), "b": d.normal(4)}),
            variant("last axis, no bias", node(op, "x s"), {"x": d.normal(3, 5)}, {"s": d.normal(5)})]


def _group_norm(op, opset, d):
    per = 2 if opset < 21 else 6        # a scale and bias per group before opset 21, per channel from it
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
        return [variant("min and max attributes", node(op, "x", min=-0.5, max=0.7), {"x": d.normal(3, 4)}),
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
        return [variant(f"{mode}, scales input", node(op, "x scales", mode=mode), {"x": x()}, scales(*s))
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
                    op, "x roi scales", mode="cubic", coordinate_transformation_mode="align_corners"),
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
            op, ["x", "", "", "sizes"], mode="linear", axes=[2, 3], keep_aspect_ratio_policy=policy),
            {"x": x()}, {"sizes": i64(9, 9)}) for policy in ("not_larger", "not_smaller")]
    if opset >= 19:
        cases.append(variant("half_pixel_symmetric", node(
            op, ["x", "", "scales"], mode="linear",
            coordinate_transformation_mode="half_pixel_symmetric"), {"x": x()}, scales(1.7, 0.6)))
    return cases


def _upsample(op, opset, d):
    x = lambda: d.normal(1, 2, 3, 4)  # noqa: E731
    if opset < 9:
        return [variant(f"{mode}, scales attribute", node(op, "x", mode=mode, scales=[1.0, 1.0, 2.0, s]),
                        {"x": x()}) for mode, s in (("nearest", 3.0), ("linear", 1.5))]
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
                    {"m": np.int64(3), "c": np.array(True), "k": np.float32(1.5)}, outputs=("y", "s"))]


def _dequantize(op, opset, d):
    w = d.integers(-128, 127, 4, 6, dtype=np.int8)
    cases = [variant("per tensor", [node(op, "w scale zero", "wf"), node("MatMul", "x wf")],
                     {"x": d.normal(3, 4)}, {"w": w, "scale": np.float32(0.05), "zero": np.int8(3)})]
    if opset >= 13:
        cases.append(variant("per axis", [node(op, "w scale zero", "wf", axis=1), node("MatMul", "x wf")],
                             {"x": d.normal(3, 4)}, {"w": w, "scale": d.uniform(0.01, 0.1, 6),
                                                     "zero": d.integers(-5, 5, 6, dtype=np.int8)}))
    if opset >= 21:
        cases.append(variant("blocked", [node(op, "w scale zero", "wf", axis=0, block_size=2),
                                         node("MatMul", "x wf")],
                             {"x": d.normal(3, 4)}, {"w": w, "scale": d.uniform(0.01, 0.1, 2, 6),
                                                     "zero": d.integers(-5, 5, 2, 6, dtype=np.int8)}))
    return cases


def _identity(op, opset, d):
    return [variant("", node(op, "x"), {"x": d.normal(3, 4)})]


def _size(op, opset, d):
    return [variant("", node(op, "x"), {"x": d.normal(2, 3, 4)})]


BUILDERS = {
    **{op: unary() for op in (
        "Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Ceil", "Floor", "Sign", "Round", "Erf", "Sin",
        "Cos", "Atan", "Asinh", "Sinh", "Cosh", "Softplus", "Softsign", "HardSwish", "Mish")},
    **{op: unary("positive") for op in ("Log", "Sqrt", "Reciprocal")},
    **{op: unary("unit") for op in ("Tan", "Acos", "Asin", "Atanh")}, "Acosh": unary("above1"),
    "Elu": unary(alpha=0.7), "Selu": unary(alpha=1.5, gamma=1.2), "Celu": unary(alpha=0.8),
    "LeakyRelu": unary(alpha=0.2), "HardSigmoid": unary(alpha=0.3, beta=0.4),
    "ThresholdedRelu": unary(alpha=0.3), "Shrink": unary(lambd=0.4, bias=0.2), "Gelu": _gelu,
    "IsNaN": _special_values, "IsInf": _special_values, "Not": _logical_unary,
    **{op: binary for op in ("Add", "Sub", "Mul", "Div")}, "Pow": _pow, "PRelu": _prelu, "Mod": _mod,
    **{op: comparison for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")},
    **{op: _logical for op in ("And", "Or", "Xor")},
    **{op: _bitwise for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")},
    "BitShift": _bit_shift, **{op: variadic for op in ("Sum", "Mean", "Max", "Min")}, "Where": _where,
    **{op: reduction for op in HANDLERS if op.startswith("Reduce")},
    "ArgMax": arg_extremum, "ArgMin": arg_extremum,
    "Concat": _concat, "Flatten": _flatten, "Reshape": _reshape, "Transpose": _transpose,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Split": _split, "Slice": _slice, "Pad": _pad,
    "Tile": _tile, "Expand": _expand, "Gather": _gather, "GatherElements": _gather_elements,
    "GatherND": _gather_nd, "ScatterElements": _scatter, "Scatter": _scatter, "Shape": _shape,
    "Size": _size, "Cast": _cast, "Constant": _constant, "ConstantOfShape": _constant_of_shape,
    "Identity": _identity, "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth,
    "Trilu": _trilu, "EyeLike": _eye_like, "OneHot": _one_hot, "NonZero": _non_zero,
    "Range": _range, "CumSum": _cumsum, "Einsum": _einsum, "TopK": _top_k,
    "Conv": _conv, "ConvTranspose": _conv_transpose, "Gemm": _gemm, "MatMul": _matmul,
    "MaxPool": _pool, "AveragePool": _pool,
    **{op: _global_pool for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")},
    "BatchNormalization": _batch_norm, "InstanceNormalization": _instance_norm, "LRN": _lrn,
    "LayerNormalization": _layer_norm, "GroupNormalization": _group_norm,
    "MeanVarianceNormalization": _mean_variance_norm, "LpNormalization": _lp_norm,
    "Dropout": _dropout, "Clip": _clip, **{op: softmax for op in ("Softmax", "LogSoftmax", "Hardmax")},
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
                cases.append(Case(op, opset, label, model_of(nodes, feeds, constants, outputs, opset),
                                  feeds))
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


def run_case(case):
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

