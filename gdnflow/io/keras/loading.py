"""The Keras importer's entry points: :func:`load`, :func:`load_weights`,
:func:`model_from_config` and :func:`file_info` (see :mod:`gdnflow.io.keras`)."""
import collections

from gdnflow.backends import default_device
from gdnflow.io.keras.applications import (application_model, application_state,
                                           describe_application)
from gdnflow.io.keras.file import KerasFile, KerasImportError, file_kind, read_model_config
from gdnflow.io.keras.graph import Graph, layer_classes
from gdnflow.io.keras.model import KerasModel, check_supported
from gdnflow.io.keras.weights import LegacyWeights, StateWeights, read_flat_weights


def load(path, device=None):
    """Read a Keras HDF5 file into a gdnflow module on ``device``, in eval mode.

    A full-model file gives a :class:`KerasModel`; a weights-only file of
    ``keras.applications``' MobileNetV2 or VGG16 gives gdnflow's
    ``mobilenet_v2`` (Keras-style padding and epsilon) or ``vgg16`` with
    those weights. Raises :class:`KerasImportError` for anything else.
    """
    device = device or default_device()
    with KerasFile(path) as f:
        kind = file_kind(f, path)
        if kind == "model":
            config = read_model_config(f, path)
            version = keras_version(f)
            check_supported(config, path, version)
            weights = LegacyWeights.from_group(f["model_weights"], path)
            model = KerasModel(config, weights, device=device, source=str(path),
                               keras_version=version)
        else:
            flat = read_flat_weights(f, kind, path)
            model = application_model(flat, path, device)
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
    with KerasFile(path) as f:
        kind = file_kind(f, path)
        flat = read_flat_weights(f, kind, path)
    state = application_state(model, flat, path)
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
    model_config, version = config["model_config"], config.get("keras_version")
    check_supported(model_config, "<checkpoint>", version)
    model = KerasModel(model_config, StateWeights(state), device=device or default_device(),
                       source="<checkpoint>", keras_version=version)
    return model.eval()


def keras_version(f):
    """The ``keras_version`` attribute of an open full-model file (None if absent)."""
    value = f.attrs.get("keras_version", f["model_weights"].attrs.get("keras_version"))
    return value.decode() if isinstance(value, bytes) else (None if value is None else str(value))


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
    with KerasFile(path) as f:
        kind = file_kind(f, path)
        info = {"kind": {"model": "keras model", "legacy": "keras weights (legacy layout)",
                         "keras3": "keras 3 weights"}[kind]}
        attrs = f["model_weights"].attrs if kind == "model" else f.attrs
        for key in ("keras_version", "backend"):
            value = f.attrs.get(key, attrs.get(key))
            info[key] = value.decode() if isinstance(value, bytes) else (
                None if value is None else str(value))
        flat = read_flat_weights(f, kind, path)
        info["parameter_count"] = int(sum(a.size for v in flat.values() for a in v.values()))
        info["weight_layers"] = len(flat)
        if kind == "model":
            config = read_model_config(f, path)
            graph = Graph(config, path)
            info["model_class"] = config["class_name"]
            info["model_name"] = graph.name
            info["input_shapes"] = graph.input_shapes
            info["layers"] = dict(collections.Counter(layer_classes(config)))
    info["application"] = describe_application(flat)
    return info
