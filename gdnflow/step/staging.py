"""The static input of a compiled step, and how each call's batch gets into it.

A captured graph reads its input from one fixed device array, so every call
copies the new batch there first. From a NumPy array on the GPU the copy
goes through two page-locked host buffers in turn: the host fills one (a
memcpy it does while the GPU still runs the previous steps) and the copy to
the device is queued behind them, truly asynchronous. From pageable memory
the driver would stage large copies itself and make the host wait for the
queued work, which would put the GPU idle between steps.
"""
import numpy as np

from gdnflow.backends import cuda
from gdnflow.errors import DeviceMismatchError, DTypeError, ShapeError
from gdnflow.tensor import Tensor

#: Page-locked buffers per input: the host fills one while the other's copy may be queued.
STAGING_BUFFERS = 2


class InputBuffer:
    """A step's static input: a tensor of ``shape`` and ``dtype`` on ``device``; see the module."""

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), device
        if device == "numpy":
            self.tensor = Tensor.wrap(np.zeros(self.shape, self.dtype), device)
        else:
            self.tensor = Tensor.wrap(cuda.empty(self.shape, self.dtype), device)
        self._staging, self._events, self._next = [], [], 0

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
        if host.dtype.kind not in "fiub":
            raise DTypeError(f"compile_step: a batch holds real numbers, got dtype {host.dtype}")
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
            self._staging = [drv.pagelocked_empty(self.shape, self.dtype)
                             for _ in range(STAGING_BUFFERS)]
            self._events = [drv.Event() for _ in range(STAGING_BUFFERS)]
            for event in self._events:
                event.record(stream)
        i = self._next
        self._next = (i + 1) % STAGING_BUFFERS
        self._events[i].synchronize()       # the copy that last read this buffer is done
        np.copyto(self._staging[i], host, casting="unsafe")
        target = self.tensor.data
        if target.nbytes:
            # The static input is read by the previous steps' kernels: this copy
            # is queued behind them on the one stream, so it cannot overtake them.
            drv.memcpy_htod_async(target.ptr, self._staging[i], stream)
        self._events[i].record(stream)
