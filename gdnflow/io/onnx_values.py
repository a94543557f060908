"""The values that flow through an imported ONNX graph, and its import error.

Two kinds of values: device tensors (:class:`gdnflow.Tensor`: activations and
weights, float32) and host NumPy arrays (integer tensors, shapes and other
constants). The importer (:mod:`gdnflow.io.onnx`) and its operator mappings
(:mod:`gdnflow.io.onnx_ops`) convert between them with these helpers.
"""
import numpy as np

from gdnflow.errors import GdnflowError
from gdnflow.tensor import Tensor


class OnnxImportError(GdnflowError, ValueError):
    """An ONNX file that gdnflow cannot read or run; the message names the file or node."""


def is_host(value):
    """Whether ``value`` is a host (NumPy) array rather than a device tensor."""
    return isinstance(value, np.ndarray)


def as_tensor(value, device):
    """``value`` as a device tensor on ``device`` (bool, integer and float data become float32)."""
    if isinstance(value, Tensor):
        return value
    array = np.asarray(value)
    if array.dtype.kind not in "fiub":
        raise OnnxImportError(f"cannot make a tensor of {array.dtype} values")
    return Tensor(array.astype(np.float32), device=device)


def host(value):
    """``value`` as a NumPy array (a device tensor is copied to the host)."""
    return value.numpy() if isinstance(value, Tensor) else np.asarray(value)


def scalar(value):
    """A one-element constant as a Python float (None stays None)."""
    return None if value is None else float(host(value).reshape(()))


def ints(value):
    """A constant's values as a list of Python ints."""
    return [int(v) for v in host(value).reshape(-1)]
