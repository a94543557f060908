"""Builders of the one-operator cases of tests/onnx_opset_cases.py: their random
inputs and nodes, and the cases of the elementwise, reduction, shape and indexing
operators. A builder takes (op, opset, data) and returns the variants of ``op``
at ``opset``, one per form its version has there."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


class Data:
    """Random inputs for one case: float32 unless named otherwise."""

    def __init__(self, rng):
        self.rng = rng

    def normal(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def uniform(self, low, high, *shape):
        return self.rng.uniform(low, high, shape).astype(np.float32)

    def away_from_zero(self, *shape):
        signs = np.where(self.rng.random(shape) < 0.5, -1, 1).astype(np.float32)
        return self.uniform(0.5, 2.0, *shape) * signs

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
            "a": d.integers(-9, 9, 2, 3, dtype=np.int32),
            "b": d.integers(-9, 9, 3, dtype=np.int32)}))
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
    x = lambda: d.normal(2, 3, 4)  # noqa: E731
    cases = [variant("0 and -1", node(op, "x shape"), {"x": x()}, {"shape": i64(0, -1)}),
             variant("-1 inside", node(op, "x shape"), {"x": x()}, {"shape": i64(4, -1, 2)})]
    if opset >= 14:
        cases.append(variant("allowzero=1", node(op, "x shape", allowzero=1), {"x": x()},
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
        cases = [variant("split attribute", node(op, "x", "p q", axis=axis, split=[3, 4]),
                         {"x": x()}, outputs=("p", "q"))]
    else:
        cases = [variant("split input", node(op, "x parts", "p q", axis=axis), {"x": x()},
                         {"parts": i64(3, 4)}, outputs=("p", "q"))]
    if opset < 18:      # from opset 18, split or num_outputs is required
        cases.append(variant("equal parts", node(op, "x", "p q", axis=0), {"x": x()},
                             outputs=("p", "q")))
    else:
        cases.append(variant("num_outputs, last smaller",
                             node(op, "x", "p q r", axis=1, num_outputs=3), {"x": x()},
                             outputs=("p", "q", "r")))
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
        return [variant("pads and value attributes",
                        node(op, "x", pads=[0, 1, 2, 1, 0, 3], value=1.5), {"x": x()})]
    cases = [variant("pads and constant_value inputs", node(op, "x pads value"), {"x": x()},
                     {"pads": i64(0, 1, 2, 1, 0, 3), "value": np.float32(-0.5)}),
             variant("no constant_value", node(op, "x pads"), {"x": x()},
                     {"pads": i64(1, 0, 0, 0, 2, 1)})]
    if opset >= 18:
        cases.append(variant("axes input", node(op, "x pads value axes"), {"x": x()},
                             {"pads": i64(1, 2, 3, 0), "value": np.float32(2.0),
                              "axes": i64(-1, 1)}))
    for mode in ("edge", "reflect") + (("wrap",) if opset >= 19 else ()):
        cases.append(variant(f"mode={mode}", node(op, "x pads", mode=mode), {"x": x()},
                             {"pads": i64(0, 2, 3, 1, 1, 2)}))
    return cases


def _tile(op, opset, d):
    return [variant("repeats", node(op, "x repeats"), {"x": d.normal(2, 3)},
                    {"repeats": i64(2, 3)})]


def _expand(op, opset, d):
    return [variant("both ways", node(op, "x shape"), {"x": d.normal(3, 1)},
                    {"shape": i64(2, 1, 4)})]


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
    cases = [variant("", node(op, "x i"), {"x": d.normal(3, 4, 2)},
                     {"i": i64(1, 2, 0, 3).reshape(2, 2)})]
    if opset >= 12:
        cases.append(variant("batch_dims=1", node(op, "x i", batch_dims=1),
                             {"x": d.normal(2, 4, 3)}, {"i": i64(1, 3, 0, 2).reshape(2, 2, 1)}))
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


def _scatter_nd(op, opset, d):
    # Rows 2 and 0 of x, then element (1, 2): indices of depth 1 and of depth 2.
    cases = [variant("rows", node(op, "x i u"), {"x": d.normal(3, 4)},
                     {"i": i64(2, 0).reshape(2, 1), "u": d.normal(2, 4)}),
             variant("elements, negative index", node(op, "x i u"), {"x": d.normal(3, 4)},
                     {"i": i64(1, -2, 0, 3).reshape(2, 2), "u": d.normal(2)})]
    if opset >= 16:
        duplicates = {"i": i64(1, 1, 0).reshape(3, 1), "u": d.normal(3, 4)}
        for reduction in ("add", "mul") + (("max", "min") if opset >= 18 else ()):
            cases.append(variant(f"reduction={reduction}", node(op, "x i u", reduction=reduction),
                                 {"x": d.normal(3, 4)}, duplicates))
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
            variant("dtype int32", node(op, "x", dtype=TensorProto.INT32, k=-1),
                    {"x": d.normal(4, 3)})]


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
                    {"start": np.float32(0.5), "limit": np.float32(-2),
                     "delta": np.float32(-0.75)})]


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

def _identity(op, opset, d):
    return [variant("", node(op, "x"), {"x": d.normal(3, 4)})]


def _size(op, opset, d):
    return [variant("", node(op, "x"), {"x": d.normal(2, 3, 4)})]


#: op type -> builder, for the operators of this module.
BUILDERS = {
    **{op: unary() for op in (
        "Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Ceil", "Floor", "Sign", "Round", "Erf",
        "Sin", "Cos", "Atan", "Asinh", "Sinh", "Cosh", "Softplus", "Softsign", "HardSwish",
        "Mish")},
    **{op: unary("positive") for op in ("Log", "Sqrt", "Reciprocal")},
    **{op: unary("unit") for op in ("Tan", "Acos", "Asin", "Atanh")}, "Acosh": unary("above1"),
    "Elu": unary(alpha=0.7), "Selu": unary(alpha=1.5, gamma=1.2), "Celu": unary(alpha=0.8),
    "LeakyRelu": unary(alpha=0.2), "HardSigmoid": unary(alpha=0.3, beta=0.4),
    "ThresholdedRelu": unary(alpha=0.3), "Shrink": unary(lambd=0.4, bias=0.2), "Gelu": _gelu,
    "IsNaN": _special_values, "IsInf": _special_values, "Not": _logical_unary,
    **{op: binary for op in ("Add", "Sub", "Mul", "Div")}, "Pow": _pow, "PRelu": _prelu,
    "Mod": _mod,
    **{op: comparison for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")},
    **{op: _logical for op in ("And", "Or", "Xor")},
    **{op: _bitwise for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")},
    "BitShift": _bit_shift, **{op: variadic for op in ("Sum", "Mean", "Max", "Min")},
    "Where": _where,
    **{op: reduction for op in (
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare")},
    "ArgMax": arg_extremum, "ArgMin": arg_extremum,
    "Concat": _concat, "Flatten": _flatten, "Reshape": _reshape, "Transpose": _transpose,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Split": _split, "Slice": _slice, "Pad": _pad,
    "Tile": _tile, "Expand": _expand, "Gather": _gather, "GatherElements": _gather_elements,
    "GatherND": _gather_nd, "ScatterElements": _scatter, "Scatter": _scatter,
    "ScatterND": _scatter_nd, "Shape": _shape,
    "Size": _size, "Cast": _cast, "Constant": _constant, "ConstantOfShape": _constant_of_shape,
    "Identity": _identity, "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth,
    "Trilu": _trilu, "EyeLike": _eye_like, "OneHot": _one_hot, "NonZero": _non_zero,
    "Range": _range, "CumSum": _cumsum, "Einsum": _einsum, "TopK": _top_k,
}
