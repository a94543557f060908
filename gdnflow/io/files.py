"""The files a command reads and writes: checked before the work, written atomically, never lost.

Every command that writes files (compress, decompress, eval, convert, prune,
train) goes through this module, so that they all keep the same promises:

- :func:`check_inputs` runs first: a missing input, a folder where a file
  is expected or an empty file is refused with one message naming it.

- :func:`check_outputs` runs before any work: an output that exists is
  refused unless ``force``, an output that is one of the command's own inputs
  is refused always, and each output folder is created and test-written, so
  that an unwritable destination fails in seconds, not after the work.
- :func:`atomic_output` and :func:`write_bytes_atomic` write a temporary file
  in the destination's folder, fsync it and rename it into place: a crash or
  an error leaves any earlier file as it was and no temporary file behind.
- Errors are :class:`OutputError` and name the user's path, never an internal
  temporary file.
"""
import contextlib
import os
import uuid
from pathlib import Path

from gdnflow.errors import GdnflowError

#: Prefix of the temporary files this module creates (``.NAME.<random>.tmp``).
TEMPORARY_SUFFIX = ".tmp"


class OutputError(GdnflowError, OSError):
    """An output that cannot or must not be written; the message names the user's path."""


class OutputExistsError(OutputError, FileExistsError):
    """An output exists and ``--force`` was not given."""


class InputError(GdnflowError, OSError):
    """An input file that cannot be read (missing, a folder, empty); the message names it."""


def check_inputs(paths, kind="file"):
    """Check, before any work, that each of ``paths`` is a non-empty file that can be read.

    ``kind`` names what the command expects (``"image"``, ``"checkpoint"``)
    in the message. Raises :class:`InputError` naming the first path that is
    missing, a folder, empty or unreadable. Returns the paths as Paths.
    """
    paths = [Path(p) for p in paths]
    for path in paths:
        if path.is_dir():
            raise InputError(f"{path} is a folder, not {_article(kind)} {kind}")
        if not path.exists():
            raise InputError(f"{path}: no such file")
        if path.stat().st_size == 0:
            raise InputError(f"{path} is empty (0 bytes), not {_article(kind)} {kind}")
        if not os.access(path, os.R_OK):
            raise InputError(f"{path}: permission denied")
    return paths


def _article(noun):
    return "an" if noun[:1].lower() in "aeiou" else "a"


def output_paths(inputs, out, suffix):
    """Where each input's result goes: ``out`` (a file for one input, a folder for several).

    Without ``out``, next to each input with ``suffix``. ``out`` an existing
    folder also works for one input. Raises OutputError if two inputs would
    share an output.
    """
    inputs = [Path(p) for p in inputs]
    if out is None:
        paths = [p.with_suffix(suffix) for p in inputs]
    elif len(inputs) == 1 and not Path(out).is_dir():
        paths = [Path(out)]
    else:
        paths = [Path(out) / (p.stem + suffix) for p in inputs]
    seen = {}
    for source, target in zip(inputs, paths):
        where = os.path.normcase(os.path.realpath(target))    # a/../a/x.gdn is a/x.gdn
        if where in seen:
            raise OutputError(f"{seen[where]} and {source} would both be written to {target}")
        seen[where] = source
    return paths


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:             # one of them does not exist: compare where they would be
        return Path(a).resolve() == Path(b).resolve()


def check_outputs(outputs, inputs=(), force=False):
    """Check, before any work, that every path of ``outputs`` may be written.

    Refuses (OutputError naming the path) an output that is also one of
    ``inputs`` (even with ``force``: the input would be gone before it is
    read), an output that is a folder, and (OutputExistsError, listing them)
    outputs that exist unless ``force``. Then creates each output's folder and
    test-writes it (:func:`check_folder`). Returns the outputs as Paths.
    """
    outputs = [Path(p) for p in outputs]
    for output in outputs:
        for source in inputs:
            if _same_file(output, source):
                raise OutputError(f"{output} is also an input of this command: write the "
                                  "result to another file")
        if output.is_dir():
            raise OutputError(f"{output} is a folder, not a file")
    existing = [str(p) for p in outputs if p.exists()]
    if existing and not force:
        raise OutputExistsError(f"{', '.join(existing)} exist{'s' if len(existing) == 1 else ''}"
                                ": pass --force to overwrite")
    for folder in dict.fromkeys(p.parent for p in outputs):
        check_folder(folder)
    return outputs


def check_folder(folder):
    """Create ``folder`` (and its parents) if needed and check a file can be written there.

    Raises OutputError naming ``folder`` (an existing file in its place, no
    permission, a read-only file system, a full disk) before any work is done.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{folder} exists and is not a folder") from None
    except OSError as exc:
        raise OutputError(f"cannot create the folder {folder}: {exc.strerror}") from None
    probe = folder / f".gdnflow-write-test.{uuid.uuid4().hex[:12]}{TEMPORARY_SUFFIX}"
    try:
        with open(probe, "xb") as f:
            f.write(b"gdnflow")
    except OSError as exc:
        raise OutputError(f"cannot write in {folder}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return folder


def temporary_path(path):
    """A fresh temporary name beside ``path`` (hidden, unique, ending in ``.tmp``)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}{TEMPORARY_SUFFIX}")


@contextlib.contextmanager
def atomic_output(path, overwrite=False):
    """``with atomic_output(path) as temporary:`` write ``temporary``; it becomes ``path`` at the end.

    On leaving the block normally the temporary file is fsynced and renamed
    over ``path`` (so a reader sees the old file or the whole new one); on an
    exception (Ctrl-C included) it is removed and ``path`` is untouched.
    Raises OutputExistsError if ``path`` exists and ``overwrite`` is false,
    OutputError naming ``path`` if the write or the rename fails.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path} exists: pass --force to overwrite it")
    temporary = temporary_path(path)
    try:
        yield temporary
        _fsync(temporary, os.O_RDWR)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, GdnflowError):
            raise
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync(path.parent, os.O_RDONLY, missing_ok=True)   # make the rename itself durable


def write_bytes_atomic(path, data, overwrite=False):
    """Write ``data`` to ``path`` through :func:`atomic_output` (same errors and guarantees)."""
    with atomic_output(path, overwrite) as temporary:
        with open(temporary, "xb") as f:
            f.write(data)


def remove_stale_temporaries(folder, names=None):
    """Delete this module's temporary files left in ``folder`` by a killed process; their paths.

    ``names``: only the temporaries of these final file names (default: all).
    Call it only where no other process can be writing (a run folder one
    holds the lock of).
    """
    removed = []
    for path in Path(folder).glob(f".*.*{TEMPORARY_SUFFIX}"):
        final = path.name[1:].rsplit(".", 2)[0]
        if names is None or final in names:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    return removed


def _fsync(path, flags, missing_ok=False):
    try:
        fd = os.open(path, flags)
    except OSError:
        if missing_ok:      # a folder cannot be opened on some systems (Windows)
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not missing_ok:
            raise
    finally:
        os.close(fd)
