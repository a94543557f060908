"""Per-step scalars (loss, rate, gradient norm) collected without waiting for the GPU.

A compiled step returns its metrics as device scalars. Reading each one
(``.item()``) would make the host wait for every step, which is what the
captured step exists to avoid. :class:`ScalarLog` instead queues a copy of
each scalar into page-locked host memory behind the step's work, with an
event after it: :meth:`ScalarLog.read` with ``wait=False`` returns the
records whose copies have already run, without stopping the GPU's queue;
``wait=True`` waits for all of them.
"""
import collections

import numpy as np

from gdnflow.backends import cuda
from gdnflow.tensor import Tensor


class ScalarLog:
    """Queued copies of named one-element tensors, read back when ready.

    ``names``: the keys :meth:`record` takes from each step's outputs (each a
    one-element tensor or device array; a float32 one reads back as a float,
    an integer one as an int); ``capacity``: how many records may wait
    (:meth:`record` waits for the oldest when all are taken).
    """

    def __init__(self, names, capacity=64):
        self.names, self.capacity = tuple(names), int(capacity)
        if self.capacity < 1:
            raise ValueError(f"ScalarLog: capacity must be >= 1, got {capacity!r}")
        self._tables = {}                       # name -> host array of capacity values
        self._events = [None] * self.capacity   # per row, on the GPU: after its copies
        self._free = collections.deque(range(self.capacity))
        self._queued = collections.deque()      # (label, row), oldest first
        self._done = []                         # read back to free a row, not yet returned

    def __len__(self):
        """How many records wait to be read."""
        return len(self._done) + len(self._queued)

    def record(self, label, outputs):
        """Queue the values ``outputs[name]`` for each name, under ``label`` (a step number)."""
        values = [outputs[name] for name in self.names]
        for name, t in zip(self.names, values):
            if t.size != 1:
                raise ValueError(f"ScalarLog: {name} must be a one-element tensor, got shape "
                                 f"{t.shape}")
        if not self._free:
            self._done.extend(self._wait(1))
        row = self._free.popleft()
        arrays = [t.data if isinstance(t, Tensor) else t for t in values]
        if isinstance(arrays[0], np.ndarray):
            for name, array in zip(self.names, arrays):
                self._table(name, array.dtype, pinned=False)[row] = array.reshape(())
        else:
            import pycuda.driver as drv     # local import: PyCUDA only on the GPU
            stream = cuda.get_runtime().stream
            for name, array in zip(self.names, arrays):
                table = self._table(name, array.dtype, pinned=True)
                drv.memcpy_dtoh_async(table[row:row + 1], array.ptr, stream)
            if self._events[row] is None:
                self._events[row] = drv.Event()
            self._events[row].record(stream)
        self._queued.append((label, row))

    def read(self, wait=True):
        """[(label, {name: value})] of the records read back, oldest first.

        ``wait=True``: every queued record (waits for the GPU). ``wait=False``:
        only those whose copies have run already; the rest stay queued.
        """
        done, self._done = self._done, []
        if wait:
            return done + self._wait(len(self._queued))
        ready = 0
        for _, row in self._queued:
            event = self._events[row]
            if event is not None and not event.query():
                break
            ready += 1
        return done + self._wait(ready)

    def _wait(self, count):
        """Take the ``count`` oldest records (waiting for their copies)."""
        records = []
        for _ in range(count):
            label, row = self._queued.popleft()
            if self._events[row] is not None:
                self._events[row].synchronize()
            records.append((label, {name: table[row].item()
                                    for name, table in self._tables.items()}))
            self._free.append(row)
        return records

    def _table(self, name, dtype, pinned):
        table = self._tables.get(name)
        if table is None or table.dtype != dtype:
            if pinned:
                import pycuda.driver as drv     # local import: PyCUDA only on the GPU
                table = drv.pagelocked_zeros(self.capacity, dtype)
            else:
                table = np.zeros(self.capacity, dtype)
            self._tables[name] = table
        return table
