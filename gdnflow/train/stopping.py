"""Stopping a training run on SIGINT (Ctrl-C) or SIGTERM (schedulers, ``timeout``) without loss.

A signal must not stop a step half-way: the optimiser may have updated
some parameters and not others, and a checkpoint of that state would not
continue the run. :class:`StopSignals` therefore turns the first signal
into a request that the training loop reads between steps; the loop then
saves a checkpoint of the last finished step and raises :class:`RunStopped`.

- ``StopSignals(defer=True)`` (the training loop): the first signal is a
  request (:attr:`StopSignals.requested`); a second one stops at once
  (RunStopped raised from the handler, nothing saved, the last checkpoint
  intact) unless a save is in progress (:meth:`StopSignals.protect`), which
  always finishes first.
- ``StopSignals(defer=False)`` (around the loop: locking, data loading):
  a signal raises RunStopped at once, so that ``finally`` blocks (the run
  folder's lock) still run.

Handlers are installed only in the main thread (Python runs signal
handlers there and nowhere else) and restored on leaving the block.
"""
import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunStopped(KeyboardInterrupt):
    """A run stopped by a signal; ``exit_status`` is 128 + the signal's number.

    A KeyboardInterrupt, so that ``except Exception`` blocks on the way do not
    swallow it, and code that catches Ctrl-C catches SIGTERM's stop too.
    """

    def __init__(self, signum, message):
        super().__init__(message)
        self.signum = signum
        self.exit_status = 128 + signum


def signal_name(signum):
    """``SIGTERM`` for 15, and so on."""
    return signal.Signals(signum).name


class StopSignals:
    """``with StopSignals() as stop:`` SIGINT and SIGTERM ask for a stop instead of killing.

    ``received``: the first signal's number (None: none yet). See the module
    docstring for ``defer``.
    """

    def __init__(self, defer=True, signals=STOP_SIGNALS):
        self.defer = defer
        self.signals = tuple(signals)
        self.received = None
        self._protected = False
        self._previous = {}

    @property
    def signal(self):
        """The signal the run stops for (None: no stop): here the first one received."""
        return self.received

    @property
    def requested(self):
        """True once the run is to stop (a stop signal arrived)."""
        return self.signal is not None

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
            if self.defer:
                return                  # the loop stops after the current step
            raise RunStopped(signum, f"stopped by {signal_name(signum)} before training started")
        if self._protected:
            return                      # a save is running: it finishes first
        raise RunStopped(self.received, f"stopped at once by a second {signal_name(signum)}, "
                         "without saving: the last checkpoint is kept and --resume continues "
                         "from it")

    @contextlib.contextmanager
    def protect(self):
        """A block (a save) that signals do not interrupt; a stop is still recorded."""
        before, self._protected = self._protected, True
        try:
            yield
        finally:
            self._protected = before

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            # None: a handler installed from C, which Python cannot put back.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
        return False
