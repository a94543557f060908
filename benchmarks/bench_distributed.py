"""DataParallel's cost on one GPU: FactorizedPrior(128, 192) training step, plain vs over NCCL.

    python benchmarks/bench_distributed.py --out benchmarks/results/distributed.md

A world of one process: the wrapped step really runs NCCL (a communicator of
one rank), bucketed (``--bucket-mb``, default 4), each bucket copied into its
flat buffer, all-reduced (ncclAvg) and copied back on the separate
communication stream. Both steps: batch 16 of random 256x256 images, loss
lambda 255^2 MSE + bpp (lambda 0.0130), Adam 1e-4 on every parameter
(quantiles included: one optimiser, so both steps do the same work but the
reduction). Timing: CUDA events on gdnflow's stream, warm-up, median
(``gdnflow.benchmarking.time_gdnflow``). One instrumented step places each
bucket's reduction (events on the communication stream) against the
backward (events on gdnflow's stream); the goal is a step at most 3% slower.
"""
import argparse

import numpy as np

from gdnflow import benchmarking as harness
import gdnflow as gf
from gdnflow import distributed as dist
from gdnflow.models import FactorizedPrior
from gdnflow.train.losses import RateDistortionLoss


def make_step(wrap, bucket_bytes, batch):
    """(step function, the DataParallel or None, the model) for a fresh FactorizedPrior(128, 192)."""
    model = FactorizedPrior(128, 192, seed=0, device="cuda")
    trained = dist.DataParallel(model, bucket_bytes=bucket_bytes) if wrap else model
    optimizer = gf.optim.Adam(trained.parameters(), lr=1e-4)
    criterion = RateDistortionLoss()

    def step(on_backward=None):
        loss = criterion(trained(batch), batch)["loss"]
        optimizer.zero_grad()
        if on_backward:
            on_backward("start")
        loss.backward()
        if on_backward:
            on_backward("end")
        optimizer.step()
    return step, (trained if wrap else None), model


def timeline(step, ddp):
    """One step's backward on gdnflow's stream and each bucket's reduction, ms from backward start."""
    import pycuda.driver as drv     # local import: PyCUDA on the GPU machine only
    stream = harness.gdnflow_stream()
    marks = {"start": drv.Event(), "end": drv.Event()}
    step(lambda which: marks[which].record(stream))
    marks["end"].synchronize()
    origin = marks["start"]
    rows = [(b.index, b.nbytes, b.started.time_since(origin), b.done.time_since(origin))
            for b in (ddp.buckets if ddp else [])]
    return marks["end"].time_since(origin), rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    world = dist.init()
    images = np.random.default_rng(0).random((16, 3, 256, 256), dtype=np.float32)
    batch = gf.tensor(images, device="cuda")
    bucket_bytes = int(args.bucket_mb * (1 << 20))
    results = {}
    for name, wrap in (("plain", False), ("DataParallel (NCCL)", True)):
        step, ddp, model = make_step(wrap, bucket_bytes, batch)
        ms = harness.time_gdnflow(step, warmup=10, repeats=args.repeats)
        backward_ms, rows = timeline(step, ddp)
        results[name] = (ms, backward_ms, rows, model)
    plain, wrapped = results["plain"], results["DataParallel (NCCL)"]
    parameters = sum(p.size for p in plain[3].parameters())
    steps = harness.markdown_table(
        "DataParallel on one GPU: FactorizedPrior(128, 192), batch 16 x 256x256",
        ["step", "ms", "backward ms", "vs plain"],
        [[name, f"{ms:.2f}", f"{backward_ms:.2f}", f"{100 * (ms / plain[0] - 1):+.1f}%"]
         for name, (ms, backward_ms, _, _) in results.items()],
        notes=[f"world of {world.size} (an NCCL communicator of one rank); {parameters / 1e6:.2f} M "
               f"parameters = {parameters * 4 / 1e6:.1f} MB of float32 gradients; buckets of "
               f"{args.bucket_mb:g} MB; median of {args.repeats} steps (CUDA events)",
               "backward ms: one instrumented step, from the start of loss.backward() to its "
               "return on gdnflow's stream (wrapped: including the wait for the last bucket)"])
    buckets = harness.markdown_table(
        "Each bucket's reduction against the backward (ms from the start of backward)",
        ["bucket", "MB", "reduction starts", "ends", "inside the unwrapped backward"],
        [[index, f"{nbytes / 1e6:.2f}", f"{started:.3f}", f"{done:.3f}",
          f"{100 * max(0.0, min(done, plain[1]) - started) / max(done - started, 1e-9):.0f}%"]
         for index, nbytes, started, done in wrapped[2]],
        notes=[f"the unwrapped backward takes {plain[1]:.2f} ms: a reduction inside it is hidden "
               "behind the backward's kernels; one after it adds to the step"])
    harness.emit(steps + "\n" + buckets, args.out)

if __name__ == "__main__":
    main()
