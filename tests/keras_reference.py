"""The Keras fixtures (tests/fixtures/keras, written by tests/fixtures/make_keras_fixtures.py)
and what the Keras import tests (tests/io/keras/) compare with them."""
from pathlib import Path

import h5py
import numpy as np

import gdnflow as gf
from gdnflow import nn
from gdnflow.nn.module import Module

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "keras"
REFERENCE = np.load(FIXTURES / "reference.npz")


def reference_input(name):
    """The fixture's input as gdnflow takes it: NCHW float32."""
    return REFERENCE[f"{name}_x"].astype(np.float32).transpose(0, 3, 1, 2)


def assert_close(got, expected, rtol=1e-4):
    """Largest error at most rtol times the largest reference value."""
    assert got.shape == expected.shape
    error = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
    assert error <= rtol, f"relative error {error:.3g}"


def run(model, x, device):
    with gf.no_grad():
        return model(gf.tensor(x, device=device)).numpy()


def legacy_weights_file(full_path, path):
    """The weights-only file of a legacy full-model file: /model_weights at the root.

    Keras writes both with the same function (save_weights_to_hdf5_group);
    the fixture script checks that this copy equals its output.
    """
    with h5py.File(full_path, "r") as src, h5py.File(path, "w") as dst:
        group = src["model_weights"]
        for key, value in group.attrs.items():
            dst.attrs[key] = value
        for name in group:
            src.copy(group[name], dst, name=name)
    return path


class SmallVGG(Module):
    """gdnflow's VGG layout (features / classifier indices) at the fixture's small widths.

    gdnflow's vgg16 has a 25088 -> 4096 classifier, too large for a fixture;
    the Keras side is the fixture script's vgg16_small.
    """

    def __init__(self, widths=(4, 8, 8, 16, 16), hidden=32, classes=10):
        super().__init__()
        self.config = {"name": "vgg16"}
        layers, channels = [], 3
        for width, convs in zip(widths, (2, 2, 3, 3, 3)):
            for _ in range(convs):
                layers += [nn.Conv2d(channels, width, 3, 1, 1), nn.ReLU()]
                channels = width
            layers.append(nn.MaxPool2d(2, 2))
        self.features = nn.Sequential(*layers)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(channels * 2 * 2, hidden), nn.ReLU(), nn.Dropout(),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))
