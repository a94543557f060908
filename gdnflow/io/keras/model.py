"""A gdnflow module that runs a Keras model's graph: :class:`KerasModel`.

A :class:`KerasModel` takes and returns 4-D tensors as NCHW (transpose NHWC
images with ``x.transpose(0, 3, 1, 2)``); see :mod:`gdnflow.io.keras.layers`
for how each layer keeps Keras' results in that layout.
"""
import numpy as np

from gdnflow.backends import default_device
from gdnflow.io.keras.file import KerasImportError
from gdnflow.io.keras.graph import MODEL_CLASSES, Graph
from gdnflow.io.keras.layers import LAYERS, layer_problems
from gdnflow.io.keras.weights import layer_key
from gdnflow.nn.module import Module
from gdnflow.tensor import weights_changed
from gdnflow.tensor import Tensor


def check_supported(model_config, path, keras_version=None):
    """Raise KerasImportError listing every unsupported layer class and feature at once.

    ``keras_version`` is the file's (see :class:`gdnflow.io.keras.graph.Graph`).
    """
    classes, features = {}, []

    def walk(model_config):
        for name, class_name, config in Graph(model_config, path, keras_version).layers:
            if class_name in MODEL_CLASSES:
                walk({"class_name": class_name, "config": config})
            elif class_name not in LAYERS:
                classes.setdefault(class_name, []).append(name)
            else:
                features.extend(f"{name} ({class_name}): {p}"
                                for p in layer_problems(class_name, config))
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


class KerasModel(Module):
    """A gdnflow module running a Keras model's graph (NCHW in and out: see the module docstring).

    ``forward(*inputs)`` takes one tensor (or NCHW NumPy array) per Keras
    input and returns the output, or a tuple for several. Each layer is a
    submodule named after the Keras layer (``Conv1.weight``,
    ``bn_Conv1.running_var``, ``inner.inner_conv.weight`` inside a nested
    model), so ``state_dict``, ``to`` and checkpoints work. ``input_shapes``
    are Keras' (NHWC without the batch, None where free); ``config`` holds
    the Keras configuration and the file's ``keras_version`` (Keras 2 gave
    some names other meanings: :class:`gdnflow.io.keras.graph.Graph`), from
    which :func:`gdnflow.io.keras.model_from_config` rebuilds the model.
    """

    def __init__(self, model_config, weights, device=None, source="<model>", keras_version=None):
        super().__init__()
        self.device = device or default_device()
        self.source = source
        graph = Graph(model_config, source, keras_version)
        self.keras_name = graph.name
        self.input_names = [name for name, _, _ in graph.inputs]
        self.input_shapes = graph.input_shapes
        self._inputs, self._outputs = graph.inputs, graph.outputs
        self.config = {"name": "keras", "keras_name": graph.name,
                       "preprocess": guess_preprocess(graph.name),
                       "model_config": model_config, "keras_version": keras_version}
        self._layers = {}
        for name, class_name, config in graph.layers:
            if class_name == "InputLayer":
                continue
            if class_name in MODEL_CLASSES:
                layer = KerasModel({"class_name": class_name, "config": config},
                                   weights.nested(name), self.device, f"{source}: {name}",
                                   keras_version)
                layer.config = {}       # the outer model's config holds it already
            else:
                params = weights.layer(name, class_name, config)
                try:
                    layer = LAYERS[class_name](name, config, params, self.device)
                except KeyError as exc:
                    raise KerasImportError(f"{source}: layer {name} ({class_name}): no weight "
                                           f"{exc} in the file") from None
            self._layers[name] = layer
            if layer_key(name) in self._modules:
                raise KerasImportError(f"{source}: two layers are called {layer_key(name)!r}")
            # Straight into the submodule table: a layer named like a Module
            # attribute ("to", "train") must not shadow it.
            self._modules[layer_key(name)] = layer
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


def guess_preprocess(name):
    """The input scaling of keras.applications' model of this name, if it is one."""
    name = str(name).lower()
    if name.startswith(("vgg", "resnet50")) and "v2" not in name:
        return "caffe"
    if name.startswith(("mobilenet", "resnet50v2", "inception", "xception")):
        return "keras-mobilenet"
    return None
