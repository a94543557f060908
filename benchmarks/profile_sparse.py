"""Where a sparse convolution call's time goes: Python, the packing launch, the kernel.

    PYTHONPATH=. python3 benchmarks/profile_sparse.py --out benchmarks/results/profile_sparse.md

For the layers where the dispatcher picks the sparse kernel (VGG16's first
layer, 3 -> 64 at 224², 90% sparse) at batch 1 and 16, one process times:

- the whole ``sparse_conv2d`` call and the dense ``ops.conv2d`` call as
  ``bench_sparse.py`` times them (CUDA events around one call from Python);
- the same calls with a memset queued before the start event ("GPU busy":
  device time only, Python hidden) and their host time;
- the forward kernel alone for each tiling in ``TILINGS`` (events around
  ``REPEATS`` back-to-back launches behind a memset, divided), and the
  values-gradient kernel of the default tiling the same way.

The write floor is the output's bytes at the measured copy bandwidth.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sparse import magnitude_prune  # noqa: E402
from profile_gdn import HBM_BYTES_PER_S, Timer  # noqa: E402

import gdnflow as gf  # noqa: E402
from gdnflow import benchmarking as harness  # noqa: E402
from gdnflow import ops  # noqa: E402
from gdnflow.errors import KernelCompileError  # noqa: E402
from gdnflow.sparse.conv import SparseConv2dOp, sparse_conv2d, values_tensor  # noqa: E402
from gdnflow.sparse.cuda_plan import TilePlan, forward_plan  # noqa: E402
from gdnflow.sparse.tiling import Tiling, _pitch  # noqa: E402
from gdnflow.sparse.csr import to_csr  # noqa: E402

LAYERS = ((3, 64, 224), (64, 64, 224), (512, 512, 28))
BATCHES = (1, 16)
SPARSITY = 0.9
#: (rows, channels per warp) tried with the layer's own tile width and chunking
TILINGS = ((8, 4), (4, 8), (8, 2), (8, 1))
REPEATS = 20


def per_launch_ms(timer, launch):
    """Device ms of one ``launch()``: REPEATS launches behind a memset, divided."""
    def launches():
        for _ in range(REPEATS):
            launch()
    device, _ = timer.time(launches, flushes=2)
    return device / REPEATS


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--host-profile", action="store_true",
                        help="also print a cProfile of 200 sparse calls (the first layer at batch 16)")
    args = parser.parse_args()
    timer = Timer(repeats=30)
    rng = np.random.default_rng(0)
    rows = []
    for c_in, c_out, side in LAYERS:
        for n in BATCHES:
            x_host = rng.standard_normal((n, c_in, side, side), dtype=np.float32)
            w_host = magnitude_prune(rng.standard_normal((c_out, c_in, 3, 3), dtype=np.float32),
                                     SPARSITY)
            csr = to_csr(w_host, (side + 2, side + 2))
            x = gf.tensor(x_host, device="cuda")
            w = gf.tensor(w_host, device="cuda")
            label = f"b{n} {c_in}->{c_out} {side}²"
            with gf.no_grad():
                calls = {"dense conv2d": lambda: ops.conv2d(x, w, padding=1),
                         "sparse_conv2d": lambda: sparse_conv2d(x, csr, padding=1)}
                for name, fn in calls.items():
                    events = harness.time_gdnflow(fn, 10, 30)
                    busy, host = timer.time(fn, flushes=2)
                    rows.append([label, name, f"{events * 1e3:.1f}", f"{busy * 1e3:.1f}",
                                 f"{host:.1f}"])
                y = sparse_conv2d(x, csr, padding=1)
                op = SparseConv2dOp(csr, padding=1)
                values = values_tensor(csr, "cuda")
                op.check(x, values)
                g = op.geometry
                plan = forward_plan(g, csr)
                floor_us = y.size * 4 / HBM_BYTES_PER_S * 1e6
                gy = gf.tensor(rng.standard_normal(y.shape, dtype=np.float32), device="cuda")
                gvalues = timer.runtime.full((csr.nnz,), 0.0, np.float32)

                ms = per_launch_ms(timer, lambda: plan.values_grad(n, x.data.ptr, gy.data.ptr,
                                                                   gvalues.ptr))
                rows.append([label, "values-gradient kernel (default tiling)", "",
                             f"{ms * 1e3:.1f}", ""])
                t = plan.tiling
                for tile_rows, cpw in TILINGS:
                    tiling = Tiling(t.tw, tile_rows, cpw, t.cc, t.sh, t.sw, t.span_h, t.span_w,
                                    _pitch(t.tw, tile_rows, t.sh, t.sw, t.in_w))
                    variant = TilePlan(tiling, csr.rows, g.c_out, g.c_in, csr.channel,
                                       csr.tap_row, csr.tap_col, plan.geometry)
                    ventries = variant.entries(values.data)
                    try:
                        ms = per_launch_ms(timer, lambda: variant.forward(
                            n, x.data.ptr, ventries.ptr, 0, y.data.ptr))
                    except KernelCompileError as error:
                        rows.append([label, f"kernel {tile_rows}/{cpw}", str(error)[:60], "", ""])
                        continue
                    default = " (default)" if (tile_rows, cpw) == (t.rows, t.cpw) else ""
                    rows.append([label, f"kernel rows/cpw {tile_rows}/{cpw}{default}", "",
                                 f"{ms * 1e3:.1f}", f"floor {floor_us:.1f}"])
                print(*rows[-1], flush=True)
    if args.host_profile:
        import cProfile
        import pstats
        x = gf.tensor(rng.standard_normal((16, 3, 224, 224), dtype=np.float32), device="cuda")
        csr = to_csr(magnitude_prune(rng.standard_normal((64, 3, 3, 3), dtype=np.float32),
                                     SPARSITY), (226, 226))
        with gf.no_grad():
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(200):
                sparse_conv2d(x, csr, padding=1)
                timer.stream.synchronize()
            profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    table = harness.markdown_table(
        "Sparse convolution call: where the time goes",
        ["layer", "call", "events us", "GPU busy us", "host us"], rows,
        [f"{SPARSITY:.0%} sparse, magnitude-pruned random weight; events: one call from "
         "Python as bench_sparse.py times it; GPU busy: memset queued first; kernel rows: "
         f"{REPEATS} launches of the forward kernel alone, divided; floor: output bytes at "
         "4.1 TB/s"])
    harness.emit(table, args.out)


if __name__ == "__main__":
    main()
