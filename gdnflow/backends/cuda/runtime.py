"""One CUDA context, one stream and one memory pool per process.

Every kernel, copy and cuBLAS call goes to :attr:`Runtime.stream`, so work is
ordered without explicit synchronisation, and a memory block returned to the
pool may be handed out again at once: whatever used it before was queued
earlier on the same stream. All device memory comes from PyCUDA's
``DeviceMemoryPool``, so a steady-state training or inference loop never calls
cudaMalloc/cudaFree (the first large loss measured in MobileNetV2 seed reports).

The context is the device's primary context, the one the CUDA runtime (and so
PyTorch) uses too, so benchmarks can run both in one process.
"""
import atexit
import contextlib
import math

import numpy as np
import pycuda.driver as drv
from pycuda.tools import DeviceMemoryPool, clear_context_caches

from gdnflow import step_state
from gdnflow.config import settings
from gdnflow.errors import GdnflowError
from gdnflow.backends.cuda.limits import MAX_ELEMENTS, check_elements, out_of_memory
from gdnflow.backends.numpy_backend import contiguous

_runtime = None


def get_runtime():
    """The process's :class:`Runtime`, created on first use."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(settings.cuda_device)
    return _runtime


def started():
    """True once :func:`get_runtime` has created the runtime."""
    return _runtime is not None


class Runtime:
    """The CUDA context, stream and memory pool of this process (on GPU ``device_index``:
    ``settings.cuda_device``, which :func:`gdnflow.distributed.init` sets to the local rank)."""

    def __init__(self, device_index=0):
        drv.init()
        self.device = drv.Device(device_index)
        self.context = self.device.retain_primary_context()
        self.context.push()
        self.stream = drv.Stream()
        self.pool = DeviceMemoryPool()
        major, minor = self.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        #: (major, minor) compute capability.
        self.compute_capability = (major, minor)
        self._max_shared_bytes = None
        self.sm_count = self.device.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
        self.name = self.device.name()
        #: When true, every new array is filled with NaN, so a kernel that
        #: leaves an output element unwritten shows in tests (gdnflow.testing).
        self.poison = False
        atexit.register(self.close)

    @property
    def max_shared_bytes(self):
        """The most dynamic shared memory one block may opt in to (bytes; asked once)."""
        if self._max_shared_bytes is None:
            self._max_shared_bytes = self.device.get_attribute(
                drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        return self._max_shared_bytes

    @contextlib.contextmanager
    def allocating_from(self, allocator):
        """Within the block, every device array gdnflow makes comes from ``allocator``.

        ``allocator`` has the pool's ``allocate(nbytes)`` (returning an object
        with ``int()`` giving the device address and ``free()``): inference
        plans and captured steps record allocations and hand out blocks of one
        arena this way. Blocks nest; the previous allocator returns on exit.
        """
        previous, self.pool = self.pool, allocator
        try:
            yield allocator
        finally:
            self.pool = previous

    def empty(self, shape, dtype=np.float32):
        """An uninitialised array of ``shape`` (a tuple of ints) from the pool.

        Raises :class:`~gdnflow.errors.TensorTooLargeError` for more than
        ``limits.MAX_ELEMENTS`` elements (before allocating anything) and
        :class:`~gdnflow.errors.DeviceMemoryError` when the GPU is full.
        """
        dtype = np.dtype(dtype)
        size = math.prod(shape)
        if size > MAX_ELEMENTS:
            check_elements(size, f"a device array of shape {tuple(shape)}")
        # The pool rejects zero-byte requests; an empty tensor still gets a
        # (tiny) block so that every CudaArray has a valid pointer.
        allocation = self.allocate(max(size * dtype.itemsize, dtype.itemsize),
                                   f"an array of shape {tuple(shape)}")
        array = CudaArray(shape, dtype, allocation)
        if self.poison and size:
            drv.memset_d8_async(array.ptr, 0xFF, array.nbytes, self.stream)   # all-ones bits: NaN
        return array

    def allocate(self, nbytes, what):
        """A block of ``nbytes`` from the current allocator (the pool, or a plan's).

        The pool, asked for more than the GPU has, frees the blocks it holds
        and tries once more; if that fails too, the result is a
        :class:`~gdnflow.errors.DeviceMemoryError` naming ``nbytes`` and
        ``what``, and the pool is as it was (a smaller request works).
        """
        try:
            return self.pool.allocate(nbytes)
        except (MemoryError, drv.MemoryError) as exc:
            if isinstance(exc, GdnflowError):
                raise
            raise out_of_memory(nbytes, what) from exc

    def allocate_outside_pool(self, nbytes, what):
        """A block of ``nbytes`` straight from cuMemAlloc (a plan's arena or input buffer).

        Not pooled: freed when the returned object is; out of memory is a
        :class:`~gdnflow.errors.DeviceMemoryError` as in :meth:`allocate`.
        Refused while a step is captured (cuMemAlloc cannot be captured).
        """
        if step_state.capturing():
            raise step_state.StepSyncError(
                f"allocating {nbytes} bytes outside the step's arena ({what}) inside a captured "
                "step: everything a captured step allocates comes from its arena")
        try:
            return drv.mem_alloc(nbytes)
        except drv.MemoryError as exc:
            raise out_of_memory(nbytes, what) from exc

    def full(self, shape, value, dtype=np.float32):
        """An array of ``shape`` filled with ``value`` (one memset on the stream)."""
        array = self.empty(shape, dtype)
        if array.size:
            if array.dtype.itemsize == 2:
                bits = np.array(value, dtype=array.dtype).view(np.uint16)
                drv.memset_d16_async(array.ptr, int(bits), array.size, self.stream)
            else:
                bits = np.array(value, dtype=array.dtype).view(np.uint32)
                drv.memset_d32_async(array.ptr, int(bits), array.size, self.stream)
        return array

    def from_numpy(self, host):
        """Copy a NumPy array to a new device array.

        Refused while a step is captured: the graph would replay the copy
        with the values of that moment (constant tables go through
        :meth:`~gdnflow.step_context.StepContext.upload_constant`).
        """
        if step_state.capturing():
            raise step_state.StepSyncError(
                f"copying a host array of shape {np.shape(host)} to the GPU inside a captured "
                "step: the graph would replay the values it had at capture on every step. Pass "
                "data that changes per step as the batch, draw random numbers on the device "
                "(uniform_noise with noise_stream=step.index)")
        host = contiguous(host)
        array = self.empty(tuple(host.shape), host.dtype)
        if array.size:
            # From pageable memory the driver stages the data before returning,
            # so ``host`` may be freed as soon as this call is back.
            drv.memcpy_htod_async(array.ptr, _as_buffer(host), self.stream)
        return array

    def upload(self, array, source):
        """Copy ``source``, a NumPy array or another device array, into the device array
        ``array`` (the same shape and dtype), on the stream: the input of a captured
        graph, say, which reads a fixed address. A NumPy ``source`` may be freed as soon
        as this returns (see :meth:`from_numpy`)."""
        on_device = isinstance(source, CudaArray)
        if not on_device:
            source = contiguous(source)
        if tuple(source.shape) != tuple(array.shape) or source.dtype != array.dtype:
            where = "device" if on_device else "host"
            raise ValueError(f"upload: a {where} array of {tuple(source.shape)} {source.dtype} "
                             f"into a device array of {tuple(array.shape)} {array.dtype}")
        if not array.size:
            return
        if on_device:
            drv.memcpy_dtod_async(array.ptr, source.ptr, array.nbytes, self.stream)
        else:
            drv.memcpy_htod_async(array.ptr, _as_buffer(source), self.stream)

    def to_numpy(self, array):
        """Copy a device array into a new NumPy array, waiting for the stream.

        Refused while a step is captured (nothing has run yet, and waiting
        would break the capture): :class:`~gdnflow.step_state.StepSyncError`.
        """
        if step_state.capturing():
            step_state.refuse_host_read(f"reading a device array of shape {array.shape}")
        host = np.empty(array.shape, array.dtype)
        if array.size:
            drv.memcpy_dtoh_async(_as_buffer(host), array.ptr, self.stream)
        self.stream.synchronize()
        return host

    def copy(self, array):
        """A new device array holding the same values."""
        out = self.empty(array.shape, array.dtype)
        if array.size:
            drv.memcpy_dtod_async(out.ptr, array.ptr, array.nbytes, self.stream)
        return out

    def close(self):
        """Release pooled memory and the context (runs at interpreter exit)."""
        try:
            self.stream.synchronize()
            self.pool.stop_holding()
            self.context.pop()
        except drv.Error:
            pass  # the context may already be gone at interpreter exit
        clear_context_caches()


def _as_buffer(host):
    """``host`` as an array the copy functions can take: a 16-bit float as its raw bits
    (ml_dtypes' bfloat16 exports no buffer format)."""
    return host.view(np.uint16) if host.dtype.itemsize == 2 else host


class CudaArray:
    """A dense, C-contiguous array in GPU memory.

    Deliberately smaller than PyCUDA's GPUArray: a launch from Python costs
    about 9 µs, and the framework's per-call overhead must stay near that, so a
    device array is just a shape, a dtype and a pooled allocation.
    ``reshape`` returns a view sharing the allocation.
    """

    __slots__ = ("shape", "dtype", "size", "allocation", "ptr")

    def __init__(self, shape, dtype, allocation, ptr=None):
        self.shape = shape
        self.dtype = dtype
        self.size = math.prod(shape)
        self.allocation = allocation
        self.ptr = int(allocation) if ptr is None else ptr

    @property
    def ndim(self):
        """Number of dimensions."""
        return len(self.shape)

    @property
    def nbytes(self):
        """Bytes the elements take."""
        return self.size * self.dtype.itemsize

    def reshape(self, shape):
        """A view with another shape of the same size."""
        shape = tuple(shape)
        return CudaArray(shape, self.dtype, self.allocation, self.ptr)

    def offset(self, elements, shape):
        """A view of ``shape`` starting ``elements`` elements into this array."""
        return CudaArray(tuple(shape), self.dtype, self.allocation,
                         self.ptr + elements * self.dtype.itemsize)

    def get(self):
        """Copy to a new NumPy array."""
        return get_runtime().to_numpy(self)

    def __repr__(self):
        return f"CudaArray(shape={self.shape}, dtype={self.dtype})"
