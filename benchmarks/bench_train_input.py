"""Where a real training run's step rate goes: the data pipeline, the captured step, both.

    python benchmarks/bench_train_input.py --data corpus/train --out results.md

The shipped codecs' runs trained well below the rate at which
``benchmarks/bench_train.py`` times the captured step back to back
(checkpoints/README.md has both). This script measures, in one process and
one run, the rows that separate the two:

1. **loader alone**: ``ImageFolder.batch`` through the trainer's
   ``BackgroundLoader`` (``--workers`` threads), no training: batches/s;
2. **step alone, one batch**: ``Trainer.queue_step`` on the same host batch
   each step (as bench_train.py times it);
3. **step alone, new batches**: the same on a different host array each step
   (a ring of ``--ring`` batches made beforehand: a fresh host copy every step, as
   the loader gives);
4. **step and loader**: ``Trainer.queue_step`` on the loader's batches, as
   ``gdnflow train`` runs.

Each row is ``--steps`` steps after ``--warmup`` steps, wall clock (the GPU
waited for at the end), median of ``--repeats``. Rows 1 and 4 run for each
``--scale-range`` asked for (random downscaling: a Lanczos resampling per crop).
On NumPy (no GPU) only row 1 runs.
"""
import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdnflow.backends import default_device  # noqa: E402
from gdnflow.benchmarking import emit, markdown_table, pipelined_ms  # noqa: E402
from gdnflow.data import ImageFolder  # noqa: E402
from gdnflow.data.augment import pyramid_level  # noqa: E402
from gdnflow.data.loader import BackgroundLoader  # noqa: E402
from gdnflow.train import TrainConfig, Trainer  # noqa: E402


def loader_rate(make_batch, steps, warmup, repeats, workers):
    """Median batches/s of a BackgroundLoader over ``make_batch``."""
    def one_round(start):
        with BackgroundLoader(make_batch, start=start, stop=start + steps + warmup,
                              workers=workers) as batches:
            iterator = iter(batches)
            for _ in range(warmup):
                next(iterator)
            begin = time.perf_counter()
            for _ in range(steps):
                next(iterator)
            return steps / (time.perf_counter() - begin)
    return statistics.median(one_round(r * (steps + warmup)) for r in range(repeats))


def main(argv=None):
    """Run the rows, print and write the table; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder of training images")
    parser.add_argument("--model", default="factorized_prior",
                        choices=("factorized_prior", "hyperprior"))
    parser.add_argument("--precision", default="tf32", choices=("fp32", "tf32", "bf16"))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--crop", type=int, default=256)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--scale-ranges", default="1,0.25",
                        help="low ends of the scale ranges to time, comma-separated (1: none)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ring", type=int, default=8)
    parser.add_argument("--device", default=None, choices=("numpy", "cuda"))
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    device = args.device or default_device()

    with tempfile.TemporaryDirectory(prefix="bench_train_input_") as scratch:
        return measure(args, device, scratch)


def measure(args, device, scratch):
    """Time the rows (``scratch``: the trainer's run folder, never written) and emit the table."""
    data = ImageFolder(args.data, crop=args.crop)
    lows = [float(v) for v in args.scale_ranges.split(",")]
    for index in range(len(data)):          # decoded and downscaled once, as a long run has them
        for level in range(pyramid_level(min(lows)) + 1):
            data.picture(index, level)
    rows = []

    def config(low):
        return TrainConfig(data=args.data, model=args.model, precision=args.precision,
                           batch_size=args.batch_size, crop=args.crop, workers=args.workers,
                           flip="both", scale_range=(low, 1.0), device=device, quiet=True,
                           out_dir=scratch, eval_every=0, checkpoint_every=0,
                           steps=10 ** 9)

    for low in lows:
        augmentation = config(low).augmentation
        per_s = loader_rate(lambda step, pool=None: data.batch(0, step, args.batch_size, pool,
                                                               augmentation=augmentation),
                            args.steps, args.warmup, args.repeats, args.workers)
        rows.append((f"loader alone, scale range ({low:g}, 1), {args.workers} threads", per_s))

    if device != "numpy":
        trainer = Trainer(config(1.0), train_data=data)

        def steps_per_s(next_batch):
            """Captured steps a second on ``next_batch()``'s batches, back to back."""
            return 1000 / pipelined_ms(lambda: trainer.queue_step(next_batch()), trainer.flush,
                                       args.steps, args.repeats, args.warmup)

        ring = [data.batch(0, step, args.batch_size) for step in range(args.ring)]
        rows.append(("step alone, one host batch", steps_per_s(lambda: ring[0])))
        rows.append((f"step alone, a new host batch each step (ring of {args.ring})",
                     steps_per_s(itertools.cycle(ring).__next__)))
        for low in lows:
            augmentation = config(low).augmentation
            with BackgroundLoader(lambda step, pool=None: data.batch(
                    0, step, args.batch_size, pool, augmentation=augmentation),
                    workers=args.workers) as batches:
                rows.append((f"step and loader, scale range ({low:g}, 1)",
                             steps_per_s(iter(batches).__next__)))

    title = (f"Training input pipeline: {args.model}, {args.precision}, batch "
             f"{args.batch_size}x{args.crop}x{args.crop}, {len(data)} images")
    notes = [f"medians of {args.repeats} rounds of {args.steps} steps after {args.warmup} "
             f"warm-up steps, wall clock (the GPU waited for at the end of each round); "
             "images decoded (and downscaled to their pyramid levels) beforehand; "
             f"`{' '.join(sys.argv)}`"]
    emit(markdown_table(title, ["row", "steps/s (batches/s)"],
                        [[name, f"{value:.1f}"] for name, value in rows], notes,
                        gpu=None if device != "numpy" else "none (NumPy)"), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
