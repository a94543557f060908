"""Images as a classifier's input, in each preprocessing mode (gdnflow.classify.preprocess)."""
import numpy as np
from PIL import Image

from gdnflow import classify


def test_preprocessing_modes(tmp_path):
    path = tmp_path / "flat.png"
    Image.new("RGB", (50, 40), (200, 100, 50)).save(path)
    rgb = np.array([200, 100, 50], np.float32)
    torchvision = classify.load_image(path, "torchvision", 32)
    assert torchvision.shape == (3, 32, 32)
    np.testing.assert_allclose(torchvision[:, 5, 5], (rgb / 255 - classify.IMAGENET_MEAN)
                               / classify.IMAGENET_STD, rtol=1e-5)
    np.testing.assert_allclose(classify.load_image(path, "keras-mobilenet", 16)[:, 0, 0],
                               rgb / 127.5 - 1, rtol=1e-5)
    np.testing.assert_allclose(classify.load_image(path, "caffe", 16)[:, 0, 0],
                               rgb[::-1] - classify.CAFFE_MEAN_BGR, rtol=1e-5)
