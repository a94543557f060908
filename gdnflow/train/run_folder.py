"""A training run's folder, owned by one process at a time.

``gdnflow train --out DIR`` keeps everything of a run in DIR (checkpoint,
histories, pictures). :class:`RunFolder` makes the promises around it:

- The folder is created and test-written before any data is read
  (:func:`gdnflow.io.files.check_folder`): an unwritable ``--out`` fails in
  seconds, not at the first checkpoint.
- A lock file, ``DIR/run.lock``, locked with ``flock`` for the whole run and
  holding the owner's pid, host and start time, is removed at the run's end
  (errors and signals included). A second process is refused, naming the
  owner. The kernel releases a dead owner's lock with its process, so a
  leftover lock file is never mistaken for a live one (nor, across PID
  namespaces or reused pids, the other way round): it is reported and
  taken over.
- A folder that holds a run is refused unless the run is resumed or
  ``force`` moves the old run's files aside into ``DIR/previous-<n>/``
  (nothing is deleted).
- Temporary files of the run's files left by a killed process are removed
  once the lock is held.
"""
import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from gdnflow.io.files import (OutputError, OutputExistsError, check_folder,
                              remove_stale_temporaries)

LOCK_NAME = "run.lock"
#: The files a run writes in its folder; any of them makes the folder "hold a run".
RUN_FILES = ("checkpoint.h5", "history.jsonl", "eval.jsonl", "curves.png", "reconstructions.png")
#: Where ``force`` moves an earlier run: ``previous-1``, ``previous-2``, ...
PREVIOUS_PREFIX = "previous-"
#: What a run folder is opened for.
MODES = ("new", "resume", "force")


class RunExistsError(OutputExistsError):
    """The run folder holds a run and neither resume nor force was asked for."""


class RunLockedError(OutputError):
    """Another process holds the run folder's lock."""


def _describe(owner):
    when = owner.get("started", "?")
    return f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}, started {when}"


class RunFolder:
    """The folder of one training run; :meth:`owned` holds it for the length of a ``with`` block.

    ``notify(line)`` reports what was done on the user's behalf (a stale
    lock taken over, an old run moved aside, temporaries removed); default:
    one line on stderr.
    """

    def __init__(self, path, notify=None):
        self.path = Path(path)
        self.lock_path = self.path / LOCK_NAME
        self.notify = notify or (lambda line: print(f"gdnflow train: {line}", file=sys.stderr))
        self._lock_fd = None

    def run_files(self):
        """The names of the run files present in the folder (empty: it holds no run)."""
        return [name for name in RUN_FILES if (self.path / name).exists()]

    @contextlib.contextmanager
    def owned(self, mode="new"):
        """Check, lock and prepare the folder for a run; release it on leaving the block.

        ``mode``: "new" (refuse a folder holding a run: RunExistsError),
        "resume" (continue the run it holds) or "force" (move the run it
        holds aside first). Raises OutputError naming the folder if it
        cannot be created or written, RunLockedError if another process
        holds it. A folder this call created and that is still empty at the
        end is removed.
        """
        if mode not in MODES:
            raise ValueError(f"RunFolder.owned: mode must be one of {MODES}, got {mode!r}")
        created = not self.path.exists()
        try:
            check_folder(self.path)
            self._lock()
            existing = self.run_files()
            if mode == "new" and existing:
                raise RunExistsError(
                    f"--out {self.path} holds a run ({', '.join(existing)}): pass --resume to "
                    f"continue it or --force to move it aside into {self._next_previous()}")
            removed = remove_stale_temporaries(self.path, RUN_FILES)
            if removed:
                self.notify(f"removed {len(removed)} temporary file(s) of a killed run from "
                            f"{self.path}")
            if mode == "force" and existing:
                self.notify(f"moved the previous run ({', '.join(existing)}) aside into "
                            f"{self._move_aside(existing)}")
            yield self
        finally:
            self._unlock()
            if created:
                with contextlib.suppress(OSError):
                    self.path.rmdir()           # only if empty: a run that wrote nothing

    # ------------------------------------------------------------- lock --
    def _lock(self):
        """Lock ``run.lock`` (flock, held until :meth:`_unlock`); RunLockedError if held.

        A lock file whose flock is free was left by a process that is gone:
        it is reported and taken over.
        """
        while True:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise OutputError(f"cannot create the lock file {self.lock_path}: "
                                  f"{exc.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if isinstance(exc, BlockingIOError):
                    owner = self._read_owner()
                    raise RunLockedError(
                        f"{self.path} is in use by another training "
                        f"({_describe(owner) if owner else 'its lock ' + str(self.lock_path)}): "
                        "wait for it to finish or stop it") from None
                raise OutputError(f"cannot lock {self.lock_path}: {exc.strerror}") from None
            # The holder we waited for may have removed the file between our open
            # and our flock: then we hold a lock on a file nobody else will see.
            try:
                current = os.stat(self.lock_path)
            except FileNotFoundError:
                current = None
            held = os.fstat(fd)
            if current is not None and (current.st_ino, current.st_dev) == (held.st_ino,
                                                                            held.st_dev):
                break
            os.close(fd)
        owner = self._read_owner()
        if owner is not None:
            what = f"its owner ({_describe(owner)})" if owner else "its owner"
            self.notify(f"took over the stale lock {self.lock_path}: {what} is no longer running")
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": datetime.datetime.now().isoformat(timespec="seconds")})
        os.ftruncate(fd, 0)
        os.pwrite(fd, (text + "\n").encode(), 0)
        self._lock_fd = fd

    def _read_owner(self):
        """The owner recorded in the lock file: a dict ({} if unreadable), None if it is empty."""
        try:
            text = self.lock_path.read_text()
        except OSError:
            return {}
        if not text.strip():
            return None
        try:
            owner = json.loads(text)
        except json.JSONDecodeError:
            return {}
        return owner if isinstance(owner, dict) else {}

    def _unlock(self):
        """Remove the lock file (while still holding it), then release the lock."""
        if self._lock_fd is None:
            return
        fd, self._lock_fd = self._lock_fd, None
        with contextlib.suppress(OSError):
            current, held = os.stat(self.lock_path), os.fstat(fd)
            if (current.st_ino, current.st_dev) == (held.st_ino, held.st_dev):
                os.unlink(self.lock_path)
        os.close(fd)

    # ------------------------------------------------------ move aside --
    def _next_previous(self):
        taken = [int(p.name[len(PREVIOUS_PREFIX):]) for p in self.path.glob(PREVIOUS_PREFIX + "*")
                 if p.name[len(PREVIOUS_PREFIX):].isdigit()]
        return self.path / f"{PREVIOUS_PREFIX}{max(taken, default=0) + 1}"

    def _move_aside(self, names):
        """Move the run files ``names`` into a new ``previous-<n>`` folder; returns it."""
        while True:
            target = self._next_previous()
            try:
                target.mkdir()
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise OutputError(f"cannot create {target} to move the previous run aside: "
                                  f"{exc.strerror}") from None
        # The checkpoint last: until it moves, the folder still reads as the old run.
        for name in sorted(names, key=lambda n: n == RUN_FILES[0]):
            os.replace(self.path / name, target / name)
        return target
