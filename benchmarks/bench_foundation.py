"""Foundation benchmarks: whole-tensor sum bandwidth, axis sums, and the cost
of one small operator call from Python; gdnflow and PyTorch side by side.

    python benchmarks/bench_foundation.py --out benchmarks/results/foundation.md
"""
import argparse
import time

import numpy as np

from gdnflow import benchmarking as harness
import gdnflow as gf
from gdnflow import ops
from gdnflow.backends.cuda import kernel
from gdnflow.backends.cuda.kernels import launch_grid
from gdnflow.backends.cuda.runtime import get_runtime


def bench_full_sum(torch, rows, notes, repeats):
    n = 2 ** 28
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n, dtype=np.float32)
    x = gf.tensor(host, device="cuda")
    ms = harness.time_gdnflow(lambda: ops.sum(x), repeats=repeats)
    gbps = 4 * n / ms / 1e6
    err = abs(ops.sum(x).item() - float(host.astype(np.float64).sum())) / np.abs(host).sum()
    notes.append(f"sum of 2^28: |gdnflow - float64| / sum|x| = {err:.2e}")
    if torch is not None:
        tx = torch.from_numpy(host).cuda()
        tms = harness.time_torch(lambda: torch.sum(tx), repeats=repeats)
        rows.append(["sum, 2^28 float32", f"{ms:.3f}", f"{tms:.3f}",
                     f"{4 * n / tms / 1e6:.0f} vs {gbps:.0f} GB/s", f"{tms / ms:.3f}"])
        del tx
    else:
        rows.append(["sum, 2^28 float32", f"{ms:.3f}", "-", f"{gbps:.0f} GB/s", "-"])
    return x


def sweep_full_sum(x, notes):
    """Time sum_partial's unroll and blocks-per-SM choices directly (one variant each)."""
    runtime = get_runtime()
    n = x.size
    results = []
    for unroll in (2, 4, 8):
        for blocks_per_sm in (4, 8, 16):
            defines = (("SUM_BLOCK", 256), ("SUM_UNROLL", unroll))
            k = kernel("reduction.cu", "sum_partial", "PPi", defines)
            grid = launch_grid(n // 4, 256, blocks_per_sm)
            partial = runtime.empty((grid[0],))
            ms = harness.time_gdnflow(lambda: k(grid, (256, 1, 1), x.data.ptr, partial.ptr, n),
                                      repeats=30)
            results.append((ms, unroll, blocks_per_sm))
    results.sort()
    notes.append("sum_partial sweep (ms, unroll, blocks/SM), fastest first: "
                 + ", ".join(f"({ms:.3f}, {u}, {b})" for ms, u, b in results))


def bench_axis_sums(torch, rows, repeats):
    rng = np.random.default_rng(1)
    for shape, axis in [((64, 256, 56, 56), (0, 2, 3)), ((64, 256, 56, 56), (2, 3)),
                        ((64, 256, 56, 56), 0), ((8192, 8192), 1)]:
        host = rng.standard_normal(shape, dtype=np.float32)
        x = gf.tensor(host, device="cuda")
        ms = harness.time_gdnflow(lambda: ops.sum(x, axis), repeats=repeats)
        label = f"sum {shape} over {axis}"
        if torch is not None:
            tx = torch.from_numpy(host).cuda()
            dims = axis if isinstance(axis, tuple) else (axis,)
            tms = harness.time_torch(lambda: torch.sum(tx, dim=dims), repeats=repeats)
            rows.append([label, f"{ms:.3f}", f"{tms:.3f}", f"{4 * host.size / ms / 1e6:.0f} GB/s",
                         f"{tms / ms:.3f}"])
            del tx
        else:
            rows.append([label, f"{ms:.3f}", "-", f"{4 * host.size / ms / 1e6:.0f} GB/s", "-"])
        del x


def bench_rows_kernel_vs_cublas(rows, repeats):
    """Row sums two ways: the sum_rows kernels, and cuBLAS (a GEMM against a ones vector)."""
    from gdnflow.backends.cuda import blas
    runtime = get_runtime()
    rng = np.random.default_rng(2)
    for shape in [(16384, 3136), (8192, 8192), (200704, 64)]:
        x = gf.tensor(rng.standard_normal(shape, dtype=np.float32), device="cuda")
        ones = gf.ones((shape[1], 1), device="cuda")
        out = runtime.empty((shape[0], 1))
        kernel_ms = harness.time_gdnflow(lambda: ops.sum(x, 1), repeats=repeats)
        gemm_ms = harness.time_gdnflow(lambda: blas.matmul(x.data.ptr, ones.data.ptr, out.ptr,
                                                           shape[0], 1, shape[1]), repeats=repeats)
        rows.append([f"row sums {shape}: kernel vs cuBLAS ones-GEMM", f"{kernel_ms:.3f}",
                     f"(cuBLAS {gemm_ms:.3f})", f"{4 * x.size / kernel_ms / 1e6:.0f} GB/s",
                     f"{gemm_ms / kernel_ms:.3f}"])


def per_call_us(fn, sync, calls=5000):
    """Wall-clock microseconds per call of ``fn`` in a tight Python loop (after warm-up)."""
    for _ in range(200):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def bench_call_overhead(torch, rows):
    runtime = get_runtime()
    a = gf.tensor(np.ones(1), device="cuda")
    b = gf.tensor(np.ones(1), device="cuda")
    sync = runtime.stream.synchronize
    us_op = per_call_us(lambda: a + b, sync)
    us_relu = per_call_us(lambda: a.relu(), sync)
    k = kernel("elementwise.cu", "add_same", "PPPi")
    out = runtime.empty((1,))
    us_raw = per_call_us(lambda: k((1, 1, 1), (256, 1, 1), a.data.ptr, b.data.ptr, out.ptr, 1), sync)
    torch_us = "-"
    if torch is not None:
        ta, tb = torch.ones(1, device="cuda"), torch.ones(1, device="cuda")
        torch_us = f"{per_call_us(lambda: ta + tb, torch.cuda.synchronize):.1f}"
    rows.append(["one `a + b` call (1 element), µs", f"{us_op:.1f}", torch_us,
                 f"raw PyCUDA prepared launch {us_raw:.1f} µs", "-"])
    rows.append(["one `a.relu()` call (1 element), µs", f"{us_relu:.1f}", "-", "", "-"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch = harness.torch_or_none()
    rows, notes = [], []
    x = bench_full_sum(torch, rows, notes, args.repeats)
    sweep_full_sum(x, notes)
    del x
    bench_axis_sums(torch, rows, args.repeats)
    bench_rows_kernel_vs_cublas(rows, args.repeats)
    bench_call_overhead(torch, rows)
    notes.append("times are medians of CUDA-event timings (ms) after warm-up; ratio = torch / gdnflow "
                 "(above 1: gdnflow faster); call costs are wall-clock per call in a Python loop")
    harness.emit(harness.markdown_table("Foundation: reductions and call overhead",
                                        ["workload", "gdnflow ms", "torch ms", "rate", "ratio"],
                                        rows, notes), args.out)


if __name__ == "__main__":
    main()
