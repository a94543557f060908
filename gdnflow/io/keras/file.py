"""Opening a Keras HDF5 file and telling its kind: full model, legacy weights, Keras 3 weights.

Every failure to open or read a file is a :class:`KerasImportError` whose
message names the file.
"""
import json
import os
import zipfile

import h5py
import numpy as np

from gdnflow.errors import GdnflowError


class KerasImportError(GdnflowError, ValueError):
    """A Keras file that gdnflow cannot read or run; the message names the file (and layer)."""


class KerasFile:
    """``with KerasFile(path) as f``: h5py.File(path), every failure naming the file.

    A missing file, a Keras 3 ``.keras`` archive and a file that is not HDF5
    raise :class:`KerasImportError` on entering; any other error raised
    inside the block (h5py's for a damaged file) is raised again as one.
    """

    def __init__(self, path):
        self.path = os.fspath(path)

    def __enter__(self):
        path = self.path
        if not os.path.exists(path):
            raise KerasImportError(f"{path}: no such file")
        if zipfile.is_zipfile(path):
            raise KerasImportError(
                f"{path}: a Keras 3 '.keras' archive, which gdnflow does not read; in Keras, "
                "save the model as HDF5 (model.save('model.h5')) and load that")
        try:
            self.file = h5py.File(path, "r")
        except OSError as exc:
            raise KerasImportError(f"{path} is not a readable HDF5 file (truncated or not "
                                   f"HDF5?): {exc}") from None
        return self.file

    def __exit__(self, kind, exc, traceback):
        self.file.close()
        if exc is not None and not isinstance(exc, KerasImportError):
            # h5py's errors for a damaged file surface while reading (OSError,
            # KeyError...), as do a damaged config's: one line naming the file.
            hint = " (truncated or corrupt?)" if isinstance(exc, (OSError, KeyError)) else ""
            raise KerasImportError(f"{self.path}: cannot read this Keras file{hint}: "
                                   f"{type(exc).__name__}: {exc}") from None
        return False


def file_kind(f, path):
    """'model', 'legacy' (weights-only, layer_names) or 'keras3' (weights, /layers/.../vars).

    ``f`` is the open file; a gdnflow checkpoint or an HDF5 file of another
    kind raises :class:`KerasImportError`.
    """
    if f.attrs.get("format") == "gdnflow-checkpoint":    # it has a model_config attribute too
        raise KerasImportError(f"{path}: a gdnflow checkpoint, not a Keras file "
                               "(read it with gdnflow.io.load_checkpoint)")
    if "model_config" in f.attrs:
        if "model_weights" not in f:
            raise KerasImportError(f"{path}: a Keras model file without weights "
                                   "(saved with include weights off?)")
        return "model"
    if attr_list(f, "layer_names") is not None:
        return "legacy"
    if "layers" in f and "vars" in f:
        return "keras3"
    raise KerasImportError(f"{path}: an HDF5 file, but not a Keras model or weights file (no "
                           "model_config or layer_names attribute, no /layers group)")


def read_model_config(f, path):
    """The ``model_config`` attribute of a full-model file as a dict (class_name, config)."""
    raw = f.attrs["model_config"]
    try:
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except ValueError as exc:
        raise KerasImportError(f"{path}: model_config is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or "class_name" not in config or "config" not in config:
        raise KerasImportError(f"{path}: model_config is not a Keras model configuration")
    return config


def attr_list(group, name):
    """A list-of-strings attribute of an h5py group, or None if absent.

    Keras splits large ones into ``name0``, ``name1``, ...
    """
    if name in group.attrs:
        values = list(np.asarray(group.attrs[name]).reshape(-1))
    elif f"{name}0" in group.attrs:
        values, i = [], 0
        while f"{name}{i}" in group.attrs:
            values += list(np.asarray(group.attrs[f"{name}{i}"]).reshape(-1))
            i += 1
    else:
        return None
    return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in values]
