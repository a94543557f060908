"""``gdnflow train --gpus N``: N processes on this host, one per GPU, running the same command.

The launcher checks that the host has N GPUs, then starts the ranks:
through ``mpiexec -n N`` when an MPI launcher is installed (next to the
Python interpreter, as the ``mpich`` wheel puts it, or on PATH) and mpi4py
can be imported (and, as root, the launcher is not Open MPI's, which refuses
root), else itself,
setting RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for
:func:`gdnflow.distributed.init`. Each rank runs the same ``gdnflow train``
command line (``--gpus N`` included: inside a world of N ranks it starts
nothing) and uses GPU ``LOCAL_RANK`` of those visible (``init`` sets
``settings.cuda_device``; CUDA_VISIBLE_DEVICES chooses which GPUs are seen).

The ranks run in their own sessions, so a terminal's Ctrl-C reaches only
the launcher, which passes SIGINT and SIGTERM on, once, to every rank (or to
mpiexec, which does the same). When a rank it started itself ends with an
error, the others (told by the rank's failure notice) get ``GRACE`` seconds
to stop before they are terminated.
"""
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gdnflow.train.stopping import STOP_SIGNALS

#: Seconds the other ranks get to stop after one failed, before they are terminated.
GRACE = 30.0


def gpu_count():
    """The number of CUDA devices this process sees (0 without PyCUDA or a driver)."""
    try:
        import pycuda.driver as drv     # local import: PyCUDA may be absent (then no GPU)
        drv.init()
        return drv.Device.count()
    except Exception:                   # ImportError, or the driver's error without a GPU
        return 0


def check_gpus(requested, available):
    """Raise ValueError unless ``requested`` GPUs are at most the ``available`` ones."""
    if requested > available:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise ValueError(f"--gpus {requested}: this host has {available} usable GPU"
                         f"{'' if available == 1 else 's'}{seen}; ask for at most {available}, "
                         "or use mpirun across several hosts")


def find_mpiexec():
    """The path of ``mpiexec`` next to the Python interpreter or on PATH, or None.

    None also where mpi4py cannot be imported: ranks that mpiexec starts join
    their world through mpi4py, so without it the launcher starts them itself
    (an MPI installed for other programs is then left alone); and None as root
    where the launcher is Open MPI's, which refuses to run as root.
    """
    if importlib.util.find_spec("mpi4py") is None:
        return None
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is not None and os.geteuid() == 0 and is_open_mpi(found):
        return None     # Open MPI refuses to start ranks as root: start them ourselves
    return found


def is_open_mpi(mpiexec):
    """True if ``mpiexec --version`` names Open MPI (whose launcher refuses to run as root).

    Measured on the H200 host (root, system Open MPI and mpi4py): ``gdnflow train
    --gpus 2`` through it stopped at once with Open MPI's refusal.
    """
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = (done.stdout + done.stderr).lower()
    return "open mpi" in text or "openrte" in text


def rank_command(argv):
    """The command line of one rank: this Python running ``gdnflow`` with ``argv``."""
    return [sys.executable, "-m", "gdnflow.cli", *argv]


def free_port():
    """A TCP port free on this host now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launches(command, ranks, mpiexec):
    """[(command line, environment)] of the processes to start for ``ranks`` ranks of
    ``command`` (one rank's command line, such as :func:`rank_command`'s)."""
    if mpiexec:
        return [([mpiexec, "-n", str(ranks), *command], dict(os.environ))]
    common = {**os.environ, "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks),
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return [(list(command), {**common, "RANK": str(r), "LOCAL_RANK": str(r)})
            for r in range(ranks)]


def spawn(command, ranks, mpiexec=None, log=print):
    """Run ``ranks`` ranks of ``command`` on this host; return the exit status.

    ``command`` is one rank's command line: ``rank_command(argv)`` for
    ``gdnflow argv`` (what ``gdnflow train --gpus N`` runs), or any program
    that calls :func:`gdnflow.distributed.init` (a benchmark's ranks).
    0 when every rank succeeded; a stopped run's 128 + signal; otherwise the
    first failing rank's status (a rank killed by a signal is reported by
    ``log``, as it could not say so itself).
    """
    processes = [subprocess.Popen(line, env=env, start_new_session=True)
                 for line, env in launches(command, ranks, mpiexec)]

    def forward(signum, frame):
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in STOP_SIGNALS}
    try:
        return _wait(processes, log)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait(processes, log):
    """Wait for every process; stop the rest ``GRACE`` seconds after one failed."""
    stopped = {128 + signum for signum in STOP_SIGNALS}
    failed, deadline = None, None
    while any(p.poll() is None for p in processes):
        for rank, process in enumerate(processes):
            code = process.poll()
            if failed is None and code not in (None, 0) and code not in stopped:
                failed, deadline = rank, time.monotonic() + GRACE
                if code < 0:
                    log(f"gdnflow train: rank {rank} was killed by "
                        f"{signal.Signals(-code).name}; stopping the other ranks")
        if deadline is not None and time.monotonic() > deadline:
            for process in processes:
                if process.poll() is None:
                    process.kill()
        time.sleep(0.05)
    codes = [p.returncode for p in processes]
    if failed is not None:
        return codes[failed] if codes[failed] > 0 else 1
    return next((code for code in codes if code), 0)


__all__ = ["spawn", "rank_command", "gpu_count", "check_gpus", "find_mpiexec", "is_open_mpi",
           "launches"]
