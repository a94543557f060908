"""checkpoints/train_corpus_codecs.sh, the shipped codecs' training chain, on NumPy with tiny
models: segments start and resume the runs, a run's state leaves in checksummed parts and
comes back byte for byte (a damaged part refused), and export writes float16 weights a
codec loads."""
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


def chain(command, env, *args):
    result = subprocess.run(["bash", str(SCRIPT), command, *map(str, args)], env=env,
                            capture_output=True, text=True, timeout=300)
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
            "STEPS": "3", "BATCH": "2", "CROP": "64", "WARMUP": "1", "PRECISION": "fp32",
            "DEVICE": "numpy", "WORKERS": "1", "EVAL_EVERY": "0", "PART_BYTES": str(PART_BYTES),
            "EXTRA_ARGS": "--N 8 --M 8", "PYTHON": sys.executable, "GPUS": "1"}


def test_segments_parts_and_export(env, tmp_path):
    out = chain("segment", env, 120)
    assert "fp1: factorized_prior quality 1 on GPU 0" in out and "(resumed)" not in out
    state = tmp_path / "state"
    for name, model in (("fp1", "factorized_prior"), ("hp1", "hyperprior")):
        info = read_checkpoint_info(state / name / "checkpoint.h5")
        assert (info["extra"]["step"], info["config"]["M"]) == (3, 8)
        assert info["model_name"] == model

    chain("split", env, tmp_path / "parts")
    parts = sorted((tmp_path / "parts" / "hp1").glob("checkpoint.h5.part*"))
    assert len(parts) >= 2 and all(p.stat().st_size <= PART_BYTES for p in parts)
    moved = {**env, "STATE": str(tmp_path / "elsewhere")}
    assert "hp1: joined" in chain("join", moved, tmp_path / "parts")
    for name in ("fp1", "hp1"):
        assert ((tmp_path / "elsewhere" / name / "checkpoint.h5").read_bytes()
                == (state / name / "checkpoint.h5").read_bytes())
    out = chain("segment", moved, 120)
    assert "hp1: hyperprior quality 2 on GPU 0 (resumed)" in out

    with open(parts[0], "r+b") as f:
        f.write(b"damaged")
    result = subprocess.run(["bash", str(SCRIPT), "join", str(tmp_path / "parts")], env=moved,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "hp1: a part is damaged" in result.stdout

    chain("export", env, tmp_path / "export")
    codec = Codec.from_checkpoint(tmp_path / "export" / "codec_hp1.h5", device="numpy")
    image = np.asarray(Image.open(tmp_path / "heldout" / "0.png"))
    assert codec.decompress(codec.compress(image)).shape == image.shape
    with h5py.File(tmp_path / "export" / "codec_fp1.h5") as f:
        dtypes = {f["parameters"][name].dtype for name in f["parameters"]}
    assert dtypes == {np.dtype(np.float16)}
