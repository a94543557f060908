"""keras.applications weight files into gdnflow's MobileNetV2 and VGG16
(gdnflow.io.keras.applications)."""
import h5py
import numpy as np
import pytest

from gdnflow import models, nn
from gdnflow.io import keras
from gdnflow.io.keras import KerasImportError
from gdnflow.io.keras.applications import application_model, mobilenet_v2_names

from keras_reference import (FIXTURES, REFERENCE, SmallVGG, assert_close, legacy_weights_file,
                             reference_input, run)


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
