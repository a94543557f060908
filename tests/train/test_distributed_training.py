"""``gdnflow train`` over 2 and 4 MPI ranks on NumPy: the same run as one process.

Each test starts ``mpiexec -n N python -m gdnflow.cli train ...`` (the
command a user types); the one-process run of the same options is the
reference. Tiny runs: N=8, M=8, 32x32 crops, a global batch of 16, 8 steps.
"""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from gdnflow.train.spawn import find_mpiexec, is_open_mpi

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpiexec and mpi4py (pip install 'gdnflow[test]': the mpich and mpi4py wheels)")

STEPS = 8
LR = 3e-3


def train_args(data, out, steps=STEPS, *more, batch=16):
    return ["train", "--data", str(data), "--out", str(out), "--crop", "32", "--N", "8",
            "--M", "8", "--batch-size", str(batch), "--steps", str(steps), "--lr", str(LR),
            "--eval-every", "0", "--checkpoint-every", "0", "--eval-images", "1",
            "--device", "numpy", "--quiet", "--workers", "0", *more]


def gdnflow(args, ranks=1, wait=True):
    """``gdnflow ARGS`` in ``ranks`` MPI processes (1: no MPI); the finished (or running) process."""
    command = [sys.executable, "-m", "gdnflow.cli", *args]
    if ranks > 1:
        command = [MPIEXEC, "-n", str(ranks), *command]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GDNFLOW_DIST_TIMEOUT": "60"}
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)


def history(out):
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


def parameters(out):
    with h5py.File(out / "checkpoint.h5") as f:
        return {name: f["parameters"][name][()] for name in f["parameters"]}


@pytest.fixture(scope="module")
def one_process(shared_image_folder, tmp_path_factory):
    """The reference: the run in one process."""
    out = tmp_path_factory.mktemp("one") / "run"
    done = gdnflow(train_args(shared_image_folder, out))
    assert done.returncode == 0, done.stderr
    return out


def assert_same_run(out, reference):
    """Same step records to float32 rounding of the averages, and the same weights."""
    mine, theirs = history(out), history(reference)
    assert [r["step"] for r in mine] == list(range(1, STEPS + 1))
    for key in ("loss", "bpp", "mse", "aux", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in mine], [r[key] for r in theirs], rtol=1e-4,
                                   err_msg=key)
    mine, theirs = parameters(out), parameters(reference)
    assert mine.keys() == theirs.keys()
    for name in mine:
        # Adam turns rounding-level gradients of the GDN gammas that sit at their bound
        # into steps of +-lr: measured 6e-4 after 8 steps; every other weight within 1e-6.
        tolerance = LR if name.endswith("gamma") else 1e-5
        np.testing.assert_allclose(mine[name], theirs[name], rtol=0, atol=tolerance, err_msg=name)


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_train_exactly_the_one_process_run(ranks, shared_image_folder, one_process,
                                                 tmp_path):
    out = tmp_path / "run"
    done = gdnflow(train_args(shared_image_folder, out), ranks)
    assert done.returncode == 0, done.stderr
    assert_same_run(out, one_process)
    # Only rank 0 wrote files and spoke: the same files as one process, one summary line.
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in one_process.iterdir())
    assert done.stdout.count(f"{STEPS} steps in") == 1
    assert done.stderr.count("smaller than 32x32") == 1


def test_two_ranks_resume_a_one_process_checkpoint(shared_image_folder, one_process, tmp_path):
    out = tmp_path / "run"
    assert gdnflow(train_args(shared_image_folder, out, STEPS // 2)).returncode == 0
    done = gdnflow(train_args(shared_image_folder, out, STEPS, "--resume"), 2)
    assert done.returncode == 0, done.stderr
    assert f"resumed at step {STEPS // 2}" in done.stdout
    assert_same_run(out, one_process)


def test_a_failing_rank_stops_all_naming_it(shared_image_folder, tmp_path):
    # A file whose header reads but whose pixels do not: it fails on the rank that crops it
    # (one crop per rank: the other rank's crop of that step is another image).
    data = tmp_path / "data"
    data.mkdir()
    for image in shared_image_folder.iterdir():
        (data / image.name).write_bytes(image.read_bytes())
    truncated = data / "im2.png"
    truncated.write_bytes(truncated.read_bytes()[:300])
    started = time.monotonic()
    done = gdnflow(train_args(data, tmp_path / "run", batch=2), 2)
    assert done.returncode != 0
    assert time.monotonic() - started < 60
    failed = [r for r in (0, 1) if f"rank {r} of 2: {truncated}: cannot decode" in done.stderr]
    assert len(failed) == 1, done.stderr
    other = 1 - failed[0]
    assert f"rank {other}: rank {failed[0]} failed during" in done.stderr, done.stderr
    assert not (tmp_path / "run" / "checkpoint.h5").exists()


def test_ranks_started_with_different_options_are_refused(shared_image_folder, tmp_path):
    args = train_args(shared_image_folder, tmp_path / "run")
    command = [sys.executable, "-m", "gdnflow.cli"]
    other = [*args[:args.index("--N") + 1], "16", *args[args.index("--N") + 2:]]
    done = subprocess.run([MPIEXEC, "-n", "1", *command, *args, ":", "-n", "1", *command, *other],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "different training options (N: rank 0 has 8, rank 1 16)" in done.stderr, done.stderr


def test_sigterm_stops_every_rank_and_rank_0_saves(shared_image_folder, tmp_path):
    out = tmp_path / "run"
    running = gdnflow(train_args(shared_image_folder, out, 10_000, "--checkpoint-every", "2"),
                      2, wait=False)
    deadline = time.monotonic() + 120
    # A checkpoint, not a fixed sleep: the ranks have trained (however loaded the machine).
    while not (out / "checkpoint.h5").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    running.send_signal(signal.SIGTERM)     # mpiexec passes it to every rank
    stdout, stderr = running.communicate(timeout=60)
    assert running.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.count("stopped by SIGTERM at step") == 1, stderr
    saved = history(out)[-1]["step"]
    assert 0 < saved < 10_000 and f"at step {saved} of 10000" in stderr
    assert not (out / "run.lock").exists()


def test_the_gpus_launcher_s_own_spawner_starts_the_same_run(shared_image_folder, one_process,
                                                            tmp_path, monkeypatch):
    # What --gpus 2 does without mpiexec (RANK, WORLD_SIZE, ... and the TCP store), on NumPy.
    from gdnflow.train.spawn import rank_command, spawn
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    out = tmp_path / "run"
    command = rank_command(train_args(shared_image_folder, out))
    assert spawn(command, 2, mpiexec=None, log=print) == 0
    assert_same_run(out, one_process)


def test_gpus_are_counted_before_anything_starts(tmp_path):
    from gdnflow.train.spawn import check_gpus
    with pytest.raises(ValueError, match="--gpus 4: this host has 2 usable GPUs"):
        check_gpus(4, 2)
    check_gpus(2, 2)
    done = gdnflow(["train", "--gpus", "2", "--device", "numpy", "--out", str(tmp_path / "run")])
    assert done.returncode == 1
    assert "on NumPy" in done.stderr and "mpirun -np 2 gdnflow train" in done.stderr
    assert not (tmp_path / "run").exists()


def test_the_gpus_launcher_uses_mpiexec_only_where_mpi4py_imports():
    # An mpiexec installed for other programs must not start ranks that cannot join
    # through mpi4py (an Open MPI as root even refuses to start them).
    probe = ("import sys\n{}from gdnflow.train.spawn import find_mpiexec, is_open_mpi\n"
             "print(find_mpiexec())")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for block, expected in (("sys.modules['mpi4py'] = None\n", "None"), ("", MPIEXEC)):
        done = subprocess.run([sys.executable, "-c", probe.format(block)], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected


@pytest.mark.parametrize("version, open_mpi", [
    ("mpiexec (OpenRTE) 4.1.6\nReport bugs to http://www.open-mpi.org/community/help/", True),
    ("mpiexec (Open MPI) 5.0.3", True),
    ("HYDRA build details:\n    Version:                                 4.2.3", False)])
def test_open_mpi_launchers_are_recognised_by_their_version(version, open_mpi, tmp_path):
    # As root the --gpus launcher leaves Open MPI's mpiexec alone (it refuses root).
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{version}'\n")
    fake.chmod(0o755)
    assert is_open_mpi(str(fake)) is open_mpi
    assert is_open_mpi(str(tmp_path / "missing")) is False
