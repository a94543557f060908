"""Backends: where a tensor's array lives and which code computes on it.

gdnflow has two backends behind one API, named by a device string:

``"numpy"``
    arrays are ``numpy.ndarray``; the plain, readable reference that every GPU
    result is checked against. Runs float32 and float64 (for gradient checks).
``"cuda"``
    arrays are :class:`gdnflow.backends.cuda.CudaArray` in GPU memory; operators
    are kernels from ``cuda_src/`` compiled at run time with PyCUDA. float32.

The default device is chosen once per process: ``GDNFLOW_DEVICE`` if set, else
``cuda`` when PyCUDA imports and a device answers, else ``numpy`` (with a
one-line notice). :func:`set_default_device` changes it.
"""
import logging
import os

from gdnflow.errors import BackendUnavailableError
from gdnflow.backends import cuda
from gdnflow.backends.numpy_backend import NumpyBackend

NUMPY = "numpy"
CUDA = "cuda"
DEVICES = (NUMPY, CUDA)

_log = logging.getLogger("gdnflow")
_backends = {NUMPY: NumpyBackend()}
_default_device = None


def cuda_available():
    """True if PyCUDA imports and at least one CUDA device can be initialised."""
    return cuda.is_available()


def get_backend(device):
    """Return the backend object for a device name ("numpy" or "cuda")."""
    device = check_device(device)
    if device not in _backends:
        if not cuda.is_available():
            raise BackendUnavailableError(
                "device 'cuda' was asked for, but no CUDA device is usable here: "
                + cuda.unavailable_reason())
        _backends[device] = cuda.CudaBackend()
    return _backends[device]


def check_device(device):
    """Return ``device`` if it names a backend, else raise a ValueError listing them."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    return device


def default_device():
    """The device new tensors go to when none is named (chosen once, see module doc)."""
    global _default_device
    if _default_device is None:
        requested = os.environ.get("GDNFLOW_DEVICE")
        if requested:
            _default_device = check_device(requested)
        elif cuda_available():
            _default_device = CUDA
        else:
            _log.warning("gdnflow: no usable CUDA device (%s); running on NumPy",
                         cuda.unavailable_reason())
            _default_device = NUMPY
    return _default_device


def set_default_device(device):
    """Make ``device`` the default for tensors created without one."""
    global _default_device
    _default_device = check_device(device)
