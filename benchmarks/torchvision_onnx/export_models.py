"""Export one small model of every torchvision family to ONNX (issue #29).

Runs with PyTorch and torchvision, never with gdnflow (a separate venv):

    python3 -m venv /tmp/tv
    /tmp/tv/bin/pip install torch==2.13.0 torchvision==0.28.0 onnx onnxruntime
    /tmp/tv/bin/python benchmarks/torchvision_onnx/export_models.py /tmp/tv_onnx

Each family's smallest variant is built with seeded random weights (no
download: the check is numerical agreement, not accuracy), its batch-norm
running statistics drawn at random too so that folding them is exercised
(and any weight matrix left at zero, such as ViT's classifier, drawn),
put in eval mode and exported with the TorchScript exporter (the one most
shipped files come from) at opsets 13 and 17. The files go to the folder
given, outside the repository, with ``manifest.json``: the torch, torchvision
and onnx versions and, per file, the family, opset and input shape that
``check_models.py`` feeds it.
"""
import argparse
import json
import os
import sys

import onnx
import torch

# PyPI's torchvision 0.28.0 is a CUDA build: its C++ operators (detection's nms,
# roi_align...) fail to load beside a CPU-only torch, and its import then stops
# declaring fake kernels for two of them. Declaring their schemas first lets it
# import; the classification and segmentation models never call them. (Beside a
# CUDA torch the C++ operators load and declare them themselves.)
if torch.version.cuda is None:
    _TORCHVISION_SCHEMAS = torch.library.Library("torchvision", "DEF")
    for _name in ("nms", "qnms"):
        _TORCHVISION_SCHEMAS.define(
            f"{_name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
import torchvision  # noqa: E402  (after the schemas above)
from torchvision import models  # noqa: E402
from torchvision.models import segmentation  # noqa: E402

SEED = 0
OPSETS = (13, 17)
CLASSIFIER_SHAPE = (1, 3, 224, 224)
# The segmentation nets upsample to their input: a smaller one keeps the dilated
# ResNet-50 of FCN affordable on NumPy.
SEGMENTATION_SHAPE = (1, 3, 160, 160)

#: family -> (model name, builder of the model, input shape); smallest variant of each.
FAMILIES = {
    "ResNet": ("resnet18", lambda: models.resnet18(), CLASSIFIER_SHAPE),
    "MobileNetV3": ("mobilenet_v3_small", lambda: models.mobilenet_v3_small(), CLASSIFIER_SHAPE),
    "EfficientNet": ("efficientnet_b0", lambda: models.efficientnet_b0(), CLASSIFIER_SHAPE),
    "RegNet": ("regnet_y_400mf", lambda: models.regnet_y_400mf(), CLASSIFIER_SHAPE),
    "ShuffleNetV2": ("shufflenet_v2_x0_5", lambda: models.shufflenet_v2_x0_5(), CLASSIFIER_SHAPE),
    "SqueezeNet": ("squeezenet1_1", lambda: models.squeezenet1_1(), CLASSIFIER_SHAPE),
    "DenseNet": ("densenet121", lambda: models.densenet121(), CLASSIFIER_SHAPE),
    "MNASNet": ("mnasnet0_5", lambda: models.mnasnet0_5(), CLASSIFIER_SHAPE),
    "ConvNeXt": ("convnext_tiny", lambda: models.convnext_tiny(), CLASSIFIER_SHAPE),
    "GoogLeNet": ("googlenet", lambda: models.googlenet(aux_logits=False, init_weights=True),
                  CLASSIFIER_SHAPE),
    "Inception v3": ("inception_v3", lambda: models.inception_v3(aux_logits=False,
                                                                 init_weights=True),
                     (1, 3, 299, 299)),
    # Families beyond issue #29's list: the transformers and the other convolutional ones.
    "MobileNetV2": ("mobilenet_v2", lambda: models.mobilenet_v2(), CLASSIFIER_SHAPE),
    "AlexNet": ("alexnet", lambda: models.alexnet(), CLASSIFIER_SHAPE),
    "ResNeXt": ("resnext50_32x4d", lambda: models.resnext50_32x4d(), CLASSIFIER_SHAPE),
    "RegNetX": ("regnet_x_400mf", lambda: models.regnet_x_400mf(), CLASSIFIER_SHAPE),
    "EfficientNetV2": ("efficientnet_v2_s", lambda: models.efficientnet_v2_s(), CLASSIFIER_SHAPE),
    "ViT": ("vit_b_16", lambda: models.vit_b_16(), CLASSIFIER_SHAPE),
    "Swin": ("swin_t", lambda: models.swin_t(), CLASSIFIER_SHAPE),
    "MaxViT": ("maxvit_t", lambda: models.maxvit_t(), CLASSIFIER_SHAPE),
    "FCN": ("fcn_resnet50", lambda: segmentation.fcn_resnet50(
        weights=None, weights_backbone=None, aux_loss=False), SEGMENTATION_SHAPE),
    "DeepLabV3": ("deeplabv3_mobilenet_v3_large", lambda: segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, aux_loss=False), SEGMENTATION_SHAPE),
    "LRASPP": ("lraspp_mobilenet_v3_large", lambda: segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None), SEGMENTATION_SHAPE),
}


class OutputOnly(torch.nn.Module):
    """The segmentation models return {"out": ...}: export the tensor alone."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def seeded_model(build):
    """The model ``build`` makes, its weights and batch-norm statistics drawn from SEED
    (weight matrices its initialiser leaves at zero drawn too)."""
    torch.manual_seed(SEED)
    model = build()
    generator = torch.Generator().manual_seed(SEED + 1)
    for parameter in model.parameters():
        # ViT's classifier starts at zero: every output would be 0 and compare as nothing.
        if parameter.dim() >= 2 and not parameter.any():
            parameter.data.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape,
                                                        generator=generator))
            module.running_var.copy_(torch.rand(module.running_var.shape,
                                                generator=generator) + 0.5)
    return model.eval()


def export(family, name, build, shape, opset, folder):
    """Write ``<name>_opset<opset>.onnx`` in ``folder``; its manifest entry."""
    model = seeded_model(build)
    if family in ("FCN", "DeepLabV3", "LRASPP"):
        model = OutputOnly(model).eval()
    path = os.path.join(folder, f"{name}_opset{opset}.onnx")
    # Not under no_grad: there nn.MultiheadAttention (ViT) takes its fused fast path,
    # which the exporter cannot write.
    torch.onnx.export(model, (torch.zeros(shape),), path, opset_version=opset,
                      input_names=["input"], output_names=["output"], dynamo=False)
    onnx.checker.check_model(path)
    return {"family": family, "model": name, "opset": opset, "file": os.path.basename(path),
            "input_shape": list(shape)}


def main(argv=None):
    """Export every family at every opset; print one line per file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where the .onnx files and manifest.json go "
                        "(outside the repository)")
    parser.add_argument("--families", nargs="*", default=list(FAMILIES),
                        help="a subset of: " + ", ".join(FAMILIES))
    args = parser.parse_args(argv)
    os.makedirs(args.folder, exist_ok=True)
    entries = []
    for family in args.families:
        name, build, shape = FAMILIES[family]
        for opset in OPSETS:
            try:
                entries.append(export(family, name, build, shape, opset, args.folder))
                print(f"{family:13s} opset {opset}: {entries[-1]['file']}", flush=True)
            except Exception as error:     # one family's export failure must not stop the rest
                reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
                print(f"{family:13s} opset {opset}: export failed: {reason}", file=sys.stderr,
                      flush=True)
                entries.append({"family": family, "model": name, "opset": opset, "file": None,
                                "input_shape": list(shape), "export_error": reason})
    manifest = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                "onnx": onnx.__version__, "seed": SEED, "models": entries}
    with open(os.path.join(args.folder, "manifest.json"), "w") as file:
        json.dump(manifest, file, indent=1)


if __name__ == "__main__":
    main()
