"""MobileNetV2 (Sandler et al. 2018), laid out as torchvision's ``mobilenet_v2``.

features.0: 3x3/2 convolution (3 -> 32·w), BatchNorm, ReLU6; features.1-17:
inverted residual blocks (expand 1x1 + BN + ReLU6, depthwise 3x3 + BN +
ReLU6, project 1x1 + BN, with a residual when the stride is 1 and the
channel count is kept); features.18: 1x1 convolution to 1280·max(1, w),
BN, ReLU6; then global average pooling, dropout and a linear classifier.

``padding_style="keras"`` and ``bn_eps=1e-3`` give Keras'
``keras.applications.MobileNetV2`` instead (same layers and channel counts,
so its weights load with :func:`gdnflow.io.keras.load_weights`): TensorFlow's
"same" padding puts the extra row and column of a stride-2 3x3 convolution
after the input, padding (top, bottom, left, right) = (0, 1, 0, 1), where
torchvision pads 1 on every side; and Keras' batch norm epsilon is 1e-3.
Keras computes its padding from the input size; (0, 1, 0, 1) is what it
computes when every stride-2 layer sees an even size (H and W multiples of
32: all of Keras' published input sizes, 96 to 224).
"""
import numpy as np

from gdnflow import nn
from gdnflow.nn.conv import Conv2d
from gdnflow.nn.module import Module

#: (expansion t, output channels c, repeats n, first stride s), from the paper's Table 2.
INVERTED_RESIDUAL_SETTING = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def make_divisible(value, divisor=8):
    """Round channels to a multiple of ``divisor``, never more than 10% down (torchvision's rule)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


#: Padding styles: torchvision's, or TensorFlow's "same" as Keras computes it (module docstring).
PADDING_STYLES = ("torchvision", "keras")


def same_padding(kernel_size, stride, style="torchvision"):
    """Padding (top, bottom, left, right) keeping H/stride for odd square kernels, in ``style``.

    torchvision: (k - 1) // 2 on every side. keras: TensorFlow's "same" for
    an input size divisible by the stride, total k - stride (at least 0),
    the larger half after.
    """
    if style == "torchvision":
        return ((kernel_size - 1) // 2,) * 4
    total = max(kernel_size - stride, 0)
    return (total // 2, total - total // 2) * 2


def conv_bn_relu6(in_channels, out_channels, kernel_size=3, stride=1, groups=1, rng=None,
                  padding_style="torchvision", bn_eps=1e-5):
    """Convolution (no bias), BatchNorm, ReLU6; 'same' padding for odd kernels."""
    return nn.Sequential(Conv2d(in_channels, out_channels, kernel_size, stride,
                                same_padding(kernel_size, stride, padding_style), groups=groups,
                                bias=False, rng=rng),
                         nn.BatchNorm2d(out_channels, eps=bn_eps), nn.ReLU6())


class InvertedResidual(Module):
    """Expand (1x1), depthwise (3x3, stride), project (1x1, linear) with a skip when shapes allow."""

    def __init__(self, in_channels, out_channels, stride, expand_ratio, rng=None,
                 padding_style="torchvision", bn_eps=1e-5):
        super().__init__()
        hidden = int(round(in_channels * expand_ratio))
        self.use_residual = stride == 1 and in_channels == out_channels
        style = {"padding_style": padding_style, "bn_eps": bn_eps}
        layers = ([conv_bn_relu6(in_channels, hidden, 1, rng=rng, **style)]
                  if expand_ratio != 1 else [])
        layers += [conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden, rng=rng, **style),
                   Conv2d(hidden, out_channels, 1, bias=False, rng=rng),
                   nn.BatchNorm2d(out_channels, eps=bn_eps)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        y = self.conv(x)
        return x + y if self.use_residual else y


class MobileNetV2(Module):
    """MobileNetV2 classifier for [N, 3, H, W] images (H, W >= 32): logits [N, num_classes]."""

    def __init__(self, num_classes=1000, width_mult=1.0, dropout=0.2, rng=None,
                 padding_style="torchvision", bn_eps=1e-5):
        super().__init__()
        if padding_style not in PADDING_STYLES:
            raise ValueError(f"MobileNetV2: padding_style must be one of {PADDING_STYLES}, "
                             f"got {padding_style!r}")
        rng = rng or np.random.default_rng(0)
        self.config = {"name": "mobilenet_v2", "num_classes": num_classes,
                       "width_mult": width_mult, "dropout": dropout}
        if (padding_style, bn_eps) != ("torchvision", 1e-5):
            self.config.update(padding_style=padding_style, bn_eps=bn_eps)
        style = {"padding_style": padding_style, "bn_eps": bn_eps}
        channels = make_divisible(32 * width_mult)
        last_channels = make_divisible(1280 * max(1.0, width_mult))
        features = [conv_bn_relu6(3, channels, 3, 2, rng=rng, **style)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            out_channels = make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(channels, out_channels, s if i == 0 else 1, t,
                                                 rng, **style))
                channels = out_channels
        features.append(conv_bn_relu6(channels, last_channels, 1, rng=rng, **style))
        self.features = nn.Sequential(*features)
        self.pool = nn.GlobalAvgPool2d()
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last_channels, num_classes,
                                                                       rng=rng))

    def forward(self, x):
        return self.classifier(self.flatten(self.pool(self.features(x))))


def mobilenet_v2(num_classes=1000, width_mult=1.0, device=None, rng=None,
                 padding_style="torchvision", bn_eps=1e-5):
    """A MobileNetV2 with random weights (PyTorch's default initialisation) on ``device``.

    ``padding_style="keras", bn_eps=1e-3``: Keras' variant (module docstring).
    """
    model = MobileNetV2(num_classes, width_mult, rng=rng, padding_style=padding_style,
                        bn_eps=bn_eps)
    return model.to(device) if device else model
