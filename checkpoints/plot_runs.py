"""Draw the training curves of the shipped codecs' runs into one figure.

    python checkpoints/plot_runs.py RUN_FOLDER... --out checkpoints/results/runs/curves.png --every 100

Each RUN_FOLDER is a ``gdnflow train`` run folder (its ``history.jsonl`` and
``eval.jsonl``), named after the run (``fp1``, ``hp3``...). The figure has three
panels against the training step: the training loss (a moving average), and the
held-out evaluation's PSNR and bpp. ``--every K`` also writes each run's history
thinned to every K-th step, with its evaluations, as ``NAME.jsonl`` beside the
figure (small enough to keep in the repository).
"""
import argparse
import json
from pathlib import Path

from gdnflow.io.files import write_bytes_atomic
from gdnflow.plots import moving_average, new_figure, png_bytes


def read_jsonl(path):
    """The records of a JSON-lines file (none if it is missing)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None):
    """Draw the figure (and the thinned histories); returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_FOLDER")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--window", type=int, default=500, help="moving-average steps")
    parser.add_argument("--every", type=int, default=0,
                        help="also write every K-th training record as NAME.jsonl (0: no)")
    args = parser.parse_args(argv)

    figure = new_figure(16, 4.8, dpi=90)
    axes = figure.subplots(1, 3)
    for run in args.runs:
        history = [r for r in read_jsonl(run / "history.jsonl") if isinstance(r["step"], int)]
        evals = read_jsonl(run / "eval.jsonl")
        if not history:
            raise SystemExit(f"{run}: no history.jsonl records")
        style = "-" if run.name.startswith("hp") else "--"
        steps = [r["step"] for r in history]
        line, = axes[0].plot(steps, moving_average([r["loss"] for r in history], args.window),
                             style, label=run.name)
        eval_steps = [r["step"] for r in evals]
        axes[1].plot(eval_steps, [r["psnr"] for r in evals], style + "o", color=line.get_color(),
                     label=run.name)
        axes[2].plot(eval_steps, [r["bpp"] for r in evals], style + "o", color=line.get_color(),
                     label=run.name)
        if args.every:
            thinned = [r for r in history if r["step"] % args.every == 0]
            with open(args.out.parent / f"{run.name}.jsonl", "w") as f:
                for record in thinned + [{"eval": True, **r} for r in evals]:
                    f.write(json.dumps(record) + "\n")
    axes[0].set(title=f"training loss ({args.window}-step mean)", xlabel="step", yscale="log")
    axes[1].set(title="held-out PSNR (dB)", xlabel="step")
    axes[2].set(title="held-out bpp", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[2].legend(ncol=2, fontsize=8)
    write_bytes_atomic(args.out, png_bytes(figure), overwrite=True)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
