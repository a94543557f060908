"""Fault cases of ``gdnflow train`` (issue #30 items 1, 2 and 7), each run as a new process
on NumPy: a finished run is never replaced unasked, one process trains in a folder at a
time, an unwritable ``--out`` fails before the data is read, and SIGTERM or ``kill -9``
at any moment loses nothing (``--resume`` ends bit-identical to an uninterrupted run).
"""
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from fault_kit import FAILURE, assert_one_line_error, fingerprint
from gdnflow.io.checkpoint import load_checkpoint

#: A run of ~100 steps per second on NumPy (N=8, M=12, batches of 2x3x32x32).
TINY = ("--N", "8", "--M", "12", "--crop", "32", "--batch-size", "2", "--eval-every", "0",
        "--eval-images", "1", "--workers", "0")
#: Tiny matrices: one BLAS thread each, so that a run in the background does not starve
#: the commands the test runs beside it (two cores in CI).
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture
def photos(tmp_path):
    """A folder of three 40x40 PNGs."""
    from PIL import Image
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(3):
        coarse = rng.integers(0, 256, (7, 7, 3), dtype=np.uint8)
        Image.fromarray(coarse).resize((40, 40), Image.BILINEAR).save(folder / f"p{i}.png")
    return folder


@pytest.fixture
def train(cli, photos):
    """``train(out, *more)``: ``gdnflow train`` of the tiny run into ``out``."""
    def run(out, *more, **kwargs):
        return cli("train", "--data", photos, "--out", out, *TINY, "--quiet", *more,
                   env=ONE_THREAD, **kwargs)
    return run


@pytest.fixture
def start(tmp_path, photos):
    """``start(out, *more)``: the tiny run as a background process (stdout, stderr to a file).

    ``progress=True`` keeps the progress bar (the run is ``--quiet`` otherwise).
    """
    processes = []

    def launch(out, *more, progress=False):
        log = tmp_path / f"train-{len(processes)}.log"
        with open(log, "w") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "gdnflow.cli", "train", "--data", str(photos),
                 "--out", str(out), *TINY, *([] if progress else ["--quiet"]), *more], cwd=tmp_path, stdout=sink,
                stderr=subprocess.STDOUT, env={**os.environ, "GDNFLOW_DEVICE": "numpy", **ONE_THREAD})
        process.log = log
        processes.append(process)
        return process

    yield launch
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_for(condition, process, timeout=30.0):
    """Poll ``condition()`` until true; fail if ``process`` ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.log.read_text()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def steps_shown(process):
    """The last step the progress bar of ``process`` showed (0 before the first)."""
    shown = re.findall(r"\| *(\d+)/\d+ \[", process.log.read_text())
    return int(shown[-1]) if shown else 0


def logged_steps(run):
    history = run / "history.jsonl"
    return [json.loads(line)["step"] for line in history.read_text().splitlines()] \
        if history.exists() else []


def assert_same_training_state(path, reference):
    """Two checkpoints hold the same step, parameters and both optimisers' states, bit for bit."""
    a, b = load_checkpoint(path), load_checkpoint(reference)
    assert a["extra"]["step"] == b["extra"]["step"]
    assert a["extra"]["aux_optimizer"] == b["extra"]["aux_optimizer"]
    for part in ("parameters", "buffers"):
        assert a[part].keys() == b[part].keys()
        for name in a[part]:
            np.testing.assert_array_equal(a[part][name], b[part][name], err_msg=name)
    for index, state in b["optimizer"]["state"].items():
        for key, value in state.items():
            np.testing.assert_array_equal(a["optimizer"]["state"][index][key], value)


def test_a_finished_run_is_refused_then_moved_aside_by_force(train, tmp_path):
    run = tmp_path / "run"
    assert train(run, "--steps", "3").returncode == 0
    before = fingerprint(run)
    result = train(run, "--steps", "3")
    assert_one_line_error(result, "train", run, "--resume", "--force", status=FAILURE)
    assert fingerprint(run) == before

    result = train(run, "--steps", "2", "--force")
    assert result.returncode == 0, result.stderr
    assert f"aside into {run / 'previous-1'}" in result.stderr
    moved = {path.replace(str(run), str(run / "previous-1"), 1): digest
             for path, digest in before.items()}
    assert fingerprint(run / "previous-1") == moved             # the old run, intact
    assert logged_steps(run) == [1, 2]                          # the new history starts empty
    assert load_checkpoint(run / "checkpoint.h5")["extra"]["step"] == 2
    assert not (run / "run.lock").exists()


def test_a_second_training_into_a_busy_folder_is_refused(train, start, tmp_path):
    run = tmp_path / "run"
    first = start(run, "--steps", "100000")
    wait_for(lambda: (run / "run.lock").exists(), first)
    owner = f"pid {first.pid} on host {socket.gethostname()}"
    for more in ((), ("--resume",), ("--force",)):
        result = train(run, "--steps", "3", *more)
        assert_one_line_error(result, "train", run, owner, status=FAILURE)
    assert first.poll() is None                 # the owner is undisturbed
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 143


def test_a_stale_lock_is_taken_over(train, tmp_path):
    run = tmp_path / "run"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run.mkdir()
    (run / "run.lock").write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(),
                                              "started": "2024-05-01T10:00:00"}))
    result = train(run, "--steps", "2")
    assert result.returncode == 0, result.stderr
    notice = [line for line in result.stderr.splitlines() if "stale lock" in line]
    assert len(notice) == 1 and f"pid {gone.pid}" in notice[0], result.stderr
    assert logged_steps(run) == [1, 2] and not (run / "run.lock").exists()


def test_out_an_existing_file_fails_before_the_data_is_read(train, tmp_path):
    out = tmp_path / "results"
    out.write_text("my notes")
    before = fingerprint(tmp_path)
    # --data names no folder: the error about --out comes first, as it must.
    result = train(out, "--steps", "2", "--data", tmp_path / "no-such-photos")
    assert_one_line_error(result, "train", out, "not a folder", status=FAILURE)
    assert fingerprint(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos", "results"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes in read-only folders anyway")
def test_out_in_a_read_only_folder_fails_before_the_data_is_read(train, tmp_path):
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        result = train(parent / "run", "--steps", "2")
        assert_one_line_error(result, "train", parent / "run", status=FAILURE)
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


def test_sigterm_saves_a_checkpoint_and_resume_finishes_bit_identical(train, start, tmp_path):
    steps = ("--steps", "200")
    reference = tmp_path / "reference"
    uninterrupted = start(reference, *steps)
    run = tmp_path / "run"
    process = start(run, *steps, progress=True)     # no checkpoint but the one SIGTERM saves
    wait_for(lambda: steps_shown(process) >= 5, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 143, process.log.read_text()
    lines = [line for line in process.log.read_text().splitlines() if "gdnflow" in line]
    assert len(lines) == 1 and "stopped by SIGTERM at step" in lines[0], lines
    assert f"checkpoint {run / 'checkpoint.h5'} saved" in lines[0] and "--resume" in lines[0]
    stopped_at = load_checkpoint(run / "checkpoint.h5")["extra"]["step"]
    assert f"at step {stopped_at} of 200" in lines[0] and stopped_at >= 5
    assert logged_steps(run) == list(range(1, stopped_at + 1))
    assert not (run / "run.lock").exists()

    result = train(run, *steps, "--resume")
    assert result.returncode == 0, result.stderr
    assert f"resumed at step {stopped_at}" in result.stdout
    assert uninterrupted.wait(60) == 0, uninterrupted.log.read_text()
    assert_same_training_state(run / "checkpoint.h5", reference / "checkpoint.h5")
    assert (run / "history.jsonl").read_text() == (reference / "history.jsonl").read_text()


def test_kill_9_at_random_moments_then_resume_loses_nothing(train, start, tmp_path):
    steps = ("--steps", "200")
    reference = tmp_path / "reference"
    uninterrupted = start(reference, *steps)
    steps += ("--checkpoint-every", "10")      # the checkpoints the kills fall between
    chance = random.Random(30)
    run = tmp_path / "run"
    process, resumes, killed, target = start(run, *steps, progress=True), [], [], 0
    for kill in range(4):
        # Kill at a random step (the machine's speed does not matter), a random
        # moment into it: in a step, a checkpoint's write or the history's.
        target += chance.randint(10, 35)
        wait_for(lambda: steps_shown(process) >= target, process)
        time.sleep(chance.uniform(0, 0.05))
        process.kill()                                          # SIGKILL: no clean-up at all
        process.wait()
        killed.append(load_checkpoint(run / "checkpoint.h5")["extra"]["step"])
        process = start(run, *steps, "--resume", progress=True)
        resumes.append(process)
    wait_for(lambda: steps_shown(process) > target, process)
    process.kill()
    process.wait()
    result = train(run, *steps, "--resume")
    assert result.returncode == 0, result.stderr
    assert killed == sorted(killed) and 0 < killed[0] and killed[-1] < 200, killed
    # Each process was killed holding the lock: the next one took it over.
    for log in [p.log.read_text() for p in resumes] + [result.stderr]:
        assert "took over the stale lock" in log, log
    assert uninterrupted.wait(60) == 0, uninterrupted.log.read_text()
    assert_same_training_state(run / "checkpoint.h5", reference / "checkpoint.h5")
    assert logged_steps(run) == list(range(1, 201))             # each step once
    assert (run / "history.jsonl").read_text() == (reference / "history.jsonl").read_text()
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in reference.iterdir())


def test_resuming_from_a_classifier_checkpoint_is_one_short_line(train, tmp_path):
    from gdnflow.io.checkpoint import save_checkpoint
    from gdnflow.models import mobilenet_v2
    classifier = tmp_path / "classifier.h5"
    save_checkpoint(classifier, mobilenet_v2(num_classes=10, width_mult=0.35, device="numpy"))
    before = fingerprint(classifier)
    result = train(tmp_path / "run", "--steps", "2", "--resume", classifier)
    line = assert_one_line_error(result, "train", classifier)
    assert len(line) < 600, line            # the names are counted, not all listed
    assert fingerprint(classifier) == before


def test_images_smaller_than_the_crop_name_the_option_that_pads_them(train, tmp_path):
    result = train(tmp_path / "run", "--steps", "2", "--crop", "64", "--small-images", "skip")
    assert_one_line_error(result, "train", "--small-images pad", "64x64")


def test_resuming_another_runs_checkpoint_never_touches_the_run_in_out(train, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert train(first, "--steps", "4").returncode == 0
    assert train(second, "--steps", "2").returncode == 0
    before = fingerprint(first)
    result = train(first, "--steps", "3", "--resume", second / "checkpoint.h5")
    assert_one_line_error(result, "train", f"--out {first} holds a run",
                          f"--resume {second / 'checkpoint.h5'}")
    assert fingerprint(first) == before
    # Into an empty folder it continues that run.
    resumed = train(tmp_path / "third", "--steps", "3", "--resume", second / "checkpoint.h5")
    assert resumed.returncode == 0, resumed.stderr
    assert logged_steps(tmp_path / "third") == [3]
