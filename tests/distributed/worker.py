"""What each rank runs in the MPI tests (``mpiexec -n N python worker.py SCENARIO ...``).

Scenarios:

``train GLOBAL_BATCH STEPS OUT [DEVICE [MODE]]``
    train a small autoencoder (conv, GDN, transposed conv; MSE; Adam) on a
    fixed sequence of random 16x16 crops; each step's global batch of
    GLOBAL_BATCH crops is split between the ranks in rank order. Rank 0 writes
    the losses (the mean over the global batch) and the final weights to OUT
    (.npz). A world of one runs the same code. DEVICE: numpy (default) or
    cuda (each rank on GPU LOCAL_RANK, gradients over NCCL); MODE: eager
    (default) or captured (steps through gdnflow.compile_step).
``mismatch``
    rank 1 builds a wider model; every rank prints the DataParallel error.
``raise``
    rank 1 raises ValueError at step 3; the others must stop naming it.
``hang``
    rank 1 sleeps at step 2 without taking part; the others must time out naming it.
"""
import itertools
import sys
import time

import numpy as np

import gdnflow as gf
from gdnflow import distributed as dist

from distributed_kit import SEED, autoencoder


def batches(global_batch, steps, device=None):
    """This rank's part of each step's global batch (the same crops whatever the world size)."""
    world = dist.init()
    per_rank = global_batch // world.size
    rng = np.random.default_rng(SEED + 1)
    for _ in range(steps):
        crops = rng.random((global_batch, 3, 16, 16), dtype=np.float32)
        yield gf.tensor(crops[world.rank * per_rank:(world.rank + 1) * per_rank], device=device)


def train(global_batch, steps, out=None, fail=None, device=None, captured=False):
    """Train; ``fail``: (rank, step, what) makes that rank raise or hang at that step;
    ``captured``: each step through :func:`gdnflow.compile_step` (a CUDA graph on the GPU)."""
    world = dist.init()
    model = dist.DataParallel(autoencoder(device=device), bucket_bytes=1024)  # several buckets
    optimizer = gf.optim.Adam(model.parameters(), lr=1e-3)

    def step_function(batch, step=None):
        loss = ((model(batch) - batch) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"loss": dist.all_reduce(loss.detach().reshape(1), "mean")}

    data = batches(global_batch, steps, device)
    first = next(data)
    run = gf.compile_step(step_function, first) if captured else step_function
    losses = []
    for step, batch in enumerate(itertools.chain([first], data)):
        if fail and fail[0] == world.rank and fail[1] == step:
            if fail[2] == "raise":
                raise ValueError(f"boom at step {step}")
            time.sleep(60)
        losses.append(run(batch)["loss"].item())
    if out and world.rank == 0:
        weights = {name: p.numpy() for name, p in model.named_parameters()}
        np.savez(out, losses=np.array(losses), **weights)


def main(scenario, *args):
    world = dist.init()
    if scenario == "train":
        device, mode = (list(args[3:]) + [None, "eager"])[:2]
        train(int(args[0]), int(args[1]), args[2], device=device, captured=mode == "captured")
    elif scenario == "mismatch":
        try:
            dist.DataParallel(autoencoder(channels=8 if world.rank != 1 else 12))
        except dist.DistributedError as exc:
            print(f"rank {world.rank} caught: {exc}", flush=True)
    elif scenario in ("raise", "hang"):
        train(8, 6, fail=(1, 3 if scenario == "raise" else 2, scenario))
    else:
        raise SystemExit(f"worker.py: unknown scenario {scenario!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
