"""The onnx package's backend node cases, as gdnflow's importer runs them: which
cases apply (every operator, inside subgraphs too, is one gdnflow runs), the cases
refused on purpose and why, and one case's outcome. tests/io/test_onnx.py runs them;
tests/fixtures/make_onnx_coverage.py tabulates them by operator."""
import warnings

import numpy as np
import onnx

import gdnflow as gf
from gdnflow.io import (onnx_control, onnx_ops, onnx_ops_index, onnx_ops_math, onnx_ops_quant,
                        onnx_ops_reduce, onnx_ops_rnn)
from gdnflow.io.onnx import HANDLERS, OnnxImportError, OnnxModule


def every_node(graph):
    """The nodes of ``graph`` and of its subgraphs (If branches, Loop and Scan bodies)."""
    for n in graph.node:
        yield n
        for attribute in n.attribute:
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(
                    attribute.graphs):
                yield from every_node(subgraph)


def node_test_cases():
    """The onnx package's backend node tests whose nodes all have supported op types."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    chosen = []
    for case in cases:
        if case.model is None or "expanded" in case.name:
            continue
        nodes = list(every_node(case.model.graph))
        ops_used = {n.op_type for n in nodes}
        if ops_used <= set(HANDLERS) and {n.domain for n in nodes} <= {"", "ai.onnx"}:
            chosen.append(case)
    return chosen


#: Operators whose every node case must pass unless listed in REFUSED_NODE_CASES.
ALL_CASES_PASS = (set(onnx_ops.HANDLERS) | set(onnx_ops_math.HANDLERS)
                  | set(onnx_ops_reduce.HANDLERS) | set(onnx_ops_index.HANDLERS)
                  | set(onnx_ops_rnn.HANDLERS) | set(onnx_ops_quant.HANDLERS)
                  | set(onnx_control.HANDLERS) | {"Dropout", "Softmax"})
_INTEGER_POW = "integer data: gdnflow computes Pow in float32 (integers only in shape arithmetic)"
_TRAINING_DROPOUT = "Dropout in training mode: imported graphs run for inference"
_HALF_FLOATS = "float16/bfloat16 data: gdnflow computes in float32"
_RESIZE_CROP = "Resize with tf_crop_and_resize (a region of interest): not composed"
_RESIZE_ANTIALIAS = "Resize with antialias=1 (a widened filter when downscaling): not composed"
_NARROW_QUANTISED = "float8/4-bit/2-bit quantised data: DequantizeLinear runs 8- to 32-bit integers"
_FLOAT_TO_INT = ("a float input cast to integers (a Loop's count from float data): float32 "
                 "inputs are device tensors, integers live only in shape arithmetic")
#: Node cases of those operators that gdnflow refuses on purpose, and why.
REFUSED_NODE_CASES = {
    "test_celu_float16": _HALF_FLOATS, "test_celu_bfloat16": _HALF_FLOATS,
    **{f"test_einsum_{name}_bfloat16": _HALF_FLOATS for name in ("batch_matmul", "sum",
                                                                 "transpose")},
    **{f"test_resize_{name}": _RESIZE_CROP for name in (
        "tf_crop_and_resize", "tf_crop_and_resize_extrapolation_value",
        "tf_crop_and_resize_axes_2_3", "tf_crop_and_resize_axes_3_2")},
    **{f"test_resize_{name}": _RESIZE_ANTIALIAS for name in (
        "downsample_scales_linear_antialias", "downsample_sizes_linear_antialias",
        "downsample_scales_cubic_antialias", "downsample_sizes_cubic_antialias")},
    **{f"test_dequantizelinear_{name}": _NARROW_QUANTISED for name in (
        "e4m3fn", "e4m3fn_float16", "e4m3fn_zero_point", "e5m2", "uint4", "int4", "uint2", "int2",
        "float4e2m1")},
    **{f"test_range_{name}_expanded": _FLOAT_TO_INT for name in (
        "float_type_positive_delta", "float16_type_positive_delta",
        "bfloat16_type_positive_delta", "int32_type_negative_delta")},
    "test_pow_types_int64_float32": _INTEGER_POW, "test_pow_types_int32_float32": _INTEGER_POW,
    "test_pow_types_int64_int64": _INTEGER_POW, "test_pow_types_int32_int32": _INTEGER_POW,
    **{f"test_training_dropout{suffix}": _TRAINING_DROPOUT
       for suffix in ("", "_default", "_default_mask", "_mask", "_zero_ratio",
                      "_zero_ratio_mask")},
}


#: Node cases whose reference output onnx writes rounded, and the relative tolerance
#: that rounding needs; onnxruntime's output matches gdnflow's to 1e-7 on each.
ROUNDED_REFERENCES = {
    # Written to 4 decimals (0.1511 for onnxruntime's 0.15105554).
    "test_averagepool_2d_ceil_last_window_starts_on_pad": 1e-3,
}


def as_array(value):
    """Test data comes as arrays, or as TensorProtos for types NumPy lacks."""
    from onnx import numpy_helper
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def run_case(case, device):
    """'passed', or 'refused: reason' when gdnflow refuses with OnnxImportError."""
    try:
        module = OnnxModule(case.model, device=device, source=case.name)
        for inputs, expected in case.data_sets:
            inputs, expected = [as_array(v) for v in inputs], [as_array(v) for v in expected]
            got = module(*inputs)
            got = got if isinstance(got, tuple) else (got,)
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                g = g.numpy() if isinstance(g, gf.Tensor) else np.asarray(g)
                assert g.shape == e.shape, f"{case.name}: shape {g.shape} != {e.shape}"
                scale = max(float(np.nanmax(np.abs(e))), 1e-6) if e.size else 1.0
                rtol = ROUNDED_REFERENCES.get(case.name, 1e-4)
                np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                           rtol=rtol, atol=rtol / 10 * scale, err_msg=case.name)
    except OnnxImportError as exc:
        return f"refused: {exc}"
    return "passed"
