"""gdnflow compress / decompress / eval through ``python -m gdnflow.codec.cli``'s main:
printed bpp equals the file's size, clear errors naming the file, nothing
overwritten without --force, and eval's JPEG bracketing."""
import json
import math
import re
from pathlib import Path

import numpy as np
from PIL import Image
import pytest

from gdnflow.codec import Codec, read_image
from gdnflow.codec.cli import main
from gdnflow.codec.references import JPEG, RateSweep
from gdnflow.data.images import list_images


def run(*argv):
    return main([str(a) for a in argv])


def test_compress_then_decompress(model, checkpoint, image_files, tmp_path, capsys):
    for kind, source in image_files.items():
        out = tmp_path / f"{kind}.gdn"
        assert run("compress", source, "-o", out, "--checkpoint", checkpoint,
                   "--device", "numpy") == 0
        printed = capsys.readouterr().out
        h, w = read_image(source).shape[:2]
        size = out.stat().st_size
        match = re.search(r"(\d+) bytes, ([\d.]+) bpp, PSNR ([\d.]+) dB", printed)
        assert int(match.group(1)) == size
        assert match.group(2) == f"{8 * size / (h * w):.4f}"
        image_out = tmp_path / f"{kind}.png"
        assert run("decompress", out, "-o", image_out, "--checkpoint", checkpoint,
                   "--device", "numpy") == 0
        assert f"{8 * size / (h * w):.4f} bpp" in capsys.readouterr().out
        expected = Codec(model).decompress(out.read_bytes())
        assert np.array_equal(read_image(image_out), expected)


def test_decompress_exact_writes_the_exact_synthesis_image(model, checkpoint, image_files,
                                                          tmp_path):
    coded = tmp_path / "odd.gdn"
    assert run("compress", image_files["png"], "-o", coded, "--checkpoint", checkpoint,
               "--device", "numpy") == 0
    assert run("decompress", coded, "-o", tmp_path / "odd.png", "--checkpoint", checkpoint,
               "--device", "numpy", "--exact") == 0
    expected = Codec(model, exact=True).decompress(coded.read_bytes())
    assert np.array_equal(read_image(tmp_path / "odd.png"), expected)


def test_several_images_go_to_a_folder(checkpoint, image_files, tmp_path, capsys):
    second = tmp_path / "images" / "second.png"
    second.write_bytes(image_files["png"].read_bytes())
    folder = tmp_path / "coded"
    assert run("compress", image_files["png"], second, "-o", folder, "--checkpoint", checkpoint,
               "--device", "numpy") == 0
    assert sorted(p.name for p in folder.iterdir()) == ["odd.gdn", "second.gdn"]
    assert run("decompress", folder / "odd.gdn", folder / "second.gdn", "-o", tmp_path / "out",
               "--checkpoint", checkpoint, "--device", "numpy") == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["odd.png", "second.png"]


def test_same_stems_are_refused_before_writing(checkpoint, image_files, tmp_path, capsys):
    folder = tmp_path / "coded"
    assert run("compress", image_files["png"], image_files["jpg"], "-o", folder,
               "--checkpoint", checkpoint, "--device", "numpy") == 1
    assert "would both be written" in capsys.readouterr().err
    assert not folder.exists()


def test_decompress_finds_its_checkpoint(checkpoint, image_files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "x.gdn"
    assert run("compress", image_files["png"], "-o", out, "--checkpoint", checkpoint,
               "--device", "numpy") == 0
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GDNFLOW_CHECKPOINTS", raising=False)
    assert run("decompress", out, "--device", "numpy") == 1
    assert "no checkpoint with model id" in capsys.readouterr().err
    monkeypatch.setenv("GDNFLOW_CHECKPOINTS", str(checkpoint.parent))
    assert run("decompress", out, "--device", "numpy") == 0
    assert (tmp_path / "x.png").exists()


def test_nothing_is_overwritten_without_force(checkpoint, image_files, tmp_path, capsys):
    out = tmp_path / "x.gdn"
    out.write_bytes(b"keep me")
    assert run("compress", image_files["png"], "-o", out, "--checkpoint", checkpoint,
               "--device", "numpy") == 1
    assert f"{out} exists: pass --force" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"
    assert run("compress", image_files["png"], "-o", out, "--checkpoint", checkpoint,
               "--device", "numpy", "--force") == 0
    assert out.read_bytes()[:4] == b"GDNF"
    image = tmp_path / "x.png"
    image.write_bytes(b"keep me too")
    assert run("decompress", out, "-o", image, "--checkpoint", checkpoint,
               "--device", "numpy") == 1
    assert image.read_bytes() == b"keep me too"
    assert run("decompress", out, "-o", image, "--checkpoint", checkpoint, "--device", "numpy",
               "--force") == 0
    assert image.read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_errors_name_the_file(checkpoint, image_files, other_model, tmp_path, capsys):
    from gdnflow.io.checkpoint import save_checkpoint
    out = tmp_path / "x.gdn"
    assert run("compress", image_files["png"], "-o", out, "--checkpoint", checkpoint,
               "--device", "numpy") == 0
    data = out.read_bytes()
    cases = {
        "truncated.gdn": (data[:len(data) // 2], "truncated"),
        "magic.gdn": (b"JUNK" + data[4:], "not a gdnflow compressed image"),
        "version.gdn": (data[:4] + b"\x05" + data[5:], "format version 5 is not supported"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        assert run("decompress", tmp_path / name, "--checkpoint", checkpoint,
                   "--device", "numpy") == 1
        err = capsys.readouterr().err
        assert f"{tmp_path / name}: " in err and message in err, err
    other = tmp_path / "other.h5"
    save_checkpoint(other, other_model)
    assert run("decompress", out, "--checkpoint", other, "--device", "numpy") == 1
    err = capsys.readouterr().err
    assert f"{out}: coded by another model" in err
    missing = tmp_path / "missing.h5"
    assert run("compress", image_files["png"], "-o", tmp_path / "y.gdn", "--checkpoint",
               missing, "--device", "numpy") == 1
    assert f"{missing}: no such file" in capsys.readouterr().err
    assert not (tmp_path / "y.gdn").exists()
    assert run("compress", tmp_path / "nothing.png", "--checkpoint", checkpoint,
               "--device", "numpy") == 1
    assert "nothing.png" in capsys.readouterr().err


def test_jpeg_bracketing_on_a_tiny_image(small_image):
    reference = RateSweep(small_image, JPEG)
    low, high = reference.bpp(50), reference.bpp(60)
    target = 0.5 * (low + high)
    q_low, q_high = reference.bracket(target)
    assert reference.bpp(q_low) < target <= reference.bpp(q_high) and q_high == q_low + 1
    at = reference.at_rate(target)
    a, b = reference.point(q_low), reference.point(q_high)
    assert min(a["psnr"], b["psnr"]) <= at["psnr"] <= max(a["psnr"], b["psnr"])
    assert math.isnan(at["ms_ssim"])               # 40x56 is too small for MS-SSIM
    assert reference.at_rate(0.5 * reference.bpp(1)) is None      # below quality 1
    assert reference.at_rate(2 * reference.bpp(100)) is None      # above quality 100


def test_eval_writes_table_plot_and_files(checkpoint, image_files, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("eval", "--checkpoint", checkpoint, "--data", image_files["png"].parent,
               "--out", out, "--device", "numpy") == 0
    printed = capsys.readouterr().out
    assert "| odd.png | model (factorized_prior, lambda 0.01) |" in printed and "**mean of 2**" in printed
    assert "| factorized_prior | 1 | WebP | — (the tested curve needs at least 2 points" in printed
    results = json.loads((out / "eval.json").read_text())
    for row in results["rows"]:
        path = out / "files" / "model" / (row["image"] + ".gdn")
        assert row["bpp"] == 8 * path.stat().st_size / np.prod(
            read_image(image_files["png"].parent / row["image"]).shape[:2])
    assert (out / "eval.md").read_text().startswith("| image |")
    assert (out / "rd.png").read_bytes()[:4] == b"\x89PNG"
    assert set(results["reference_curves"]) == {"JPEG", "WebP", "JPEG 2000"}
    assert all(results["reference_curves"].values())
    # A second run refuses to overwrite the results without --force.
    assert run("eval", "--checkpoint", checkpoint, "--data", image_files["png"].parent,
               "--out", out, "--device", "numpy") == 1
    assert "pass --force" in capsys.readouterr().err


def test_eval_without_out_writes_a_new_folder_under_runs(checkpoint, small_image, tmp_path,
                                                         monkeypatch, capsys):
    data = tmp_path / "data"
    data.mkdir()
    Image.fromarray(small_image).save(data / "one.png")
    monkeypatch.chdir(tmp_path)
    for expected in ("eval", "eval-2"):
        assert run("eval", "--checkpoint", checkpoint, "--data", data, "--device", "numpy") == 0
        assert f"written: {Path('runs') / expected / 'eval.md'}" in capsys.readouterr().out
        assert (tmp_path / "runs" / expected / "eval.json").is_file()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["eval", "eval-2"]


def test_eval_keeps_checkpoints_of_one_name_apart(checkpoint, other_model, small_image, tmp_path):
    from PIL import Image
    from gdnflow.codec.evaluate import evaluate
    from gdnflow.io.checkpoint import save_checkpoint
    other = tmp_path / "elsewhere" / checkpoint.name
    other.parent.mkdir()
    save_checkpoint(other, other_model)
    data = tmp_path / "tiny"
    data.mkdir()
    Image.fromarray(small_image).save(data / "tiny.png")
    results = evaluate([checkpoint, other], data, tmp_path / "out", device="numpy",
                       log=lambda line: None)
    assert [m["model"] for m in results["means"]] == ["model (factorized_prior, lambda 0.01)",
                                                      "model-2 (factorized_prior)"]
    assert sorted(p.name for p in (tmp_path / "out" / "files").iterdir()) == [
        ".gdnflow-eval", "model", "model-2"]
    # Each file's decoding is kept beside it, and is what the file decodes to.
    coded = tmp_path / "out" / "files" / "model" / "tiny.png.gdn"
    decoded = read_image(tmp_path / "out" / "files" / "model" / "tiny.png.decoded.png")
    assert np.array_equal(decoded, Codec.from_checkpoint(checkpoint, "numpy").decompress(
        coded.read_bytes()))


def test_eval_names_a_runs_checkpoint_by_its_folder(model, small_image, tmp_path):
    from PIL import Image
    from gdnflow.codec.evaluate import evaluate
    from gdnflow.io.checkpoint import save_checkpoint
    run = tmp_path / "runs" / "q3" / "checkpoint.h5"
    run.parent.mkdir(parents=True)
    save_checkpoint(run, model, extra={"train_config": {"lmbda": 0.0067}})
    data = tmp_path / "tiny"
    data.mkdir()
    Image.fromarray(small_image).save(data / "tiny.png")
    results = evaluate([run], data, tmp_path / "out", device="numpy", log=lambda line: None)
    assert results["means"][0]["model"] == "q3 (factorized_prior, quality 3, lambda 0.0067)"
    assert (tmp_path / "out" / "files" / "q3" / "tiny.png.gdn").is_file()
    # 40x56: JPEG's smallest file is larger than the model's, and MS-SSIM needs 161 pixels.
    assert results["rows"][0]["references"]["JPEG"] is None and "out of JPEG's range" in (
        tmp_path / "out" / "eval.md").read_text()


def test_float16_weights_decode_exactly_and_are_found_by_id(model, image_files, tmp_path,
                                                            monkeypatch):
    """A checkpoint stored in float16 names the weights the codec runs with (their float32
    values), so decompress finds it by the file's model id and decodes what compress saw."""
    from gdnflow.io.checkpoint import save_checkpoint
    half = tmp_path / "half" / "model.h5"
    half.parent.mkdir()
    save_checkpoint(half, model, storage_dtype="float16")
    out = tmp_path / "x.gdn"
    assert run("compress", image_files["png"], "-o", out, "--checkpoint", half,
               "--device", "numpy") == 0
    monkeypatch.setenv("GDNFLOW_CHECKPOINTS", str(half.parent))
    assert run("decompress", out, "-o", tmp_path / "x.png", "--device", "numpy") == 0
    codec = Codec.from_checkpoint(half, device="numpy")
    expected = codec.decompress(codec.compress(read_image(image_files["png"])))
    np.testing.assert_array_equal(read_image(tmp_path / "x.png"), expected)


def test_eval_with_worker_threads_gives_the_same_results(checkpoint, other_model, image_files,
                                                         tmp_path):
    from gdnflow.codec.evaluate import evaluate
    from gdnflow.io.checkpoint import save_checkpoint
    other = tmp_path / "other.h5"
    save_checkpoint(other, other_model)
    data = image_files["png"].parent
    results, lines = [], []
    for workers in (1, 3):
        lines.append([])
        results.append(evaluate([checkpoint, other], data, tmp_path / f"out{workers}",
                                device="numpy", log=lines[-1].append, workers=workers))
    timing = ("encode_s_per_mp", "decode_s_per_mp")
    one, three = ([{k: v for k, v in row.items() if k not in timing} for row in r["rows"]]
                  for r in results)
    assert len(one) == 2 * len(list_images(data))
    same = lambda a, b: json.dumps(a) == json.dumps(b)      # NaN (small images) equals NaN
    assert same(one, three)
    for key in ("means", "reference_curves", "bd_rates"):
        assert same(results[0][key], results[1][key])
    assert lines[0] == lines[1]                         # the same lines, in the same order
    with pytest.raises(ValueError, match="workers must be at least 1"):
        evaluate([checkpoint], data, tmp_path / "out0", device="numpy", workers=0)
