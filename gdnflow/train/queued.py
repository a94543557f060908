"""The trainer's compiled step: steps queued on the GPU, their records read back in batches.

:meth:`gdnflow.train.Trainer.queue_step` runs each step through
:func:`gdnflow.compile_step` (one CUDA graph per batch shape on the GPU) and
queues a copy of its scalars and of the step's finite flag;
:meth:`QueuedSteps.read` returns the records read back (all of them, or only
those already copied, without stopping the GPU's queue) and the first step
whose values were not finite, if one of them saw the flag set.
"""
import numpy as np

from gdnflow.step import compile_step
from gdnflow.step.scalar_log import ScalarLog
from gdnflow.tensor import Tensor

#: Steps between two read backs of a compiled run's records (and its NaN check).
SYNC_EVERY = 10
#: The scalars of a step record that the step computes on the device.
STEP_SCALARS = ("loss", "bpp", "mse", "aux", "grad_norm")
#: The record's copy of the compiled step's flag (0, or the first non-finite step).
FLAG = "first_nonfinite_step"


class QueuedSteps:
    """A compiled ``step_function(batch, step)`` on ``device`` and its unread step records.

    ``notify(message)`` receives the compiled step's notices (another batch
    shape captured, say).
    """

    def __init__(self, step_function, device, notify):
        self.step_function, self.device, self.notify = step_function, device, notify
        self.compiled = None
        self._batches = {}          # step number -> its batch, until its record is read
        # Room for a few read intervals: the host may run ahead of the GPU.
        self.log = ScalarLog(STEP_SCALARS + (FLAG,), capacity=4 * SYNC_EVERY)

    def __len__(self):
        """How many steps ran since the last :meth:`read`."""
        return len(self.log)

    def run(self, batch, step):
        """Run step ``step`` (its index: the noise stream) on ``batch`` and queue its record."""
        x = batch if isinstance(batch, Tensor) else np.asarray(batch)
        if self.compiled is None:
            self.compiled = compile_step(
                self.step_function, Tensor(np.zeros(x.shape, np.float32), device=self.device),
                start_step=step, notify=self.notify)
        elif self.compiled.step != step:
            self.compiled.step = step         # eager steps ran in between
        self.log.record(step + 1, {**self.compiled(x), FLAG: self.compiled.flag})
        # Kept (a reference, no copy) to rerun the step should it turn out non-finite.
        self._batches[step + 1] = batch

    def read(self, wait=True):
        """(records, bad): steps' records [(step number, {scalar: float})] and the number
        of the first step that went non-finite (None if none of them saw one).

        ``wait=True`` reads every queued step (waiting for the GPU); ``wait=False``
        only those already done.
        """
        records, bad = [], None
        for label, values in self.log.read(wait):
            flag = values.pop(FLAG)
            if flag and bad is None:
                bad = flag
            records.append((label, values))
            if bad is None:
                self._batches.pop(label, None)
        return records, bad

    def batch_of(self, step):
        """The batch that step number ``step`` ran on, while its record was unread (or None)."""
        return self._batches.get(step)

    def discard(self):
        """Forget the compiled step (after a non-finite step: its flag stays set) and the
        steps still queued (their records are dropped unread)."""
        self.log.read(wait=True)
        self._batches.clear()
        if self.compiled is not None:
            self.compiled.reset()
        self.compiled = None
