"""One training run over several processes (data parallel): what each rank does.

Started by ``mpirun -np N gdnflow train ...``, by ``gdnflow train --gpus N``
(:mod:`gdnflow.train.spawn`) or by any launcher that :func:`gdnflow.distributed.init`
understands, every rank runs the same command; :func:`gdnflow.train.train`
then trains with a :class:`DistributedTrainer`:

- Data: ``--batch-size`` is the global batch B; rank r of n trains on
  samples [r B/n, (r + 1) B/n) of each step's batch, drawn from the whole
  batch's plan (:func:`gdnflow.data.images.shard_slice`), with those
  samples' quantisation noise (``settings.noise_sample_offset``). The ranks'
  batches together are exactly the one-process batch of the same seed and
  step, so the run is the one-process run up to float32 rounding of the
  averages, and a checkpoint resumes with any number of ranks.
- Gradients: :class:`gdnflow.distributed.DataParallel` averages the main
  loss's gradients in buckets during its backward; the auxiliary loss is a
  function of the parameters only, the same on every rank, so its backward
  needs none. The logged loss, bpp and MSE are averaged over the ranks (the
  whole batch's values); the gradient norm and the auxiliary loss are the
  same on every rank.
- Files and output: only rank 0 holds the run folder's lock and writes the
  checkpoint, the histories and the pictures; the other ranks print nothing
  but errors. Every rank evaluates (the same parameters, the same images:
  no rank waits for another in a collective while rank 0 evaluates).
- Stopping: a rank that receives SIGINT or SIGTERM finishes its step; after
  every step the ranks agree (an all-gather of the signals received), so all
  stop after the same step and rank 0 saves it. A rank that fails reports it
  to the others (:func:`gdnflow.distributed.report_failure`), which stop with
  an error naming it.
"""
import contextlib
import dataclasses
import logging
import os

from gdnflow import distributed as dist
from gdnflow.config import settings
from gdnflow.data.images import shard_slice
from gdnflow.distributed.data_parallel import BUCKET_BYTES
from gdnflow.train.stopping import STOP_SIGNALS, StopSignals
from gdnflow.train.trainer import Trainer

#: TrainConfig fields that may differ between ranks: they change no value of the run.
PER_RANK_FIELDS = ("quiet", "workers", "prefetch")


class AgreedStopSignals(StopSignals):
    """StopSignals whose stop all ranks agree on: :meth:`agree` after each step.

    ``received`` is this rank's own first signal (its second one still stops
    at once, as for one process); ``signal``, the stop the run acts on, is
    the first signal any rank had received at the last :meth:`agree`.
    """

    def __init__(self, defer=True, signals=STOP_SIGNALS):
        super().__init__(defer, signals)
        self.agreed = None

    @property
    def signal(self):
        return self.agreed

    def agree(self):
        """Every rank calls it at the same point: afterwards all have the same ``signal``."""
        if self.agreed is None:
            votes = dist.all_gather_object(self.received)
            self.agreed = next((vote for vote in votes if vote is not None), None)
        return self.agreed


def run_options(config):
    """The fields of ``config`` that every rank must share (all but PER_RANK_FIELDS)."""
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in PER_RANK_FIELDS}


def check_same_options(config):
    """Raise DistributedError naming the options in which some rank's ``config`` differs from
    rank 0's (the ranks were not started with one command line)."""
    every = dist.all_gather_object(run_options(config))
    for rank, options in enumerate(every):
        differing = [f"{k}: rank 0 has {every[0][k]!r}, rank {rank} {options.get(k)!r}"
                     for k in every[0] if options.get(k) != every[0][k]]
        if differing:
            raise dist.DistributedError(
                f"the ranks were started with different training options ({'; '.join(differing)})"
                ": start every rank with the same command", failed_rank=rank)


class DistributedTrainer(Trainer):
    """A :class:`Trainer` for one rank of a data-parallel run (see the module docstring).

    ``world``: this process's :class:`gdnflow.distributed.World` (default
    :func:`gdnflow.distributed.init`). Raises ValueError if the batch does not
    split evenly over the ranks, DistributedError if the ranks' options or
    models differ.
    """

    stop_signals = AgreedStopSignals

    def __init__(self, config, world=None, bucket_bytes=BUCKET_BYTES):
        world = world or dist.init()
        self.world = world
        self.shard = (world.rank, world.size)
        samples = shard_slice(config.batch_size, self.shard)      # refused before any work
        self.writes_files = world.rank == 0
        check_same_options(config)
        super().__init__(config)
        # This process draws the noise of its samples of every batch, whichever step it is.
        settings.noise_sample_offset = samples.start
        self.ddp = dist.DataParallel(self.model, bucket_bytes=bucket_bytes)
        self._alone = False     # True: steps take part in no collective

    def _forward_backward(self, x, noise_stream):
        terms, aux = super()._forward_backward(x, noise_stream)
        if not self._alone:
            for key in ("loss", "bpp", "mse"):      # this rank's means -> the whole batch's
                terms[key] = dist.all_reduce(terms[key].reshape(1), op="mean")
        return terms, aux

    def _stop_compiled_non_finite(self, bad, values):
        # Each rank reads the compiled steps' flag when its GPU has finished them
        # (flush(wait=False)), so ranks find a NaN at different steps of the loop: the
        # rerun that locates it must not wait in a collective that the others, still
        # training, never join. It runs on this rank's samples alone, then raises.
        self._alone = True
        try:
            with self.ddp.no_sync():
                super()._stop_compiled_non_finite(bad, values)
        finally:
            self._alone = False

    def local_gradients(self):
        return self.ddp.no_sync()

    def _loop_step(self, batch, bar, stop):
        super()._loop_step(batch, bar, stop)
        stop.agree()


@contextlib.contextmanager
def quiet_unless(speaking):
    """The block prints nothing on stdout and logs only errors unless ``speaking`` (rank 0)."""
    if speaking:
        yield
        return
    log = logging.getLogger("gdnflow")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            yield
    finally:
        log.setLevel(level)


__all__ = ["DistributedTrainer", "AgreedStopSignals", "check_same_options", "quiet_unless"]
