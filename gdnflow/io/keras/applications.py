"""keras.applications weight files (no architecture inside) as gdnflow's MobileNetV2 and VGG16.

The models are recognised by their layer names (``Conv1`` and
``expanded_conv_depthwise``: MobileNetV2, its width from the channels of the
last block; ``block1_conv1`` and ``block5_conv3``: VGG16), and Keras layer
names map to gdnflow's parameters (``Conv1`` -> ``features.0.0``,
``block_1_expand_BN`` -> ``features.2.conv.0.1``, ``block1_conv1`` ->
``features.0``, ``fc1`` -> ``classifier.0``...).

Keras' MobileNetV2 is torchvision's but for its padding (stride-2
convolutions pad (0, 1) where torchvision pads (1, 1)) and its batch-norm
epsilon (1e-3): the model built is ``gdnflow.models.mobilenet_v2(width_mult,
padding_style="keras", bn_eps=1e-3)``, which computes what Keras computes for
inputs whose sides are multiples of 32 (Keras' published sizes, 96 to 224).
VGG16 is the same network in both; Keras flattens its last (h, w, c) map
where gdnflow's VGG16 flattens (c, h, w), so ``fc1``'s kernel rows are
permuted. gdnflow's models end in logits where Keras' end in a softmax;
MobileNetV2's dropout (Keras has none) is the identity in eval mode.
"""
import math

import numpy as np

from gdnflow import models, nn
from gdnflow.io.keras.file import KerasImportError
from gdnflow.io.keras.weights import to_gdnflow
from gdnflow.models.mobilenet_v2 import make_divisible

#: MobileNetV2 widths of the keras.applications weight files.
MOBILENET_V2_ALPHAS = (0.35, 0.5, 0.75, 1.0, 1.3, 1.4)


def _mobilenet_width(flat):
    """MobileNetV2's alpha from the channels of its last block (unique across Keras' widths)."""
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


def describe_application(flat):
    """"mobilenet_v2 alpha 0.35, 10 classes"-style description of the weights ``flat``, or None."""
    found = _application(flat)
    if found is None:
        return None
    name, alpha, classes = found
    width = f" alpha {alpha}" if alpha is not None else ""
    top = f", {classes} classes" if classes else ", no classifier (include_top=False)"
    return f"{name}{width}{top}"


def application_model(flat, path, device):
    """gdnflow's MobileNetV2 or VGG16 with the weights ``flat`` ({Keras layer: {variable: array}}).

    Raises :class:`KerasImportError` naming ``path`` when the layers are
    not those of either, lack the classifier, or do not fit.
    """
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
        model.load_state_dict(application_state(model, flat, path))
    except (KeyError, ValueError) as exc:       # ShapeError is a ValueError
        raise KerasImportError(f"{path}: the weights do not fit gdnflow's {name}: {exc}") from None
    return model.to(device)


def application_state(model, flat, path):
    """gdnflow state dict of ``model`` (MobileNetV2 or VGG16) from Keras layers' weights.

    Raises ValueError for another model (or a MobileNetV2 without Keras'
    padding and epsilon), :class:`KerasImportError` for missing layers.
    """
    name = getattr(model, "config", {}).get("name")
    if name == "mobilenet_v2":
        config = model.config
        if config.get("padding_style") != "keras" or config.get("bn_eps") != 1e-3:
            raise ValueError(
                "load_weights: Keras' MobileNetV2 weights need Keras' padding and epsilon; build "
                "the model with gdnflow.models.mobilenet_v2(..., padding_style='keras', "
                "bn_eps=1e-3)")
        names = mobilenet_v2_names(model)
    elif name == "vgg16":
        names = vgg16_names(model)
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
            params = to_gdnflow(layer, class_name, {"use_bias": "bias" in flat[layer]},
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


def mobilenet_v2_names(model):
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


def vgg16_names(model):
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
