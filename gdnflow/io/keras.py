"""Import Keras models and weights (HDF5 files) as gdnflow modules.

    model = gdnflow.io.keras.load("model.h5", device="cuda")     # NCHW in, as every gdnflow model
    probabilities = model(gdnflow.tensor(images_nchw, device="cuda"))

Three kinds of file are read, with h5py alone (no TensorFlow or Keras):

- **Full-model files**, ``model.save("x.h5")`` in Keras 2 or 3: a root
  attribute ``model_config`` (the architecture, JSON) and the weights under
  ``/model_weights``. :func:`load` builds a :class:`KerasModel` that runs the
  graph (Functional or Sequential, nested models, shared layers).
- **Legacy weights-only files**, the layout of the ``keras.applications``
  downloads (``model.save_weights("x.h5")`` in Keras 2): root attribute
  ``layer_names``, one group per layer with a ``weight_names`` attribute. They
  hold no architecture, so :func:`load` recognises MobileNetV2 and VGG16 by
  their layer names and builds gdnflow's own model (below);
  :func:`load_weights` loads such a file into a model you built.
- **Keras 3 weights files** (``model.save_weights("x.weights.h5")``: groups
  ``/layers/<class>/vars/<i>``, the layer's name in an attribute) are read
  the same way as legacy weights-only files.

Layers supported in full-model files: InputLayer, Conv2D, DepthwiseConv2D,
BatchNormalization, ReLU, Activation, Add, Concatenate, ZeroPadding2D,
MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D,
GlobalMaxPooling2D, Flatten, Dense, Dropout, Reshape, Softmax, Rescaling
(scalar), and nested Functional/Sequential models; activations linear,
relu, relu6, sigmoid, softmax. :func:`load` checks every layer first and
reports all unsupported layer types (by class and layer name) and features
(``channels_first``, other activations, ``padding="causal"``...) in one
:class:`KerasImportError`, before anything runs.

**Layout.** Keras computes in NHWC; gdnflow in NCHW. A :class:`KerasModel`
takes and returns 4-D tensors as NCHW (transpose NHWC images with
``x.transpose(0, 3, 1, 2)``) and keeps every 4-D value NCHW inside, so
kernels are converted once at import: Conv2D [kh, kw, in, out] ->
[out, in, kh, kw]; DepthwiseConv2D [kh, kw, in, mult] -> [in*mult, 1, kh, kw]
(Keras' output channel c*mult + m is gdnflow's group c, member m); Dense
[in, out] -> [out, in]. Where the order of elements matters (Flatten,
Reshape, Dense on a 4-D value), the value is transposed to NHWC first, so
Flatten gives exactly Keras' order whatever layer follows it. (For gdnflow's
own VGG16, which flattens NCHW, :func:`load_weights` instead permutes the
rows of ``fc1``'s kernel.) Axes of Softmax, Concatenate and
BatchNormalization are mapped from NHWC to NCHW.

**Padding.** "same" is TensorFlow's, computed from each input's size at run
time: ``total = max((ceil(H/s) - 1)*s + (k - 1)*d + 1 - H, 0)``, ``total // 2``
before and the rest (one more for odd totals) after. Average pooling with
"same" padding divides by the number of real inputs in the window (as
TensorFlow does); max pooling ignores the padding.

**keras.applications weights.** Keras' MobileNetV2 is torchvision's but for
its padding (stride-2 convolutions pad (0, 1) where torchvision pads (1, 1))
and its batch-norm epsilon (1e-3): :func:`load` builds
``gdnflow.models.mobilenet_v2(width_mult, padding_style="keras",
bn_eps=1e-3)``, which computes what Keras computes for inputs whose sides
are multiples of 32 (Keras' published sizes, 96 to 224). VGG16 is the same
network in both. gdnflow's models end in logits where Keras' end in a
softmax; MobileNetV2's dropout (Keras has none) is the identity in eval mode.
"""
import collections
import json
import math
import os
import re
import zipfile

import numpy as np

from gdnflow import nn, ops
from gdnflow.backends import default_device
from gdnflow.nn.module import Module, Parameter, weights_changed
from gdnflow.tensor import Tensor
from gdnflow.errors import GdnflowError

#: MobileNetV2 widths of the keras.applications weight files.
MOBILENET_V2_ALPHAS = (0.35, 0.5, 0.75, 1.0, 1.3, 1.4)


class KerasImportError(GdnflowError, ValueError):
    """A Keras file that gdnflow cannot read or run; the message names the file (and layer)."""


# ------------------------------------------------------------ public API --
def load(path, device=None):
    """Read a Keras HDF5 file into a gdnflow module on ``device``, in eval mode.

    A full-model file gives a :class:`KerasModel`; a weights-only file of
    ``keras.applications``' MobileNetV2 or VGG16 gives gdnflow's
    ``mobilenet_v2`` (Keras-style padding and epsilon) or ``vgg16`` with
    those weights. Raises :class:`KerasImportError` for anything else.
    """
    device = device or default_device()
    with _open(path) as f:
        kind = _kind(f, path)
        if kind == "model":
            config = _model_config(f, path)
            _check_supported(config, path)
            weights = _LegacyWeights.from_group(f["model_weights"], path)
            model = KerasModel(config, weights, device=device, source=str(path))
        else:
            flat = _read_flat_weights(f, kind, path)
            model = _application_model(flat, path, device)
    return model.eval()


def load_weights(path, model):
    """Load a Keras weights file (or a model file's weights) into gdnflow's MobileNetV2 or VGG16.

    ``model`` is ``gdnflow.models.mobilenet_v2(..., padding_style="keras",
    bn_eps=1e-3)`` (a torchvision-style MobileNetV2 would compute something
    else than Keras with these weights, so it is refused with ValueError) or a
    VGG16 (any module with VGG's ``features``/``classifier`` layout and
    ``config["name"] == "vgg16"``). Keras layer names map to gdnflow's
    parameters (``Conv1`` -> ``features.0.0``, ``block_1_expand_BN`` ->
    ``features.2.conv.0.1``, ``block1_conv1`` -> ``features.0``, ``fc1`` ->
    ``classifier.0``...). Every parameter and buffer of the model must be
    found with the right shape, else :class:`KerasImportError` says which;
    nothing changes before that check passes. Returns ``model``.
    """
    with _open(path) as f:
        kind = _kind(f, path)
        flat = _read_flat_weights(f, kind, path)
    state = _application_state(model, flat, path)
    try:
        model.load_state_dict(state)
    except (KeyError, ValueError) as exc:
        raise KerasImportError(f"{path}: the weights do not fit {type(model).__name__}: "
                               f"{exc}") from None
    return model


def model_from_config(config, state, device=None):
    """Rebuild a :class:`KerasModel` from its ``config`` and ``state`` (as in a gdnflow checkpoint).

    ``config`` is ``KerasModel.config`` (the Keras configuration inside);
    ``state`` is {dotted name: array} in gdnflow's layout, e.g. a
    checkpoint's parameters and buffers together.
    """
    model_config = config["model_config"]
    _check_supported(model_config, "<checkpoint>")
    model = KerasModel(model_config, _StateWeights(state), device=device or default_device(),
                       source="<checkpoint>")
    return model.eval()


def file_info(path):
    """What a Keras file holds, without building a model (for ``gdnflow info FILE``).

    A dict: ``kind`` ("keras model", "keras weights (legacy layout)" or
    "keras 3 weights"), ``keras_version``, ``backend``, ``parameter_count``,
    ``layers`` (count per layer class, nested models included, for model
    files) or ``weight_layers`` (layers holding weights), ``model_class``,
    ``model_name``, ``input_shapes`` (Keras' NHWC, None where free) for model
    files, and ``application`` (e.g. "mobilenet_v2 alpha 0.35, 10 classes")
    where the layer names are those of a keras.applications model.
    """
    with _open(path) as f:
        kind = _kind(f, path)
        info = {"kind": {"model": "keras model", "legacy": "keras weights (legacy layout)",
                         "keras3": "keras 3 weights"}[kind]}
        attrs = f["model_weights"].attrs if kind == "model" else f.attrs
        for key in ("keras_version", "backend"):
            value = f.attrs.get(key, attrs.get(key))
            info[key] = value.decode() if isinstance(value, bytes) else (
                None if value is None else str(value))
        flat = _read_flat_weights(f, kind, path)
        info["parameter_count"] = int(sum(a.size for v in flat.values() for a in v.values()))
        info["weight_layers"] = len(flat)
        if kind == "model":
            config = _model_config(f, path)
            graph = _Graph(config, path)
            info["model_class"] = config["class_name"]
            info["model_name"] = graph.name
            info["input_shapes"] = graph.input_shapes
            info["layers"] = dict(collections.Counter(_layer_classes(config)))
    info["application"] = _describe_application(flat)
    return info


# -------------------------------------------------------------- the file --
class _open:
    """h5py.File(path) as a context manager whose every failure names the file."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def __enter__(self):
        path = self.path
        if not os.path.exists(path):
            raise KerasImportError(f"{path}: no such file")
        if zipfile.is_zipfile(path):
            raise KerasImportError(
                f"{path}: a Keras 3 '.keras' archive, which gdnflow does not read; in Keras, "
                "save the model as HDF5 (model.save('model.h5')) and load that")
        import h5py
        try:
            self.file = h5py.File(path, "r")
        except OSError as exc:
            raise KerasImportError(f"{path} is not a readable HDF5 file (truncated or not "
                                   f"HDF5?): {exc}") from None
        return self.file

    def __exit__(self, kind, exc, traceback):
        self.file.close()
        if exc is not None and not isinstance(exc, KerasImportError):
            # h5py's errors for a damaged file surface while reading (OSError,
            # KeyError...), as do a damaged config's: one line naming the file.
            hint = " (truncated or corrupt?)" if isinstance(exc, (OSError, KeyError)) else ""
            raise KerasImportError(f"{self.path}: cannot read this Keras file{hint}: "
                                   f"{type(exc).__name__}: {exc}") from None
        return False


def _kind(f, path):
    """'model', 'legacy' (weights-only, layer_names) or 'keras3' (weights, /layers/.../vars)."""
    if f.attrs.get("format") == "gdnflow-checkpoint":    # it has a model_config attribute too
        raise KerasImportError(f"{path}: a gdnflow checkpoint, not a Keras file "
                               "(read it with gdnflow.io.load_checkpoint)")
    if "model_config" in f.attrs:
        if "model_weights" not in f:
            raise KerasImportError(f"{path}: a Keras model file without weights "
                                   "(saved with include weights off?)")
        return "model"
    if _attr_list(f, "layer_names") is not None:
        return "legacy"
    if "layers" in f and "vars" in f:
        return "keras3"
    raise KerasImportError(f"{path}: an HDF5 file, but not a Keras model or weights file (no "
                           "model_config or layer_names attribute, no /layers group)")


def _model_config(f, path):
    raw = f.attrs["model_config"]
    try:
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except ValueError as exc:
        raise KerasImportError(f"{path}: model_config is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or "class_name" not in config or "config" not in config:
        raise KerasImportError(f"{path}: model_config is not a Keras model configuration")
    return config


def _attr_list(group, name):
    """A list-of-strings attribute; Keras splits large ones into name0, name1, ..."""
    if name in group.attrs:
        values = list(np.asarray(group.attrs[name]).reshape(-1))
    elif f"{name}0" in group.attrs:
        values, i = [], 0
        while f"{name}{i}" in group.attrs:
            values += list(np.asarray(group.attrs[f"{name}{i}"]).reshape(-1))
            i += 1
    else:
        return None
    return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in values]


def _variable_name(name):
    """'kernel:0' -> 'kernel'; Keras 2 calls a depthwise kernel 'depthwise_kernel'."""
    name = name.split(":")[0]
    return "kernel" if name == "depthwise_kernel" else name


class _LegacyWeights:
    """The legacy layout (full-model /model_weights, or a weights-only file's root).

    Weight names are variable paths, ``[model/]layer/variable[:0]``; the
    second-to-last part names the layer owning the variable, which for a
    nested model's group is one of its inner layers.
    """

    def __init__(self, groups):
        self.groups = groups        # {top-level layer: {owning layer: {variable: array}}}

    @classmethod
    def from_group(cls, group, path):
        names = _attr_list(group, "layer_names")
        if names is None:
            raise KerasImportError(f"{path}: the weights group has no layer_names attribute")
        groups = {}
        for layer in names:
            if layer not in group:
                raise KerasImportError(f"{path}: layer {layer!r} is listed but has no weights "
                                       "group (truncated or corrupt?)")
            g = group[layer]
            owners = groups.setdefault(layer, {})
            for weight in _attr_list(g, "weight_names") or []:
                parts = weight.split("/")
                owner = parts[-2] if len(parts) > 1 else layer
                owners.setdefault(owner, {})[_variable_name(parts[-1])] = np.asarray(
                    g[weight], dtype=np.float32)
        return cls(groups)

    def layer(self, name, class_name, config):
        owners = self.groups.get(name, {})
        variables = owners.get(name) or (next(iter(owners.values())) if len(owners) == 1 else {})
        return _to_gdnflow(name, class_name, config, variables)

    def nested(self, name):
        return _FlatWeights(self.groups.get(name, {}))

    def flat(self):
        """{layer: {variable: array}} over every layer, nested ones included."""
        return {owner: variables for owners in self.groups.values()
                for owner, variables in owners.items()}


class _FlatWeights:
    """A nested model's weights: {layer: {variable: array}} for all layers inside it."""

    def __init__(self, layers):
        self.layers = layers

    def layer(self, name, class_name, config):
        return _to_gdnflow(name, class_name, config, self.layers.get(name, {}))

    def nested(self, name):
        return self


class _StateWeights:
    """Weights already in gdnflow's layout: a state dict by dotted name (from a checkpoint)."""

    def __init__(self, state, prefix=""):
        self.state, self.prefix = state, prefix

    def layer(self, name, class_name, config):
        start = f"{self.prefix}{_key(name)}."
        return {k[len(start):]: np.asarray(v) for k, v in self.state.items()
                if k.startswith(start)}

    def nested(self, name):
        return _StateWeights(self.state, f"{self.prefix}{_key(name)}.")


#: Keras 3 weights files name variables by position; these are the layers' orders.
_KERAS3_VARIABLES = {"conv2d": ("kernel", "bias"), "depthwise_conv2d": ("kernel", "bias"),
                     "dense": ("kernel", "bias"),
                     "batch_normalization": ("gamma", "beta", "moving_mean", "moving_variance")}


def _read_flat_weights(f, kind, path):
    """{layer: {variable: array}} of any kind of Keras file (nested models' layers too)."""
    if kind == "model":
        return _LegacyWeights.from_group(f["model_weights"], path).flat()
    if kind == "legacy":
        return _LegacyWeights.from_group(f, path).flat()
    flat = {}

    def visit(group):
        for key, child in group.items():
            if "vars" in child:
                variables = child["vars"]
                name = variables.attrs.get("name", key)
                name = name.decode() if isinstance(name, bytes) else str(name)
                arrays = [np.asarray(variables[str(i)], dtype=np.float32)
                          for i in range(len(variables))]
                if arrays:
                    # The group's key is the layer's class in snake case ("conv2d_1").
                    order = _KERAS3_VARIABLES.get(re.sub(r"_\d+$", "", key), ())
                    if len(arrays) > len(order) or (order and order[0] == "gamma"
                                                    and len(arrays) != 4):
                        # Unknown, or a batch norm without center or scale: which
                        # variable is which cannot be told, and a layer needing
                        # them says so by name.
                        order = tuple(f"var{i}" for i in range(len(arrays)))
                    flat[name] = dict(zip(order, arrays))
            if "layers" in child:
                visit(child["layers"])
    visit(f["layers"])
    return flat


# --------------------------------------------------- converting weights --
def _to_gdnflow(name, class_name, config, variables):
    """A layer's Keras variables as gdnflow arrays (NCHW kernels), by parameter name."""
    def need(var):
        if var not in variables:
            raise KerasImportError(f"layer {name} ({class_name}): the file holds no {var!r} "
                                   f"(it has {sorted(variables) or 'no weights'})")
        return variables[var]
    out = {}
    if class_name == "Conv2D":
        out["weight"] = need("kernel").transpose(3, 2, 0, 1)
    elif class_name == "DepthwiseConv2D":
        kh, kw, channels, mult = need("kernel").shape
        out["weight"] = variables["kernel"].transpose(2, 3, 0, 1).reshape(channels * mult, 1,
                                                                          kh, kw)
    elif class_name == "Dense":
        out["weight"] = need("kernel").T
    elif class_name == "BatchNormalization":
        mean, var = need("moving_mean"), need("moving_variance")
        out["weight"] = variables.get("gamma", np.ones_like(mean))
        out["bias"] = variables.get("beta", np.zeros_like(mean))
        out["running_mean"], out["running_var"] = mean, var
        return out
    else:
        return out
    if config.get("use_bias", True):
        out["bias"] = need("bias")
    return out


# ------------------------------------------------------------ the graph --
_MODEL_CLASSES = ("Functional", "Model", "Sequential")


def _is_keras_tensor(value):
    return isinstance(value, dict) and value.get("class_name") == "__keras_tensor__"


def _tensor_refs(value, found):
    """Append the (layer, node, tensor) of every Keras tensor inside ``value`` (Keras 3 nodes)."""
    if _is_keras_tensor(value):
        layer, node, tensor = value["config"]["keras_history"][:3]
        found.append((layer, int(node), int(tensor)))
    elif isinstance(value, dict):
        for item in value.values():
            _tensor_refs(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensor_refs(item, found)
    return found


def _parse_node(node, layer, path):
    """The inputs of one call of a layer: [(layer, node index, tensor index)]."""
    if isinstance(node, dict):                  # Keras 3: {"args": [...], "kwargs": {...}}
        if _tensor_refs(node.get("kwargs", {}), []):
            raise KerasImportError(f"{path}: layer {layer}: tensors passed as keyword "
                                   "arguments (masks...) are not supported")
        return _tensor_refs(node.get("args", []), [])
    # Keras 2: [[layer, node index, tensor index, kwargs], ...]
    return [(ref[0], int(ref[1]), int(ref[2])) for ref in node]


def _refs(value):
    """input_layers / output_layers: one [layer, node, tensor] or a list of them."""
    if value and isinstance(value[0], str):
        value = [value]
    return [(v[0], int(v[1]), int(v[2])) for v in value]


def _batch_shape(config):
    for key in ("batch_shape", "batch_input_shape"):
        if config.get(key) is not None:
            return list(config[key])
    return None


class _Graph:
    """A Functional or Sequential configuration as layers and calls, in one form."""

    def __init__(self, model_config, path):
        class_name, config = model_config["class_name"], model_config["config"]
        if isinstance(config, list):        # Keras 2.2's Sequential: the layers alone
            config = {"name": "sequential", "layers": config}
        self.name = config.get("name", "model")
        self.layers = []            # [(name, class_name, config)]
        self.calls = []             # [(name, call index, [(layer, node, tensor)])]
        if class_name == "Sequential":
            self._sequential(config)
        else:
            for entry in config["layers"]:
                name = entry.get("name") or entry["config"]["name"]
                self.layers.append((name, entry["class_name"], entry["config"]))
                for index, node in enumerate(entry.get("inbound_nodes") or []):
                    self.calls.append((name, index, _parse_node(node, name, path)))
            self.inputs = _refs(config["input_layers"])
            self.outputs = _refs(config["output_layers"])
        configs = {name: (cls, cfg) for name, cls, cfg in self.layers}
        self.input_shapes = []
        for name, _, _ in self.inputs:
            shape = _batch_shape(configs[name][1]) if name in configs else None
            self.input_shapes.append(None if shape is None else shape[1:])

    def _sequential(self, config):
        entries = list(config["layers"])
        if entries and entries[0]["class_name"] == "InputLayer":
            first = entries.pop(0)["config"]
            input_name, shape = first.get("name", "input"), _batch_shape(first)
        else:
            input_name = "input"
            shape = (_batch_shape(entries[0]["config"]) if entries else None) or config.get(
                "build_input_shape")
        self.layers.append((input_name, "InputLayer", {"batch_shape": shape}))
        previous = input_name
        for entry in entries:
            name = entry["config"]["name"]
            self.layers.append((name, entry["class_name"], entry["config"]))
            self.calls.append((name, 0, [(previous, 0, 0)]))
            previous = name
        self.inputs, self.outputs = [(input_name, 0, 0)], [(previous, 0, 0)]


def _layer_classes(model_config):
    """Every layer's class name, nested models' layers included (and the nested models)."""
    for _, class_name, config in _Graph(model_config, "<config>").layers:
        yield class_name
        if class_name in _MODEL_CLASSES:
            yield from _layer_classes({"class_name": class_name, "config": config})


# ------------------------------------------------------- checking layers --
_ACTIVATIONS = ("linear", "relu", "relu6", "sigmoid", "softmax")


def _activation_name(value):
    if isinstance(value, dict):     # a serialised activation object
        value = value.get("config", {}).get("name") or value.get("class_name")
    return "linear" if value is None else str(value)


def _channels_last(config):
    return config.get("data_format") in (None, "channels_last")


def _pair(value):
    return (int(value), int(value)) if isinstance(value, (int, float)) else tuple(
        int(v) for v in value)


def _layer_problems(class_name, config):
    """What gdnflow cannot do in one layer of a supported class (empty: all fine)."""
    problems = []
    if not _channels_last(config):
        problems.append(f"data_format {config.get('data_format')!r} (only channels_last)")
    if "activation" in config and _activation_name(config["activation"]) not in _ACTIVATIONS:
        problems.append(f"activation {_activation_name(config['activation'])!r} (supported: "
                        f"{', '.join(_ACTIVATIONS)})")
    if str(config.get("padding", "valid")).lower() not in ("valid", "same") and \
            class_name != "ZeroPadding2D":
        problems.append(f"padding {config.get('padding')!r}")
    if class_name == "ReLU":
        if float(config.get("negative_slope") or 0) != 0:
            problems.append("negative_slope (leaky ReLU)")
        if float(config.get("threshold") or 0) != 0:
            problems.append("threshold")
    if class_name == "BatchNormalization":
        axis = config.get("axis", -1)
        axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
        if axis not in (-1, 3):
            problems.append(f"axis {config.get('axis')!r} (only the last, channel axis)")
    if class_name == "Rescaling" and not all(
            isinstance(config.get(k, 0), (int, float)) for k in ("scale", "offset")):
        problems.append("per-channel scale or offset")
    return problems


def _check_supported(model_config, path):
    """Raise KerasImportError listing every unsupported layer class and feature at once."""
    classes, features = {}, []

    def walk(model_config):
        for name, class_name, config in _Graph(model_config, path).layers:
            if class_name in _MODEL_CLASSES:
                walk({"class_name": class_name, "config": config})
            elif class_name not in LAYERS:
                classes.setdefault(class_name, []).append(name)
            else:
                features.extend(f"{name} ({class_name}): {p}"
                                for p in _layer_problems(class_name, config))
    walk(model_config)
    if classes or features:
        parts = []
        if classes:
            parts.append("unsupported Keras layers: " + "; ".join(
                f"{cls} (layers {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                for cls, names in sorted(classes.items())))
        if features:
            parts.append("unsupported features: " + "; ".join(features))
        raise KerasImportError(f"{path}: " + ". ".join(parts))


# ----------------------------------------------------------- the layers --
def _tf_same(size, kernel, stride, dilation=1):
    """TensorFlow's "same" padding (before, after) of one dimension."""
    effective = (kernel - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _same_padding(x, kernel, stride, dilation=(1, 1)):
    top, bottom = _tf_same(x.shape[2], kernel[0], stride[0], dilation[0])
    left, right = _tf_same(x.shape[3], kernel[1], stride[1], dilation[1])
    return (top, bottom, left, right)


def _activate(x, name):
    """Apply a Keras activation by name (softmax over Keras' last axis: channels for 4-D)."""
    if name == "relu":
        return ops.relu(x)
    if name == "relu6":
        return ops.relu6(x)
    if name == "sigmoid":
        return ops.sigmoid(x)
    if name == "softmax":
        return ops.softmax(x, axis=1 if x.ndim == 4 else -1)
    return x


def _to_nhwc(x):
    """A 4-D value in Keras' element order (NHWC); free when H = W = 1."""
    if x.ndim != 4:
        return x
    if x.shape[2] == x.shape[3] == 1:
        return ops.reshape(x, (x.shape[0], 1, 1, x.shape[1]))
    return ops.transpose(x, (0, 2, 3, 1))


def _from_nhwc(x):
    """An NHWC 4-D value back in gdnflow's NCHW."""
    if x.ndim != 4:
        return x
    if x.shape[1] == x.shape[2] == 1:
        return ops.reshape(x, (x.shape[0], x.shape[3], 1, 1))
    return ops.transpose(x, (0, 3, 1, 2))


def _axis(axis, ndim):
    """A Keras axis (NHWC for 4-D values) as gdnflow's axis (NCHW)."""
    axis = int(axis) % ndim
    return (0, 2, 3, 1)[axis] if ndim == 4 else axis


def _parameter(params, key, device):
    return Parameter(np.ascontiguousarray(params[key], dtype=np.float32), device=device)


class KerasConv2d(Module):
    """Keras' Conv2D or DepthwiseConv2D: weight [out, in/groups, kh, kw], bias [out] or None.

    ``padding`` is "valid" (none) or "same" (TensorFlow's, from each input's
    size); relu and relu6 activations are fused into the convolution.
    """

    def __init__(self, params, strides, dilation, groups, padding, activation, device):
        super().__init__()
        self.weight = _parameter(params, "weight", device)
        self.bias = _parameter(params, "bias", device) if "bias" in params else None
        self.kernel_size = tuple(self.weight.shape[2:])
        self.stride, self.dilation, self.groups = strides, dilation, groups
        self.same, self.activation = padding == "same", activation

    def forward(self, x):
        padding = _same_padding(x, self.kernel_size, self.stride, self.dilation) if self.same else 0
        fused = self.activation if self.activation in ("relu", "relu6") else None
        y = ops.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                       self.groups, activation=fused)
        return y if fused else _activate(y, self.activation)


class KerasDense(Module):
    """Keras' Dense: weight [out, in] (the transposed Keras kernel), bias [out] or None.

    On a 4-D value it acts on the channels, as Keras' does on the last axis.
    """

    def __init__(self, params, activation, device):
        super().__init__()
        self.weight = _parameter(params, "weight", device)
        self.bias = _parameter(params, "bias", device) if "bias" in params else None
        self.activation = activation

    def forward(self, x):
        if x.ndim == 4:
            y = _from_nhwc(ops.linear(_to_nhwc(x), self.weight, self.bias))
        else:
            y = ops.linear(x, self.weight, self.bias)
        return _activate(y, self.activation)


class KerasBatchNorm(nn.BatchNorm2d):
    """Keras' BatchNormalization over the channels of a 4-D value, or the features of a 2-D one."""

    def forward(self, x):
        if x.ndim == 2:
            return ops.reshape(super().forward(ops.reshape(x, x.shape + (1, 1))), x.shape)
        return super().forward(x)


class KerasFunction(Module):
    """A parameterless Keras layer: ``function(*inputs)``; ``name`` says which."""

    def __init__(self, name, function):
        super().__init__()
        self.name, self.function = name, function

    def forward(self, *inputs):
        return self.function(*inputs)

    def __repr__(self):
        return f"KerasFunction({self.name})"


def _conv(depthwise):
    def build(name, config, params, device):
        # Depthwise: one group per input channel, depth_multiplier outputs each.
        groups = (params["weight"].shape[0] // int(config.get("depth_multiplier", 1))
                  if depthwise else int(config.get("groups", 1)))
        return KerasConv2d(params, _pair(config.get("strides", 1)),
                           _pair(config.get("dilation_rate", 1)), groups,
                           str(config.get("padding", "valid")).lower(),
                           _activation_name(config.get("activation")), device)
    return build


def _build_batch_norm(name, config, params, device):
    channels = params["running_mean"].shape[0]
    layer = KerasBatchNorm(channels, eps=float(config.get("epsilon", 1e-3)),
                           # Keras keeps `momentum` of the old value; PyTorch's rule the new one.
                           momentum=1.0 - float(config.get("momentum", 0.99)))
    layer.weight = _parameter(params, "weight", device)
    layer.bias = _parameter(params, "bias", device)
    layer.running_mean = Tensor(np.array(params["running_mean"], np.float32), device=device)
    layer.running_var = Tensor(np.array(params["running_var"], np.float32), device=device)
    return layer


def _relu(name, config, params, device):
    top = config.get("max_value")
    if top is None:
        return KerasFunction(name, ops.relu)
    if float(top) == 6:
        return KerasFunction(name, ops.relu6)
    return KerasFunction(name, lambda x: ops.clamp(x, 0.0, float(top)))


def _add(*inputs):
    total = inputs[0]
    for x in inputs[1:]:
        total = total + x
    return total


def _zero_padding(name, config, params, device):
    padding = config.get("padding", 1)
    if isinstance(padding, (int, float)):
        rows = cols = (int(padding), int(padding))
    else:
        rows, cols = padding
        rows = _pair(rows) if not isinstance(rows, (int, float)) else (int(rows), int(rows))
        cols = _pair(cols) if not isinstance(cols, (int, float)) else (int(cols), int(cols))
    return KerasFunction(name, lambda x: ops.pad(x, [(0, 0), (0, 0), rows, cols]))


def _pool(kind):
    def build(name, config, params, device):
        kernel = _pair(config.get("pool_size", 2))
        stride = _pair(config.get("strides") or kernel)
        same = str(config.get("padding", "valid")).lower() == "same"

        def pool(x):
            padding = _same_padding(x, kernel, stride) if same else 0
            if kind == "max":
                return ops.max_pool2d(x, kernel, stride, padding)
            # TensorFlow averages over the real inputs of a "same"-padded window.
            return ops.avg_pool2d(x, kernel, stride, padding, count_include_pad=False)
        return KerasFunction(name, pool)
    return build


def _global_pool(kind):
    def build(name, config, params, device):
        keepdims = bool(config.get("keepdims", False))

        def pool(x):
            y = (ops.global_avg_pool2d(x) if kind == "avg"
                 else ops.max_pool2d(x, tuple(x.shape[2:])))
            return y if keepdims else ops.reshape(y, y.shape[:2])
        return KerasFunction(name, pool)
    return build


def _flatten(x):
    return ops.reshape(_to_nhwc(x), (x.shape[0], -1)) if x.ndim > 2 else x


def _reshape(name, config, params, device):
    target = tuple(int(s) for s in config["target_shape"])
    return KerasFunction(name, lambda x: _from_nhwc(ops.reshape(_to_nhwc(x),
                                                                (x.shape[0],) + target)))


def _softmax(name, config, params, device):
    axis = config.get("axis", -1)
    axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
    return KerasFunction(name, lambda x: ops.softmax(x, axis=_axis(axis, x.ndim)))


def _concatenate(name, config, params, device):
    axis = int(config.get("axis", -1))
    return KerasFunction(name, lambda *xs: ops.concat(list(xs), axis=_axis(axis, xs[0].ndim)))


def _rescaling(name, config, params, device):
    scale, offset = float(config.get("scale", 1.0)), float(config.get("offset", 0.0))
    return KerasFunction(name, lambda x: ops.affine(x, scale, offset))


def _simple(function):
    return lambda name, config, params, device: KerasFunction(name, function)


#: Keras layer class -> builder(name, config, params in gdnflow layout, device) -> Module.
LAYERS = {
    "Conv2D": _conv(depthwise=False),
    "DepthwiseConv2D": _conv(depthwise=True),
    "BatchNormalization": _build_batch_norm,
    "Dense": lambda name, config, params, device: KerasDense(
        params, _activation_name(config.get("activation")), device),
    "ReLU": _relu,
    "Activation": lambda name, config, params, device: KerasFunction(
        name, lambda x, a=_activation_name(config.get("activation")): _activate(x, a)),
    "Add": _simple(_add),
    "Concatenate": _concatenate,
    "ZeroPadding2D": _zero_padding,
    "MaxPooling2D": _pool("max"),
    "AveragePooling2D": _pool("avg"),
    "GlobalAveragePooling2D": _global_pool("avg"),
    "GlobalMaxPooling2D": _global_pool("max"),
    "Flatten": _simple(_flatten),
    "Dropout": lambda name, config, params, device: nn.Dropout(float(config.get("rate", 0.5))),
    "Reshape": _reshape,
    "Softmax": _softmax,
    "Rescaling": _rescaling,
    "InputLayer": None,
}
# Older Keras names for the same layers.
LAYERS["MaxPool2D"], LAYERS["AvgPool2D"] = LAYERS["MaxPooling2D"], LAYERS["AveragePooling2D"]
LAYERS["GlobalAvgPool2D"] = LAYERS["GlobalAveragePooling2D"]


def _key(name):
    """A layer name as a submodule name (no dots: they separate state-dict names)."""
    return str(name).replace(".", "_")


class KerasModel(Module):
    """A gdnflow module running a Keras model's graph (see the module docstring for layouts).

    ``forward(*inputs)`` takes one tensor (or NCHW NumPy array) per Keras
    input and returns the output, or a tuple for several. Each layer is a
    submodule named after the Keras layer (``Conv1.weight``,
    ``bn_Conv1.running_var``, ``inner.inner_conv.weight`` inside a nested
    model), so ``state_dict``, ``to`` and checkpoints work. ``input_shapes``
    are Keras' (NHWC without the batch, None where free); ``config`` holds
    the Keras configuration, from which :func:`model_from_config` rebuilds
    the model.
    """

    def __init__(self, model_config, weights, device=None, source="<model>"):
        super().__init__()
        self.device = device or default_device()
        self.source = source
        graph = _Graph(model_config, source)
        self.keras_name = graph.name
        self.input_names = [name for name, _, _ in graph.inputs]
        self.input_shapes = graph.input_shapes
        self._inputs, self._outputs = graph.inputs, graph.outputs
        self.config = {"name": "keras", "keras_name": graph.name,
                       "preprocess": _guess_preprocess(graph.name),
                       "model_config": model_config}
        self._layers = {}
        for name, class_name, config in graph.layers:
            if class_name == "InputLayer":
                continue
            if class_name in _MODEL_CLASSES:
                layer = KerasModel({"class_name": class_name, "config": config},
                                   weights.nested(name), self.device, f"{source}: {name}")
                layer.config = {}       # the outer model's config holds it already
            else:
                params = weights.layer(name, class_name, config)
                try:
                    layer = LAYERS[class_name](name, config, params, self.device)
                except KeyError as exc:
                    raise KerasImportError(f"{source}: layer {name} ({class_name}): no weight "
                                           f"{exc} in the file") from None
            self._layers[name] = layer
            if _key(name) in self._modules:
                raise KerasImportError(f"{source}: two layers are called {_key(name)!r}")
            # Straight into the submodule table: a layer named like a Module
            # attribute ("to", "train") must not shadow it.
            self._modules[_key(name)] = layer
        weights_changed()
        self._order = self._schedule(graph)

    def _schedule(self, graph):
        """The calls in an order where each one's inputs are computed before it."""
        ready = {(name, 0) for name, _, _ in graph.inputs}
        pending, order = list(graph.calls), []
        while pending:
            runnable = [c for c in pending if all((l, n) in ready for l, n, _ in c[2])]
            if not runnable:
                missing = sorted({f"{l}[{n}]" for c in pending for l, n, _ in c[2]
                                  if (l, n) not in ready})
                raise KerasImportError(f"{self.source}: the graph refers to outputs no layer "
                                       f"computes: {', '.join(missing[:5])}")
            for call in runnable:
                pending.remove(call)
                order.append(call)
                ready.add(call[:2])
        needed = [f"{l}[{n}]" for l, n, _ in graph.outputs if (l, n) not in ready]
        if needed:
            raise KerasImportError(f"{self.source}: model outputs {needed} are never computed")
        return order

    @property
    def image_size(self):
        """(H, W) of the first input when the Keras model fixes it, else None."""
        shape = self.input_shapes[0] if self.input_shapes else None
        if shape and len(shape) == 3 and shape[0] and shape[1]:
            return int(shape[0]), int(shape[1])
        return None

    def forward(self, *inputs):
        if len(inputs) != len(self._inputs):
            raise TypeError(f"{self.source}: the model takes {len(self._inputs)} inputs "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        values = {}
        for (name, _, _), x in zip(self._inputs, inputs):
            if not isinstance(x, Tensor):
                x = Tensor(np.asarray(x, dtype=np.float32), device=self.device)
            values[(name, 0)] = [x]
        for name, index, refs in self._order:
            args = [values[(layer, node)][tensor] for layer, node, tensor in refs]
            try:
                out = self._layers[name](*args)
            except KerasImportError:
                raise
            except Exception as exc:
                raise type(exc)(f"{self.source}: layer {name}: {exc}") from exc
            values[(name, index)] = list(out) if isinstance(out, (list, tuple)) else [out]
        outputs = [values[(layer, node)][tensor] for layer, node, tensor in self._outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __repr__(self):
        return f"KerasModel({self.keras_name!r}, {len(self._layers)} layers, from {self.source})"


def _guess_preprocess(name):
    """The input scaling of keras.applications' model of this name, if it is one."""
    name = str(name).lower()
    if name.startswith(("vgg", "resnet50")) and "v2" not in name:
        return "caffe"
    if name.startswith(("mobilenet", "resnet50v2", "inception", "xception")):
        return "keras-mobilenet"
    return None


# --------------------------------------------------- keras.applications --
def _mobilenet_width(flat):
    """MobileNetV2's alpha from the channels of its last block (unique across Keras' widths)."""
    from gdnflow.models.mobilenet_v2 import make_divisible
    kernel = flat.get("block_16_project", {}).get("kernel")
    if kernel is None:
        return None
    for alpha in MOBILENET_V2_ALPHAS:
        if make_divisible(320 * alpha) == kernel.shape[-1]:
            return alpha
    return None


def _application(flat):
    """('mobilenet_v2', alpha, classes) or ('vgg16', None, classes) by layer names, else None."""
    classes = flat.get("predictions", {}).get("kernel")
    classes = None if classes is None else int(classes.shape[-1])
    if "Conv1" in flat and "expanded_conv_depthwise" in flat:
        return "mobilenet_v2", _mobilenet_width(flat), classes
    if "block1_conv1" in flat and "block5_conv3" in flat:
        return "vgg16", None, classes
    return None


def _describe_application(flat):
    found = _application(flat)
    if found is None:
        return None
    name, alpha, classes = found
    width = f" alpha {alpha}" if alpha is not None else ""
    top = f", {classes} classes" if classes else ", no classifier (include_top=False)"
    return f"{name}{width}{top}"


def _application_model(flat, path, device):
    from gdnflow import models
    found = _application(flat)
    if found is None:
        raise KerasImportError(
            f"{path}: a Keras weights file without architecture whose layers are not those of "
            "keras.applications' MobileNetV2 or VGG16; load the full model file "
            "(model.save('x.h5')) instead")
    name, alpha, classes = found
    if classes is None:
        raise KerasImportError(f"{path}: {name} weights without the classifier (an "
                               "include_top=False file); gdnflow's model needs 'predictions'")
    if name == "mobilenet_v2":
        if alpha is None:
            raise KerasImportError(f"{path}: MobileNetV2 weights of a width gdnflow does not "
                                   f"recognise (Keras' widths: {MOBILENET_V2_ALPHAS})")
        model = models.mobilenet_v2(classes, alpha, padding_style="keras", bn_eps=1e-3)
        model.config["preprocess"] = "keras-mobilenet"
    else:
        # Checked before building: gdnflow's VGG16 has 138 M parameters to initialise.
        shapes = {layer: tuple(flat[layer].get("kernel", np.empty(0)).shape)
                  for layer in ("block1_conv1", "fc1")}
        if shapes != {"block1_conv1": (3, 3, 3, 64), "fc1": (25088, 4096)}:
            raise KerasImportError(
                f"{path}: the weights do not fit gdnflow's vgg16 (kernels {shapes}, VGG16 "
                "has (3, 3, 3, 64) and (25088, 4096)); load the full Keras model file instead")
        model = models.vgg16(classes)
        model.config["preprocess"] = "caffe"
    try:
        model.load_state_dict(_application_state(model, flat, path))
    except (KeyError, ValueError) as exc:       # ShapeError is a ValueError
        raise KerasImportError(f"{path}: the weights do not fit gdnflow's {name}: {exc}") from None
    return model.to(device)


def _application_state(model, flat, path):
    """gdnflow state dict of ``model`` (MobileNetV2 or VGG16) from Keras layers' weights."""
    name = getattr(model, "config", {}).get("name")
    if name == "mobilenet_v2":
        config = model.config
        if config.get("padding_style") != "keras" or config.get("bn_eps") != 1e-3:
            raise ValueError(
                "load_weights: Keras' MobileNetV2 weights need Keras' padding and epsilon; build "
                "the model with gdnflow.models.mobilenet_v2(..., padding_style='keras', "
                "bn_eps=1e-3)")
        names = _mobilenet_v2_names(model)
    elif name == "vgg16":
        names = _vgg16_names(model)
    else:
        raise ValueError(f"load_weights: gdnflow maps Keras weights onto its mobilenet_v2 and "
                         f"vgg16 only, not {type(model).__name__}; for other models load the "
                         "full Keras model file with gdnflow.io.keras.load")
    missing = [layer for _, layer, _, _ in names if layer not in flat]
    if missing:
        raise KerasImportError(f"{path}: no weights for the Keras layers {', '.join(missing[:5])}"
                               f"{', ...' if len(missing) > 5 else ''} that {name} needs")
    state = {}
    for prefix, layer, class_name, flattened in names:
        try:
            params = _to_gdnflow(layer, class_name, {"use_bias": "bias" in flat[layer]},
                                 flat[layer])
        except KerasImportError as exc:
            raise KerasImportError(f"{path}: {exc}") from None
        if flattened is not None:
            # Keras flattened its (h, w, c) map, gdnflow flattens (c, h, w):
            # permute the kernel's input columns to match.
            c, h, w = flattened
            weight = params["weight"]
            if weight.shape[1] != c * h * w:
                raise KerasImportError(f"{path}: layer {layer} takes {weight.shape[1]} inputs, "
                                       f"the model flattens {c}x{h}x{w}")
            params["weight"] = weight.reshape(-1, h, w, c).transpose(0, 3, 1, 2).reshape(
                weight.shape[0], -1)
        state.update({f"{prefix}.{k}": v for k, v in params.items()})
    return state


def _mobilenet_v2_names(model):
    """[(gdnflow prefix, Keras layer, Keras class, None)] of gdnflow's MobileNetV2."""
    conv, bn = "Conv2D", "BatchNormalization"
    names = [("features.0.0", "Conv1", conv), ("features.0.1", "bn_Conv1", bn)]
    features = list(model.features)
    for i, block in enumerate(features[1:-1], start=1):
        keras = "expanded_conv" if i == 1 else f"block_{i - 1}"
        p = f"features.{i}.conv"
        d = len(block.conv) - 3         # the depthwise stage: 1 after an expansion, else 0
        if d:
            names += [(f"{p}.0.0", f"{keras}_expand", conv), (f"{p}.0.1", f"{keras}_expand_BN", bn)]
        names += [(f"{p}.{d}.0", f"{keras}_depthwise", "DepthwiseConv2D"),
                  (f"{p}.{d}.1", f"{keras}_depthwise_BN", bn),
                  (f"{p}.{d + 1}", f"{keras}_project", conv),
                  (f"{p}.{d + 2}", f"{keras}_project_BN", bn)]
    last = len(features) - 1
    names += [(f"features.{last}.0", "Conv_1", conv), (f"features.{last}.1", "Conv_1_bn", bn),
              ("classifier.1", "predictions", "Dense")]
    return [name + (None,) for name in names]


def _vgg16_names(model):
    """[(gdnflow prefix, Keras layer, Keras class, (C, H, W) flattened or None)] of a VGG.

    Works on any module with VGG's ``features`` (convolutions, ReLUs, max
    pooling) and ``classifier`` (Linear layers: fc1, fc2, ..., predictions).
    """
    names, block, conv, channels = [], 1, 0, None
    for i, layer in enumerate(model.features):
        if isinstance(layer, nn.MaxPool2d):
            block, conv = block + 1, 0
        elif isinstance(layer, nn.Conv2d):
            conv += 1
            channels = layer.out_channels
            names.append((f"features.{i}", f"block{block}_conv{conv}", "Conv2D", None))
    linears = [(i, layer) for i, layer in enumerate(model.classifier)
               if isinstance(layer, nn.Linear)]
    for n, (i, layer) in enumerate(linears):
        keras = "predictions" if n == len(linears) - 1 else f"fc{n + 1}"
        flattened = None
        if n == 0:      # the first takes the flattened (square) feature map
            side = math.isqrt(layer.in_features // channels)
            flattened = (channels, side, side)
        names.append((f"classifier.{i}", keras, "Dense", flattened))
    return names
