"""Reading Keras weights (gdnflow.io.keras.weights): the Keras 3 layout, Keras 2's names."""
import h5py
import numpy as np
import pytest

from gdnflow.io import keras
from gdnflow.io.keras import KerasImportError
from gdnflow.io.keras.weights import LegacyWeights, read_flat_weights

from keras_reference import (FIXTURES, REFERENCE, assert_close, legacy_weights_file,
                             reference_input, run)


def test_keras3_weights_layout_is_read_like_the_legacy_one():
    with h5py.File(FIXTURES / "sequential.weights.h5", "r") as f:
        new = read_flat_weights(f, "keras3", "new")
    with h5py.File(FIXTURES / "sequential.h5", "r") as f:
        old = LegacyWeights.from_group(f["model_weights"], "old").flat()
    assert set(new) == set(old) == {"c1", "c2", "bn2", "out"}
    for layer in old:
        assert set(new[layer]) == set(old[layer])
        for variable in old[layer]:
            np.testing.assert_array_equal(new[layer][variable], old[layer][variable])
    info = keras.file_info(FIXTURES / "sequential.weights.h5")
    assert info["kind"] == "keras 3 weights" and info["parameter_count"] == 630
    with pytest.raises(KerasImportError, match="not those of keras.applications"):
        keras.load(FIXTURES / "sequential.weights.h5")


def test_keras2_weight_names(tmp_path):
    """Keras 2 wrote ``Conv1/kernel:0`` and ``.../depthwise_kernel:0``; Keras 3 ``Conv1/kernel``."""
    path = legacy_weights_file(FIXTURES / "mobilenet_v2.h5", tmp_path / "keras2.h5")
    with h5py.File(path, "r+") as f:
        for layer in f.attrs["layer_names"]:
            group = f[layer]
            names = []
            for name in group.attrs["weight_names"]:
                name = name.decode() if isinstance(name, bytes) else str(name)
                new = name + ":0"
                if "depthwise" in layer and name.endswith("/kernel"):
                    new = name[:-len("kernel")] + "depthwise_kernel:0"
                group.move(name, new)
                names.append(new.encode())
            group.attrs["weight_names"] = names
    model = keras.load(path, device="numpy")
    assert_close(run(model, reference_input("mobilenet_v2"), "numpy"),
                 REFERENCE["mobilenet_v2_logits"])
