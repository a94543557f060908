"""Tiles, depths and thread groups of the direct pointwise kernel: GPU time against the cost model.

    python benchmarks/sweep_pointwise_tiles.py --out benchmarks/results/pointwise_tiles.md

For tuning the cost model of gdnflow/ops/conv/algorithms/pointwise_tiles.py
(:func:`predicted_seconds`):
for each layer, the thread tiles the model ranks best (and those measured
best before) run the layer's forward with every K step (BK 8, 16, 32),
pipeline depth (2-4 stages) and number of thread groups sharing a tile
(KSPLIT 1, 2, 4) that fits, and the GPU time (calls queued behind
a busy kernel, as bench_conv.py's "gpu ms") is listed next to the model's
prediction, fastest first, with the variant the model chooses and the best
2-stage, BK-8, one-group one (the kernel before stages and groups) marked. The variants are
compiled in parallel first (gdnflow's kernel cache).
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_conv import gdnflow_gpu_ms  # noqa: E402  (benchmarks/ is not a package)

from gdnflow import benchmarking as harness  # noqa: E402
from gdnflow.backends import cuda  # noqa: E402
from gdnflow.backends.cuda.kernels import precompile  # noqa: E402
from gdnflow.config import override  # noqa: E402
from gdnflow.ops.conv.algorithms import pointwise_tiles  # noqa: E402
from gdnflow.ops.conv.algorithms.pointwise import SOURCE, PointwiseDirect  # noqa: E402
from gdnflow.ops.conv.geometry import conv_geometry  # noqa: E402

#: (batch, C_in, side, C_out): MobileNetV2's narrow projections (slower than
#: cuDNN in benchmarks/results/conv.md before stages), an expansion, and
#: three 14x14 layers the GEMM path runs by default; and the product of VGG16's
#: first layer at batch 1 after im2col (27 rows of 224x224 columns, 64 filters).
LAYERS = [(64, 144, 28, 32), (64, 192, 28, 32), (64, 96, 56, 24), (64, 144, 56, 24),
          (64, 32, 28, 192), (64, 192, 14, 64), (64, 64, 14, 384), (64, 384, 14, 64),
          (1, 27, 224, 64)]
#: Block tiles (TM, TN, TX, TY) measured best on the narrow layers with 2 stages.
KNOWN_TILES = [(8, 4, 32, 2), (4, 4, 32, 8), (4, 8, 32, 4), (4, 8, 8, 8), (12, 8, 32, 2),
               (4, 8, 32, 6)]


def variants(layer, tiles_per_layer):
    """The configs to time for a layer: each chosen tile at every BK, depth and KSPLIT."""
    batch, c_in, side, c_out = layer
    columns = batch * side * side
    fitting = [c for c in pointwise_tiles.candidate_configs(4) if c.bm <= 1.34 * c_out]
    ranked = sorted(fitting,
                    key=lambda c: pointwise_tiles.predicted_seconds(c, c_out, c_in, columns))
    tiles = []
    for c in ranked:
        if (c.tm, c.tn, c.tx, c.ty) not in tiles:
            tiles.append((c.tm, c.tn, c.tx, c.ty))
        if len(tiles) == tiles_per_layer:
            break
    tiles += [t for t in KNOWN_TILES if t not in tiles and t[0] * t[3] <= 1.34 * c_out]
    chosen = pointwise_tiles.choose_config(c_out, c_in, side * side, columns, 4)
    return [c for c in fitting if (c.tm, c.tn, c.tx, c.ty) in tiles] + (
        [] if chosen in fitting else [chosen])


def sweep(layer, configs, top):
    """Rows (tile, threads, BK, stages, predicted µs, measured µs, mark) of one layer."""
    batch, c_in, side, c_out = layer
    runtime = cuda.get_runtime()
    rng = np.random.default_rng(0)
    g = conv_geometry("conv2d", (batch, c_in, side, side), (c_out, c_in, 1, 1), (1, 1),
                      (0, 0, 0, 0), (1, 1), 1)
    x = runtime.from_numpy(rng.standard_normal(g.x_shape, dtype=np.float32))
    w = runtime.from_numpy(rng.standard_normal(g.w_shape, dtype=np.float32))
    hw, columns = side * side, batch * side * side
    chosen = pointwise_tiles.choose_config(c_out, c_in, hw, columns, 4, runtime.sm_count)
    rows = []
    for config in configs:
        with override(pointwise_config_chooser=lambda *args, config=config: config):
            measured = gdnflow_gpu_ms(lambda: PointwiseDirect.forward(g, x, w))
        predicted = pointwise_tiles.predicted_seconds(config, c_out, c_in, columns,
                                                      runtime.sm_count)
        rows.append((measured, config, predicted))
    rows.sort(key=lambda r: r[0])
    two_stage = [r for r in rows if r[1].stages == 2 and r[1].bk == 8 and r[1].ksplit == 1][:1]
    keep = rows[:top] + [r for r in rows[top:] if r[1] == chosen or r in two_stage]

    def mark(c):
        return " ".join(m for m, yes in (("**chosen**", c == chosen),
                                         ("before", two_stage and c == two_stage[0][1]))
                        if yes)
    return [[f"{batch}x{c_in}x{side}² -> {c_out}",
             f"{c.tm}x{c.tn} of {c.tx}x{c.ty} (BM {c.bm}, BN {c.bn})", c.ksplit, c.threads,
             c.bk, c.stages, pointwise_tiles.blocks_per_sm(c), f"{1e6 * p:.1f}", f"{1e3 * m:.1f}",
             mark(c)] for m, c, p in keep]


def main():
    """Sweep every layer of LAYERS and print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--top", type=int, default=8, help="fastest variants listed per layer")
    parser.add_argument("--tiles", type=int, default=3,
                        help="block tiles per layer from the model's ranking")
    args = parser.parse_args()
    configs = {layer: variants(layer, args.tiles) for layer in LAYERS}
    precompile(SOURCE, {c.defines(False) for cs in configs.values() for c in cs})
    rows = [row for layer in LAYERS for row in sweep(layer, configs[layer], args.top)]
    harness.emit(harness.markdown_table(
        "Direct pointwise kernel: tiles and pipeline depths, measured against the cost model",
        ["layer", "thread tile of threads (block tile)", "groups", "threads", "BK", "stages",
         "blocks/SM (model)", "predicted µs", "measured GPU µs", ""], rows,
        ["measured: GPU time per call, calls queued behind a busy kernel (bench_conv.py's "
         "'gpu ms'); predicted: pointwise_tiles.predicted_seconds; per layer the model's best "
         f"{args.tiles} block tiles and the formerly best ones (at most a third of their rows "
         "idle), each at every BK, depth and group count that fits; listed: the fastest, the "
         "model's choice and the fastest 2-stage, BK-8, one-group variant ('before': the "
         "kernel before stages and groups)",
         f"variants timed: {sum(len(c) for c in configs.values())}"]), args.out)


if __name__ == "__main__":
    main()
