"""The MPI transport: mpi4py's COMM_WORLD, with deadlines and failure notices.

Collectives are non-blocking MPI calls (``Iallreduce`` on the buffer in place,
``Ibcast``, an all-gather of pickled objects) completed by polling ``Test``
until a deadline, so nothing waits forever. While polling, a rank also
listens on a duplicate of COMM_WORLD kept for failure traffic:

- a *failure notice* (a rank raised: :func:`~gdnflow.distributed.world.report_failure`)
  makes the waiting rank raise a DistributedError naming the failed rank;
- a *ping* (a rank timed out) is answered with a *pong* saying which
  collective this rank waits in, so the rank that timed out can name the ranks
  that did not answer (dead, or stuck outside gdnflow's collectives) or that
  lag behind.

All ranks must call the collectives in the same order (as MPI requires).
"""
import pickle
import time

import numpy as np
from mpi4py import MPI

from gdnflow.distributed.transport import Transport
from gdnflow.distributed.world import DistributedError

FAILURE, PING, PONG = 1, 2, 3           # message tags on the failure communicator
#: Seconds a rank that timed out waits for the others to answer its ping.
PING_GRACE = 2.0
#: Seconds a failing rank waits after its notice before ending the job.
ABORT_GRACE = 1.0
_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}


class MpiTransport(Transport):
    """Host collectives over MPI's COMM_WORLD; see the module docstring."""

    name = "mpi"

    def __init__(self, timeout):
        self.comm = MPI.COMM_WORLD
        self.control = self.comm.Dup()      # failure notices and pings, apart from the data
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.local_rank = self.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        self.timeout = timeout
        self.sequence = 0       # collectives begun so far: what a pong reports
        self.current = "init"
        self._sends = []        # outstanding control messages (kept until complete)

    # ---------------------------------------------------------- collectives --
    def all_gather_object(self, obj):
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        sizes = np.zeros(self.size, dtype=np.int64)
        self._complete(self.comm.Iallgather(np.array([data.size], dtype=np.int64), sizes),
                       "all_gather_object (sizes)")
        gathered = np.empty(int(sizes.sum()), dtype=np.uint8)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self._complete(self.comm.Iallgatherv(data, [gathered, sizes, offsets, MPI.BYTE]),
                       "all_gather_object")
        return [pickle.loads(gathered[o:o + s].tobytes()) for o, s in zip(offsets, sizes)]

    def start_all_reduce(self, array):
        request = self.comm.Iallreduce(MPI.IN_PLACE, [array, _mpi_type(array)], op=MPI.SUM)
        return _Request(self, request, f"all_reduce of {array.size} elements")

    def broadcast_array(self, array, root):
        self._complete(self.comm.Ibcast([array, _mpi_type(array)], root=root),
                       f"broadcast of {array.size} elements from rank {root}")

    def barrier(self):
        self._complete(self.comm.Ibarrier(), "barrier")

    # ------------------------------------------------------------- failure --
    def report_failure(self, message):
        payload = pickle.dumps((self.rank, message))
        self._sends += [self.control.Isend([payload, MPI.BYTE], dest=peer, tag=FAILURE)
                        for peer in range(self.size) if peer != self.rank]

    def abort(self, code):
        # The grace lets the notices leave and the other ranks print their
        # error before MPI_Abort ends every process of the job.
        deadline = time.monotonic() + ABORT_GRACE
        while time.monotonic() < deadline and not MPI.Request.Testall(self._sends):
            time.sleep(0.01)
        time.sleep(max(0.0, deadline - time.monotonic()))
        self.comm.Abort(code)

    # ------------------------------------------------------------- waiting --
    def _complete(self, request, what):
        """Wait for ``request`` (the collective ``what``) with the deadline; see the module docstring."""
        self.sequence += 1
        self.current = what
        deadline = time.monotonic() + self.timeout
        pause = 1e-5
        while not request.Test():
            self._serve_control()
            if time.monotonic() > deadline:
                raise self._timed_out(what)
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)

    def _serve_control(self):
        """Raise on a peer's failure notice; answer pings."""
        status = MPI.Status()
        while self.control.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            source, tag = status.Get_source(), status.Get_tag()
            payload = bytearray(status.Get_count(MPI.BYTE))
            self.control.Recv([payload, MPI.BYTE], source=source, tag=tag)
            if tag == FAILURE:
                failed, message = pickle.loads(payload)
                raise DistributedError(
                    f"rank {self.rank}: rank {failed} failed during {self.current}: {message}",
                    failed_rank=failed, from_peer=True)
            if tag == PING:
                answer = pickle.dumps((self.sequence, self.current))
                self._sends.append(self.control.Isend([answer, MPI.BYTE], dest=source, tag=PONG))

    def _timed_out(self, what):
        """The error for a collective that did not finish in time, naming the ranks to blame."""
        peers = [peer for peer in range(self.size) if peer != self.rank]
        self._sends += [self.control.Isend([b"", MPI.BYTE], dest=peer, tag=PING) for peer in peers]
        answers = {}
        deadline = time.monotonic() + min(PING_GRACE, self.timeout)
        status = MPI.Status()
        while len(answers) < len(peers) and time.monotonic() < deadline:
            if self.control.Iprobe(source=MPI.ANY_SOURCE, tag=PONG, status=status):
                payload = bytearray(status.Get_count(MPI.BYTE))
                self.control.Recv([payload, MPI.BYTE], source=status.Get_source(), tag=PONG)
                answers[status.Get_source()] = pickle.loads(payload)
            else:
                self._serve_control()
                time.sleep(1e-3)
        silent = [peer for peer in peers if peer not in answers]
        behind = [f"rank {peer} is at collective #{seq} ({where})"
                  for peer, (seq, where) in sorted(answers.items()) if seq != self.sequence]
        blame = []
        if silent:
            blame.append(f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} "
                         "did not answer (dead, or busy outside gdnflow's collectives)")
        blame += behind
        return DistributedError(
            f"rank {self.rank}: {what} (collective #{self.sequence}) did not complete within "
            f"{self.timeout:g} s: {'; '.join(blame) or 'every rank answered but it did not finish'}",
            failed_rank=silent[0] if silent else None)


class _Request:
    """A started all-reduce; ``wait()`` completes it under the deadline."""

    def __init__(self, transport, request, what):
        self.transport, self.request, self.what = transport, request, what

    def wait(self):
        """Wait for the sum (raises DistributedError on a failure or the deadline)."""
        self.transport._complete(self.request, self.what)


def _mpi_type(array):
    if not array.flags.c_contiguous or array.dtype not in _MPI_TYPES:
        raise TypeError(f"MPI collectives take contiguous float32 or float64 arrays, got "
                        f"{array.dtype} (contiguous: {array.flags.c_contiguous})")
    return _MPI_TYPES[array.dtype]
