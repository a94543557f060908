"""``gdnflow classify``, ``convert`` and ``info FILE`` (gdnflow.classify.cli) on images
made here with Pillow, small checkpoints saved here, the Keras fixtures and a small ONNX
model; and the errors for files they cannot use."""
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

import gdnflow as gf
from gdnflow import classify, models
from gdnflow.cli import main
from gdnflow.io.checkpoint import save_checkpoint

KERAS = Path(__file__).resolve().parents[1] / "fixtures" / "keras"
SIZE = 64       # small inputs keep the NumPy forward passes fast


@pytest.fixture
def images(tmp_path, rng):
    """A JPEG and a PNG of different sizes with some structure (a gradient plus noise)."""
    paths = []
    for name, (h, w) in (("photo.jpg", (90, 120)), ("drawing.png", (80, 70))):
        ramp = np.linspace(0, 255, w)[None, :, None] * rng.uniform(0.2, 1, 3)
        pixels = np.clip(ramp + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(tmp_path / name)
        paths.append(str(tmp_path / name))
    return paths


@pytest.fixture
def checkpoint(tmp_path):
    """A 7-class MobileNetV2 (width 0.35, random weights) saved as a gdnflow checkpoint."""
    model = models.mobilenet_v2(num_classes=7, width_mult=0.35, device="numpy",
                                rng=np.random.default_rng(3))
    path = tmp_path / "mnv2.h5"
    save_checkpoint(path, model)
    return str(path), model.eval()


def expected_top5(model, image, mode="torchvision", device="numpy"):
    x = classify.load_image(image, mode, SIZE)[None]
    with gf.no_grad():
        logits = model(gf.tensor(x, device=device)).numpy()[0].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    order = np.argsort(-p)[:5]
    return order, p[order]


def parse(output):
    """{image: [(class index, probability)]} from classify's printout."""
    results, current = {}, None
    for line in output.splitlines():
        if not line.startswith(" "):
            current = results.setdefault(line, [])
        else:
            percent, rest = line.split("%", 1)
            index = int(rest.strip().rsplit("(", 1)[-1].rstrip(")").replace("class ", ""))
            current.append((index, float(percent) / 100))
    return results


# ------------------------------------------------------------- classify --
def test_classify_prints_top5_per_image(images, checkpoint, capsys):
    path, model = checkpoint
    assert main(["classify", *images, "--weights", path, "--device", "numpy",
                 "--size", str(SIZE)]) == 0
    results = parse(capsys.readouterr().out)
    assert list(results) == images
    for image in images:
        order, probabilities = expected_top5(model, image)
        assert [i for i, _ in results[image]] == list(order)
        np.testing.assert_allclose([p for _, p in results[image]], probabilities, atol=6e-5)


def test_labels_file_names_the_classes(images, checkpoint, tmp_path, capsys):
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"thing{i}" for i in range(7)) + "\n")
    assert main(["classify", images[0], "--weights", checkpoint[0], "--labels", str(labels),
                 "--device", "numpy", "--size", str(SIZE)]) == 0
    out = capsys.readouterr().out
    assert out.count("thing") == 5 and "(" in out
    labels.write_text("only\ntwo\n")
    assert main(["classify", images[0], "--weights", checkpoint[0], "--labels", str(labels),
                 "--device", "numpy", "--size", str(SIZE)]) == 1
    assert "2 names for a model of 7 classes" in capsys.readouterr().err


def test_keras_model_and_its_converted_checkpoint_agree(images, tmp_path, capsys):
    keras_file = str(KERAS / "mobilenet_v2.h5")
    converted = str(tmp_path / "converted.h5")
    assert main(["convert", keras_file, converted]) == 0
    assert "keras, 408,938 parameters" in capsys.readouterr().out
    outputs = []
    for weights in (keras_file, converted):
        # The Keras model fixes its input at 96x96 and scales to [-1, 1] (from its name).
        assert main(["classify", *images, "--weights", weights, "--device", "numpy"]) == 0
        outputs.append(parse(capsys.readouterr().out))
    assert outputs[0] == outputs[1]
    network = classify.load_model(keras_file, device="numpy")
    assert network.config["preprocess"] == "keras-mobilenet" and classify.input_size(network) == 96


def test_keras_applications_weights_convert_to_gdnflows_mobilenet(tmp_path, capsys):
    # A keras.applications-style weights file: the full file's /model_weights at the root.
    weights = tmp_path / "weights.h5"
    with h5py.File(KERAS / "mobilenet_v2.h5", "r") as src, h5py.File(weights, "w") as dst:
        dst.attrs.update(src["model_weights"].attrs)
        for name in src["model_weights"]:
            src.copy(src["model_weights"][name], dst, name=name)
    converted = tmp_path / "mnv2.h5"
    assert main(["convert", str(weights), str(converted)]) == 0
    network = classify.load_model(str(converted), "mobilenet_v2", device="numpy")
    assert network.config["padding_style"] == "keras" and network.config["width_mult"] == 0.35
    assert network.config["preprocess"] == "keras-mobilenet"
    assert main(["info", str(converted)]) == 0
    out = capsys.readouterr().out
    assert "model: mobilenet_v2" in out and "padding_style=keras" in out


def onnx_classifier(path, rng):
    """A tiny ONNX classifier: conv 3x3 (3 -> 4), relu, global average pool, Gemm to 6 classes."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    fc = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, 48, 48])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 6])], initializer=[w, b, fc])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return str(path)


def test_onnx_model_and_its_converted_checkpoint_agree(images, tmp_path, rng, capsys):
    model = onnx_classifier(tmp_path / "tiny.onnx", rng)
    converted = str(tmp_path / "tiny.h5")
    assert main(["convert", model, converted]) == 0
    assert "onnx, 136 parameters" in capsys.readouterr().out
    outputs = []
    for weights in (model, converted):
        assert main(["classify", *images, "--weights", weights, "--device", "numpy"]) == 0
        outputs.append(parse(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and len(outputs[0][images[0]]) == 5
    assert classify.input_size(classify.load_model(converted, device="numpy")) == 48
    assert main(["info", converted]) == 0
    assert "model: onnx" in capsys.readouterr().out


@pytest.mark.gpu
def test_classify_on_cuda(images, checkpoint, capsys):
    path, model = checkpoint
    assert main(["classify", *images, "--weights", path, "--device", "cuda",
                 "--size", str(SIZE)]) == 0
    results = parse(capsys.readouterr().out)
    for image in images:
        order, probabilities = expected_top5(model, image)
        assert [i for i, _ in results[image]] == list(order)
        np.testing.assert_allclose([p for _, p in results[image]], probabilities, atol=6e-5)


# --------------------------------------------------------------- errors --
def test_unreadable_image_is_named(images, checkpoint, tmp_path, capsys):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(Path(images[0]).read_bytes()[:40])
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    for bad in (broken, text):
        assert main(["classify", images[1], str(bad), "--weights", checkpoint[0],
                     "--device", "numpy", "--size", str(SIZE)]) == 1
        captured = capsys.readouterr()
        assert f"{bad}: cannot decode the image" in captured.err and captured.out == ""


def test_missing_files_are_named(images, checkpoint, tmp_path, capsys):
    missing = str(tmp_path / "missing.jpg")
    cases = [(["classify", missing, "--weights", checkpoint[0]], f"{missing}: no such file"),
             (["classify", images[0], "--weights", str(tmp_path / "w.h5")], "w.h5: no such file"),
             (["classify", images[0]], "--weights is required"),
             (["classify", images[0], "--model", "nothing.onnx"], "neither a classifier's name"),
             (["convert", str(tmp_path / "in.onnx"), str(tmp_path / "out.h5")],
              "in.onnx: no such file"),
             (["info", str(tmp_path / "x.h5")], "x.h5: no such file")]
    for argv, message in cases:
        assert main(argv + (["--device", "numpy"] if argv[0] == "classify" else [])) == 1
        assert message in capsys.readouterr().err, argv


def test_wrong_model_or_file_kind_is_explained(images, checkpoint, tmp_path, capsys):
    assert main(["classify", images[0], "--model", "vgg16", "--weights", checkpoint[0],
                 "--device", "numpy"]) == 1
    assert "holds a mobilenet_v2 model, not a vgg16" in capsys.readouterr().err
    assert main(["classify", images[0], "--model", "vgg16", "--weights",
                 str(KERAS / "functional.h5"), "--device", "numpy"]) == 1
    assert "leave out --model vgg16" in capsys.readouterr().err
    assert main(["convert", checkpoint[0], str(tmp_path / "again.h5")]) == 1
    assert "already a gdnflow checkpoint" in capsys.readouterr().err
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01junk")
    assert main(["info", str(junk)]) == 1
    assert "not a gdnflow checkpoint, Keras HDF5 or ONNX file" in capsys.readouterr().err


# ----------------------------------------------------------------- info --
def test_info_on_each_kind_of_file(checkpoint, tmp_path, rng, capsys):
    assert main(["info", checkpoint[0]]) == 0
    out = capsys.readouterr().out
    assert "gdnflow checkpoint, format version 1" in out and "model: mobilenet_v2" in out
    count = sum(p.size for p in checkpoint[1].parameters())
    assert f"parameters: {count:,}" in out and "num_classes=7" in out
    assert main(["info", str(KERAS / "functional.h5")]) == 0
    out = capsys.readouterr().out
    assert "keras model (keras 3.15.1, backend torch)" in out
    assert "functional_cnn (Functional), inputs (13, 11, 3)" in out and "Conv2D 5" in out
    assert main(["info", str(KERAS / "vgg16_small_weights.h5")]) == 0
    assert "keras.applications: vgg16, 10 classes" in capsys.readouterr().out
    model = onnx_classifier(tmp_path / "tiny.onnx", rng)
    assert main(["info", model]) == 0
    out = capsys.readouterr().out
    assert "opset ai.onnx 13" in out and "Conv 1, Flatten 1, Gemm 1" in out
    assert "x [Nx3x48x48]" in out and "parameters: 136 in 3 tensors (as gdnflow loads them)" in out
    assert main(["info"]) == 0          # without FILE: what gdnflow sees, as before
    assert "default device" in capsys.readouterr().out


def test_a_pruned_checkpoint_classifies_like_its_dense_twin(images, checkpoint, tmp_path, capsys):
    """gdnflow prune's output (dense weights with zeros, plus weight_mask buffers) loads where
    the dense checkpoint does, and classifies as a dense model with those weights."""
    path, _ = checkpoint
    pruned = tmp_path / "pruned.h5"
    assert main(["prune", str(path), "--sparsity", "0.5", "-o", str(pruned)]) == 0
    capsys.readouterr()
    assert main(["classify", *images, "--weights", str(pruned), "--device", "numpy",
                 "--size", str(SIZE)]) == 0
    results = parse(capsys.readouterr().out)
    dense = models.mobilenet_v2(num_classes=7, width_mult=0.35, device="numpy")
    saved = gf.io.checkpoint.load_checkpoint(pruned)
    dense.load_state_dict(saved["parameters"] | {k: v for k, v in saved["buffers"].items()
                                                 if not k.endswith("weight_mask")})
    assert any(np.mean(v == 0) > 0.4 for v in saved["parameters"].values())   # really pruned
    for image in images:
        order, probabilities = expected_top5(dense.eval(), image)
        assert [i for i, _ in results[image]] == list(order)
        np.testing.assert_allclose([p for _, p in results[image]], probabilities, atol=6e-5)
