"""The static input of a compiled step, and how each call's batch gets into it.

A captured graph reads its input from one fixed device array, so every call
copies the new batch there first. From a NumPy array on the GPU the copy
goes through two page-locked host buffers and two device buffers in turn:
the host fills a page-locked buffer (while the GPU still runs the previous
steps), a second stream copies it to a device buffer (over PCIe, while the
previous step computes), and gdnflow's stream then copies that into the
static input (device to device: microseconds) once the previous step is
done reading it. From pageable memory the driver would stage large copies
itself and make the host wait for the queued work, and a host-to-device
copy on gdnflow's stream would leave the GPU's compute idle while it runs.
"""
import numpy as np

from gdnflow.backends import cuda
from gdnflow.errors import DeviceMismatchError, DTypeError, ShapeError
from gdnflow.tensor import Tensor

#: Staging buffer pairs (page-locked, device) per input: the host fills one pair's
#: page-locked buffer while the other pair's copies may still be queued.
STAGING_BUFFERS = 2


def check_real(dtype):
    """Raise DTypeError unless ``dtype`` holds real numbers (bool, integers, floats)."""
    if dtype.kind not in "fiub":
        raise DTypeError(f"compile_step: a batch holds real numbers, got dtype {dtype}")


class InputBuffer:
    """A step's static input: a tensor of ``shape`` and ``dtype`` on ``device``; see the module."""

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), device
        if device == "numpy":
            self.tensor = Tensor.wrap(np.zeros(self.shape, self.dtype), device)
        else:
            self.tensor = Tensor.wrap(cuda.empty(self.shape, self.dtype), device)
        self._staging, self._copy_stream, self._next = [], None, 0

    def load(self, batch):
        """Copy ``batch`` (a NumPy array, or a Tensor on the step's device) into the input."""
        if isinstance(batch, Tensor):
            if batch.device != self.device:
                raise DeviceMismatchError(f"compile_step: the batch is on {batch.device!r}, the "
                                          f"step on {self.device!r}")
            if batch.dtype != self.dtype:
                raise DTypeError(f"compile_step: the batch is {batch.dtype}, the step's input "
                                 f"{self.dtype}")
            self._check_shape(batch.shape)
            self._copy_device(batch.data)
            return
        host = np.asarray(batch)
        check_real(host.dtype)
        self._check_shape(host.shape)
        if self.device == "numpy":
            np.copyto(self.tensor.data, host, casting="unsafe")
        else:
            self._copy_host(host)

    def _check_shape(self, shape):
        if tuple(shape) != self.shape:
            raise ShapeError(f"compile_step: expected a batch of shape {self.shape}, got "
                             f"{tuple(shape)}")

    def _copy_device(self, array):
        if self.device == "numpy":
            np.copyto(self.tensor.data, array)
            return
        import pycuda.driver as drv     # local import: PyCUDA only on the GPU
        target = self.tensor.data
        if target.nbytes:
            drv.memcpy_dtod_async(target.ptr, array.ptr, target.nbytes, cuda.get_runtime().stream)

    def _copy_host(self, host):
        import pycuda.driver as drv     # local import: PyCUDA only on the GPU
        stream = cuda.get_runtime().stream
        if not self._staging:
            self._copy_stream = drv.Stream()
            self._staging = [(drv.pagelocked_empty(self.shape, self.dtype),
                              cuda.empty(self.shape, self.dtype), drv.Event(), drv.Event())
                             for _ in range(STAGING_BUFFERS)]
            for _, _, copied, consumed in self._staging:
                copied.record(self._copy_stream)
                consumed.record(stream)
        pinned, on_device, copied, consumed = self._staging[self._next]
        self._next = (self._next + 1) % STAGING_BUFFERS
        copied.synchronize()            # the last copy out of this page-locked buffer ran
        np.copyto(pinned, host, casting="unsafe")
        target = self.tensor.data
        if not target.nbytes:
            return
        # The device buffer may still feed the copy queued two calls ago.
        self._copy_stream.wait_for_event(consumed)
        drv.memcpy_htod_async(on_device.ptr, pinned, self._copy_stream)
        copied.record(self._copy_stream)
        # Into the static input behind the previous steps, which read it.
        stream.wait_for_event(copied)
        drv.memcpy_dtod_async(target.ptr, on_device.ptr, target.nbytes, stream)
        consumed.record(stream)
