"""RunFolder: the folder checked before the work, the lock (owner, stale locks), a run
refused unless resumed or moved aside, temporaries of killed runs removed."""
import json
import os
import socket
import subprocess
import sys

import pytest

from gdnflow.io.files import OutputError
from gdnflow.train.run_folder import LOCK_NAME, RunExistsError, RunFolder, RunLockedError


def make_run(folder, step=3):
    """A finished run's files (contents distinct, so that moves can be checked)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("checkpoint.h5", "history.jsonl", "curves.png"):
        (folder / name).write_text(f"{name} of step {step}\n")


def contents(folder):
    return {p.relative_to(folder).as_posix(): p.read_text()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def dead_pid():
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def write_lock(folder, **owner):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps(owner) + "\n")


def test_lock_names_this_process_and_goes_at_the_end(tmp_path):
    folder = tmp_path / "runs" / "a"
    with RunFolder(folder).owned() as run:
        owner = json.loads((folder / LOCK_NAME).read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        (folder / "checkpoint.h5").write_text("x")
        assert run.run_files() == ["checkpoint.h5"]
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.h5"]


def test_a_folder_created_for_a_run_that_wrote_nothing_is_removed(tmp_path):
    folder = tmp_path / "a"
    with pytest.raises(RuntimeError):
        with RunFolder(folder).owned():
            assert folder.is_dir()
            raise RuntimeError("data loading failed")
    assert not folder.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with RunFolder(kept).owned():
        pass
    assert kept.is_dir()            # existed before: left in place


def test_a_run_is_refused_unless_resumed(tmp_path):
    folder = tmp_path / "a"
    make_run(folder)
    before = contents(folder)
    with pytest.raises(RunExistsError) as error:
        with RunFolder(folder).owned("new"):
            pass
    message = str(error.value)
    assert str(folder) in message and "--resume" in message and "--force" in message
    assert "previous-1" in message and "\n" not in message
    assert contents(folder) == before           # lock gone, nothing moved
    with RunFolder(folder).owned("resume"):
        assert (folder / LOCK_NAME).exists()
    assert contents(folder) == before


def test_force_moves_each_earlier_run_aside(tmp_path):
    folder = tmp_path / "a"
    lines = []
    make_run(folder, step=3)
    (folder / "notes.txt").write_text("mine")   # not a run file: stays
    with RunFolder(folder, notify=lines.append).owned("force"):
        assert (folder / "previous-1" / "checkpoint.h5").read_text() == "checkpoint.h5 of step 3\n"
        make_run(folder, step=5)
    make_run(folder, step=5)
    with RunFolder(folder, notify=lines.append).owned("force"):
        pass
    assert contents(folder) == {
        "notes.txt": "mine",
        **{f"previous-1/{n}": f"{n} of step 3\n"
           for n in ("checkpoint.h5", "history.jsonl", "curves.png")},
        **{f"previous-2/{n}": f"{n} of step 5\n"
           for n in ("checkpoint.h5", "history.jsonl", "curves.png")}}
    assert len(lines) == 2 and str(folder / "previous-2") in lines[1]


def test_a_live_owner_is_named_and_refused(tmp_path):
    folder = tmp_path / "a"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from gdnflow.train.run_folder import RunFolder\n"
         f"with RunFolder({str(folder)!r}).owned():\n"
         "    print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError) as error:
            with RunFolder(folder).owned("resume"):
                pass
        assert f"pid {holder.pid} on host {socket.gethostname()}" in str(error.value)
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == holder.pid    # left alone
        holder.kill()           # kill -9: the kernel releases its flock with the process
        holder.wait()
        lines = []
        with RunFolder(folder, notify=lines.append).owned("resume"):
            pass
        assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and "stale" in lines[0]
    finally:
        holder.kill()
        holder.wait()


def test_one_process_cannot_own_a_folder_twice(tmp_path):
    with RunFolder(tmp_path / "a").owned():
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            with RunFolder(tmp_path / "a").owned():
                pass
        assert (tmp_path / "a" / LOCK_NAME).exists()    # the refused one left the lock


@pytest.mark.parametrize("owner", [
    {"pid": "dead", "host": "here"},
    {"pid": "alive", "host": "here"},
    {"pid": "this process", "host": "here"},
    {"pid": "dead", "host": "elsewhere.example"},
], ids=["dead pid", "pid reused by a live process", "a previous process of this pid",
        "another host"])
def test_a_lock_file_nobody_holds_is_reported_and_taken_over(tmp_path, owner):
    # Whatever pid and host it names: only a held flock makes a lock live, so a pid
    # reused by another process (or by a process in another PID namespace) is no owner.
    pid = {"dead": dead_pid(), "alive": os.getppid(), "this process": os.getpid()}[owner["pid"]]
    host = socket.gethostname() if owner["host"] == "here" else owner["host"]
    folder = tmp_path / "a"
    write_lock(folder, pid=pid, host=host, started="2024-01-01T00:00:00")
    lines = []
    with RunFolder(folder, notify=lines.append).owned():
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(lines) == 1 and "stale lock" in lines[0] and f"pid {pid} on host {host}" in lines[0]
    assert not (folder / LOCK_NAME).exists()


@pytest.mark.parametrize("content", ["", "{not json"], ids=["empty", "garbage"])
def test_an_empty_or_unreadable_lock_nobody_holds_is_taken_over(tmp_path, content):
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / LOCK_NAME).write_text(content)    # a process died before writing it whole
    lines = []
    with RunFolder(folder, notify=lines.append).owned():
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(lines) == (1 if content else 0)
    assert not (folder / LOCK_NAME).exists()


def test_temporaries_of_the_run_files_are_removed(tmp_path):
    folder = tmp_path / "a"
    make_run(folder)
    for name in (".checkpoint.h5.0123456789ab.tmp", ".history.jsonl.ba9876543210.tmp",
                 ".curves.png.aaaaaaaaaaaa.tmp", ".photo.gdn.aaaaaaaaaaaa.tmp"):
        (folder / name).write_text("partial")
    lines = []
    with RunFolder(folder, notify=lines.append).owned("resume"):
        pass
    assert sorted(p.name for p in folder.glob(".*")) == [".photo.gdn.aaaaaaaaaaaa.tmp"]
    assert "removed 3 temporary" in lines[0]


def test_an_existing_file_in_its_place_fails_before_anything(tmp_path):
    path = tmp_path / "a"
    path.write_text("not a folder")
    with pytest.raises(OutputError, match=str(path)):
        with RunFolder(path).owned():
            pytest.fail("the block must not run")
    assert path.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_unknown_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        with RunFolder(tmp_path).owned("overwrite"):
            pass
