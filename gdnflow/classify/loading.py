"""The model to classify with, from a model file (by content: gdnflow checkpoint, Keras HDF5
or ONNX) and/or the name of one of gdnflow's classifiers.

- a gdnflow checkpoint (:mod:`gdnflow.io.checkpoint`) is rebuilt from the
  model config it stores: gdnflow's ``mobilenet_v2``/``vgg16`` (by name), or
  a converted Keras or ONNX model (:mod:`gdnflow.classify.conversion`);
- a Keras HDF5 file (:mod:`gdnflow.io.keras`): a full model, or a
  ``keras.applications`` MobileNetV2/VGG16 weights file;
- an ONNX file (:mod:`gdnflow.io.onnx`).

A checkpoint without a config needs the classifier's name; files that carry
their architecture need none.
"""
import inspect
import os

from gdnflow import models
from gdnflow.backends import default_device
from gdnflow.classify.errors import ClassifyError
from gdnflow.classify.onnx_config import onnx_from_config, onnx_image_size
from gdnflow.io import formats
from gdnflow.io import keras as keras_io
from gdnflow.io import onnx as onnx_io
from gdnflow.io.checkpoint import load_checkpoint, read_checkpoint_info
from gdnflow.sparse.checkpoint import load_pruned

#: gdnflow's image classifiers (the --model names).
CLASSIFIERS = ("mobilenet_v2", "vgg16")


def detect_format(path):
    """'gdnflow-checkpoint', 'keras', 'onnx' for the file at ``path`` (by content).

    Raises :class:`ClassifyError` for a file of no known kind (and
    :mod:`gdnflow.io.formats`' errors for a missing, empty or unreadable one).
    """
    kind = formats.detect_format(path)
    if kind is None:
        raise ClassifyError(f"{os.fspath(path)}: not a gdnflow checkpoint, Keras HDF5 or ONNX file")
    return kind


def _build_named(name, config, device):
    """gdnflow's model ``name`` from a checkpoint config (the keys its constructor takes)."""
    constructor = models.get(name)
    accepted = inspect.signature(constructor).parameters
    kwargs = {k: v for k, v in config.items() if k in accepted and k not in ("device", "rng")}
    model = constructor(device=device, **kwargs)
    model.config.update({k: v for k, v in config.items() if k not in model.config})
    return model


def load_model(weights=None, model=None, device=None):
    """The model to classify with, in eval mode: from ``weights`` and/or ``model``.

    ``model`` is None, a name of :mod:`gdnflow.models` or a model file;
    ``weights`` a gdnflow checkpoint, Keras or ONNX file (see the module
    docstring). Raises :class:`ClassifyError` (or the importers' errors,
    all ValueErrors naming the file) when they do not make a model.
    """
    device = device or default_device()
    if model in models.MODELS and model not in CLASSIFIERS:
        raise ClassifyError(f"--model {model} is not an image classifier; gdnflow's "
                            f"classifiers are {', '.join(CLASSIFIERS)} (or give a model file)")
    model_is_file = model is not None and model not in CLASSIFIERS
    if model_is_file and not os.path.exists(model):
        raise ClassifyError(f"--model {model}: neither a classifier's name "
                            f"({', '.join(CLASSIFIERS)}) nor an existing file")
    if model_is_file:
        network = load_file(model, device)
        if weights is not None:
            if detect_format(weights) != "gdnflow-checkpoint":
                raise ClassifyError(f"--weights {weights}: with --model FILE, the weights must be "
                                    "a gdnflow checkpoint")
            load_pruned(weights, network)       # pruned or not
        return network.eval()
    if weights is None:
        raise ClassifyError("--weights is required: gdnflow ships no trained weights (give a "
                            "gdnflow checkpoint, a Keras .h5 or an ONNX file)")
    network = load_file(weights, device, model_name=model)
    found = getattr(network, "config", {}).get("name")
    if model is not None and found != model:
        raise ClassifyError(f"--weights {weights} holds a {found} model, not a {model}")
    if found not in CLASSIFIERS + ("keras", "onnx"):
        raise ClassifyError(f"--weights {weights} holds a {found} model, not an image classifier")
    return network.eval()


def load_file(path, device, model_name=None):
    """The model in the file at ``path`` (checkpoint, Keras or ONNX: :func:`detect_format`).

    ``model_name`` names the classifier a checkpoint without config holds; a
    full Keras model, which brings its architecture, refuses it.
    """
    kind = detect_format(path)
    if kind == "onnx":
        network = onnx_io.load(path, device=device)     # needs the onnx package, as below
        import onnx     # local import: onnx is optional, loaded on first use
        network.config = {"name": "onnx", "preprocess": "torchvision"}
        network.image_size = onnx_image_size(onnx.load(str(path), load_external_data=False))
        return network
    if kind == "keras":
        network = keras_io.load(path, device=device)
        if model_name is not None and isinstance(network, keras_io.KerasModel):
            raise ClassifyError(f"{path} is a full Keras model: it brings its architecture, "
                                f"so leave out --model {model_name}")
        return network
    return model_from_checkpoint(path, device, model_name)


def model_from_checkpoint(path, device=None, model_name=None):
    """Rebuild the model a gdnflow checkpoint holds (from its config) with its weights.

    ``model_name`` (a :mod:`gdnflow.models` name) is used when the
    checkpoint's config names no model.
    """
    device = device or default_device()
    info = read_checkpoint_info(path)
    config = dict(info["config"])
    name = config.get("name") or model_name
    if name == "keras":
        saved = load_checkpoint(path)
        return keras_io.model_from_config(config, {**saved["parameters"], **saved["buffers"]},
                                          device=device)
    if name == "onnx":
        saved = load_checkpoint(path)
        return onnx_from_config(path, config, saved["parameters"], device)
    if name not in models.MODELS:
        stored = info["model_name"]
        if stored in models.MODELS and stored not in CLASSIFIERS:
            raise ClassifyError(f"{path} holds a {stored} model, not an image classifier "
                                f"({', '.join(CLASSIFIERS)})")
        raise ClassifyError(f"{path}: a checkpoint of {stored!r} whose config names no model "
                            f"gdnflow can build; if it holds a {' or '.join(CLASSIFIERS)}, "
                            "pass --model with its name")
    if "num_classes" not in config:
        config["num_classes"] = _classes_from_shapes(info["parameter_shapes"])
    network = _build_named(name, config, device)
    load_pruned(path, network)          # a pruned checkpoint (gdnflow prune) too
    return network


def _classes_from_shapes(shapes):
    """The output count of the last ``classifier.*.weight`` (a checkpoint without config)."""
    heads = sorted((int(k.split(".")[1]), s) for k, s in shapes.items()
                   if k.startswith("classifier.") and k.endswith(".weight"))
    if not heads:
        raise ClassifyError("the checkpoint has no classifier.*.weight to size the classifier")
    return int(heads[-1][1][0])
