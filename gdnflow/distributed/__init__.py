"""Data-parallel training: the same model on every rank, gradients averaged over NCCL or MPI.

::

    from gdnflow import distributed as dist
    world = dist.init()                 # World(rank, size, local_rank, backend)
    model = dist.DataParallel(model)    # same parameters everywhere, from rank 0
    for batch in my_shard:              # each rank its own part of the data
        loss = criterion(model(batch), batch)
        optimizer.zero_grad()
        loss.backward()                 # gradients averaged over the ranks, in buckets
        optimizer.step()

Launch with ``mpirun -np N python train.py`` (or ``gdnflow train --gpus N``),
or with any launcher that sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT;
without one it is a world of one process. CUDA tensors go over NCCL
(nccl4py), NumPy arrays and host objects over MPI (mpi4py) or a small TCP
store. docs/distributed.md explains launching, failures and scaling.
"""
from gdnflow.distributed.collectives import (all_gather_object, all_reduce, barrier, broadcast,
                                             check_same)
from gdnflow.distributed.data_parallel import DataParallel
from gdnflow.distributed.world import (DistributedError, World, init, is_initialized, local_rank,
                                       rank, report_failure, world_size)

__all__ = ["DataParallel", "DistributedError", "World", "all_gather_object", "all_reduce",
           "barrier", "broadcast", "check_same", "init", "is_initialized", "local_rank", "rank",
           "report_failure", "world_size"]
