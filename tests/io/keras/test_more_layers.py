"""The Keras layers beyond plain CNNs (separable and 1-D convolutions, normalisations,
PReLU and the activations, merges, upsampling, recurrent layers) against Keras' own outputs
(tests/fixtures/keras_layers, written by tests/fixtures/make_keras_layer_fixtures.py), what
Keras 2 files name differently, and the refusal of options gdnflow does not run."""
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.io import keras
from gdnflow.io.checkpoint import load_checkpoint, save_checkpoint
from gdnflow.io.keras import KerasImportError

from keras_reference import assert_close

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "keras_layers"
REFERENCE = np.load(FIXTURES / "reference.npz")
MODELS = ("image", "sequence", "activations")
RTOL = 1e-5

#: The fixture's Activation layers (act_<name>, 4 channels each), in its order.
ACTIVATION_NAMES = ("linear", "relu", "relu6", "sigmoid", "tanh", "softplus", "softsign",
                    "exponential", "mish", "elu", "selu", "leaky_relu", "gelu", "swish",
                    "silu", "hard_sigmoid", "hard_swish", "hard_silu", "softmax")


def model_input(name):
    """The fixture's input as gdnflow takes it (images NCHW, sequences as they are)."""
    x = REFERENCE[f"{name}_x"].astype(np.float32)
    return x.transpose(0, 3, 1, 2) if x.ndim == 4 else x


def keras_order(y):
    """A gdnflow output in Keras' layout (NHWC for images)."""
    y = y.numpy()
    return y.transpose(0, 2, 3, 1) if y.ndim == 4 else y


def outputs(model, x, device):
    with gf.no_grad():
        ys = model(gf.tensor(x, device=device))
    return [keras_order(y) for y in (ys if isinstance(ys, tuple) else (ys,))]


def layer(model, name):
    """The submodule of a KerasModel running Keras layer ``name``."""
    return dict(model.named_modules())[f"{name}."]


def references(name):
    return [REFERENCE[f"{name}_y{i}"] for i in range(sum(k.startswith(f"{name}_y")
                                                         for k in REFERENCE.files))]


def check_matches_keras(model, name, device):
    got, expected = outputs(model, model_input(name), device), references(name)
    assert len(got) == len(expected)
    for y, reference in zip(got, expected):
        assert_close(y, reference, rtol=RTOL)


@pytest.mark.parametrize("device", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", MODELS)
def test_model_matches_keras(name, device):
    model = keras.load(FIXTURES / f"{name}.h5", device=device)
    check_matches_keras(model, name, device)


def check_each_activation(model, device):
    """Block by block, so that a small activation is not judged on exponential's scale."""
    config = model.config["model_config"]["config"]
    names = [layer["name"] for layer in config["layers"] if layer["class_name"] == "Activation"]
    assert names == [f"act_{name}" for name in ACTIVATION_NAMES]
    maps, _ = outputs(model, model_input("activations"), device)
    expected = references("activations")[0]
    for i, name in enumerate(ACTIVATION_NAMES):
        block = slice(4 * i, 4 * i + 4)
        try:
            assert_close(maps[..., block], expected[..., block], rtol=RTOL)
        except AssertionError as error:
            raise AssertionError(f"activation {name}: {error}") from None


@pytest.mark.parametrize("device", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_each_activation_matches_keras(device):
    check_each_activation(keras.load(FIXTURES / "activations.h5", device=device), device)


def test_activation_aliases(tmp_path):
    """Keras 3 writes swish and hard_swish as silu and hard_silu; older files by their names."""
    def aliases(layers):
        assert layers["act_swish"]["config"]["activation"] == "silu"
        layers["act_swish"]["config"]["activation"] = "swish"
        layers["act_hard_swish"]["config"]["activation"] = "hard_swish"
        layers["conv_hard_swish"]["config"]["activation"] = "hard_swish"
    path = edit_file("activations.h5", tmp_path / "aliases.h5", aliases)
    check_each_activation(keras.load(path, device="numpy"), "numpy")


def test_weights_in_gdnflow_layout_and_checkpoint_round_trip(tmp_path):
    model = keras.load(FIXTURES / "sequence.h5", device="numpy")
    state = model.state_dict()
    assert state["lstm.input_weight"].shape == (28, 6)              # 4 gates x 7, features
    assert state["lstm.recurrent_weight"].shape == (28, 7)
    assert state["gru.recurrent_bias"].shape == (15,)               # reset_after: two biases
    assert "gru_backwards_v1.recurrent_bias" not in state
    assert state["bi_concat.backward_layer.input_weight"].shape == (12, 4)
    assert state["conv_causal.weight"].shape == (6, 5, 1, 3)        # [out, in, 1, k]
    assert state["prelu_steps.alpha"].shape == (1, 6)
    image = keras.load(FIXTURES / "image.h5", device="numpy").state_dict()
    assert image["sep_s2.depthwise.weight"].shape == (6, 1, 3, 3)   # 3 channels x 2
    assert image["sep_s2.pointwise.weight"].shape == (8, 6, 1, 1)
    assert "sep_valid.pointwise.bias" not in image
    assert image["prelu.alpha"].shape == (8, 1, 1)                  # [C, 1, 1]: shared H, W
    assert image["prelu_full.alpha"].shape == (8, 11, 15)
    assert image["ln_all.weight"].shape == (10, 6, 4) and "ln_all.bias" not in image

    path = tmp_path / "sequence.ckpt.h5"
    save_checkpoint(path, model)
    saved = load_checkpoint(path)
    rebuilt = keras.model_from_config(saved["config"],
                                      {**saved["parameters"], **saved["buffers"]}, "numpy")
    x = model_input("sequence")
    for a, b in zip(outputs(rebuilt, x, "numpy"), outputs(model, x, "numpy")):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------ Keras 2 files --
def numpy_lstm(x, kernel, recurrent, bias, gate):
    """Keras' LSTM (gates i, f, c, o), the last h, by a plain loop."""
    h = np.zeros((x.shape[0], recurrent.shape[0]))
    c = np.zeros_like(h)
    for t in range(x.shape[1]):
        i, f, g, o = np.split(x[:, t] @ kernel + h @ recurrent + bias, 4, axis=1)
        c = gate(f) * c + gate(i) * np.tanh(g)
        h = gate(o) * np.tanh(c)
    return h


@pytest.mark.parametrize("version, slope", [("2.2.4", 0.2), ("3.3.3", 1 / 6), (None, 1 / 6)])
def test_hard_sigmoid_means_what_the_files_keras_version_meant(rng, version, slope):
    """Keras 2's hard_sigmoid (LSTM's default recurrent activation up to Keras 2.2) is
    clamp(0.2 x + 1/2, 0, 1); Keras 3's has slope 1/6."""
    features, units = 3, 4
    kernel = rng.normal(0, 1, (features, 4 * units))
    recurrent = rng.normal(0, 0.5, (units, 4 * units))
    bias = rng.normal(0, 0.5, 4 * units)
    config = {"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"class_name": "InputLayer", "config": {"name": "in", "batch_shape": [None, 6, 3]}},
        {"class_name": "LSTM", "config": {"name": "lstm", "units": units,
                                          "recurrent_activation": "hard_sigmoid"}}]}}
    state = {"lstm.input_weight": kernel.T, "lstm.recurrent_weight": recurrent.T,
             "lstm.bias": bias}
    model = keras.model_from_config({"model_config": config, "keras_version": version},
                                     state, "numpy")
    x = rng.uniform(-3, 3, (2, 6, features))
    expected = numpy_lstm(x, kernel, recurrent, bias,
                          lambda v: np.clip(slope * v + 0.5, 0, 1))
    (got,) = outputs(model, x.astype(np.float32), "numpy")
    assert_close(got, expected, rtol=RTOL)


def edit_file(source, path, edit_config=None, edit_weights=None, keras_version=None):
    """A copy of fixture ``source`` at ``path``, its configuration (a dict of layers by
    name) and weights group changed in place by the given functions."""
    shutil.copy(FIXTURES / source, path)
    with h5py.File(path, "r+") as f:
        if edit_config:
            config = json.loads(f.attrs["model_config"])
            edit_config({layer["name"]: layer for layer in config["config"]["layers"]})
            f.attrs["model_config"] = json.dumps(config)
        if edit_weights:
            edit_weights(f["model_weights"])
        if keras_version:
            f.attrs["keras_version"] = keras_version
    return path


def test_keras_version_of_a_file_renames_hard_sigmoid(tmp_path):
    def to_hard_sigmoid(layers):
        layers["lstm"]["config"]["recurrent_activation"] = "hard_sigmoid"
    for version, meaning in (("2.15.0", "hard_sigmoid_keras2"), ("3.15.1", "hard_sigmoid")):
        path = edit_file("sequence.h5", tmp_path / f"{version}.h5", to_hard_sigmoid,
                         keras_version=version)
        model = keras.load(path, device="numpy")
        assert layer(model, "lstm").recurrent_activation == meaning
        assert model.config["keras_version"] == version


@pytest.mark.parametrize("cell", ["", "lstm_cell_3/"])
def test_keras2_names_of_bidirectional_weights(tmp_path, cell):
    """Keras 2 names the wrapped layer in the config without "forward_", writes no
    backward_layer, and saves bi/forward_lstm_1/kernel:0 (Keras 2.2) or
    bi/forward_lstm_1/lstm_cell_3/kernel:0 (tf.keras)."""
    def keras2_config(layers):
        bidirectional = layers["bi_concat"]["config"]
        bidirectional["layer"]["config"]["name"] = "lstm_1"
        del bidirectional["backward_layer"]

    def keras2_weights(group):
        group = group["bi_concat"]
        names = [n.decode() if isinstance(n, bytes) else str(n)
                 for n in group.attrs["weight_names"]]
        renamed = []
        for name in names:
            # bi_concat/forward_lstm/lstm_cell/kernel
            _, direction, _, variable = name.split("/")
            new = f"bi_concat/{direction}_1/{cell}{variable}:0"
            data = group[name][()]
            del group[name]
            group[new] = data
            renamed.append(new.encode())
        group.attrs["weight_names"] = np.array(renamed)
    path = edit_file("sequence.h5", tmp_path / "keras2.h5", keras2_config, keras2_weights)
    check_matches_keras(keras.load(path, device="numpy"), "sequence", "numpy")


# --------------------------------------------------------------- refusals --
def test_unsupported_options_are_named_at_once(tmp_path):
    def image_options(layers):
        layers["up_bilinear"]["config"]["interpolation"] = "bicubic"
        layers["ln_all"]["config"]["rms_scaling"] = True
        layers["conv_after_permute"]["config"]["padding"] = "causal"
        layers["leaky"]["class_name"] = "ThresholdedReLU"
    with pytest.raises(KerasImportError) as error:
        keras.load(edit_file("image.h5", tmp_path / "image.h5", image_options))
    message = str(error.value)
    assert "unsupported Keras layers: ThresholdedReLU (layers leaky)" in message
    assert "up_bilinear (UpSampling2D): interpolation 'bicubic' (supported: nearest, " \
        "bilinear)" in message
    assert "ln_all (LayerNormalization): rms_scaling" in message
    assert "conv_after_permute (Conv2D): padding 'causal'" in message

    def sequence_options(layers):
        layers["lstm"]["config"]["return_state"] = True
        layers["gru"]["config"]["recurrent_activation"] = "log_sigmoid"
        layers["bi_sum"]["config"]["merge_mode"] = "max"
        layers["bi_ave"]["config"]["layer"]["class_name"] = "ConvLSTM1D"
        layers["bi_ave"]["config"]["backward_layer"]["class_name"] = "ConvLSTM1D"
    with pytest.raises(KerasImportError) as error:
        keras.load(edit_file("sequence.h5", tmp_path / "sequence.h5", sequence_options))
    message = str(error.value)
    assert "lstm (LSTM): return_state=True (the states as outputs)" in message
    assert "gru (GRU): recurrent_activation 'log_sigmoid' (supported: linear, " in message
    assert "bi_sum (Bidirectional): merge_mode 'max' (supported: concat, sum, ave, mul, " \
        "None)" in message
    assert "bi_ave (Bidirectional): a wrapped ConvLSTM1D (supported: SimpleRNN, LSTM, " \
        "GRU)" in message


def test_recurrent_layer_refuses_a_non_sequence():
    model = keras.load(FIXTURES / "sequence.h5", device="numpy")
    with pytest.raises(ValueError, match=r"LSTM takes sequences \[batch, time, features\], "
                                         r"got a 2-D input of shape \(2, 6\)"):
        layer(model, "lstm")(gf.tensor(np.ones((2, 6), np.float32), device="numpy"))
