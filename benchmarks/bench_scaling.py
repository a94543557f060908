"""Data-parallel scaling on the GPUs of one host: FactorizedPrior(128, 192), batch 16 of 256x256 per GPU.

    python benchmarks/bench_scaling.py --ranks 1,2 --out benchmarks/results/scaling.md

For each world size in ``--ranks`` the script starts that many ranks of
itself, as ``gdnflow train --gpus N`` starts its ranks (one process a GPU,
the TCP store, NCCL; :func:`gdnflow.train.spawn.spawn`). Each rank builds the
trainer that ``gdnflow train`` runs (:class:`~gdnflow.train.distributed_run.DistributedTrainer`:
DataParallel in buckets, the loss terms averaged over the ranks, clipping,
two Adam optimisers) on its own random batch of 16 crops, and measures:

- the captured step back to back (``Trainer.queue_step`` and the host's
  per-step stop vote, as ``gdnflow train``'s loop runs them; batch copied
  from host memory each step): wall ms per step, median of 3 rounds;
- the eager step (``Trainer.train_step``): CUDA events, median;
- the reduction against the backward: the same model and buckets stepped
  by hand (``bench_distributed.make_step``), each bucket's reduction placed
  against this rank's unwrapped backward; the all-reduce ms per step (the
  buckets' reductions, end to end on the communication stream) and the share
  of it inside the unwrapped backward (hidden behind its kernels);
- the GPU memory the rank holds (``cuMemGetInfo``: total - free on its GPU,
  the CUDA context and NCCL's buffers included).

Each rank writes its figures as it measures them (a stage that fails or
hangs, stopped by ``--watchdog``, leaves '-' in the table and the ranks'
tracebacks in their output); the slowest rank's step is the world's.
Scaling efficiency at N GPUs = step ms at 1 GPU / step ms at N (the work per
GPU is constant). Results go to ``--out`` as a markdown table.
"""
import argparse
import faulthandler
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

#: Crops per GPU and their side, as the scaling issue asks.
PER_GPU_BATCH, SIDE = 16, 256
LMBDA = 0.013


def measure_rank(args, save):
    """One rank's figures, each passed to ``save(row)`` as soon as it is measured (so a
    stage that fails or hangs leaves the ones before it); run inside a world of ranks."""
    import pycuda.driver as drv     # local import: the ranks run on GPUs only

    import gdnflow as gf
    from gdnflow import benchmarking as harness
    from gdnflow import distributed as dist
    from gdnflow.train import TrainConfig
    from gdnflow.train.distributed_run import DistributedTrainer
    from bench_distributed import make_step, timeline

    world = dist.init()
    x_host = np.random.default_rng(world.rank).random((PER_GPU_BATCH, 3, SIDE, SIDE),
                                                      dtype=np.float32)
    x = gf.tensor(x_host, device="cuda")
    bucket_bytes = int(args.bucket_mb * (1 << 20))
    config = TrainConfig(N=128, M=192, lmbda=LMBDA, device="cuda", quiet=True,
                         batch_size=PER_GPU_BATCH * world.size, precision=args.precision)
    trainer = DistributedTrainer(config, world=world, bucket_bytes=bucket_bytes)
    row = {"rank": world.rank, "gpu": drv.Context.get_device().name()}
    row["eager_ms"] = harness.time_gdnflow(lambda: trainer.train_step(x), warmup=5,
                                           repeats=args.repeats)
    free, total = drv.mem_get_info()
    row.update(memory_gb=(total - free) / 1e9, loss=trainer.history[-1]["loss"])
    save(row)

    # The reduction against the backward: the unwrapped backward first (no collective).
    plain_step, _, _ = make_step(False, bucket_bytes, x)
    for _ in range(5):
        plain_step()
    plain_backward = statistics.median(timeline(plain_step, None)[0] for _ in range(10))
    step, ddp, _ = make_step(True, bucket_bytes, x)
    for _ in range(5):
        step()
    reduce_ms, hidden_ms = [], []
    for _ in range(10):
        _, buckets = timeline(step, ddp)
        reduce_ms.append(sum(done - started for _, _, started, done in buckets))
        hidden_ms.append(sum(max(0.0, min(done, plain_backward) - started)
                             for _, _, started, done in buckets))
    row.update(plain_backward_ms=plain_backward, allreduce_ms=statistics.median(reduce_ms),
               hidden_ms=statistics.median(hidden_ms), buckets=len(ddp.buckets),
               gradient_mb=sum(b.nbytes for b in ddp.buckets) / 1e6)
    ddp.close()
    save(row)

    def loop_step():
        trainer.queue_step(x_host)
        dist.all_gather_object(None)    # the loop's per-step stop vote (AgreedStopSignals)

    row["captured_ms"] = harness.pipelined_ms(loop_step, harness.gdnflow_stream().synchronize,
                                              steps=args.steps)
    trainer.flush()
    save(row)


def rank_main(args):
    """A rank: measure, writing this rank's figures to ``args.result``.rankR.json as they come.

    ``args.watchdog`` seconds after the start, a rank still running prints
    every thread's traceback and exits (a hung collective shows where).
    """
    from gdnflow import distributed as dist
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    path = Path(f"{args.result}.rank{dist.init().rank}.json")
    measure_rank(args, lambda row: path.write_text(json.dumps(row)))


def world_row(ranks, rows, one):
    """The table row of a world of ``ranks`` (``rows``: its ranks' figures, missing ones
    left out; ``one``: 1 GPU's, or None)."""
    def most(key, fmt="{:.2f}"):
        values = [r[key] for r in rows if key in r]
        return (fmt.format(max(values)), max(values)) if len(values) == ranks else ("-", None)

    step, step_ms = most("captured_ms")
    eager, eager_ms = most("eager_ms")
    reduce, _ = most("allreduce_ms")
    images = f"{PER_GPU_BATCH * ranks * 1000 / step_ms:.0f}" if step_ms else "-"
    hidden = [r["hidden_ms"] / r["allreduce_ms"] for r in rows if r.get("allreduce_ms")]
    return [ranks, PER_GPU_BATCH * ranks, step, images, efficiency(one, step_ms, "captured_ms"),
            eager, efficiency(one, eager_ms, "eager_ms"), reduce,
            f"{100 * min(hidden):.0f}%" if len(hidden) == ranks else "-",
            " / ".join(f"{r['memory_gb']:.2f}" for r in rows if "memory_gb" in r) or "-"]


def efficiency(one, ms, key):
    """1 GPU's step over this world's, as a percentage ("-" where either is missing)."""
    return f"{100 * one[key] / ms:.1f}%" if one and key in one and ms else "-"


def run_world(ranks, args):
    """Start ``ranks`` ranks of this script: (their figures, a list of dicts in rank order,
    missing ranks left out; a note when the world failed, else None)."""
    from gdnflow.train.spawn import spawn
    result = Path(tempfile.mkdtemp()) / f"ranks{ranks}"
    command = [sys.executable, os.path.abspath(__file__), "--rank", "--result", str(result),
               "--bucket-mb", str(args.bucket_mb), "--steps", str(args.steps),
               "--repeats", str(args.repeats), "--precision", args.precision,
               "--watchdog", str(args.watchdog)]
    code = spawn(command, ranks, mpiexec=None)
    rows = [json.loads(p.read_text()) for rank in range(ranks)
            if (p := Path(f"{result}.rank{rank}.json")).exists()]
    note = (f"the world of {ranks} failed (exit status {code}; its ranks' output says where): "
            "its missing figures are '-'" if code != 0 else None)
    return rows, note


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2", help="world sizes, comma-separated (default 1,2)")
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=50, help="steps per round back to back")
    parser.add_argument("--repeats", type=int, default=30, help="eager steps timed")
    parser.add_argument("--precision", choices=("fp32", "tf32"), default="fp32")
    parser.add_argument("--watchdog", type=float, default=300,
                        help="seconds after which a rank still running prints its threads' "
                        "tracebacks and exits (default 300)")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        return rank_main(args)
    from gdnflow import benchmarking as harness
    from gdnflow.train.spawn import check_gpus, gpu_count
    sizes = [int(n) for n in args.ranks.split(",")]
    check_gpus(max(sizes), gpu_count())
    worlds, failures = {}, []
    for n in sizes:
        worlds[n], note = run_world(n, args)
        failures += [note] if note else []
    one = worlds[1][0] if worlds.get(1) else None
    first = next((rows[0] for rows in worlds.values() if rows and "gradient_mb" in rows[0]), None)
    if first is None:
        raise SystemExit("bench_scaling: no world measured its buckets; see the ranks' output")
    table = harness.markdown_table(
        f"Data-parallel FactorizedPrior(128, 192) training, batch {PER_GPU_BATCH} x "
        f"{SIDE}x{SIDE} per GPU, {args.precision}",
        ["GPUs", "global batch", "step ms (captured, back to back)", "images/s",
         "efficiency vs 1 GPU", "eager step ms", "eager efficiency", "all-reduce ms/step",
         "hidden in backward", "GPU memory per rank (GB)"],
        [world_row(n, rows, one) for n, rows in worlds.items()],
        notes=[f"GPU: {first['gpu']}; one process a GPU, NCCL over the TCP store's unique id "
               f"(NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}); "
               f"{first['gradient_mb']:.1f} MB of float32 gradients in {first['buckets']} "
               f"buckets of {args.bucket_mb:g} MB",
               "step ms: the slowest rank's wall time per captured step (gdnflow train's "
               f"loop), {args.steps} steps back to back, median of 3 rounds; eager: CUDA "
               f"events, median of {args.repeats}; efficiency = 1-GPU step / N-GPU step",
               "all-reduce ms/step: the buckets' reductions on the communication stream "
               "(the most of any rank); hidden: the share of it inside the rank's unwrapped "
               f"backward ({first['plain_backward_ms']:.2f} ms on rank 0 of the first world), "
               "the least of any rank",
               "GPU memory: total - free on each rank's GPU after the eager steps (CUDA "
               "context, memory pool and NCCL buffers)", *failures])
    harness.emit(table, args.out)


if __name__ == "__main__":
    main()
