"""The CUDA side of a DataParallel bucket: copy in and NCCL average on a side stream.

All buckets of a process share one communication stream. A bucket's start
records an event on gdnflow's stream (its gradients are written), makes the
communication stream wait for it, and queues there the copies into the flat
buffer and the NCCL all-reduce (``ncclAvg``, float32); an event marks the
end. :meth:`CudaBucket.complete` makes gdnflow's stream wait for everything
queued on the communication stream, then copies the averages back into the
gradient arrays, in place, on gdnflow's stream. The copies back wait until
then because a gradient array may be shared: an operator's backward can
hand one array to a parameter and to the input it still back-propagates
(``p + x``, a reshape), which the rest of the backward reads on gdnflow's
stream, or to two parameters of different buckets. Nothing waits on the
host, so a compiled step (CUDA graph) captures the whole exchange: the side
stream joins the capture through the first event and leaves it through the
last (NCCL >= 2.9 supports capture).

``started``/``done`` (timing events on the communication stream) let a
benchmark place each bucket's reduction against the backward.
"""
import pycuda.driver as drv

from gdnflow.backends import cuda
from gdnflow.distributed import world as _world
from gdnflow.distributed.buckets import Bucket

_comm_stream = None


def comm_stream():
    """The communication stream shared by every bucket of this process."""
    global _comm_stream
    if _comm_stream is None:
        _comm_stream = drv.Stream()
    return _comm_stream


class CudaBucket(Bucket):
    """A bucket of CUDA gradients; see the module docstring."""

    def __init__(self, params, index, world):
        super().__init__(params, index, world)
        self.runtime = cuda.get_runtime()
        self.stream = comm_stream()
        self.grads_written, self.started, self.done = drv.Event(), drv.Event(), drv.Event()
        self.side_done = drv.Event()
        self.pending = False

    def start(self):
        main, side = self.runtime.stream, self.stream
        self.grads_written.record(main)
        side.wait_for_event(self.grads_written)
        self.started.record(side)
        item = self.flat.dtype.itemsize
        for p, begin in zip(self.params, self.offsets):
            drv.memcpy_dtod_async(self.flat.ptr + int(begin) * item, p.grad.data.ptr,
                                  p.grad.data.nbytes, side)
        _world.nccl_communicator().all_reduce(self.flat, "mean", stream=side)
        self.done.record(side)
        self.pending = True

    def complete(self):
        if not self.pending:
            return
        self.pending = False
        main = self.runtime.stream
        # Every bucket has started (DataParallel.finish): this waits for all their copies
        # in, so that writing a shared gradient array cannot change another bucket's input.
        self.side_done.record(self.stream)
        main.wait_for_event(self.side_done)
        item = self.flat.dtype.itemsize
        for p, begin in zip(self.params, self.offsets):
            drv.memcpy_dtod_async(p.grad.data.ptr, self.flat.ptr + int(begin) * item,
                                  p.grad.data.nbytes, main)
        _world.nccl_communicator().check()
