"""A Keras model configuration (Functional or Sequential, Keras 2 or 3) as layers and calls.

:class:`Graph` reads the JSON configuration into one form whatever the
Keras version wrote: ``layers`` [(name, class name, config)], ``calls``
[(layer, call index, [(input layer, node index, tensor index)])],
``inputs`` and ``outputs`` as (layer, node, tensor), and ``input_shapes``
(Keras' NHWC without the batch, None where free).

Where a name meant something else in Keras 2 (``keras_version`` below 3),
the layer configs are rewritten to say what it meant: Keras 2's
``hard_sigmoid`` (``clamp(0.2 x + 1/2, 0, 1)``, Keras 3's has slope 1/6)
becomes ``hard_sigmoid_keras2`` in ``activation`` and
``recurrent_activation`` (inside wrapped layers too).
"""
from gdnflow.io.keras.file import KerasImportError

#: Keras classes of (nested) models.
MODEL_CLASSES = ("Functional", "Model", "Sequential")

#: The config keys that name activations.
_ACTIVATION_KEYS = ("activation", "recurrent_activation")


def is_keras2(keras_version):
    """Whether a file's ``keras_version`` attribute (a string, or None: unknown) is below 3."""
    major = str(keras_version or "").split(".")[0]
    return major.isdigit() and int(major) < 3


def _keras2_names(value):
    """A copy of a Keras 2 layer config with Keras 2's meanings spelled out (module docstring)."""
    if isinstance(value, list):
        return [_keras2_names(v) for v in value]
    if not isinstance(value, dict):
        return value
    renamed = {key: _keras2_names(item) for key, item in value.items()}
    for key in _ACTIVATION_KEYS:
        if renamed.get(key) == "hard_sigmoid":
            renamed[key] = "hard_sigmoid_keras2"
    return renamed


def _is_keras_tensor(value):
    return isinstance(value, dict) and value.get("class_name") == "__keras_tensor__"


def tensor_refs(value, found):
    """Append the (layer, node, tensor) of every Keras tensor inside ``value`` (Keras 3 nodes)."""
    if _is_keras_tensor(value):
        layer, node, tensor = value["config"]["keras_history"][:3]
        found.append((layer, int(node), int(tensor)))
    elif isinstance(value, dict):
        for item in value.values():
            tensor_refs(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            tensor_refs(item, found)
    return found


def _parse_node(node, layer, path):
    """The inputs of one call of a layer: [(layer, node index, tensor index)]."""
    if isinstance(node, dict):                  # Keras 3: {"args": [...], "kwargs": {...}}
        if tensor_refs(node.get("kwargs", {}), []):
            raise KerasImportError(f"{path}: layer {layer}: tensors passed as keyword "
                                   "arguments (masks...) are not supported")
        return tensor_refs(node.get("args", []), [])
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


class Graph:
    """A Functional or Sequential configuration as layers and calls, in one form (module docstring).

    ``Graph(model_config, path, keras_version)``: ``model_config`` is the
    dict with ``class_name`` and ``config``; ``path`` names the file in
    errors; ``keras_version`` is the file's (None: Keras 3's meanings).
    """

    def __init__(self, model_config, path, keras_version=None):
        class_name, config = model_config["class_name"], model_config["config"]
        if is_keras2(keras_version):
            config = _keras2_names(config)
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


def wrapped_layers(config):
    """Bidirectional's (forward, backward) layers as (class name, config) pairs.

    The backward layer is the given one (Keras 3 always writes it), else
    the forward layer's config run from the other end, named as Keras names
    it (``backward_lstm`` for a wrapped ``lstm`` or ``forward_lstm``).
    """
    layer = config["layer"]
    forward = (layer["class_name"], layer["config"])
    given = config.get("backward_layer")
    if given:
        return forward, (given["class_name"], given["config"])
    name = str(forward[1].get("name", ""))
    backward = dict(forward[1], go_backwards=not forward[1].get("go_backwards", False),
                    name="backward_" + name.removeprefix("forward_"))
    return forward, (forward[0], backward)


def layer_classes(model_config):
    """Every layer's class name, nested models' layers included (and the nested models)."""
    for _, class_name, config in Graph(model_config, "<config>").layers:
        yield class_name
        if class_name in MODEL_CLASSES:
            yield from layer_classes({"class_name": class_name, "config": config})
