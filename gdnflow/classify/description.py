"""``gdnflow info FILE``: what a gdnflow checkpoint, Keras or ONNX file holds, as lines of text."""
import numpy as np

from gdnflow.classify.errors import ClassifyError
from gdnflow.classify.loading import detect_format
from gdnflow.io import keras as keras_io
from gdnflow.io.checkpoint import read_checkpoint_info
from gdnflow.io.onnx import OnnxImportError, OnnxModule, model_opset, unsupported


def describe(path):
    """Lines saying what a checkpoint, Keras or ONNX file holds (``gdnflow info FILE``)."""
    kind = detect_format(path)
    if kind == "gdnflow-checkpoint":
        info = read_checkpoint_info(path)
        config = dict(info["config"])
        lines = [f"{path}: gdnflow checkpoint, format version {info['format_version']} "
                 f"(written by gdnflow {info['gdnflow_version']})",
                 f"model: {config.get('name') or info['model_name']}"]
        if config.get("name") == "keras":
            lines.append(f"keras model: {config.get('keras_name')} "
                         f"({config['model_config'].get('class_name')})")
            config = {k: v for k, v in config.items() if k not in ("model_config", "name")}
        elif config.get("name") == "onnx":
            lines.append(f"onnx graph: {len(config['onnx_model']) * 3 // 4:,} bytes, "
                         f"{len(config['parameters'])} parameters from initializers")
            config = {k: v for k, v in config.items()
                      if k not in ("onnx_model", "parameters", "name")}
        if config:
            lines.append("config: " + ", ".join(f"{k}={v}" for k, v in config.items()
                                                if k != "name"))
        lines.append(f"parameters: {info['parameter_count']:,} in "
                     f"{len(info['parameter_shapes'])} arrays; buffers: "
                     f"{len(info['buffer_shapes'])}")
        lines.append(f"optimizer: {info['optimizer'] or 'none'}")
        if info["extra"]:
            lines.append("extra: " + ", ".join(sorted(info["extra"])))
        return lines
    if kind == "keras":
        info = keras_io.file_info(path)
        lines = [f"{path}: {info['kind']} (keras {info['keras_version'] or '?'}, backend "
                 f"{info['backend'] or '?'})"]
        if "model_class" in info:
            lines.append(f"model: {info['model_name']} ({info['model_class']}), inputs "
                         + ", ".join(str(tuple(s) if s else None) for s in info["input_shapes"]))
            lines.append("layers: " + ", ".join(f"{k} {v}" for k, v in info["layers"].items()))
        if info["application"]:
            lines.append(f"keras.applications: {info['application']}")
        lines.append(f"parameters: {info['parameter_count']:,} in {info['weight_layers']} layers "
                     "with weights")
        return lines
    return _describe_onnx(path)


def _describe_onnx(path):
    """describe() of an ONNX file: opsets, inputs, outputs, operators, parameters."""
    try:
        import onnx     # local import: onnx is optional, loaded on first use
    except ImportError:
        raise ClassifyError("reading ONNX files needs the onnx package: pip install onnx") from None
    try:
        model = onnx.load(str(path))
    except Exception as exc:        # protobuf's DecodeError and friends
        raise OnnxImportError(f"{path} is not a valid ONNX model: {exc}") from None
    if not model.ir_version:        # protobuf parses many non-ONNX bytes as an empty model
        raise OnnxImportError(f"{path} is not a valid ONNX model: it has no IR version "
                              "(not an ONNX file, or truncated)")
    graph = model.graph
    verdict, module = _runs_in_gdnflow(model, path)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    initializers = {t.name for t in graph.initializer}
    counts = {}
    for node in graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    inside = _nodes_in_subgraphs(graph)

    def shape(value):
        dims = value.type.tensor_type.shape.dim
        return "x".join(str(d.dim_value or d.dim_param or "?") for d in dims)
    if module is not None:
        # Weights written as Constant nodes, ConstantOfShape fills or dequantised
        # integers count too: what the module holds as parameters.
        weights = [np.asarray(v) for v in module.state_dict().values()]
        parameters = (f"parameters: {sum(w.size for w in weights):,} in {len(weights)} "
                      "tensors (as gdnflow loads them)")
    else:
        parameters = (f"parameters: {sum(int(np.prod(t.dims)) for t in graph.initializer):,} in "
                      f"{len(graph.initializer)} initializers")
    return [f"{path}: ONNX model, IR version {model.ir_version}, opset {opsets}"
            + (f", from {model.producer_name} {model.producer_version}".rstrip()
               if model.producer_name else ""),
            f"runs in gdnflow: {verdict}",
            "inputs: " + ", ".join(f"{i.name} [{shape(i)}]" for i in graph.input
                                   if i.name not in initializers),
            "outputs: " + ", ".join(f"{o.name} [{shape(o)}]" for o in graph.output),
            f"operators ({len(graph.node)} nodes"
            + (f", {inside} more in subgraphs" if inside else "") + "): "
            + ", ".join(f"{op} {n}" for op, n in sorted(counts.items())),
            parameters]


def _runs_in_gdnflow(model, path):
    """("yes", the module loaded on NumPy) or ("no: why", None): every unsupported
    operator (inside subgraphs too), attribute and graph feature, as the importer
    reports them."""
    problems = unsupported(model.graph, model_opset(model))
    if problems:
        return f"no: {problems}", None
    try:
        return "yes", OnnxModule(model, device="numpy", source=str(path))
    except OnnxImportError as exc:
        return f"no: {str(exc).removeprefix(f'{path}: ')}", None


def _nodes_in_subgraphs(graph):
    """How many nodes the subgraphs of ``graph`` (If branches, Loop and Scan bodies) hold."""
    return sum(len(g.node) + _nodes_in_subgraphs(g) for node in graph.node
               for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs))
