"""The command line's promises, tried as a user does (issue #30, "CLI errors" and item 9).

Each case runs ``gdnflow`` in a new process and checks the exit status (2 for
a usage error, 1 for a failure), that stderr is one line ``gdnflow CMD: ...``
naming the option and value or the file, with no traceback, and that the
user's files are unchanged.
"""
import os
import subprocess
import sys

import pytest

from fault_kit import FAILURE, USAGE_ERROR, assert_one_line_error, fingerprint

#: The environment of the commands run here without fault_kit.run_gdnflow (pipes).
NUMPY = {**os.environ, "GDNFLOW_DEVICE": "numpy"}


def tiny_onnx(path):
    """A valid one-node ONNX model (Relu on 1x3x4x4) at ``path``."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    shape = [1, 3, 4, 4]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


# ------------------------------------------------------------ usage errors --
@pytest.mark.parametrize("argv, option, value", [
    (["train", "--lambda", "-0.01"], "--lambda", "-0.01"),
    (["train", "--lr", "nan"], "--lr", "nan"),
    (["train", "--steps", "0"], "--steps", "0"),
    (["train", "--batch-size", "-3"], "--batch-size", "-3"),
    (["train", "--crop", "7"], "--crop", "7"),
    (["prune", "m.h5", "-o", "o.h5", "--sparsity", "1.5"], "--sparsity", "1.5"),
    (["classify", "x.png", "--top", "zero"], "--top", "zero"),
    (["compress", "x.png", "--checkpoint", "c.h5", "--device", "tpu"], "--device", "tpu"),
    (["bench", "--batches", "1,0"], "--batches", "0"),
])
def test_a_bad_option_value_is_a_usage_error_naming_option_and_value(cli, tmp_path, argv, option,
                                                                      value):
    before = fingerprint(tmp_path)
    result = cli(*argv)
    line = assert_one_line_error(result, argv[0], option, repr(value), status=USAGE_ERROR)
    assert "--help" in line
    assert fingerprint(tmp_path) == before and not (tmp_path / "runs").exists()


def test_an_unknown_option_is_named_with_its_command(cli):
    result = cli("compress", "x.png", "--checkpoint", "c.h5", "--levle", "3")
    assert_one_line_error(result, "compress", "unrecognized arguments: --levle 3",
                          status=USAGE_ERROR)


def test_debug_shows_the_traceback(cli, tmp_path):
    (tmp_path / "folder").mkdir()
    result = cli("--debug", "info", "folder")
    assert result.returncode == FAILURE
    assert "Traceback" in result.stderr and "folder is a folder" in result.stderr
    result = cli("info", "folder", env={"GDNFLOW_DEBUG": "1"})
    assert "Traceback" in result.stderr


# ------------------------------------------------------------ info FILE --
def test_info_of_a_folder(cli, tmp_path):
    (tmp_path / "models").mkdir()
    assert_one_line_error(cli("info", "models"), "info", "models is a folder")


def test_info_of_an_empty_onnx_file_is_an_error(cli, tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    result = cli("info", "empty.onnx")
    assert_one_line_error(result, "info", "empty.onnx", "empty (0 bytes)")
    assert result.stdout == ""


def test_info_of_a_file_protobuf_reads_as_an_empty_model_is_an_error(cli, tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\x00\x00\x00")
    assert_one_line_error(cli("info", "junk.onnx"), "info", "junk.onnx",
                          "not a valid ONNX model")


def test_info_into_a_closed_pipe_ends_quietly(tmp_path, codec_checkpoint):
    read_end, write_end = os.pipe()
    os.close(read_end)              # what `| head -1` leaves once head has exited
    try:
        result = subprocess.run([sys.executable, "-m", "gdnflow.cli", "info", codec_checkpoint],
                                cwd=tmp_path, env=NUMPY, stdout=write_end, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    finally:
        os.close(write_end)
    assert result.returncode == 141 and result.stderr == ""


def test_info_piped_into_head_prints_the_first_line(tmp_path, codec_checkpoint):
    result = subprocess.run(f"'{sys.executable}' -m gdnflow.cli info '{codec_checkpoint}' "
                            "| head -1", shell=True, cwd=tmp_path, env=NUMPY,
                            capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith(f"{codec_checkpoint}: gdnflow checkpoint")
    assert result.stderr == ""


# -------------------------------------------------------------- classify --
def test_classify_with_a_model_that_is_no_classifier(cli, photo):
    line = assert_one_line_error(cli("classify", photo.name, "--model", "factorized_prior"),
                                 "classify", "--model factorized_prior",
                                 "not an image classifier")
    assert "mobilenet_v2, vgg16" in line


def test_classify_with_codec_weights_says_they_are_no_classifier(cli, photo, codec_checkpoint):
    line = assert_one_line_error(cli("classify", photo.name, "--weights", codec_checkpoint.name),
                                 "classify", codec_checkpoint.name, "not an image classifier")
    assert "--model (" not in line and "factorized_prior" in line


# --------------------------------------------------------- prune, convert --
def test_prune_of_an_onnx_file_says_what_it_is(cli, tmp_path):
    tiny_onnx(tmp_path / "relu.onnx")
    line = assert_one_line_error(cli("prune", "relu.onnx", "--sparsity", "0.5", "-o", "out.h5"),
                                 "prune", "relu.onnx is an ONNX file", "gdnflow convert")
    assert "corrupt" not in line and not (tmp_path / "out.h5").exists()


def test_prune_never_writes_over_its_input(cli, tmp_path, codec_checkpoint):
    before = fingerprint(tmp_path)
    result = cli("prune", "codec.h5", "--sparsity", "0.5", "-o", "codec.h5", "--force")
    assert_one_line_error(result, "prune", "codec.h5 is also an input")
    assert fingerprint(tmp_path) == before


def test_prune_and_convert_refuse_to_overwrite_without_force(cli, tmp_path, codec_checkpoint):
    tiny_onnx(tmp_path / "relu.onnx")
    (tmp_path / "out.h5").write_bytes(b"an earlier result")
    before = fingerprint(tmp_path)
    assert_one_line_error(cli("prune", "codec.h5", "--sparsity", "0.5", "-o", "out.h5"),
                          "prune", "out.h5 exists", "--force")
    assert_one_line_error(cli("convert", "relu.onnx", "out.h5"), "convert", "out.h5 exists",
                          "--force")
    assert fingerprint(tmp_path) == before
    assert cli("prune", "codec.h5", "--sparsity", "0.5", "-o", "out.h5", "--force").returncode == 0
    assert (tmp_path / "out.h5").read_bytes()[:4] == b"\x89HDF"


@pytest.mark.parametrize("content, needle", [(None, "is a folder"), (b"", "empty (0 bytes)"),
                                             (b"just some notes\n", "not a gdnflow checkpoint")])
def test_a_bad_checkpoint_file_is_named_without_a_traceback(cli, tmp_path, photo, content, needle):
    bad = tmp_path / "weights.h5"
    if content is None:
        bad.mkdir()
    else:
        bad.write_bytes(content)
    before = fingerprint(tmp_path)
    for argv in (["prune", "weights.h5", "--sparsity", "0.5", "-o", "out.h5"],
                 ["compress", photo.name, "--checkpoint", "weights.h5"]):
        assert_one_line_error(cli(*argv), argv[0], "weights.h5", needle)
    assert fingerprint(tmp_path) == before


# ------------------------------------------------------------- codec outputs --
def test_compress_never_writes_over_the_image(cli, tmp_path, photo, codec_checkpoint):
    before = fingerprint(tmp_path)
    result = cli("compress", photo.name, "-o", photo.name, "--checkpoint", "codec.h5", "--force")
    assert_one_line_error(result, "compress", "photo.png is also an input")
    assert fingerprint(tmp_path) == before


def test_an_output_folder_that_is_a_file_is_refused_before_the_work(cli, tmp_path, photo,
                                                                      codec_checkpoint):
    (tmp_path / "results").write_text("a file where the folder should be")
    before = fingerprint(tmp_path)
    assert_one_line_error(cli("compress", photo.name, "-o", "results/photo.gdn",
                              "--checkpoint", "codec.h5"), "compress", "results", "not a folder")
    assert_one_line_error(cli("eval", "--checkpoint", "codec.h5", "--data", ".", "--out",
                              "results"), "eval", "results", "not a folder")
    assert fingerprint(tmp_path) == before


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="permissions do not stop root")
def test_a_read_only_output_folder_is_refused_before_the_work(cli, tmp_path, photo,
                                                              codec_checkpoint):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert_one_line_error(cli("compress", photo.name, "-o", "locked/photo.gdn",
                                  "--checkpoint", "codec.h5"), "compress", "locked",
                              "cannot write")
    finally:
        locked.chmod(0o755)
    assert not any(locked.iterdir())


def test_eval_refuses_earlier_results_and_leaves_no_partial_set(cli, tmp_path, photo,
                                                                codec_checkpoint):
    data = tmp_path / "data"
    data.mkdir()
    photo.rename(data / photo.name)
    # Listed after photo.png: the failure comes once one image's results exist.
    (data / "zz_broken.png").write_text("not an image")
    result = cli("eval", "--checkpoint", "codec.h5", "--data", "data", "--out", "results")
    assert_one_line_error(result, "eval", "zz_broken.png")
    assert "photo.png" in result.stdout         # measured before the failure
    assert list((tmp_path / "results").iterdir()) == []
    (tmp_path / "results" / "eval.md").write_text("earlier results")
    before = fingerprint(tmp_path)
    assert_one_line_error(cli("eval", "--checkpoint", "codec.h5", "--data", "data", "--out",
                              "results"), "eval", "eval.md exists", "--force")
    assert fingerprint(tmp_path) == before


def test_eval_never_replaces_a_files_folder_it_did_not_write(cli, tmp_path, photo,
                                                            codec_checkpoint):
    photos = tmp_path / "photos"
    (photos / "files").mkdir(parents=True)
    photo.rename(photos / "files" / "holiday.png")
    before = fingerprint(photos)
    # --out the data folder: its files/ holds an input, even with --force.
    result = cli("eval", "--checkpoint", "codec.h5", "--data", "photos", "--out", "photos",
                 "--force")
    assert_one_line_error(result, "eval", "photos/files holds inputs")
    # Another folder's files/ that eval did not write (no marker): refused too.
    (tmp_path / "out" / "files").mkdir(parents=True)
    (tmp_path / "out" / "files" / "notes.txt").write_text("mine")
    result = cli("eval", "--checkpoint", "codec.h5", "--data", "photos", "--out", "out",
                 "--force")
    assert_one_line_error(result, "eval", "out/files exists and was not written by gdnflow eval")
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "files").write_text("a file")
    result = cli("eval", "--checkpoint", "codec.h5", "--data", "photos", "--out", "res",
                 "--force")
    assert_one_line_error(result, "eval", "res/files exists and is not a folder")
    assert fingerprint(photos) == before
    assert (tmp_path / "out" / "files" / "notes.txt").read_text() == "mine"


def test_eval_force_replaces_its_own_earlier_results(cli, tmp_path, photo, codec_checkpoint):
    (tmp_path / "photos").mkdir()
    photo.rename(tmp_path / "photos" / "a.png")
    args = ("eval", "--checkpoint", "codec.h5", "--data", "photos", "--out", "res")
    assert cli(*args).returncode == 0
    coded = tmp_path / "res" / "files" / "codec" / "a.png.gdn"
    first = coded.read_bytes()
    assert cli(*args).returncode == 1                       # earlier results kept
    again = cli(*args, "--force")
    assert again.returncode == 0, again.stderr
    assert coded.read_bytes() == first                      # the same model codes the same file
    assert sorted(p.name for p in (tmp_path / "res").iterdir()) == [
        "eval.json", "eval.md", "files", "rd.png"]
