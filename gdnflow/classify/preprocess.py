"""Images as a classifier's input: read through :func:`gdnflow.data.load_image`, then
resized and scaled the way the weights expect (:data:`PREPROCESSING`).

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
"""
import os

import numpy as np
from PIL import Image, UnidentifiedImageError

from gdnflow.classify.errors import ClassifyError
from gdnflow.data import images

#: Input scalings by name (see the module docstring).
PREPROCESSING = ("torchvision", "keras-mobilenet", "caffe")

#: ImageNet's per-channel RGB mean, of values in [0, 1] (``torchvision`` scaling).
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
#: ImageNet's per-channel RGB standard deviation, of values in [0, 1] (``torchvision``).
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
#: The per-channel BGR mean that ``caffe`` scaling subtracts from values in [0, 255].
CAFFE_MEAN_BGR = np.array([103.939, 116.779, 123.68], np.float32)


def load_image(path, mode="torchvision", size=224):
    """The image at ``path`` preprocessed for a classifier: float32 [3, size, size].

    ``mode`` is one of :data:`PREPROCESSING` (see the module docstring).
    Raises :class:`ClassifyError` naming the file if it is missing or
    cannot be decoded.
    """
    if mode not in PREPROCESSING:
        raise ClassifyError(f"unknown preprocessing {mode!r}; choose one of {PREPROCESSING}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ClassifyError(f"{path}: no such file")
    try:
        # gdnflow's one image reader: (3, H, W) in [0, 1], k / 255 for 8-bit files,
        # so rounding x * 255 gives back the file's 8-bit RGB pixels exactly.
        pixels = images.load_image(path)
        image = Image.fromarray(np.rint(pixels * 255).astype(np.uint8).transpose(1, 2, 0))
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
