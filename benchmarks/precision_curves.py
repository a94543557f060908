"""Two training runs side by side: evaluation losses, late training loss, one plot.

    python benchmarks/precision_curves.py RUN_FP32 RUN_BF16 --labels fp32 bf16 \
        --out benchmarks/results/precision/bf16_vs_fp32_20k.md --plot .../bf16_vs_fp32_20k.png

Each RUN is a ``gdnflow train`` run folder (or a copy of its ``history.jsonl`` and
``eval.jsonl``). The table lists every evaluation of both runs and the second
run's relative difference from the first; then the mean training loss over
the last ``--tail`` steps. Issue #18 asks for the bf16 run's evaluation loss
within 1% of the fp32 run's after 20,000 steps (same seed, same data).
``--thin K`` also writes each run's history with every K-th step, and its
evaluations, into a folder ``run_<label>`` beside the table (small enough to
commit; this script reads such a folder as a run).
"""
import argparse
import json
from pathlib import Path

import matplotlib
import numpy as np

from gdnflow import benchmarking as harness

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the display-free backend)


def read_records(path):
    """The JSON records of a ``.jsonl`` file, one per line."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs=2, type=Path, help="two run folders: reference, other")
    parser.add_argument("--labels", nargs=2, default=("fp32", "bf16"))
    parser.add_argument("--gpu", required=True, help="the GPU both runs trained on (the table "
                        "is made after the runs, on any machine)")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the table's notes (how the runs were made)")
    parser.add_argument("--tail", type=int, default=2000,
                        help="steps at the end over which training losses are averaged")
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--plot", help="write the plot (PNG) here")
    parser.add_argument("--thin", type=int, default=0, metavar="K",
                        help="write run_<label>/ (every K-th step) beside --out")
    args = parser.parse_args()
    histories = [read_records(run / "history.jsonl") for run in args.runs]
    evals = [read_records(run / "eval.jsonl") for run in args.runs]
    reference, other = ({r["step"]: r for r in e} for e in evals)
    rows = []
    for step in sorted(set(reference) & set(other)):
        a, b = reference[step]["loss"], other[step]["loss"]
        rows.append([str(step), f"{a:.4f}", f"{b:.4f}", f"{100 * (b - a) / a:+.2f}%",
                     f"{reference[step]['bpp']:.4f} / {other[step]['bpp']:.4f}",
                     f"{reference[step]['psnr']:.2f} / {other[step]['psnr']:.2f}"])
    tails = [np.mean([r["loss"] for r in h[-args.tail:]]) for h in histories]
    last3 = [np.mean([r["loss"] for r in e[-3:]]) for e in evals]
    first, second = args.labels
    notes = [f"training loss, mean of the last {args.tail} steps: {first} {tails[0]:.4f}, "
             f"{second} {tails[1]:.4f} ({100 * (tails[1] - tails[0]) / tails[0]:+.2f}%)",
             f"evaluation loss, mean of the last three evaluations: {first} {last3[0]:.4f}, "
             f"{second} {last3[1]:.4f} ({100 * (last3[1] - last3[0]) / last3[0]:+.2f}%)",
             *args.note]
    harness.emit(harness.markdown_table(
        f"Training in {second} against {first}: evaluation loss",
        ["step", f"{first} loss", f"{second} loss", f"{second} vs {first}",
         "bpp", "PSNR dB"], rows, notes, gpu=args.gpu), args.out)
    if args.plot:
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        for label, history, records in zip(args.labels, histories, evals):
            steps = np.array([r["step"] for r in history])
            loss = np.array([r["loss"] for r in history])
            window = 200        # a moving mean: single steps are noise
            smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
            axes[0].plot(steps[window - 1:], smooth, label=label)
            axes[1].plot([r["step"] for r in records], [r["loss"] for r in records], "o-",
                         label=label)
        axes[0].set(title=f"training loss (mean of {window} steps)", xlabel="step",
                    yscale="log")
        axes[1].set(title="evaluation loss (held-out photos)", xlabel="step", yscale="log")
        for ax in axes:
            ax.legend()
        figure.tight_layout()
        figure.savefig(args.plot, dpi=80)
    if args.thin and args.out:
        for label, history, records in zip(args.labels, histories, evals):
            folder = Path(args.out).with_name(f"run_{label}")
            folder.mkdir(exist_ok=True)
            for name, kept in (("history.jsonl", history[::args.thin]), ("eval.jsonl", records)):
                (folder / name).write_text("".join(json.dumps(r) + "\n" for r in kept))


if __name__ == "__main__":
    main()
