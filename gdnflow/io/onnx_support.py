"""Which ONNX attributes, values and outputs gdnflow's importer runs, checked at load.

:data:`ATTRIBUTES` lists, for each operator the importer handles, every
attribute its handler reads and a rule for the values it can run (None:
every value the ONNX spec allows). :func:`unsupported_features` reports, for
one node, each attribute the handler would ignore or could not run (an
attribute of an older opset, a dilated pooling, a ``SAME`` padding on a
transposed convolution...) and each extra output it does not compute, so that
:func:`gdnflow.io.onnx.load` refuses such a model at once, naming the node,
rather than running it wrong or failing at its first forward. What depends on
the input (a 3-D activation, a negative pad given as an input) is still
checked when the node runs.
"""
import numpy as np

from gdnflow.io.onnx_ops_rnn import ACTIVATIONS as _RNN_ACTIVATIONS

#: ONNX TensorProto data types the Cast handler converts to, as NumPy types.
ONNX_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64,
              9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def _one_of(*allowed):
    def rule(value):
        return None if value in allowed else f"only {' or '.join(map(str, allowed))}"
    return rule


def _pair(value):
    return None if len(value) == 2 else "2-D only"


def _ones(value):
    return None if all(v == 1 for v in value) else "no dilation"


def _quadruple(value):
    if len(value) != 4:
        return "2-D only"
    return None if all(v >= 0 for v in value) else "no negative pads"


def _refused(reason):
    return lambda value: reason


_ANY = None
_AUTO_PAD = _one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_CONV = {"auto_pad": _AUTO_PAD, "dilations": _pair, "group": _ANY, "kernel_shape": _pair,
         "pads": _quadruple, "strides": _pair}
_REDUCE = {"axes": _ANY, "keepdims": _ANY, "noop_with_empty_axes": _ANY}
_COORDINATES = ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn")
_POOL = {"auto_pad": _AUTO_PAD, "ceil_mode": _one_of(0, 1), "dilations": _ones, "kernel_shape": _pair,
         "pads": _quadruple, "strides": _pair}

#: op type -> {attribute: rule}; a rule returns None for a value that runs, else why not.
ATTRIBUTES = {
    "Conv": _CONV,
    "ConvTranspose": dict(_CONV, auto_pad=_one_of("NOTSET", "VALID"), output_padding=_pair,
                          output_shape=_refused("give pads and output_padding instead")),
    "Gemm": {"alpha": _ANY, "beta": _ANY, "transA": _ANY, "transB": _ANY},
    "Clip": {"min": _ANY, "max": _ANY},
    "BatchNormalization": {"epsilon": _ANY, "momentum": _ANY, "is_test": _ANY,
                           "training_mode": _one_of(0), "spatial": _ANY},
    # storage_order only orders the Indices output, which is refused below.
    "MaxPool": dict(_POOL, storage_order=_ANY),
    "AveragePool": dict(_POOL, count_include_pad=_ANY),
    "Flatten": {"axis": _ANY}, "Reshape": {"allowzero": _ANY}, "Transpose": {"perm": _ANY},
    "Squeeze": {"axes": _ANY}, "Unsqueeze": {"axes": _ANY}, "Concat": {"axis": _ANY},
    "Pad": {"mode": _one_of("constant", "edge", "reflect", "wrap"), "pads": _ANY, "value": _ANY},
    "Softmax": {"axis": _ANY}, "Dropout": {"ratio": _ANY, "seed": _ANY, "is_test": _ANY},
    "Shape": {"start": _ANY, "end": _ANY}, "Gather": {"axis": _ANY},
    "Slice": {"starts": _ANY, "ends": _ANY, "axes": _ANY},
    "Cast": {"to": lambda to: None if to in ONNX_TYPES else "only float, integer and bool types",
             "saturate": _ANY},
    "Constant": {"value": _ANY, "value_float": _ANY, "value_floats": _ANY, "value_int": _ANY,
                 "value_ints": _ANY},
    "ConstantOfShape": {"value": _ANY},
    # Composed from gdnflow operators (gdnflow.io.onnx_ops).
    "HardSigmoid": {"alpha": _ANY, "beta": _ANY}, "LeakyRelu": {"alpha": _ANY},
    "Elu": {"alpha": _ANY},
    "ReduceSum": _REDUCE, "ReduceMean": _REDUCE, "ReduceSumSquare": _REDUCE,
    "ReduceL1": _REDUCE, "ReduceL2": _REDUCE, "ReduceLogSum": _REDUCE,
    "Split": {"axis": _ANY, "split": _ANY, "num_outputs": _ANY},
    "LRN": {"size": _ANY, "alpha": _ANY, "beta": _ANY, "bias": _ANY},
    "LayerNormalization": {"axis": _ANY, "epsilon": _ANY, "stash_type": _one_of(1)},
    "InstanceNormalization": {"epsilon": _ANY},
    "Gelu": {"approximate": _ANY},
    "Selu": {"alpha": _ANY, "gamma": _ANY}, "Celu": {"alpha": _ANY},
    # Every mode and coordinate transformation but tf_crop_and_resize (gdnflow.io.onnx_resize).
    "Resize": {"mode": _ANY, "coordinate_transformation_mode": _one_of(*_COORDINATES),
               "nearest_mode": _ANY, "axes": _ANY, "antialias": _one_of(0),
               "cubic_coeff_a": _ANY, "exclude_outside": _ANY, "extrapolation_value": _ANY,
               "keep_aspect_ratio_policy": _ANY},
    "Upsample": {"mode": _one_of("nearest", "linear"), "scales": _ANY},
    # gdnflow.io.onnx_ops_math
    "IsInf": {"detect_positive": _ANY, "detect_negative": _ANY}, "BitShift": {"direction": _ANY},
    "Mod": {"fmod": _ANY}, "ThresholdedRelu": {"alpha": _ANY},
    "Shrink": {"lambd": _ANY, "bias": _ANY}, "Swish": {"alpha": _ANY},
    "LogSoftmax": {"axis": _ANY}, "Hardmax": {"axis": _ANY},
    # gdnflow.io.onnx_ops_reduce
    "ReduceMax": _REDUCE, "ReduceMin": _REDUCE, "ReduceProd": _REDUCE, "ReduceLogSumExp": _REDUCE,
    "CumSum": {"exclusive": _ANY, "reverse": _ANY}, "LpNormalization": {"axis": _ANY, "p": _ANY},
    "GlobalLpPool": {"p": _ANY}, "MeanVarianceNormalization": {"axes": _ANY},
    "GroupNormalization": {"num_groups": _ANY, "epsilon": _ANY, "stash_type": _one_of(1)},
    "RMSNormalization": {"axis": _ANY, "epsilon": _ANY, "stash_type": _one_of(1)},
    # gdnflow.io.onnx_ops_index
    "GatherElements": {"axis": _ANY}, "TopK": {"axis": _ANY, "k": _ANY, "largest": _ANY,
                                                         "sorted": _ANY},
    "ArgMax": {"axis": _ANY, "keepdims": _ANY, "select_last_index": _ANY},
    "ArgMin": {"axis": _ANY, "keepdims": _ANY, "select_last_index": _ANY},
    "ScatterElements": {"axis": _ANY, "reduction": _ANY}, "Scatter": {"axis": _ANY},
    "ScatterND": {"reduction": _ANY},
    "GatherND": {"batch_dims": _ANY}, "DepthToSpace": {"blocksize": _ANY, "mode": _ANY},
    "SpaceToDepth": {"blocksize": _ANY, "mode": _ANY}, "Trilu": {"upper": _ANY}, "Einsum": {"equation": _ANY},
    "EyeLike": {"dtype": _ANY, "k": _ANY}, "OneHot": {"axis": _ANY},
}

# gdnflow.io.onnx_ops_rnn
_RECURRENT = {
    "hidden_size": _ANY, "layout": _ANY, "clip": _ANY,
    "direction": _one_of("forward", "reverse", "bidirectional"),
    "activations": lambda names: None if set(names) <= set(_RNN_ACTIVATIONS) else (
        f"only {', '.join(sorted(_RNN_ACTIVATIONS))}"),
    "activation_alpha": _refused("parameterised activations run with ONNX's defaults"),
    "activation_beta": _refused("parameterised activations run with ONNX's defaults"),
}
ATTRIBUTES.update({
    # gdnflow.io.onnx_control and onnx_ops_quant
    "If": {"then_branch": _ANY, "else_branch": _ANY}, "Loop": {"body": _ANY},
    "DequantizeLinear": {"axis": _ANY, "block_size": _ANY,
                         "output_dtype": _one_of(0, 1)},     # 0: the scale's type, 1: float32
    "RNN": _RECURRENT, "GRU": dict(_RECURRENT, linear_before_reset=_ANY),
                   "LSTM": dict(_RECURRENT, input_forget=_ANY)})

#: Defaults that the rules must see when an attribute is left out.
DEFAULTS = {}

#: Op types whose handlers compute every output (Dropout's mask: all true in inference;
#: LayerNormalization's Mean and InvStdDev; TopK's indices; the recurrent ones' states;
#: the subgraphs' outputs).
EVERY_OUTPUT = {"Split", "Dropout", "LayerNormalization", "TopK", "RNN", "GRU", "LSTM", "If",
                "Loop"}


def unsupported_features(op_type, attributes, outputs):
    """What of a node of ``op_type`` gdnflow cannot run: a list of phrases such as
    ``"dilations=[2, 2] (no dilation)"``; empty when it runs.

    ``attributes`` maps names to decoded values (strings as str), ``outputs``
    lists the node's output names ("" for an omitted one).
    """
    rules = ATTRIBUTES.get(op_type, {})
    attributes = {**DEFAULTS.get(op_type, {}), **attributes}
    found = []
    for name, value in attributes.items():
        if name not in rules:
            found.append(f"attribute {name}")
            continue
        why = rules[name](value) if rules[name] is not None else None
        if why:
            found.append(f"{name}={_show(value)} ({why})")
    if op_type in ("MaxPool", "AveragePool") and "pads" in attributes and "kernel_shape" in attributes:
        pads, kernel = attributes["pads"], attributes["kernel_shape"]
        if len(pads) == 4 and len(kernel) == 2 and any(
                p >= k for p, k in zip(pads, list(kernel) * 2)):
            found.append(f"pads={_show(pads)} (each smaller than kernel_shape {_show(kernel)})")
    # Other handlers compute the first output only.
    extra = [] if op_type in EVERY_OUTPUT else [name for name in outputs[1:] if name]
    if extra:
        found.append(f"output {', '.join(extra)} (only the first output is computed)")
    return found


def _show(value):
    return list(value) if isinstance(value, (list, tuple)) else value
