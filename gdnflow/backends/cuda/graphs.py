"""CUDA graphs: capture a sequence of launches on gdnflow's stream once, replay it with one call.

PyCUDA 2026.1 exposes no stream-capture API, so the six driver functions
needed are bound here from libcuda with ctypes (prototypes from ``cuda.h``
of CUDA 13.0)::

    CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode)
    CUresult cuStreamEndCapture(CUstream, CUgraph *)
    CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long flags)
    CUresult cuGraphLaunch(CUgraphExec, CUstream)
    CUresult cuGraphExecDestroy(CUgraphExec)
    CUresult cuGraphDestroy(CUgraph)

plus ``cuStreamIsCapturing``, ``cuGraphUpload`` and ``cuGetErrorName`` /
``cuGetErrorString`` for checks and messages. Every CUresult is checked: a
failure raises :class:`CudaGraphError` naming the function and the code.

What capture means for gdnflow code: between begin and end nothing runs;
every kernel, memset, device-to-device copy and cuBLAS call enqueued on the
stream becomes a node of the graph, with the device addresses it was given.
So the captured code must not allocate (the addresses would belong to the
capture run only; ``cuMemAlloc`` during capture is an error) nor synchronise
nor copy from pageable host memory. :mod:`gdnflow.inference` plans every
buffer before capturing for exactly this reason. cuBLAS is safe to capture
because :mod:`gdnflow.backends.cuda.blas` gives its handle a user-owned
workspace (``cublasSetWorkspace``): without one, cuBLAS allocates its
workspace during capture.
"""
import ctypes
import functools
import threading

from gdnflow.backends.cuda.runtime import get_runtime
from gdnflow.errors import GdnflowError

CUDA_SUCCESS = 0
#: CUstreamCaptureMode (cuda.h).
CAPTURE_MODE_GLOBAL = 0
CAPTURE_MODE_THREAD_LOCAL = 1
CAPTURE_MODE_RELAXED = 2
#: CUstreamCaptureStatus.
CAPTURE_STATUS_NONE = 0
CAPTURE_STATUS_ACTIVE = 1
CAPTURE_STATUS_INVALIDATED = 2
#: CUgraphInstantiate_flags: free, before each relaunch, what a graph's
#: allocation nodes left allocated. gdnflow's graphs have no allocation nodes
#: (nothing allocates during capture); the flag only keeps a relaunch from
#: failing should a library ever add one.
GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1

_MODES = {"global": CAPTURE_MODE_GLOBAL, "thread_local": CAPTURE_MODE_THREAD_LOCAL,
          "relaxed": CAPTURE_MODE_RELAXED}
#: The CudaGraph whose capture runs in this thread (``.graph``; captures do not nest).
_capture = threading.local()


def capturing_graph():
    """The :class:`CudaGraph` whose :meth:`~CudaGraph.capture` is running in this thread, or None.

    For libraries whose captured work outlives the capture: NCCL keeps its
    communicator until every graph that captured one of its collectives is
    destroyed, so :mod:`gdnflow.distributed.nccl` notes those graphs here.
    """
    return getattr(_capture, "graph", None)


class CudaGraphError(GdnflowError, RuntimeError):
    """A CUDA driver call of graph capture or replay failed, or capture was misused."""


@functools.lru_cache(maxsize=None)
def driver():
    """libcuda with the prototypes this module uses (loaded once)."""
    lib = ctypes.CDLL("libcuda.so.1")
    p = ctypes.c_void_p
    prototypes = {
        "cuStreamBeginCapture_v2": [p, ctypes.c_int],
        "cuStreamEndCapture": [p, ctypes.POINTER(p)],
        "cuStreamIsCapturing": [p, ctypes.POINTER(ctypes.c_int)],
        "cuGraphInstantiateWithFlags": [ctypes.POINTER(p), p, ctypes.c_ulonglong],
        "cuGraphUpload": [p, p],
        "cuGraphLaunch": [p, p],
        "cuGraphExecDestroy": [p],
        "cuGraphDestroy": [p],
        "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    }
    for name, argtypes in prototypes.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    return lib


def error_text(code):
    """``NAME: description`` of a CUresult, from the driver itself."""
    lib = driver()
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    if lib.cuGetErrorName(code, ctypes.byref(name)) != CUDA_SUCCESS or not name.value:
        return f"unknown CUresult {code}"
    lib.cuGetErrorString(code, ctypes.byref(text))
    description = text.value.decode() if text.value else ""
    return f"{name.value.decode()}: {description}"


def check(function, code):
    """Raise :class:`CudaGraphError` unless ``code`` (returned by ``function``) is CUDA_SUCCESS."""
    if code != CUDA_SUCCESS:
        raise CudaGraphError(f"{function} failed with CUresult {code} ({error_text(code)})")


def capture_status(stream):
    """One of the CAPTURE_STATUS_* values for a PyCUDA stream."""
    status = ctypes.c_int()
    check("cuStreamIsCapturing",
          driver().cuStreamIsCapturing(ctypes.c_void_p(stream.handle), ctypes.byref(status)))
    return status.value


class CudaGraph:
    """A sequence of GPU work captured from gdnflow's stream, replayed with one launch.

    ::

        graph = CudaGraph()
        out = graph.capture(lambda: model_step(x))   # runs the Python once, records the launches
        graph.replay()                                # re-runs every recorded launch on the GPU

    ``capture(fn)`` calls ``fn()`` with the stream in capture mode and returns
    what ``fn`` returned; none of its GPU work runs then. Each :meth:`replay`
    runs all of it, in order, on the same stream, with the same arguments and
    addresses: the arrays ``fn`` read and wrote must stay allocated (and are
    read and written again) for as long as the graph may be replayed. Replay
    is ordered with other work on the stream like any launch.

    Capture mode. ``"thread_local"`` (the default) makes CUDA refuse, in the
    capturing thread, every call that cannot be captured (an allocation, a
    synchronisation, a copy from pageable memory): such a mistake in ``fn``
    raises at once instead of producing a graph that replays with addresses
    it does not own. Other threads are left alone, so a data loader thread
    that allocates (through PyTorch, say) does not break a capture or get
    broken by it; with ``"global"`` it would fail while any capture runs.
    gdnflow work must still not be enqueued on the stream from another thread
    during capture: it would be captured too.
    """

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else get_runtime().stream
        self._graph = None
        self._exec = None
        # Bound once: replay is the hot path of an inference plan.
        self._stream = ctypes.c_void_p(self.stream.handle)
        self._launch = None

    @property
    def captured(self):
        """True once a capture succeeded (and until :meth:`close`)."""
        return self._exec is not None

    def capture(self, fn, mode="thread_local"):
        """Capture the GPU work ``fn()`` enqueues on the stream; returns ``fn()``'s result.

        A previous capture of this object is released first. If ``fn`` raises,
        capture is ended (the stream can be used again), the partial graph is
        destroyed and the exception propagates with a note on what capture
        forbids.
        """
        if mode not in _MODES:
            raise ValueError(f"CudaGraph.capture: mode must be one of {sorted(_MODES)}, "
                             f"got {mode!r}")
        self.close()
        lib = driver()
        self._launch = lib.cuGraphLaunch
        stream = self._stream
        if capture_status(self.stream) != CAPTURE_STATUS_NONE:
            raise CudaGraphError("CudaGraph.capture: the stream is already being captured "
                                 "(captures do not nest)")
        check("cuStreamBeginCapture_v2", lib.cuStreamBeginCapture_v2(stream, _MODES[mode]))
        graph = ctypes.c_void_p()
        _capture.graph = self
        try:
            result = fn()
        except BaseException as exc:
            # End the capture whatever happened, so that the stream works again.
            lib.cuStreamEndCapture(stream, ctypes.byref(graph))
            if graph.value:
                lib.cuGraphDestroy(graph)
            exc.add_note("(raised while capturing a CUDA graph: captured code must not "
                         "allocate device memory, synchronise, or copy from pageable host "
                         "memory)")
            raise
        finally:
            _capture.graph = None
        check("cuStreamEndCapture", lib.cuStreamEndCapture(stream, ctypes.byref(graph)))
        if not graph.value:
            raise CudaGraphError("cuStreamEndCapture returned no graph: the capture was "
                                 "invalidated by a call that cannot be captured")
        self._graph = graph
        executable = ctypes.c_void_p()
        try:
            check("cuGraphInstantiateWithFlags", lib.cuGraphInstantiateWithFlags(
                ctypes.byref(executable), graph, GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))
            self._exec = executable
            # Uploading now keeps the first replay from paying for it.
            check("cuGraphUpload", lib.cuGraphUpload(executable, stream))
        except CudaGraphError:
            self.close()
            raise
        return result

    def replay(self):
        """Launch the captured work on the stream (asynchronous, like any launch)."""
        if self._exec is None:
            raise CudaGraphError("CudaGraph.replay: nothing captured (or the graph was closed)")
        code = self._launch(self._exec, self._stream)
        if code != CUDA_SUCCESS:
            check("cuGraphLaunch", code)

    def close(self):
        """Destroy the executable graph and the graph (idempotent)."""
        executable, graph = self._exec, self._graph
        self._exec = self._graph = None
        results = []
        if executable is not None:
            results.append(("cuGraphExecDestroy", driver().cuGraphExecDestroy(executable)))
        if graph is not None:
            results.append(("cuGraphDestroy", driver().cuGraphDestroy(graph)))
        for function, code in results:
            check(function, code)

    def __del__(self):
        # At interpreter exit the context may already be gone: nothing to report then.
        try:
            self.close()
        except Exception:
            pass
