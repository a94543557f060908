"""The collectives of :mod:`gdnflow.distributed`, on Tensors or backend arrays.

NumPy arrays go through the host transport (MPI, the TCP store); in a world
of one they are left as they are. CUDA arrays go through NCCL (a communicator
of one rank in a world of one), queued on gdnflow's stream: ordered after the
kernels that made them, before the ones that read them, with no host
synchronisation. Reductions run in the array's dtype (float32).
"""
import hashlib
import pickle

import numpy as np

from gdnflow.distributed import world as _world
from gdnflow.distributed.world import DistributedError
from gdnflow.tensor import Tensor

#: What ``all_reduce`` computes.
OPS = ("sum", "mean")


def all_reduce(t, op="sum"):
    """Sum (``op="sum"``) or average (``"mean"``) ``t`` over the ranks, in place; return ``t``.

    ``t`` is a Tensor or a backend array (NumPy or CUDA, float32; float64 on
    NumPy). The mean is the sum scaled by 1 / world size (on CUDA, NCCL's
    average). CUDA arrays always go through NCCL, in a world of one too.
    """
    if op not in OPS:
        raise ValueError(f"all_reduce: op must be one of {', '.join(OPS)}, got {op!r}")
    array, device = _array_of(t)
    world = _world.current()
    if not array.size:
        return t
    if device == "cuda":
        _world.nccl_communicator().all_reduce(array, op, stream=None)
    elif world.size > 1:
        _world.transport().all_reduce_array(_host_buffer(array, "all_reduce"))
        if op == "mean":
            array *= array.dtype.type(1.0 / world.size)
    return t


def broadcast(t, root=0):
    """Copy rank ``root``'s values of ``t`` into ``t`` on every rank, in place; return ``t``.

    A Tensor broadcast is marked changed (:meth:`~gdnflow.tensor.Tensor.mark_changed`).
    """
    array, device = _array_of(t)
    world = _world.current()
    if not 0 <= root < world.size:
        raise ValueError(f"broadcast: root {root} is not a rank of a world of {world.size}")
    if not array.size or (world.size == 1 and device != "cuda"):
        return t
    if device == "cuda":
        _world.nccl_communicator().broadcast(array, root, stream=None)
    else:
        _world.transport().broadcast_array(_host_buffer(array, "broadcast"), root)
    if isinstance(t, Tensor):
        t.mark_changed()
    return t


def barrier():
    """Return once every rank has called it (host only: queued GPU work is not waited for)."""
    _world.transport().barrier()


def all_gather_object(obj):
    """[``obj`` of rank 0, of rank 1, ...] on every rank: small picklable host objects."""
    return _world.transport().all_gather_object(obj)


def check_same(what, value):
    """Raise a DistributedError if ``value`` (picklable) is not equal on every rank.

    The message names ``what``, the ranks that differ from rank 0 and both
    values (shortened). Compared by a digest of the pickled value, so large
    values cost one small all-gather.
    """
    data = pickle.dumps(value)
    digest = hashlib.sha256(data).hexdigest()
    summary = repr(value)
    if len(summary) > 300:
        summary = summary[:300] + "..."
    gathered = all_gather_object((digest, summary))
    differ = [r for r, (d, _) in enumerate(gathered) if d != gathered[0][0]]
    if differ:
        details = "; ".join(f"rank {r}: {gathered[r][1]}" for r in differ)
        raise DistributedError(
            f"{what} differ across ranks: rank 0 has {gathered[0][1]}, but {details}",
            failed_rank=differ[0])


def _array_of(t):
    """(backend array, device) of a Tensor, NumPy array or CudaArray."""
    if isinstance(t, Tensor):
        return t.data, t.device
    if isinstance(t, np.ndarray):
        return t, "numpy"
    if hasattr(t, "ptr") and hasattr(t, "dtype"):
        return t, "cuda"
    raise TypeError(f"expected a Tensor or a backend array, got {type(t).__name__}")


def _host_buffer(array, what):
    """``array`` itself: MPI reduces in place, so it must be contiguous (no hidden copy)."""
    if not array.flags.c_contiguous:
        raise ValueError(f"{what}: the NumPy array must be C-contiguous (it is reduced in place)")
    return array
