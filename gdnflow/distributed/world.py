"""Which processes train together: launch detection, :func:`init`, and the world's state.

A process learns its place from how it was started:

- by ``mpirun``/``mpiexec`` (MPICH's Hydra or PMI: ``PMI_RANK``/``PMI_SIZE``;
  Open MPI: ``OMPI_COMM_WORLD_RANK``; PMIx: ``PMIX_RANK``): the world is
  mpi4py's ``COMM_WORLD``;
- by a launcher that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR`` and ``MASTER_PORT`` (torchrun, a SLURM script, gdnflow's own
  spawner): the ranks meet over a small TCP store (:mod:`gdnflow.distributed.store`)
  that rank 0 serves at MASTER_ADDR:MASTER_PORT, with no MPI at all;
- by neither: a world of one process, which imports no MPI.

The transport (MPI or the store) carries host objects and NumPy arrays; CUDA
arrays go over NCCL (:mod:`gdnflow.distributed.nccl`), whose unique id the
transport hands round. Every wait has a deadline (``timeout``, default 300 s,
or the environment variable ``GDNFLOW_DIST_TIMEOUT``): a peer that died,
raised or hangs becomes a :class:`DistributedError` naming it, not a hang.
"""
import os
import sys
import traceback
from typing import NamedTuple

from gdnflow.config import settings
from gdnflow.errors import GdnflowError

#: Seconds a collective may wait for its peers before it fails.
DEFAULT_TIMEOUT = 300.0
#: Variables by which an MPI launcher announces a rank (MPICH/Hydra, Open MPI, PMIx).
MPI_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID")
#: The variables of a launcher that is not MPI (torchrun's names).
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class DistributedError(GdnflowError, RuntimeError):
    """A collective failed: ranks disagree, a peer raised, died or did not answer in time.

    ``failed_rank`` is the rank the error is about (None when unknown);
    ``from_peer`` is true when this process learnt of the failure from
    another rank (it then does not report it further).
    """

    def __init__(self, message, failed_rank=None, from_peer=False):
        super().__init__(message)
        self.failed_rank = failed_rank
        self.from_peer = from_peer


class World(NamedTuple):
    """This process's place: ``rank`` of ``size`` processes, ``local_rank`` on its host
    (the GPU it uses), and ``backend``, the host transport ("mpi", "store" or "single")."""

    rank: int
    size: int
    local_rank: int
    backend: str


class _State:
    """The initialised world and its transport (one per process)."""

    world = None
    transport = None
    timeout = DEFAULT_TIMEOUT
    nccl = None             # the NCCL communicator, made on the first CUDA collective


_state = _State()


def detect_launcher(environ):
    """How this process was launched: "mpi", "launcher" (RANK/WORLD_SIZE) or "single"."""
    if any(name in environ for name in MPI_RANK_VARIABLES):
        return "mpi"
    if int(environ.get("WORLD_SIZE", "1")) > 1:
        missing = [name for name in LAUNCHER_VARIABLES if name not in environ]
        if missing:
            raise DistributedError(
                f"WORLD_SIZE={environ['WORLD_SIZE']} is set but {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not: a launcher without MPI must set "
                f"all of {', '.join(LAUNCHER_VARIABLES)} (or start the processes with mpirun)")
        return "launcher"
    return "single"


def timeout_from(environ, timeout):
    """The collectives' deadline in seconds: ``timeout``, else GDNFLOW_DIST_TIMEOUT, else 300."""
    if timeout is None:
        timeout = float(environ.get("GDNFLOW_DIST_TIMEOUT", DEFAULT_TIMEOUT))
    if not timeout > 0:
        raise ValueError(f"gdnflow.distributed: the timeout must be > 0 seconds, got {timeout!r}")
    return float(timeout)


def init(timeout=None, environ=None):
    """Join the world this process was launched into; return its :class:`World`.

    Idempotent: later calls return the same World. ``timeout`` (seconds) bounds
    every wait for peers. Under MPI or a RANK/WORLD_SIZE launcher with several
    processes per host, each process uses the GPU of its ``local_rank``
    (``settings.cuda_device``), so call ``init()`` before the first CUDA tensor.
    """
    if _state.world is not None:
        return _state.world
    environ = os.environ if environ is None else environ
    launcher = detect_launcher(environ)
    timeout = timeout_from(environ, timeout)
    if launcher == "mpi":
        from gdnflow.distributed.mpi import MpiTransport    # local import: mpi4py only under mpirun
        transport = MpiTransport(timeout)
    elif launcher == "launcher":
        from gdnflow.distributed.store import StoreTransport  # local import: sockets only when used
        transport = StoreTransport.from_environ(environ, timeout)
    else:
        from gdnflow.distributed.transport import SingleProcess  # local import: the world of one
        transport = SingleProcess()
    world = World(transport.rank, transport.size, transport.local_rank, transport.name)
    if world.size > 1:
        _use_local_gpu(world.local_rank)
        _install_failure_report()
    _state.world, _state.transport, _state.timeout = world, transport, timeout
    return world


def nccl_communicator():
    """The world's NCCL communicator (made on first use; every rank must ask at the same point)."""
    if _state.nccl is None:
        world = current()
        try:
            from gdnflow.distributed.nccl import Communicator  # local import: NCCL for CUDA only
        except ImportError as exc:
            raise DistributedError(
                f"CUDA collectives need NCCL through nccl4py ({exc}): pip install "
                "'gdnflow[nccl]' (nccl4py and nvidia-nccl-cu13)") from exc
        _state.nccl = Communicator(_state.transport, world.rank, world.size, _state.timeout)
    return _state.nccl


def _use_local_gpu(local_rank):
    """Make this process's CUDA runtime use GPU ``local_rank`` (before the runtime starts)."""
    from gdnflow.backends.cuda import runtime_started   # local import: the facade, no PyCUDA
    if runtime_started() and settings.cuda_device != local_rank:
        raise DistributedError(
            f"gdnflow.distributed.init(): the CUDA runtime already runs on GPU "
            f"{settings.cuda_device}, but this process is local rank {local_rank}; call init() "
            "before making the first CUDA tensor")
    settings.cuda_device = local_rank


def is_initialized():
    """True once :func:`init` has run."""
    return _state.world is not None


def current():
    """The World, initialising a world of one if :func:`init` has not run."""
    return init() if _state.world is None else _state.world


def transport():
    """The host transport of the world (initialising it if needed)."""
    current()
    return _state.transport


def rank():
    """This process's rank (0 in a world of one)."""
    return current().rank


def world_size():
    """The number of processes (1 without a launcher)."""
    return current().size


def local_rank():
    """This process's rank among those on its host (its GPU's index)."""
    return current().local_rank


def report_failure(exc):
    """Tell the other ranks that this one failed with ``exc``; they raise a
    :class:`DistributedError` naming this rank at their next (or current) collective.

    Called for an uncaught exception (the hook :func:`init` installs); call it
    yourself before leaving a rank on an exception you catch. Nothing for a
    failure that came from a peer, or in a world of one.
    """
    if _state.transport is None or getattr(exc, "from_peer", False):
        return
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    _state.transport.report_failure(message)


def _install_failure_report():
    """Uncaught exception: print it, tell the peers, then end this process's part.

    Under MPI the last step is ``MPI_Abort``, which ends the job (a rank that
    just returned would leave the others waiting in MPI_Finalize).
    """
    previous = sys.excepthook

    def report_and_abort(kind, exc, tb):
        previous(kind, exc, tb)
        sys.stderr.flush()
        try:
            report_failure(exc)
        finally:
            if _state.transport is not None:
                _state.transport.abort(1)
    sys.excepthook = report_and_abort
