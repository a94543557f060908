"""Per-step scalars (loss, rate, gradient norm) collected without waiting for the GPU.

A compiled step returns its metrics as device scalars. Reading each one
(``.item()``) would make the host wait for every step, which is what the
captured step exists to avoid. :class:`ScalarLog` instead queues a copy of
each scalar into a page-locked host table behind the step's work, and
:meth:`ScalarLog.read` waits once for all the steps queued since the last
read.
"""
import numpy as np

from gdnflow.backends import cuda


class ScalarLog:
    """Queued copies of named one-element tensors, read back in batches.

    ``names``: the keys :meth:`record` takes from each step's outputs, in
    order; ``capacity``: how many records may wait between two reads
    (:meth:`record` reads back by itself when the table is full).
    """

    def __init__(self, names, capacity=64):
        self.names, self.capacity = tuple(names), int(capacity)
        if self.capacity < 1:
            raise ValueError(f"ScalarLog: capacity must be >= 1, got {capacity!r}")
        self._table, self._pinned = None, False
        self._labels = []          # one per queued record
        self._read = []             # records read back but not yet taken

    def __len__(self):
        return len(self._labels) + len(self._read)

    def record(self, label, outputs):
        """Queue the scalars ``outputs[name]`` for each name, under ``label`` (a step number)."""
        if len(self._labels) == self.capacity:
            self._read.extend(self._drain())
        row = len(self._labels)
        values = [outputs[name] for name in self.names]
        for name, t in zip(self.names, values):
            if t.size != 1:
                raise ValueError(f"ScalarLog: {name} must be a one-element tensor, got shape "
                                 f"{t.shape}")
        if values[0].device == "numpy":
            self._host_table()[row] = [float(t.data.reshape(())) for t in values]
        else:
            import pycuda.driver as drv     # local import: PyCUDA only on the GPU
            table, stream = self._host_table(pinned=True), cuda.get_runtime().stream
            for j, t in enumerate(values):
                drv.memcpy_dtoh_async(table[row, j:j + 1], t.data.ptr, stream)
        self._labels.append(label)

    def read(self):
        """[(label, {name: float})] of every record since the last read (waits for the GPU)."""
        records = self._read + self._drain()
        self._read = []
        return records

    def _drain(self):
        if not self._labels:
            return []
        if self._pinned:
            cuda.get_runtime().stream.synchronize()
        rows = self._table[:len(self._labels)].astype(np.float64)
        records = [(label, dict(zip(self.names, map(float, row))))
                   for label, row in zip(self._labels, rows)]
        self._labels = []
        return records

    def _host_table(self, pinned=False):
        if self._table is None:
            shape = (self.capacity, len(self.names))
            if pinned:
                import pycuda.driver as drv     # local import: PyCUDA only on the GPU
                self._table = drv.pagelocked_empty(shape, np.float32)
            else:
                self._table = np.zeros(shape, np.float32)
            self._pinned = pinned
        return self._table
