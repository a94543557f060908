"""Every tile of the direct pointwise kernel on a few layers: measured GPU time against the cost model.

    python benchmarks/sweep_pointwise_tiles.py --out benchmarks/results/pointwise_tiles.md

For tuning the cost model of gdnflow/ops/pointwise.py (:func:`predicted_seconds`):
for each layer, every candidate tile whose rows fit the output channels
(at most a third idle) runs the layer's forward, and its GPU time (calls
queued behind a busy kernel, as bench_conv.py's "gpu ms") is listed next to
the model's prediction, fastest first, with the tile the model chooses
marked. Each tile is a compile of its own the first time (a few seconds).
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_conv import gdnflow_gpu_ms  # noqa: E402  (benchmarks/ is not a package)

from gdnflow import benchmarking as harness  # noqa: E402
from gdnflow.ops import pointwise  # noqa: E402
from gdnflow.ops.conv import conv_geometry  # noqa: E402

#: (batch, C_in, side, C_out): MobileNetV2's narrow projections at 28x28 (0.7x
#: cuDNN's GPU time in benchmarks/results/conv.md) and one at 56x56 for contrast.
LAYERS = [(64, 144, 28, 32), (64, 192, 28, 32), (64, 144, 56, 24)]


def sweep(layer, top):
    """Rows (tile, threads, BK, predicted µs, measured µs, chosen) of one layer, fastest first."""
    from gdnflow.backends.cuda.runtime import get_runtime
    batch, c_in, side, c_out = layer
    runtime = get_runtime()
    rng = np.random.default_rng(0)
    g = conv_geometry("conv2d", (batch, c_in, side, side), (c_out, c_in, 1, 1), (1, 1),
                      (0, 0, 0, 0), (1, 1), 1)
    x = runtime.from_numpy(rng.standard_normal(g.x_shape, dtype=np.float32))
    w = runtime.from_numpy(rng.standard_normal(g.w_shape, dtype=np.float32))
    hw, columns = side * side, batch * side * side
    chosen = pointwise.choose_config(c_out, c_in, hw, columns, 4, runtime.sm_count)
    original = pointwise.choose_config
    rows = []
    try:
        for config in pointwise.candidate_configs(4):
            if config.bm > 1.34 * c_out:
                continue
            pointwise.choose_config = lambda *args, config=config: config
            measured = gdnflow_gpu_ms(lambda: pointwise.PointwiseDirect.forward(g, x, w))
            predicted = pointwise.predicted_seconds(config, c_out, c_in, columns,
                                                    runtime.sm_count)
            rows.append((measured, config, predicted))
    finally:
        pointwise.choose_config = original
    rows.sort(key=lambda r: r[0])
    keep = rows[:top] + [r for r in rows[top:] if r[1] == chosen]
    return [[f"{batch}x{c_in}x{side}² -> {c_out}",
             f"{c.tm}x{c.tn} of {c.tx}x{c.ty} (BM {c.bm}, BN {c.bn})", c.threads, c.bk,
             pointwise.blocks_per_sm(c), f"{1e6 * p:.1f}", f"{1e3 * m:.1f}",
             "**chosen**" if c == chosen else ""] for m, c, p in keep]


def main():
    """Sweep every layer of LAYERS and print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--top", type=int, default=8, help="fastest tiles listed per layer")
    args = parser.parse_args()
    rows = [row for layer in LAYERS for row in sweep(layer, args.top)]
    harness.emit(harness.markdown_table(
        "Direct pointwise kernel: every tile, measured against the cost model",
        ["layer", "thread tile of threads (block tile)", "threads", "BK", "blocks/SM (model)",
         "predicted µs", "measured GPU µs", ""], rows,
        ["measured: GPU time per call, calls queued behind a busy kernel (bench_conv.py's "
         "'gpu ms'); predicted: pointwise.predicted_seconds; tiles with at most a third of "
         "their rows idle; the fastest per layer, and the tile the model chooses"]), args.out)


if __name__ == "__main__":
    main()
