"""Checkpoints: a model's parameters, its optimiser's state and the training
run's progress in one HDF5 file (written through h5py).

Layout (format version 1)::

    /                     attributes:
                            format          "gdnflow-checkpoint"
                            format_version  1
                            gdnflow_version the writer's gdnflow.__version__
                            model_name      model.name, else its class name
                            model_config    JSON: getattr(model, "config", {})
                            extra           JSON: the caller's dict (step, RNG state, ...)
    /parameters/<name>    one dataset per parameter, by dotted name
                          ("encoder.0.weight"), in the parameter's dtype; or
                          rounded to float16 (``storage_dtype``: half the size
                          of a shipped model), with an attribute ``dtype``
                          naming the dtype it is read back as
    /buffers/<name>       one dataset per buffer (model.named_buffers(), if any)
    /optimizer            only with an optimiser; attributes:
                            type            the optimiser's class name
                            param_groups    JSON: each group's hyperparameters and
                                            the indices of its parameters
    /optimizer/state/<i>  per parameter i (numbered across the groups in order,
                          as Optimizer.state_dict does): its state arrays as
                          datasets, its counters (step) as attributes

Every non-empty array is stored with a Fletcher-32 checksum, so a file
damaged on disk fails to load instead of loading wrong numbers.

Writing is atomic: the file is written under a temporary name in the same
folder, flushed and fsynced, then renamed over ``path`` with ``os.replace``;
if anything fails before the rename (or the process dies), the previous
checkpoint at ``path`` is untouched.
"""
import io
import json
import os

import h5py
import numpy as np

from gdnflow.backends import get_backend
from gdnflow.errors import GdnflowError
from gdnflow.io.files import write_bytes_atomic
from gdnflow.tensor import Tensor, weights_changed
from gdnflow.version import __version__

FORMAT_NAME = "gdnflow-checkpoint"
FORMAT_VERSION = 1
# HDF5 1.8 file format or later: checksummed metadata, and attributes larger
# than 64 KiB (an RNG state or a big config in `extra`) stored densely.
_LIBVER = ("v108", "latest")


class CheckpointError(GdnflowError, ValueError):
    """A checkpoint file cannot be read, or does not fit the model or optimiser.

    The message names the file and says what is wrong.
    """


# ------------------------------------------------------------------ save --
def optimizer_state_to_json(optimizer):
    """An optimiser's state dict as JSON-able data (exact: float32 values survive JSON)."""
    state = optimizer.state_dict()
    return {"type": state["type"], "param_groups": state["param_groups"],
            "state": {str(i): {k: (v.tolist() if isinstance(v, np.ndarray) else v)
                               for k, v in entry.items()}
                      for i, entry in state["state"].items()}}


def optimizer_state_from_json(data):
    """The state dict :func:`optimizer_state_to_json` described (arrays back as float32)."""
    return {"type": data["type"], "param_groups": data["param_groups"],
            "state": {int(i): {k: (np.array(v, dtype=np.float32) if isinstance(v, list) else v)
                               for k, v in entry.items()}
                      for i, entry in data["state"].items()}}


def save_checkpoint(path, model, optimizer=None, extra=None, storage_dtype=None):
    """Write ``model``'s parameters and buffers, ``optimizer``'s state and ``extra`` to ``path``.

    ``extra`` is a dict of JSON-able data (the step, an RNG state as lists of
    ints, the data order...). ``storage_dtype="float16"`` stores the
    floating-point parameters rounded to float16, for a file of weights half
    the size (buffers stay exact); reading gives those rounded values back in
    the parameters' own dtype (magnitudes below float16's smallest subnormal,
    6e-8, read back as 0). Refused with an optimiser (a run's state must stay
    exact) and for values float16 cannot hold (ValueError naming the
    parameter). The write is atomic (see the module docstring): on any error
    the previous file at ``path`` is unchanged and no temporary file is left.
    """
    path = os.fspath(path)
    if not isinstance(extra, (dict, type(None))):
        raise TypeError(f"save_checkpoint: extra must be a dict, got {type(extra).__name__}")
    if storage_dtype is not None:
        if np.dtype(storage_dtype) != np.float16:
            raise ValueError(f"save_checkpoint: storage_dtype must be 'float16' (or None: "
                             f"exact), got {storage_dtype!r}")
        if optimizer is not None:
            raise ValueError("save_checkpoint: storage_dtype is for weights only: a checkpoint "
                             "with optimiser state is stored exactly")
    # Gather and encode everything before creating a file, so that a bad
    # config or extra fails without touching the disk.
    parameters = {name: _host_array(p) for name, p in model.named_parameters()}
    buffers = {name: _host_array(b) for name, b in _named_buffers(model)}
    config = getattr(model, "config", {})
    config = config() if callable(config) else config
    header = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "gdnflow_version": __version__,
        "model_name": str(getattr(model, "name", None) or type(model).__name__),
        "model_config": _to_json(config, "the model's config"),
        "extra": _to_json({} if extra is None else extra, "extra"),
    }
    optimizer_state = optimizer.state_dict() if optimizer is not None else None
    if optimizer_state is not None:
        groups_json = _to_json(optimizer_state["param_groups"], "the optimiser's groups")

    # Built in memory, then written in one atomic write: HDF5 failing on a full disk
    # crashed the process and left its temporary file.
    image = io.BytesIO()
    with h5py.File(image, "w", libver=_LIBVER) as f:
        f.attrs.update(header)
        _write_arrays(f.create_group("parameters"), parameters, storage_dtype)
        _write_arrays(f.create_group("buffers"), buffers)
        if optimizer_state is not None:
            group = f.create_group("optimizer")
            group.attrs["type"] = optimizer_state["type"]
            group.attrs["param_groups"] = groups_json
            states = group.create_group("state")
            for index, entry in optimizer_state["state"].items():
                slot = states.create_group(str(index))
                for key, value in entry.items():
                    if isinstance(value, np.ndarray):
                        _write_array(slot, key, value)
                    else:
                        slot.attrs[key] = value
    write_bytes_atomic(path, image.getvalue(), overwrite=True)


def _write_arrays(group, arrays, storage_dtype=None):
    """One dataset per array; rounded ones (``storage_dtype``) record the dtype they are
    read back as."""
    for name, array in arrays.items():
        stored = _stored(name, array, storage_dtype)
        dataset = _write_array(group, name, stored)
        if stored.dtype != array.dtype:
            dataset.attrs["dtype"] = array.dtype.str


def _write_array(group, name, array):
    """One dataset (checksummed where HDF5 allows), returned."""
    # Chunked storage (which the checksum needs) exists only for non-empty
    # arrays of at least one dimension.
    checksum = array.ndim > 0 and array.size > 0
    # One chunk per array: h5py's automatic chunk shapes pad small kernels
    # (5x5) by ~40% on disk. HDF5 caps a chunk at 4 GiB.
    chunks = array.shape if checksum and array.nbytes < (1 << 31) else None
    return group.create_dataset(name, data=array, fletcher32=checksum,
                                chunks=chunks if chunks else (True if checksum else None))


def _read_array(dataset):
    """A dataset's values, in the dtype they were saved from (see ``storage_dtype``)."""
    values = dataset[()]
    read_dtype = dataset.attrs.get("dtype")
    return values if read_dtype is None else values.astype(str(read_dtype))


def load_checkpoint(path, model=None, optimizer=None):
    """Read the checkpoint at ``path``; load it into ``model`` and ``optimizer`` if given.

    Every parameter (and buffer) name and shape must match the model's, and
    the optimiser state must fit the optimiser; otherwise a
    :class:`CheckpointError` names the file and lists the missing, unexpected
    and mis-shaped entries. Everything is checked before anything changes.
    Parameters keep their identity: each Parameter object of the model gets
    a new array (on its device, in its dtype), so an optimiser built on the
    model before loading stays attached to it.

    Returns a dict: ``model_name``, ``config``, ``extra``, ``format_version``,
    ``gdnflow_version``, ``parameters`` and ``buffers`` ({name: NumPy
    array}), ``optimizer`` (a state dict for ``Optimizer.load_state_dict``,
    or None).
    """
    path = os.fspath(path)
    checkpoint = _read(path, arrays=True)
    if model is not None:
        _check_names(path, f"model {type(model).__name__}", "parameter",
                     dict(model.named_parameters()), checkpoint["parameters"])
        buffers = dict(_named_buffers(model))
        _check_names(path, f"model {type(model).__name__}", "buffer",
                     buffers, checkpoint["buffers"])
    if optimizer is not None:
        if checkpoint["optimizer"] is None:
            raise CheckpointError(f"{path}: holds no optimiser state to load into "
                                  f"{type(optimizer).__name__}")
        try:
            optimizer.check_state_dict(checkpoint["optimizer"])
        except ValueError as exc:
            raise CheckpointError(f"{path}: optimiser state does not fit: {exc}") from None
    if model is not None:
        for name, p in model.named_parameters():
            _assign(p, checkpoint["parameters"][name])
        for name, b in buffers.items():
            _assign(b, checkpoint["buffers"][name])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint


def read_checkpoint_info(path):
    """What a checkpoint holds, without reading its arrays (for ``gdnflow info FILE``).

    Returns a dict: ``model_name``, ``config``, ``extra``, ``format_version``,
    ``gdnflow_version``, ``parameter_count`` (elements in all parameters),
    ``parameter_shapes`` ({name: shape}), ``buffer_shapes`` and ``optimizer``
    (its class name, or None). Raises :class:`CheckpointError` for a file
    that is not a readable gdnflow checkpoint.
    """
    path = os.fspath(path)
    info = _read(path, arrays=False)
    info["parameter_count"] = int(sum(int(np.prod(s)) for s in info["parameter_shapes"].values()))
    return info


def _read(path, arrays):
    """Everything in the file (arrays too if ``arrays``), read and checked while it is open."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT_NAME:
                raise CheckpointError(f"{path}: an HDF5 file, but not a gdnflow checkpoint "
                                      "(it has no format attribute 'gdnflow-checkpoint')")
            version = int(f.attrs["format_version"])
            if version > FORMAT_VERSION:
                raise CheckpointError(
                    f"{path}: checkpoint format version {version} is newer than this gdnflow "
                    f"({__version__}) reads (up to {FORMAT_VERSION}); upgrade gdnflow")
            result = {
                "model_name": str(f.attrs["model_name"]),
                "config": json.loads(f.attrs["model_config"]),
                "extra": json.loads(f.attrs["extra"]),
                "format_version": version,
                "gdnflow_version": str(f.attrs["gdnflow_version"]),
            }
            for kind in ("parameters", "buffers"):
                group = f[kind]
                if arrays:
                    result[kind] = {name: _read_array(group[name]) for name in group}
                else:
                    result[kind[:-1] + "_shapes"] = {name: tuple(group[name].shape)
                                                     for name in group}
            result["optimizer"] = None
            if "optimizer" in f:
                group = f["optimizer"]
                if arrays:
                    result["optimizer"] = _read_optimizer(group)
                else:
                    result["optimizer"] = str(group.attrs["type"])
            return result
    except CheckpointError:
        raise
    except Exception as exc:   # noqa: BLE001 (h5py raises OSError, KeyError, ValueError...)
        # One line naming the file, not h5py's traceback.
        raise CheckpointError(f"{path}: not a readable gdnflow checkpoint (truncated or "
                              f"corrupt?): {type(exc).__name__}: {exc}") from None


def _read_optimizer(group):
    state = {}
    for index, slot in group["state"].items():
        entry = {key: _python_scalar(value) for key, value in slot.attrs.items()}
        entry.update((key, slot[key][()]) for key in slot)
        state[int(index)] = entry
    return {"type": str(group.attrs["type"]),
            "param_groups": json.loads(group.attrs["param_groups"]),
            "state": dict(sorted(state.items()))}


def _check_names(path, owner, what, expected, found):
    """Raise CheckpointError listing missing, unexpected and mis-shaped names."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = [f"{name} (checkpoint {tuple(found[name].shape)}, model {tuple(expected[name].shape)})"
             for name in sorted(set(expected) & set(found))
             if tuple(found[name].shape) != tuple(expected[name].shape)]
    if missing or unexpected or wrong:
        problems = [f"{len(names)} {what}{'s' if len(names) > 1 else ''} {label} "
                    f"({_first_names(names)})" for label, names in
                    (("missing", missing), ("unexpected", unexpected), ("mis-shaped", wrong))
                    if names]
        raise CheckpointError(f"{path} does not fit {owner}: " + "; ".join(problems))


#: Names listed in a mismatch message; the rest are counted (a classifier has hundreds).
LISTED_NAMES = 3


def _first_names(names):
    """'a, b, c' or 'a, b, c, ... and 309 more': a message stays one readable line."""
    shown = ", ".join(names[:LISTED_NAMES])
    return shown if len(names) <= LISTED_NAMES else f"{shown}, ... and " \
        f"{len(names) - LISTED_NAMES} more"


def _assign(target, array):
    """Give a tensor (or NumPy buffer) the values of ``array``, keeping the object."""
    if isinstance(target, Tensor):
        target.data = get_backend(target.device).from_numpy(np.array(array, dtype=target.dtype))
        target.mark_changed()       # compiled inference plans of it are now stale
    else:
        target[...] = array
        weights_changed()


# --------------------------------------------------------------- helpers --
def _named_buffers(model):
    """(name, tensor or array) of the model's buffers; none if it has no ``named_buffers``."""
    named_buffers = getattr(model, "named_buffers", None)
    if named_buffers is None:
        return []
    buffers = named_buffers() if callable(named_buffers) else named_buffers
    return list(buffers.items() if isinstance(buffers, dict) else buffers)


def _stored(name, array, storage_dtype):
    """``array`` as saved: floating point rounded to ``storage_dtype`` (None: unchanged)."""
    if storage_dtype is None or not np.issubdtype(array.dtype, np.floating):
        return array
    with np.errstate(over="ignore"):        # reported below, by name
        stored = array.astype(storage_dtype)
    if not np.array_equal(np.isfinite(stored), np.isfinite(array)):
        raise ValueError(f"save_checkpoint: {name} has values outside {np.dtype(storage_dtype)}'s "
                         f"range (largest magnitude {np.nanmax(np.abs(array)):.4g})")
    return stored


def _host_array(value):
    """A NumPy copy of a tensor's or array's values."""
    return np.array(value.numpy() if isinstance(value, Tensor) else value)


def _to_json(value, what):
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"save_checkpoint: {what} is not JSON-serialisable: {exc}") from None


def _python_scalar(value):
    return value.item() if isinstance(value, np.generic) else value

