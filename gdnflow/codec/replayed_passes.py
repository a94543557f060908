"""GPU passes of the codec's exact transforms kept as CUDA graphs, one per input shape.

The exact hyper-synthesis (:mod:`gdnflow.codec.hyper_synthesis`) and the exact image
synthesis (:mod:`gdnflow.codec.exact_image`) launch a fixed list of kernels and
float64 GEMMs per pass. Launched from Python that list costs the host 10-50 µs an
operation, which an encode or decode waits for; :class:`ReplayedPasses` runs the first
pass over a key (input shape and whatever else fixes the launches) eagerly, captures
the second as a CUDA graph with its buffers, and replays that graph from then on.
"""
from collections import OrderedDict

import numpy as np

from gdnflow.backends import cuda

#: Keys whose first (eager) pass is remembered, so that the second is captured.
SEEN_KEYS = 64


class ReplayedPasses:
    """Passes kept as CUDA graphs, ``capacity`` of them, the least recently used evicted.

    ``run(key, source, build, replayable=True)`` gives the result of the pass that
    ``build(device_source)`` describes, ``(result, launches, buffers)``: the device
    array the pass writes, the functions that launch its operations (allocating
    nothing, so a graph may capture them) and every buffer they use. ``source`` is
    the pass's input, a NumPy or device array. A capacity of 0 (or a simulated device,
    or ``replayable=False``) runs every pass eagerly. One object serves one thread at a
    time.
    """

    def __init__(self, capacity):
        self.capacity = capacity
        self._passes = OrderedDict()   # key -> (graph, source buffer, result, buffers)
        self._seen = set()             # the keys of eager passes: the next one is captured

    def kept(self):
        """The keys of the kept graphs, the least recently used first."""
        return list(self._passes)

    def run(self, key, source, build, replayable=True):
        """The result of ``build``'s pass over ``source`` (class docstring): replayed from
        the second pass of ``key`` on, a device copy of the graph's own result (the next
        replay overwrites that one)."""
        if replayable and self.capacity and not cuda.simulating() and key in self._seen:
            result = self._replayed(key, source, build)
            if result is not None:
                return result
        runtime = cuda.get_runtime()
        device_source = runtime.from_numpy(source) if isinstance(source, np.ndarray) else source
        result, launches, _ = build(device_source)
        for launch in launches:
            launch()
        # Remembered once it ran: the capture of the next pass relies on what this one set
        # up outside any capture (the kernels loaded, cuBLAS's handle made).
        if len(self._seen) > SEEN_KEYS:
            self._seen.clear()
        self._seen.add(key)
        return result

    def _replayed(self, key, source, build):
        """:meth:`run` through ``key``'s graph, captured on first use; None where the
        capture failed (that key then stays eager)."""
        runtime = cuda.get_runtime()
        replay = self._passes.pop(key, None)
        if replay is None:
            # local import: graphs load libcuda, needed on a GPU only
            from gdnflow.backends.cuda.graphs import CudaGraph, CudaGraphError
            fixed = runtime.empty(source.shape, source.dtype)
            result, launches, buffers = build(fixed)
            graph = CudaGraph(runtime.stream)
            try:
                graph.capture(lambda: [launch() for launch in launches])
            except CudaGraphError:
                graph.close()
                self._seen.discard(key)
                return None
            replay = (graph, fixed, result, buffers)
            while len(self._passes) >= self.capacity:
                self._passes.pop(next(iter(self._passes)))[0].close()
        self._passes[key] = replay          # the most recently used last
        graph, fixed, result, _ = replay
        runtime.upload(fixed, source)
        graph.replay()
        return runtime.copy(result)

    def close(self):
        """Release every kept graph and its buffers (after the work already launched); the
        next passes capture again."""
        if self._passes:
            cuda.get_runtime().stream.synchronize()
        while self._passes:
            self._passes.popitem()[1][0].close()
