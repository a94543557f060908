"""Keras import: models written by Keras 3 (tests/fixtures/make_keras_fixtures.py)
against Keras' own outputs, keras.applications weight files into gdnflow's
MobileNetV2 and VGG16, the Keras 2 configuration format, and the errors for
files gdnflow cannot run."""
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import models, nn
from gdnflow.io import keras
from gdnflow.io.checkpoint import load_checkpoint, save_checkpoint
from gdnflow.io.keras import KerasImportError
from gdnflow.io.keras.applications import application_model, mobilenet_v2_names
from gdnflow.io.keras.graph import tensor_refs
from gdnflow.io.keras.layers import tf_same
from gdnflow.io.keras.weights import LegacyWeights, read_flat_weights
from gdnflow.nn.module import Module

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "keras"
REFERENCE = np.load(FIXTURES / "reference.npz")
FULL_MODELS = ["functional", "sequential", "mobilenet_v2", "vgg16_small"]


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


# ------------------------------------------------------ full-model files --
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


def test_same_padding_is_tensorflows():
    same = tf_same
    assert same(13, 3, 2) == (1, 1)             # odd size, stride 2: symmetric
    assert same(224, 3, 2) == (0, 1)            # even size: the extra row after
    assert same(7, 4, 2) == (1, 2)              # even kernel
    assert same(6, 4, 2) == (1, 1)
    assert same(5, 3, 1, dilation=2) == (2, 2)
    assert same(4, 1, 2) == (0, 0)              # never negative


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


# ------------------------------------------- keras.applications weights --
def test_mobilenet_v2_weights_file_builds_keras_style_mobilenet(tmp_path):
    path = legacy_weights_file(FIXTURES / "mobilenet_v2.h5", tmp_path / "weights.h5")
    model = keras.load(path, device="numpy")
    assert isinstance(model, models.mobilenet_v2().__class__)
    assert model.config == {"name": "mobilenet_v2", "num_classes": 10, "width_mult": 0.35,
                            "dropout": 0.2, "padding_style": "keras", "bn_eps": 1e-3,
                            "preprocess": "keras-mobilenet"}
    # gdnflow's MobileNetV2 ends in logits where Keras' ends in a softmax.
    assert_close(run(model, reference_input("mobilenet_v2"), "numpy"),
                 REFERENCE["mobilenet_v2_logits"])


@pytest.mark.gpu
def test_mobilenet_v2_weights_file_on_cuda(tmp_path):
    path = legacy_weights_file(FIXTURES / "mobilenet_v2.h5", tmp_path / "weights.h5")
    model = keras.load(path, device="cuda")
    assert_close(run(model, reference_input("mobilenet_v2"), "cuda"),
                 REFERENCE["mobilenet_v2_logits"])


def test_torchvision_padding_would_not_match_keras():
    """The fixture sees the difference the Keras padding style makes."""
    model = models.mobilenet_v2(10, 0.35, padding_style="keras", bn_eps=1e-3)
    keras.load_weights(FIXTURES / "mobilenet_v2.h5", model)     # a full-model file's weights
    model.eval()
    x = reference_input("mobilenet_v2")
    assert_close(run(model, x, "numpy"), REFERENCE["mobilenet_v2_logits"])
    for module in model.features.named_modules():
        layer = module[1]
        if isinstance(layer, nn.Conv2d) and layer.stride == 2:
            layer.padding = 1                           # torchvision's
    error = np.max(np.abs(run(model, x, "numpy") - REFERENCE["mobilenet_v2_logits"]))
    assert error > 1e-2 * np.max(np.abs(REFERENCE["mobilenet_v2_logits"]))


def test_load_weights_refuses_a_torchvision_style_mobilenet():
    with pytest.raises(ValueError, match="padding_style='keras'"):
        keras.load_weights(FIXTURES / "mobilenet_v2.h5", models.mobilenet_v2(10, 0.35))


def test_vgg16_weights_file_into_gdnflows_vgg_layout():
    model = keras.load_weights(FIXTURES / "vgg16_small_weights.h5", SmallVGG()).eval()
    # Keras flattens NHWC, gdnflow NCHW: fc1's rows were permuted on loading.
    logits = run(model, reference_input("vgg16_small"), "numpy")
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert_close(probabilities, REFERENCE["vgg16_small_y"])


def test_vgg16_weights_of_other_widths_do_not_fit_gdnflows_vgg16():
    with pytest.raises(KerasImportError, match="vgg16_small_weights.h5: the weights do not fit "
                                               "gdnflow's vgg16"):
        keras.load(FIXTURES / "vgg16_small_weights.h5", device="numpy")


def test_weights_without_classifier_are_refused(tmp_path):
    path = legacy_weights_file(FIXTURES / "mobilenet_v2.h5", tmp_path / "notop.h5")
    with h5py.File(path, "r+") as f:
        f.attrs["layer_names"] = [n for n in f.attrs["layer_names"] if n != "predictions"]
        del f["predictions"]
    with pytest.raises(KerasImportError, match="include_top=False"):
        keras.load(path, device="numpy")


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


def test_file_info():
    info = keras.file_info(FIXTURES / "functional.h5")
    assert info["kind"] == "keras model" and info["model_name"] == "functional_cnn"
    assert info["layers"]["Conv2D"] == 5 and info["layers"]["Functional"] == 1
    assert info["input_shapes"] == [[13, 11, 3]]
    model = keras.load(FIXTURES / "functional.h5", device="numpy")
    assert info["parameter_count"] == sum(a.size for a in model.state_dict().values())
    info = keras.file_info(FIXTURES / "mobilenet_v2.h5")
    assert info["application"] == "mobilenet_v2 alpha 0.35, 10 classes"


# ---------------------------------------------------------------- errors --
def test_unsupported_layers_and_features_are_reported_at_once(tmp_path):
    path = tmp_path / "unsupported.h5"
    shutil.copy(FIXTURES / "functional.h5", path)
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["model_config"])
        layers = {layer["name"]: layer for layer in config["config"]["layers"]}
        layers["act"]["class_name"] = "PReLU"
        layers["zpad"]["class_name"] = "LSTM"
        layers["zpad_sym"]["class_name"] = "LSTM"
        layers["conv_s2"]["config"]["activation"] = "tanh"
        inner = {layer["name"]: layer for layer in layers["inner"]["config"]["layers"]}
        inner["inner_relu"]["config"]["negative_slope"] = 0.1
        f.attrs["model_config"] = json.dumps(config)
    with pytest.raises(KerasImportError) as error:
        keras.load(path)
    message = str(error.value)
    assert message.startswith(f"{path}: unsupported Keras layers: LSTM (layers zpad, zpad_sym); "
                              "PReLU (layers act). unsupported features: ")
    assert "conv_s2 (Conv2D): activation 'tanh'" in message
    assert "inner_relu (ReLU): negative_slope" in message


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
    import zipfile
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("config.json", "{}")
    with pytest.raises(KerasImportError, match="model.keras: a Keras 3 '.keras' archive"):
        keras.load(archive)


def test_gdnflow_checkpoint_is_not_a_keras_file(tmp_path):
    path = tmp_path / "ckpt.h5"
    save_checkpoint(path, SmallVGG())
    with pytest.raises(KerasImportError, match="ckpt.h5: a gdnflow checkpoint"):
        keras.load(path)


def keras_layout(model):
    """{Keras layer: {variable: array}} of a Keras-style gdnflow MobileNetV2 (the inverse map)."""
    state = model.state_dict()
    flat = {}
    for prefix, layer, class_name, _ in mobilenet_v2_names(model):
        if class_name == "BatchNormalization":
            flat[layer] = {"gamma": state[f"{prefix}.weight"], "beta": state[f"{prefix}.bias"],
                           "moving_mean": state[f"{prefix}.running_mean"],
                           "moving_variance": state[f"{prefix}.running_var"]}
        elif class_name == "Dense":
            flat[layer] = {"kernel": state[f"{prefix}.weight"].T, "bias": state[f"{prefix}.bias"]}
        elif class_name == "DepthwiseConv2D":
            flat[layer] = {"kernel": state[f"{prefix}.weight"].transpose(2, 3, 0, 1)}
        else:
            flat[layer] = {"kernel": state[f"{prefix}.weight"].transpose(2, 3, 1, 0)}
    return flat


@pytest.mark.parametrize("alpha", keras.MOBILENET_V2_ALPHAS)
def test_every_published_mobilenet_v2_width_is_recognised(alpha):
    source = models.mobilenet_v2(1000, alpha, padding_style="keras", bn_eps=1e-3,
                                 rng=np.random.default_rng(1))
    flat = keras_layout(source)
    assert len(flat) == 2 + 4 + 16 * 6 + 2 + 1         # Keras' layers with weights
    model = application_model(flat, "weights.h5", "numpy")
    assert model.config["width_mult"] == alpha and model.config["num_classes"] == 1000
    for name, array in source.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[name], array, err_msg=name)


@pytest.mark.parametrize("device", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_inference_plan_of_an_imported_model_matches_keras(device):
    """gdnflow.inference traces the graph's operators: BN folding works on Keras models too."""
    model = keras.load(FIXTURES / "mobilenet_v2.h5", device=device)
    x = reference_input("mobilenet_v2")
    compiled = model.compile_inference(x.shape)
    assert_close(compiled(gf.tensor(x, device=device)).numpy(), REFERENCE["mobilenet_v2_y"])


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
