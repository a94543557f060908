"""Keras full-model files (written by Keras 3) run as gdnflow modules against Keras' own
outputs; the Keras 2 configuration format; unsupported layers reported at once."""
import json
import shutil

import h5py
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.io import keras
from gdnflow.io.checkpoint import load_checkpoint, save_checkpoint
from gdnflow.io.keras import KerasImportError
from gdnflow.io.keras.graph import tensor_refs

from keras_reference import FIXTURES, REFERENCE, assert_close, reference_input, run


FULL_MODELS = ["functional", "sequential", "mobilenet_v2", "vgg16_small"]


@pytest.mark.parametrize("name", FULL_MODELS)
def test_full_model_matches_keras_on_numpy(name):
    model = keras.load(FIXTURES / f"{name}.h5", device="numpy")
    assert isinstance(model, keras.KerasModel) and not model.training
    assert_close(run(model, reference_input(name), "numpy"), REFERENCE[f"{name}_y"])


@pytest.mark.gpu
@pytest.mark.parametrize("name", FULL_MODELS)
def test_full_model_matches_keras_on_cuda(name):
    model = keras.load(FIXTURES / f"{name}.h5", device="cuda")
    assert_close(run(model, reference_input(name), "cuda"), REFERENCE[f"{name}_y"])


def test_layers_are_submodules_named_after_keras_layers():
    model = keras.load(FIXTURES / "functional.h5", device="numpy")
    state = model.state_dict()
    assert state["conv_s2.weight"].shape == (6, 3, 3, 3)            # [out, in, kh, kw]
    assert state["conv_even_kernel.weight"].shape == (8, 6, 4, 4)
    assert state["dw_mult.weight"].shape == (16, 1, 2, 2)           # 8 channels x 2
    assert state["fc.weight"].shape == (12, 64)                     # [out, in]
    assert "conv_dilated.bias" not in state                          # use_bias=False
    assert {"inner.inner_conv.weight", "inner.inner_bn.running_var",
            "bn.running_mean"} <= set(state)
    assert model.input_shapes == [[13, 11, 3]] and model.image_size == (13, 11)


def test_checkpoint_round_trip_rebuilds_the_keras_graph(tmp_path):
    model = keras.load(FIXTURES / "functional.h5", device="numpy")
    path = tmp_path / "functional.ckpt.h5"
    save_checkpoint(path, model)
    saved = load_checkpoint(path)
    assert saved["config"]["name"] == "keras"
    rebuilt = keras.model_from_config(saved["config"],
                                      {**saved["parameters"], **saved["buffers"]}, "numpy")
    x = reference_input("functional")
    np.testing.assert_array_equal(run(rebuilt, x, "numpy"), run(model, x, "numpy"))


def keras2_config(config):
    """A Keras 3 configuration rewritten in Keras 2's form (nodes as lists, batch_input_shape)."""
    config = json.loads(json.dumps(config))

    def convert(model):
        if model["class_name"] == "Sequential":
            layers = model["config"]["layers"]
            first = layers.pop(0)           # Keras 2 puts the input shape on the first layer
            layers[0]["config"]["batch_input_shape"] = first["config"].pop("batch_shape")
            return
        for layer in model["config"]["layers"]:
            if "batch_shape" in layer["config"]:
                layer["config"]["batch_input_shape"] = layer["config"].pop("batch_shape")
            nodes = []
            for node in layer["inbound_nodes"]:
                refs = tensor_refs(node["args"], [])
                nodes.append([[l, n, t, {}] for l, n, t in refs])
            layer["inbound_nodes"] = nodes
            if layer["class_name"] in ("Functional", "Sequential"):
                convert(layer)
        for key in ("input_layers", "output_layers"):
            refs = model["config"][key]
            model["config"][key] = [refs] if isinstance(refs[0], str) else refs
    convert(config)
    return config


@pytest.mark.parametrize("name", ["functional", "sequential", "sequential-list"])
def test_keras2_configuration_format(tmp_path, name):
    name, _, form = name.partition("-")
    path = tmp_path / f"{name}_keras2.h5"
    shutil.copy(FIXTURES / f"{name}.h5", path)
    with h5py.File(path, "r+") as f:
        config = keras2_config(json.loads(f.attrs["model_config"]))
        assert "__keras_tensor__" not in json.dumps(config)
        if form == "list":      # Keras 2.2 wrote a Sequential's config as its list of layers
            config["config"] = config["config"]["layers"]
        f.attrs["model_config"] = json.dumps(config)
        f.attrs["keras_version"] = "2.15.0"
    model = keras.load(path, device="numpy")
    assert_close(run(model, reference_input(name), "numpy"), REFERENCE[f"{name}_y"])


def test_unsupported_layers_and_features_are_reported_at_once(tmp_path):
    path = tmp_path / "unsupported.h5"
    shutil.copy(FIXTURES / "functional.h5", path)
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["model_config"])
        layers = {layer["name"]: layer for layer in config["config"]["layers"]}
        layers["act"]["class_name"] = "Attention"
        layers["zpad"]["class_name"] = "ConvLSTM2D"
        layers["zpad_sym"]["class_name"] = "ConvLSTM2D"
        layers["conv_s2"]["config"]["activation"] = "log_softmax"
        inner = {layer["name"]: layer for layer in layers["inner"]["config"]["layers"]}
        inner["inner_relu"]["config"]["threshold"] = 0.1
        f.attrs["model_config"] = json.dumps(config)
    with pytest.raises(KerasImportError) as error:
        keras.load(path)
    message = str(error.value)
    assert message.startswith(f"{path}: unsupported Keras layers: Attention (layers act); "
                              "ConvLSTM2D (layers zpad, zpad_sym). unsupported features: ")
    assert "conv_s2 (Conv2D): activation 'log_softmax' (supported: linear, relu" in message
    assert "inner_relu (ReLU): threshold" in message


@pytest.mark.parametrize("device", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_inference_plan_of_an_imported_model_matches_keras(device):
    """gdnflow.inference traces the graph's operators: BN folding works on Keras models too."""
    model = keras.load(FIXTURES / "mobilenet_v2.h5", device=device)
    x = reference_input("mobilenet_v2")
    compiled = gf.compile(model, x.shape)
    assert_close(compiled(gf.tensor(x, device=device)).numpy(), REFERENCE["mobilenet_v2_y"])
