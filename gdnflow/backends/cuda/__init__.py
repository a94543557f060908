"""The CUDA backend: PyCUDA kernels from ``cuda_src/``, cuBLAS through ``blas``.

Importing this package never touches the GPU; :func:`is_available` probes it
once, and :class:`CudaBackend` brings up the process's one context, stream and
memory pool (see :mod:`gdnflow.backends.cuda.runtime`).
"""
import contextlib
import functools
import sys
import types

import numpy as np

from gdnflow.errors import DTypeError
from gdnflow.precision import BFLOAT16, FLOAT16, as_dtype
from gdnflow.backends.cuda import kernel_builds
from gdnflow.backends.cuda.limits import check_elements

_probe_error = None


@functools.lru_cache(maxsize=None)
def is_available():
    """True if PyCUDA imports and a CUDA device can be initialised (probed once)."""
    global _probe_error
    try:
        import pycuda.driver as drv    # local import: PyCUDA may be absent; this probes for it
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
    dtypes = (np.dtype(np.float32), FLOAT16, BFLOAT16)

    def __init__(self):
        from gdnflow.backends.cuda import runtime   # local import: PyCUDA on first use
        self.runtime = runtime.get_runtime()
        self.array_type = runtime.CudaArray

    def check_dtype(self, dtype):
        """Return ``dtype`` as a numpy dtype, or raise DTypeError if unsupported."""
        dtype = as_dtype(dtype)
        if dtype not in self.dtypes:
            raise DTypeError(f"cuda backend supports float32, float16 and bfloat16, got {dtype} "
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


# The operator modules reach the GPU only through the functions below (the
# facade), never through runtime or kernels directly: they import PyCUDA only
# on first use, so the operator modules import on machines without it, and
# :func:`simulated` can stand a test double in for the device.
_device = None      # the kernels module, or a test double (see simulated())


def _loaded():
    global _device
    if _device is None:
        from gdnflow.backends.cuda import kernels    # local import: PyCUDA on first use only
        _device = kernels
    return _device


def kernel(file, name, arg_types, defines=()):
    """The compiled, prepared kernel ``name`` from ``file`` (see ``kernels.kernel``)."""
    return (_device or _loaded()).kernel(file, name, arg_types, defines)


#: The ``-D`` defines a kernel module is built with for tensors of each dtype
#: (storage_t in cuda_src/gdnflow_common.cuh): float32 modules have none.
STORAGE_DEFINES = {np.dtype(np.float32): (), BFLOAT16: (("STORAGE_BF16", 1),),
                   FLOAT16: (("STORAGE_FP16", 1),)}


def storage_defines(dtype):
    """The defines of the module variant whose kernels read and write ``dtype`` tensors."""
    return STORAGE_DEFINES[dtype]


def declare_variants(file, *variants):
    """Say which ``-D`` define tuples ``file`` is loaded with (see ``kernel_builds``).

    A first compile in a process then compiles those modules ahead, in parallel.
    """
    kernel_builds.declare_variants(file, *variants)


def runtime_started():
    """True once this process's CUDA runtime (context, stream, pool) exists."""
    runtime = sys.modules.get(f"{__name__}.runtime")
    return runtime is not None and runtime.started()


def get_runtime():
    """The process's :class:`~gdnflow.backends.cuda.runtime.Runtime` (context, stream, pool)."""
    return (_device or _loaded()).get_runtime()


def empty(shape, dtype=np.float32):
    """An uninitialised device array from the process's memory pool."""
    return (_device or _loaded()).get_runtime().empty(shape, dtype)


def zeros(shape, dtype=np.float32):
    """A device array of zeros (one memset on the stream)."""
    return (_device or _loaded()).get_runtime().full(shape, 0.0, dtype)


def sm_count():
    """The number of streaming multiprocessors of the device."""
    return (_device or _loaded()).get_runtime().sm_count


def compute_capability():
    """The device's (major, minor) compute capability."""
    return (_device or _loaded()).get_runtime().compute_capability


def max_shared_bytes():
    """The most dynamic shared memory one block of the device may opt in to, in bytes."""
    return (_device or _loaded()).get_runtime().max_shared_bytes


def launch_grid(threads, block=256, blocks_per_sm=16):
    """The grid a grid-stride kernel of ``threads`` threads is launched with."""
    return (_device or _loaded()).launch_grid(threads, block, blocks_per_sm)


def matmul(a, b, c, m, n, k, **options):
    """C = op(A) @ op(B) for row-major matrices at device addresses ``a``, ``b``, ``c``.

    The arguments and options of :func:`gdnflow.backends.cuda.blas.matmul`, which runs it
    (cuBLAS); a simulated device's own ``matmul`` instead, where it has one.
    """
    stand_in = getattr(_device, "matmul", None)
    if stand_in is not None:
        return stand_in(a, b, c, m, n, k, **options)
    from gdnflow.backends.cuda import blas    # local import: PyCUDA on first use
    return blas.matmul(a, b, c, m, n, k, **options)


def check_index_range(n, what):
    """Refuse ``n`` elements for ``what`` (a workspace) if kernels cannot index them.

    A :class:`~gdnflow.errors.TensorTooLargeError` past ``limits.MAX_ELEMENTS``;
    for work arrays a kernel indexes as a whole, before they are allocated.
    """
    check_elements(n, what)


def simulating():
    """Whether a test double stands in for the GPU (inside :func:`simulated`): code with a
    GPU-only path (CUDA graphs, say) takes its other one then."""
    return _device is not None and not isinstance(_device, types.ModuleType)


@contextlib.contextmanager
def simulated(device):
    """Within the block, the functions above go to ``device`` instead of the GPU.

    For tests that run a kernel plan without a GPU (the kernels built for the
    host, NumPy arrays as device memory): ``device`` has ``kernel(file, name,
    arg_types, defines)``, ``launch_grid(threads, block, blocks_per_sm)`` and
    ``get_runtime()`` (an object with ``empty``, ``full``, ``sm_count`` and
    ``stream``), and optionally ``matmul`` (as :func:`matmul`, on its memory).
    """
    global _device
    previous, _device = _device, device
    try:
        yield device
    finally:
        _device = previous
