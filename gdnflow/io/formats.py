"""Which kind of model file a path holds (by content), and the refusal of a wrong kind.

gdnflow reads three kinds: its own checkpoints (HDF5 with the attribute
``format = "gdnflow-checkpoint"``), Keras HDF5 files and ONNX files.
Commands that need one kind (``prune`` and the codec's commands need a
gdnflow checkpoint) call :func:`require_checkpoint`, so a valid ONNX or
Keras file is called what it is, with the command that converts it, rather
than "a corrupt checkpoint".
"""
import os

import h5py

from gdnflow.errors import GdnflowError
from gdnflow.io.files import check_inputs

CHECKPOINT, KERAS, ONNX = "gdnflow-checkpoint", "keras", "onnx"
#: How each kind is named in messages.
KIND_NAMES = {CHECKPOINT: "a gdnflow checkpoint", KERAS: "a Keras HDF5 file",
              ONNX: "an ONNX file"}


class FileKindError(GdnflowError, ValueError):
    """A file of another kind than the one asked for; the message names the file and its kind."""


def detect_format(path):
    """CHECKPOINT, KERAS or ONNX for the file at ``path`` (by content), or None if none of them.

    Raises :class:`~gdnflow.io.files.InputError` for a missing, empty or
    unreadable path or a folder, :class:`FileKindError` for an HDF5 file
    h5py cannot open.
    """
    path = os.fspath(check_inputs([path], "model file")[0])
    if h5py.is_hdf5(path):
        try:
            with h5py.File(path, "r") as f:
                if f.attrs.get("format") == CHECKPOINT:
                    return CHECKPOINT
        except OSError as exc:
            raise FileKindError(f"{path}: an HDF5 file that cannot be read (truncated or "
                                f"corrupt?): {exc}") from None
        return KERAS        # the Keras reader says what is wrong if it is not one
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x89HDF"):
        return KERAS        # an HDF5 signature h5py rejects: let the reader explain
    if path.lower().endswith(".onnx") or head[:1] == b"\x08":   # ModelProto's ir_version field
        return ONNX
    return None


def require_checkpoint(path, command):
    """Raise :class:`FileKindError` unless ``path`` is a gdnflow checkpoint.

    ``command`` (``"gdnflow prune"``) is named in the message, which says
    that ``gdnflow convert`` makes a checkpoint of an ONNX or Keras file.
    """
    kind = detect_format(path)
    if kind in (KERAS, ONNX):
        raise FileKindError(f"{path} is {KIND_NAMES[kind]}; {command} expects a gdnflow "
                            f"checkpoint: make one with gdnflow convert {path} OUT.h5")
    if kind is None:
        raise FileKindError(f"{path} is not a gdnflow checkpoint (nor any HDF5 or ONNX file); "
                            f"{command} expects one")
    return path
