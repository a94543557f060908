"""The CUDA backend: PyCUDA kernels from ``cuda_src/``, cuBLAS through ``blas``.

Importing this package never touches the GPU; :func:`is_available` probes it
once, and :class:`CudaBackend` brings up the process's one context, stream and
memory pool (see :mod:`gdnflow.backends.cuda.runtime`).
"""
import functools

import numpy as np

from gdnflow.errors import DTypeError

_probe_error = None


@functools.lru_cache(maxsize=None)
def is_available():
    """True if PyCUDA imports and a CUDA device can be initialised (probed once)."""
    global _probe_error
    try:
        import pycuda.driver as drv
        drv.init()
        if drv.Device.count() == 0:
            _probe_error = "the CUDA driver reports no device"
            return False
    except Exception as exc:  # ImportError, or the driver's own error without a GPU
        _probe_error = f"{type(exc).__name__}: {exc}".strip()
        return False
    return True


def unavailable_reason():
    """Why :func:`is_available` said no (empty if it said yes)."""
    is_available()
    return _probe_error or ""


class CudaBackend:
    """The GPU backend. Arrays are :class:`~gdnflow.backends.cuda.runtime.CudaArray`."""

    name = "cuda"
    dtypes = (np.dtype(np.float32),)

    def __init__(self):
        from gdnflow.backends.cuda import runtime
        self.runtime = runtime.get_runtime()
        self.array_type = runtime.CudaArray

    def check_dtype(self, dtype):
        """Return ``dtype`` as a numpy dtype, or raise DTypeError if unsupported."""
        dtype = np.dtype(dtype)
        if dtype not in self.dtypes:
            raise DTypeError(f"cuda backend supports float32 only, got {dtype} "
                             "(float64 is for NumPy gradient checks)")
        return dtype

    def from_numpy(self, array):
        """Copy a NumPy array to the GPU."""
        return self.runtime.from_numpy(array)

    def to_numpy(self, array):
        """Copy a GPU array to a new NumPy array (waits for the stream)."""
        return array.get()

    def empty(self, shape, dtype):
        """An uninitialised GPU array from the memory pool."""
        return self.runtime.empty(shape, dtype)

    def full(self, shape, value, dtype):
        """A GPU array filled with ``value``."""
        return self.runtime.full(shape, value, dtype)

    def synchronize(self):
        """Wait until every kernel queued on gdnflow's stream has finished."""
        self.runtime.stream.synchronize()


# Operators call these on every launch. They import PyCUDA only on first
# use, so that the operator modules import on machines without it.
_kernels = None


def kernel(file, name, arg_types, defines=()):
    """The compiled, prepared kernel ``name`` from ``file`` (see ``kernels.kernel``)."""
    global _kernels
    if _kernels is None:
        from gdnflow.backends.cuda import kernels as _kernels
    return _kernels.kernel(file, name, arg_types, defines)


def empty(shape, dtype=np.float32):
    """An uninitialised device array from the process's memory pool."""
    global _kernels
    if _kernels is None:
        from gdnflow.backends.cuda import kernels as _kernels
    return _kernels.get_runtime().empty(shape, dtype)


def launch_grid(threads, block=256, blocks_per_sm=16):
    """The grid a grid-stride kernel of ``threads`` threads is launched with."""
    global _kernels
    if _kernels is None:
        from gdnflow.backends.cuda import kernels as _kernels
    return _kernels.launch_grid(threads, block, blocks_per_sm)
