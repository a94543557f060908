"""PSNR of the scale hyperprior against the factorized prior at equal bpp, from ``gdnflow eval``.

    python benchmarks/hyperprior_vs_factorized/compare.py EVAL_DIR/eval.json [--out table.md]

Each model's kind is its ``architecture`` in eval.json (or, in files written
before eval recorded it, its label's start: ``factorized_...``,
``hyperprior_...``, as run.sh names them). Each kind's mean points (bpp
from the real files, PSNR of their decodings, over the held-out images) make
a curve, piecewise linear in log(bpp). The gain is the hyperprior's PSNR
minus the factorized prior's at the same bpp, at each hyperprior point
inside the factorized curve's bpp range, and averaged over the two curves'
common bpp range (a Bjøntegaard-style delta PSNR with linear instead of
cubic interpolation, fit for two or three points a curve). The same is also
done photo by photo (each photo's own factorized curve), the stricter
measure: a mean over photos moves with the rates each model spends on each.
"""
import argparse
import json
import sys

import numpy as np

KINDS = ("factorized", "hyperprior")


def kind_of(mean):
    """"factorized", "hyperprior" or None: the kind of an eval.json mean row's model."""
    name = mean.get("architecture") or mean["model"]
    return next((k for k in KINDS if name.startswith(k)), None)


def curves(results, rows=None):
    """{kind: [(bpp, psnr, label)] sorted by bpp} from an eval.json's mean rows (or from
    ``rows``, its per-image rows of one photo)."""
    kinds = {mean["model"]: kind_of(mean) for mean in results["means"]}
    out = {kind: [] for kind in KINDS}
    for row in results["means"] if rows is None else rows:
        kind = kinds.get(row["model"])
        if kind is not None:
            out[kind].append((row["bpp"], row["psnr"], row["model"]))
    return {kind: sorted(points) for kind, points in out.items()}


def photo_gains(results):
    """The hyperprior's PSNR minus its photo's factorized curve's at the same bpp, for
    every (photo, hyperprior model) inside that curve's range."""
    gains = []
    for image in sorted({row["image"] for row in results["rows"]}):
        kinds = curves(results, [row for row in results["rows"] if row["image"] == image])
        if len(kinds["factorized"]) < 2:
            continue
        for bpp, value, _ in kinds["hyperprior"]:
            other = psnr_at(kinds["factorized"], bpp)
            if other is not None:
                gains.append(value - other)
    return gains


def psnr_at(points, bpp):
    """PSNR of a curve at ``bpp`` (linear in log bpp), or None outside its range."""
    rates = np.log([p[0] for p in points])
    if not rates[0] <= np.log(bpp) <= rates[-1]:
        return None
    return float(np.interp(np.log(bpp), rates, [p[1] for p in points]))


def mean_gain(reference, test, samples=200):
    """Mean of test - reference PSNR over their common log-bpp range, or None if disjoint."""
    low = max(np.log(reference[0][0]), np.log(test[0][0]))
    high = min(np.log(reference[-1][0]), np.log(test[-1][0]))
    if low >= high:
        return None
    grid = np.exp(np.linspace(low, high, samples))
    return float(np.mean([psnr_at(test, b) - psnr_at(reference, b) for b in grid]))


def table(results):
    """The markdown comparison table of an eval.json's results."""
    kinds = curves(results)
    lines = ["| model | bpp | PSNR (dB) | factorized prior at that bpp | gain (dB) |",
             "|---|---:|---:|---:|---:|"]
    for kind in KINDS:
        for bpp, value, label in kinds[kind]:
            other = psnr_at(kinds["factorized"], bpp) if kind == "hyperprior" else None
            gain = "" if other is None else f"{value - other:+.2f}"
            lines.append(f"| {label} | {bpp:.4f} | {value:.2f} | "
                         f"{'' if other is None else f'{other:.2f}'} | {gain} |")
    gain = mean_gain(kinds["factorized"], kinds["hyperprior"]) \
        if all(len(kinds[k]) >= 2 for k in KINDS) else None
    lines.append("")
    lines.append("Mean gain over the common bpp range: "
                 + ("curves do not overlap" if gain is None else f"{gain:+.2f} dB"))
    gains = photo_gains(results) if "rows" in results else []
    if gains:
        lines.append("")
        lines.append(f"Photo by photo: mean {np.mean(gains):+.2f} dB, median "
                     f"{np.median(gains):+.2f} dB, over {len(gains)} hyperprior points inside "
                     "their photo's factorized curve")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("eval_json", help="eval.json written by gdnflow eval")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    with open(args.eval_json) as f:
        text = table(json.load(f))
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
