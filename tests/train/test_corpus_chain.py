"""checkpoints/train_corpus_codecs.sh, the shipped codecs' training chain, on NumPy with tiny
models: segments start and resume the runs, a run's state leaves in checksummed parts and
comes back byte for byte (a damaged part refused), and export writes float16 weights a
codec loads, and a new chain starts from exported weights (INIT_DIR)."""
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from gdnflow.codec import Codec
from gdnflow.io.checkpoint import read_checkpoint_info

SCRIPT = Path(__file__).resolve().parents[2] / "checkpoints" / "train_corpus_codecs.sh"
PART_BYTES = 40_000


def run_chain(command, env, *args):
    return subprocess.run(["bash", str(SCRIPT), command, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)


def chain(command, env, *args):
    result = run_chain(command, env, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture
def env(tmp_path):
    rng = np.random.default_rng(4)
    for folder, count in (("train", 2), ("heldout", 1)):
        (tmp_path / folder).mkdir()
        for i in range(count):
            pixels = rng.integers(0, 256, (40, 50, 3)).repeat(2, 0).repeat(2, 1)
            Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / folder / f"{i}.png")
    return {**os.environ, "DATA": str(tmp_path / "train"), "HELDOUT": str(tmp_path / "heldout"),
            "RUNS": "fp1:factorized_prior:1 hp1:hyperprior:2", "STATE": str(tmp_path / "state"),
            "STEPS": "100000", "BATCH": "2", "CROP": "64", "WARMUP": "1", "PRECISION": "fp32",
            "DEVICE": "numpy", "WORKERS": "1", "EVAL_EVERY": "0", "PART_BYTES": str(PART_BYTES),
            "EXTRA_ARGS": "--N 8 --M 8", "PYTHON": sys.executable, "GPUS": "1"}


def step_of(path):
    return read_checkpoint_info(path)["extra"]["step"]


def test_segments_stop_move_in_parts_and_resume(env, tmp_path):
    """A segment stops its runs with a checkpoint; their state leaves in parts no larger
    than PART_BYTES, comes back byte for byte elsewhere, and the next segment resumes it."""
    out = chain("segment", env, 15)
    assert "fp1: factorized_prior quality 1 on GPU 0" in out and "(resumed)" not in out
    state = tmp_path / "state"
    for name, model in (("fp1", "factorized_prior"), ("hp1", "hyperprior")):
        info = read_checkpoint_info(state / name / "checkpoint.h5")
        assert info["model_name"] == model and info["config"]["M"] == 8
        assert 0 < info["extra"]["step"] < 100000

    chain("split", env, tmp_path / "parts")
    parts = sorted((tmp_path / "parts" / "hp1").glob("checkpoint.h5.part*"))
    assert len(parts) >= 2 and all(p.stat().st_size <= PART_BYTES for p in parts)
    moved = {**env, "STATE": str(tmp_path / "elsewhere")}
    assert "hp1: joined" in chain("join", moved, tmp_path / "parts")
    for name in ("fp1", "hp1"):
        assert ((tmp_path / "elsewhere" / name / "checkpoint.h5").read_bytes()
                == (state / name / "checkpoint.h5").read_bytes())
    saved = step_of(tmp_path / "elsewhere" / "hp1" / "checkpoint.h5")
    out = chain("segment", moved, 15)
    assert "hp1: hyperprior quality 2 on GPU 0 (resumed)" in out
    assert f"resumed at step {saved}" in (tmp_path / "elsewhere" / "hp1.log").read_text()
    assert step_of(tmp_path / "elsewhere" / "hp1" / "checkpoint.h5") > saved

    refused = run_chain("segment", {**moved, "STEPS": "200000"}, 15)
    assert refused.returncode == 2 and "ran with STEPS=100000, not 200000" in refused.stdout

    with open(parts[0], "r+b") as f:
        f.write(b"damaged")
    refused = run_chain("join", moved, tmp_path / "parts")
    assert refused.returncode == 1 and "hp1: a part is damaged or missing" in refused.stdout


def test_a_failed_run_fails_the_segment(env):
    result = run_chain("segment", {**env, "RUNS": "x1:no_such_model:1"}, 15)
    assert result.returncode == 1, result.stdout
    assert "== x1: exit 2;" in result.stdout and "invalid choice" in result.stdout


def test_export_writes_the_shipped_names_in_float16(env, tmp_path):
    chain("segment", {**env, "STEPS": "2"}, 60)
    chain("export", env, tmp_path / "export")
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == [
        "codec_q1.h5", "hyperprior_q2.h5"]
    with h5py.File(tmp_path / "export" / "codec_q1.h5") as f:
        assert {f["parameters"][name].dtype for name in f["parameters"]} == {np.dtype(np.float16)}
    codec = Codec.from_checkpoint(tmp_path / "export" / "hyperprior_q2.h5", device="numpy")
    image = np.asarray(Image.open(tmp_path / "heldout" / "0.png"))
    assert codec.decompress(codec.compress(image)).shape == image.shape


def test_init_dir_starts_runs_from_exported_weights(env, tmp_path):
    chain("segment", {**env, "STEPS": "2"}, 60)
    chain("export", env, tmp_path / "export")
    tuned = {**env, "STATE": str(tmp_path / "tuned"), "INIT_DIR": str(tmp_path / "export"),
             "STEPS": "2"}
    out = chain("segment", tuned, 60)
    source = tmp_path / "export" / "hyperprior_q2.h5"
    assert f"hp1: hyperprior quality 2 on GPU 0 (from {source})" in out
    info = read_checkpoint_info(tmp_path / "tuned" / "hp1" / "checkpoint.h5")
    assert info["extra"]["train_config"]["init"] == str(source) and info["extra"]["step"] == 2
    assert "(resumed)" in chain("segment", tuned, 60)
