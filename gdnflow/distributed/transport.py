"""What a host transport does, and the world of one process, which needs none.

A transport moves host data between the ranks: picklable objects
(:meth:`Transport.all_gather_object`) and NumPy arrays (all-reduce,
broadcast), and tells the ranks when one of them failed. Every wait is
bounded by the world's timeout; a failure becomes a
:class:`~gdnflow.distributed.world.DistributedError` naming the rank.
Implementations: :class:`SingleProcess` here, MPI
(:mod:`gdnflow.distributed.mpi`) and the TCP store (:mod:`gdnflow.distributed.store`).
"""


class Transport:
    """The interface: ``rank``, ``size``, ``local_rank``, ``name`` and the methods below."""

    name = None
    rank = 0
    size = 1
    local_rank = 0

    def all_gather_object(self, obj):
        """[obj of rank 0, obj of rank 1, ...] on every rank (pickled objects)."""
        raise NotImplementedError

    def all_reduce_array(self, array):
        """Sum the NumPy ``array`` over the ranks, in place (float32 or float64, contiguous)."""
        self.start_all_reduce(array).wait()

    def start_all_reduce(self, array):
        """Begin the in-place sum of ``array``; return a request whose ``wait()`` finishes it."""
        raise NotImplementedError

    def broadcast_array(self, array, root):
        """Copy rank ``root``'s ``array`` into every rank's ``array``, in place."""
        raise NotImplementedError

    def barrier(self):
        """Return once every rank has called it."""
        self.all_gather_object(None)

    def report_failure(self, message):
        """Tell the other ranks that this one failed with ``message``."""

    def abort(self, code):
        """After an uncaught exception: end this rank's part (under MPI: the whole job)."""


class Done:
    """A request that is already complete."""

    def wait(self):
        """Nothing to wait for."""


class SingleProcess(Transport):
    """The world of one: every collective is the identity."""

    name = "single"

    def all_gather_object(self, obj):
        return [obj]

    def start_all_reduce(self, array):
        return Done()

    def broadcast_array(self, array, root):
        if root != 0:
            raise ValueError(f"broadcast from rank {root} in a world of one process")
