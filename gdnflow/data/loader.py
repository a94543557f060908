"""A loader that prepares batches in a background thread, ahead of the training loop.

The worker calls ``make_batch(step)`` for step = start, start + 1, ... and
puts the results in a bounded queue; the training loop takes them in order.
Decoding and cropping (NumPy and Pillow, which release the GIL for much of
their work) thus overlap with the loop's own work and the GPU's.

- Parallel: with ``workers > 1``, ``prefetch`` batches are made at once, each
  spreading its crops over the ``workers`` threads of a shared pool, so a
  slow crop delays its own batch and not the pool.
- Bounded: at most ``prefetch`` batches wait in the queue, one is in the
  worker's hands and ``prefetch - 1`` more are being made, so memory stays
  fixed.
- Stops cleanly: :meth:`BackgroundLoader.close` (or leaving a ``with``
  block, or the loop ending) stops the worker and joins it, also while it
  is blocked on a full queue.
- Propagates exceptions: an exception raised by ``make_batch`` is re-raised
  in the consuming thread, the same exception object, with a note naming
  the step, when the loop reaches that step.
"""
import collections
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

_DONE = object()


class _Failure:
    """An exception raised in the worker, carried to the consumer."""

    def __init__(self, step, exception):
        self.step, self.exception = step, exception


class BackgroundLoader:
    """Iterate over ``make_batch(step)`` for ``start <= step < stop``, built by a background thread.

    ``stop=None`` runs until closed. ``prefetch`` is the queue's bound.
    ``workers > 1`` also hands ``make_batch`` a thread pool of that size as
    ``pool=`` (e.g. :meth:`ImageFolder.batch` decodes the images of one batch
    in parallel with it), and ``prefetch`` batches are made at once, each in
    a thread of its own; they are queued in step order. Use as an iterator and
    close it, or as a context manager::

        with BackgroundLoader(lambda step: data.batch(seed, step, 16), start=step) as batches:
            for batch in batches:
                ...
    """

    def __init__(self, make_batch, start=0, stop=None, prefetch=4, workers=1,
                 name="gdnflow-data"):
        if prefetch < 1:
            raise ValueError(f"BackgroundLoader: prefetch must be >= 1, got {prefetch}")
        self.make_batch = make_batch
        self.start, self.stop = int(start), stop
        self.workers = int(workers)
        self._queue = queue.Queue(maxsize=int(prefetch))
        self._stopping = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ worker --
    def _run(self):
        if self.workers > 1:
            self._run_parallel()
            return
        step = self.start
        while not self._stopping.is_set() and (self.stop is None or step < self.stop):
            try:
                item = self.make_batch(step)
            except BaseException as exc:      # noqa: BLE001 (handed to the consumer)
                self._put(_Failure(step, exc))
                return
            if not self._put(item):
                return
            step += 1
        self._put(_DONE)

    def _run_parallel(self):
        """``_run`` with ``prefetch`` batches being made at once, queued in step order."""
        crops = ThreadPoolExecutor(self.workers, thread_name_prefix="gdnflow-decode")
        batches = ThreadPoolExecutor(self._queue.maxsize, thread_name_prefix="gdnflow-batch")
        pending = collections.deque()       # (step, future), oldest first
        step, ahead = self.start, self._queue.maxsize
        try:
            while not self._stopping.is_set():
                while len(pending) < ahead and (self.stop is None or step < self.stop):
                    pending.append((step, batches.submit(self.make_batch, step, pool=crops)))
                    step += 1
                if not pending:
                    self._put(_DONE)
                    return
                made, future = pending.popleft()
                try:
                    item = future.result()
                except BaseException as exc:      # noqa: BLE001 (handed to the consumer)
                    self._put(_Failure(made, exc))
                    return
                if not self._put(item):
                    return
        finally:
            for _, future in pending:
                future.cancel()
            batches.shutdown(wait=True, cancel_futures=True)
            crops.shutdown(wait=True, cancel_futures=True)

    def _put(self, item):
        """Queue ``item``, waiting while the queue is full; False once closing."""
        while not self._stopping.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    # ---------------------------------------------------------- consumer --
    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._finished = True      # closed, or the worker died without a word
                    raise StopIteration from None
        if item is _DONE:
            self._finished = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            self._thread.join()
            exc = item.exception
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised in gdnflow's data loader thread, preparing step {item.step})")
            raise exc
        return item

    def close(self, timeout=10.0):
        """Stop the worker and wait for it (at most ``timeout`` seconds); safe to call twice."""
        self._stopping.set()
        self._finished = True
        # Empty the queue so a worker blocked in put() sees the stop at once.
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)

    @property
    def alive(self):
        """True while the worker thread runs."""
        return self._thread.is_alive()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False

    def __del__(self):
        try:
            self._stopping.set()
        except AttributeError:
            pass
