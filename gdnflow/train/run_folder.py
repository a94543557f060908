"""A training run's folder, owned by one process at a time.

``gdnflow train --out DIR`` keeps everything of a run in DIR (checkpoint,
histories, pictures). :class:`RunFolder` makes the promises around it:

- The folder is created and test-written before any data is read
  (:func:`gdnflow.io.files.check_folder`): an unwritable ``--out`` fails in
  seconds, not at the first checkpoint.
- A lock file, ``DIR/run.lock``, created with ``O_EXCL`` and holding the
  owner's pid, host and start time, is held for the whole run and removed
  at its end (errors and signals included). A second process is refused,
  naming the owner; a lock whose process is gone (same host) is stale: it
  is reported and taken over.
- A folder that holds a run is refused unless the run is resumed or
  ``force`` moves the old run's files aside into ``DIR/previous-<n>/``
  (nothing is deleted).
- Temporary files of the run's files left by a killed process are removed
  once the lock is held.
"""
import contextlib
import datetime
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

from gdnflow.io.files import (OutputError, OutputExistsError, check_folder,
                              remove_stale_temporaries)

LOCK_NAME = "run.lock"
#: The files a run writes in its folder; any of them makes the folder "hold a run".
RUN_FILES = ("checkpoint.h5", "history.jsonl", "eval.jsonl", "curves.png", "reconstructions.png")
#: Where ``force`` moves an earlier run: ``previous-1``, ``previous-2``, ...
PREVIOUS_PREFIX = "previous-"
#: A lock file that cannot be read and is older than this is a crash's leftover.
UNREADABLE_LOCK_GRACE_S = 30.0
#: What a run folder is opened for.
MODES = ("new", "resume", "force")
#: The lock files this process holds (two RunFolders of one folder in one process).
_HELD_HERE = set()


class RunExistsError(OutputExistsError):
    """The run folder holds a run and neither resume nor force was asked for."""


class RunLockedError(OutputError):
    """Another process holds the run folder's lock."""


def _process_start(pid):
    """When ``pid`` started (clock ticks since boot, from /proc), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()      # the name may hold spaces
    return None if fields[0] == "Z" else int(fields[19])


def _pid_alive(pid, started=None):
    """Whether process ``pid`` of this host runs (and is the one that started at ``started``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # another user's process: alive
        return True
    except OSError:
        return False
    if Path("/proc").is_dir():
        now = _process_start(pid)
        # A zombie is dead; a different start time means the pid was reused.
        return now is not None and (started is None or now == started)
    return True


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
        self._lock_text = None

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
        """Create the lock file (O_EXCL); take over a stale one; RunLockedError if held."""
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": datetime.datetime.now().isoformat(timespec="seconds"),
                           "pid_start": _process_start(os.getpid())}) + "\n"
        for _ in range(3):          # a lost race against another takeover: look again
            try:
                fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            except OSError as exc:
                raise OutputError(f"cannot create the lock file {self.lock_path}: "
                                  f"{exc.strerror}") from None
            self._lock_text = text
            _HELD_HERE.add(self.lock_path.resolve())
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return
        raise RunLockedError(f"{self.path} is being taken by another process: try again")

    def _read_lock(self):
        """(text, owner dict) of the lock file; text None if it vanished, owner {} if unreadable."""
        try:
            text = self.lock_path.read_text()
        except FileNotFoundError:
            return None, {}
        except OSError:
            return "", {}
        try:
            owner = json.loads(text)
        except json.JSONDecodeError:
            return text, {}
        return text, (owner if isinstance(owner, dict) else {})

    def _take_over_if_stale(self):
        """Remove the lock if its owner is gone (saying so); else raise RunLockedError."""
        text, owner = self._read_lock()
        if text is None:
            return
        if not owner:
            age = time.time() - self.lock_path.stat().st_mtime
            if age < UNREADABLE_LOCK_GRACE_S:       # being written by its creator
                raise RunLockedError(f"{self.path} is being taken by another process "
                                     f"(lock {self.lock_path}): try again in a minute")
            reason = "it cannot be read and is older than a minute"
        else:
            pid, host = owner.get("pid"), owner.get("host")
            if host != socket.gethostname():
                raise RunLockedError(
                    f"{self.path} is in use by another training ({_describe(owner)}); if that "
                    f"process is gone, delete {self.lock_path}")
            # Our own pid in a lock this process does not hold: a previous process
            # of the same pid (a restarted container) left it.
            mine = pid == os.getpid()
            if (mine and self.lock_path.resolve() in _HELD_HERE) or (
                    not mine and isinstance(pid, int) and _pid_alive(pid, owner.get("pid_start"))):
                raise RunLockedError(
                    f"{self.path} is in use by another training ({_describe(owner)}): wait for "
                    f"it to finish or stop it")
            reason = f"its owner ({_describe(owner)}) is no longer running"
        # Move the stale lock away under a name of our own, then check that what
        # moved is the lock judged stale: a second process may have taken over
        # (and written a live lock) in between.
        moved = self.path / f".{LOCK_NAME}.{uuid.uuid4().hex[:12]}.stale"
        try:
            os.rename(self.lock_path, moved)
        except FileNotFoundError:
            return
        try:
            moved_text = moved.read_text()
        except OSError:
            moved_text = ""
        if moved_text != text:
            with contextlib.suppress(OSError):
                os.link(moved, self.lock_path)      # put the live lock back (not over a new one)
            moved.unlink()
            raise RunLockedError(f"{self.path} was taken by another process meanwhile")
        moved.unlink()
        self.notify(f"took over the stale lock {self.lock_path}: {reason}")

    def _unlock(self):
        """Remove the lock file if it is still the one this object wrote."""
        if self._lock_text is None:
            return
        with contextlib.suppress(OSError):
            if self.lock_path.read_text() == self._lock_text:
                self.lock_path.unlink()
        _HELD_HERE.discard(self.lock_path.resolve())
        self._lock_text = None

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
