"""NCCL for CUDA arrays, through nccl4py's low-level bindings (``nccl.bindings.nccl``).

nccl4py has two layers. Its ``nccl.core`` Communicator takes buffers and
streams as cuda.core objects (DLPack, ``__cuda_array_interface__``) and
brings cuda.core's own device and stream model; gdnflow's arrays and streams
are PyCUDA's (raw device pointers, ``Stream.handle``) in the primary context.
``nccl.bindings.nccl`` is the C API one-to-one, taking exactly those raw
pointers and stream handles, so gdnflow calls it and nothing else.

The communicator is made from a unique id that rank 0 draws and the host
transport (MPI or the TCP store) hands round. A watchdog thread polls
``ncclCommGetAsyncError`` and the completion of recent collectives: on an
error, or a collective pending past the timeout, it aborts the communicator
(``ncclCommAbort`` ends its kernels, so the GPU stream moves on) and the next
collective or DataParallel ``finish()`` raises a DistributedError.
"""
import atexit
import contextlib
import threading
import time
import weakref

import nccl.bindings.nccl as nccl_api
import pycuda.driver as drv

from gdnflow.backends import cuda
from gdnflow.backends.cuda.graphs import CudaGraphError, capturing_graph
from gdnflow.distributed.errors import DistributedError

_DTYPES = {"float32": nccl_api.DataType.Float32, "float64": nccl_api.DataType.Float64}
_OPS = {"sum": nccl_api.RedOp.Sum, "mean": nccl_api.RedOp.Avg}
#: Seconds between two looks of the watchdog.
WATCH_INTERVAL = 0.1


class Communicator:
    """One NCCL communicator over the world's ranks, on this process's GPU."""

    def __init__(self, transport, rank, size, timeout):
        self.runtime = cuda.get_runtime()       # the context is current: NCCL binds its device
        self.rank, self.size, self.timeout = rank, size, timeout
        unique_id = bytes(nccl_api.get_unique_id()) if rank == 0 else None
        unique_id = transport.all_gather_object(unique_id)[0]
        try:
            self.comm = nccl_api.comm_init_rank(size, nccl_api.UniqueId.from_buffer(unique_id), rank)
        except nccl_api.NCCLError as exc:
            raise DistributedError(f"rank {rank}: creating the NCCL communicator of {size} ranks "
                                   f"failed: {exc} (NCCL_DEBUG=INFO says more)") from exc
        self.error = None
        self._pending = []      # (time queued, event recorded after a collective, what)
        self._graphs = weakref.WeakSet()    # CUDA graphs that captured a collective
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="gdnflow-nccl-watchdog",
                                          daemon=True)
        self._watchdog.start()
        # Before the runtime's own exit handler (registered earlier, so run later): the
        # watchdog must pop the context it pushed, or PyCUDA aborts the process at exit.
        atexit.register(self.close)

    def close(self):
        """Stop the watchdog and free the communicator (at exit; the runtime closes after).

        ``ncclCommDestroy`` waits for the collectives in flight, which never end
        when this rank leaves on a peer's failure: then the communicator is
        aborted instead, so that the process exits. Both also wait until every
        CUDA graph that captured one of its collectives is destroyed (NCCL
        counts them), forever if a compiled step still holds one at exit: those
        graphs are closed first, and can no longer replay.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        self._watchdog.join(timeout=5 * WATCH_INTERVAL + 1)
        if self.error is None:
            with self._lock:
                in_flight = any(not done.query() for _, done, _ in self._pending)
            in_flight = in_flight or not self.runtime.stream.is_done()   # replayed graphs too
            for graph in list(self._graphs):
                with contextlib.suppress(CudaGraphError):
                    graph.close()
            with contextlib.suppress(nccl_api.NCCLError):
                (nccl_api.comm_abort if in_flight else nccl_api.comm_destroy)(self.comm)

    def all_reduce(self, array, op, stream):
        """Reduce ``array`` (a CudaArray) in place over the ranks on ``stream`` (None: gdnflow's)."""
        self._call(nccl_api.all_reduce, f"all_reduce of {array.size} elements", stream,
                   array.ptr, array.ptr, array.size, _dtype(array), _OPS[op])

    def broadcast(self, array, root, stream):
        """Copy rank ``root``'s ``array`` into every rank's, in place, on ``stream``."""
        self._call(nccl_api.broadcast, f"broadcast of {array.size} elements from rank {root}",
                   stream, array.ptr, array.ptr, array.size, _dtype(array), root)

    def check(self):
        """Raise the DistributedError the watchdog found, if any."""
        if self.error is not None:
            raise self.error

    def _call(self, function, what, stream, *arguments):
        self.check()
        stream = stream or self.runtime.stream
        try:
            function(*arguments, self.comm, stream.handle)
        except nccl_api.NCCLError as exc:
            raise DistributedError(f"rank {self.rank}: NCCL {what} failed: {exc}") from exc
        graph = capturing_graph()
        if graph is not None:               # it runs at each replay, unwatched
            self._graphs.add(graph)
        else:
            done = drv.Event()
            done.record(stream)
            with self._lock:
                self._pending.append((time.monotonic(), done, what))

    def _watch(self):
        """The watchdog thread; see the module docstring."""
        self.runtime.context.push()
        try:
            while self.error is None and not self._stop.wait(WATCH_INTERVAL):
                self.error = self._look()
            if self.error is not None:
                nccl_api.comm_abort(self.comm)
        finally:
            drv.Context.pop()

    def _look(self):
        """A DistributedError if the communicator failed or a collective is overdue, else None."""
        state = nccl_api.comm_get_async_error(self.comm)
        if state not in (nccl_api.Result.Success, nccl_api.Result.InProgress):
            return DistributedError(
                f"rank {self.rank}: NCCL reported {nccl_api.get_error_string(state)} (a peer "
                "died or the network failed); the communicator was aborted")
        with self._lock:
            while self._pending and self._pending[0][1].query():
                self._pending.pop(0)
            if self._pending and time.monotonic() - self._pending[0][0] > self.timeout:
                what = self._pending[0][2]
                return DistributedError(
                    f"rank {self.rank}: NCCL {what} did not complete within {self.timeout:g} s "
                    "(a peer is stuck or gone); the communicator was aborted")
        return None


def _dtype(array):
    try:
        return _DTYPES[str(array.dtype)]
    except KeyError:
        raise TypeError(f"NCCL collectives take float32 arrays, got {array.dtype}") from None
