"""Keras files gdnflow reads or refuses (gdnflow.io.keras.file), and file_info."""
import zipfile

import h5py
import numpy as np
import pytest

from gdnflow.io import keras
from gdnflow.io.checkpoint import save_checkpoint
from gdnflow.io.keras import KerasImportError

from keras_reference import FIXTURES, SmallVGG


def test_file_info():
    info = keras.file_info(FIXTURES / "functional.h5")
    assert info["kind"] == "keras model" and info["model_name"] == "functional_cnn"
    assert info["layers"]["Conv2D"] == 5 and info["layers"]["Functional"] == 1
    assert info["input_shapes"] == [[13, 11, 3]]
    model = keras.load(FIXTURES / "functional.h5", device="numpy")
    assert info["parameter_count"] == sum(a.size for a in model.state_dict().values())
    info = keras.file_info(FIXTURES / "mobilenet_v2.h5")
    assert info["application"] == "mobilenet_v2 alpha 0.35, 10 classes"


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(KerasImportError, match="nope.h5: no such file"):
        keras.load(tmp_path / "nope.h5")
    text = tmp_path / "text.h5"
    text.write_text("not HDF5 at all")
    with pytest.raises(KerasImportError, match="text.h5 is not a readable HDF5 file"):
        keras.load(text)
    data = (FIXTURES / "mobilenet_v2.h5").read_bytes()
    for cut in (1000, len(data) // 2):
        truncated = tmp_path / f"cut{cut}.h5"
        truncated.write_bytes(data[:cut])
        with pytest.raises(KerasImportError, match=f"cut{cut}.h5"):
            keras.load(truncated)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(KerasImportError, match="other.h5: an HDF5 file, but not a Keras model"):
        keras.load(other)
    archive = tmp_path / "model.keras"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("config.json", "{}")
    with pytest.raises(KerasImportError, match="model.keras: a Keras 3 '.keras' archive"):
        keras.load(archive)


def test_gdnflow_checkpoint_is_not_a_keras_file(tmp_path):
    path = tmp_path / "ckpt.h5"
    save_checkpoint(path, SmallVGG())
    with pytest.raises(KerasImportError, match="ckpt.h5: a gdnflow checkpoint"):
        keras.load(path)
