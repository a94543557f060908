"""VGG16 (Simonyan and Zisserman 2015, configuration D), laid out as torchvision's ``vgg16``.

features: thirteen 3x3 convolutions (padding 1) with ReLU, in five stages of
64, 128, 256, 512, 512 channels, each stage closed by 2x2/2 max pooling;
classifier: 25088 -> 4096 -> 4096 -> num_classes with ReLU and dropout.
Inputs are [N, 3, 224, 224] (the classifier expects a 7x7 feature map).
"""
import numpy as np

from gdnflow import nn
from gdnflow.nn.conv import Conv2d
from gdnflow.nn.module import Module

CONFIG_D = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
            512, 512, 512, "M"]


class VGG(Module):
    """VGG classifier: logits [N, num_classes] for [N, 3, 224, 224] images."""

    def __init__(self, config=CONFIG_D, num_classes=1000, dropout=0.5, rng=None):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.config = {"name": "vgg16", "num_classes": num_classes, "dropout": dropout}
        layers, channels = [], 3
        for item in config:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                # ReLU is a separate module (as in torchvision, keeping its
                # indices): applied by its own operator here, fused into the
                # convolution by inference plans.
                layers += [Conv2d(channels, item, 3, 1, 1, rng=rng), nn.ReLU()]
                channels = item
        self.features = nn.Sequential(*layers)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096, rng=rng), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, 4096, rng=rng), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, num_classes, rng=rng))

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


def vgg16(num_classes=1000, device=None, rng=None):
    """A VGG16 with random weights (PyTorch's default initialisation) on ``device``."""
    model = VGG(CONFIG_D, num_classes, rng=rng)
    return model.to(device) if device else model
