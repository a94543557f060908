"""Host (Python) time per convolution call: where the microseconds before the kernel go.

    python benchmarks/profile_host.py --out benchmarks/results/profile_host.md

For a few MobileNetV2 / VGG16 layers, one per algorithm the planner runs, it
measures host microseconds per call of ``ops.conv2d`` (no graph) and of
``torch.nn.functional.conv2d`` in the same process: the calls are issued while
a busy kernel holds the GPU, so no call waits for the GPU and the time is all
host work (launch queue back-pressure excluded). Then it runs the gdnflow
calls under cProfile and lists the functions with the most own time per call.
The primitives every call is built from are timed the same way: a PyCUDA
launch, a pool allocation, and a cuBLAS SGEMM through ``blas.matmul``.
"""
import argparse
import cProfile
import pstats
import time

import numpy as np

import gdnflow as gf
from gdnflow import benchmarking as harness
from gdnflow.backends import cuda

import bench_conv

CALLS = 200


def host_us(fn, calls=CALLS, hold_seconds=0.05):
    """Median over 5 runs of host µs per fn() call, with the GPU held busy meanwhile."""
    import pycuda.driver as drv
    stream = harness.gdnflow_stream()
    spin = cuda.kernel(bench_conv.SPIN, "spin", "q")
    hz = bench_conv._clock_hz()
    fn()
    stream.synchronize()
    runs = []
    for _ in range(5):
        spin((1, 1, 1), (1, 1, 1), int(hold_seconds * hz))
        held = drv.Event()
        held.record(stream)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if held.query():
            hold_seconds *= 4            # the GPU caught up: hold it longer next time
        stream.synchronize()
        runs.append(1e6 * elapsed / calls)
    return sorted(runs)[2]


def torch_host_us(torch, fn, calls=CALLS, hold_seconds=0.05):
    """As :func:`host_us` for torch, holding its stream with torch.cuda._sleep."""
    hz = bench_conv._clock_hz()
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        torch.cuda._sleep(int(hold_seconds * hz))
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append(1e6 * (time.perf_counter() - start) / calls)
        torch.cuda.synchronize()
    return sorted(runs)[2]


def profile_lines(fn, calls=CALLS, top=12):
    """The ``top`` functions by own time under cProfile, as (µs per call, calls per call, name)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    harness.gdnflow_stream().synchronize()
    stats = pstats.Stats(profiler).stats
    rows = []
    for (file, line, name), (_, ncalls, tottime, _, _) in stats.items():
        where = f"{file.split('site-packages/')[-1].split('gdnflow/')[-1]}:{line}({name})"
        rows.append((1e6 * tottime / calls, ncalls / calls, where))
    return sorted(rows, reverse=True)[:top]


def primitives():
    """(name, callable) for the building blocks of a call."""
    from gdnflow.backends.cuda import blas
    runtime = cuda.get_runtime()
    a = runtime.empty((64, 64))
    noop = cuda.kernel(bench_conv.SPIN, "spin", "q")
    return [
        ("PyCUDA launch (Kernel.__call__, 1 arg)", lambda: noop((1, 1, 1), (1, 1, 1), 0)),
        ("pool allocation of 12 MB, freed", lambda: runtime.empty((64, 960, 7, 7))),
        ("blas.matmul 64x64x64", lambda: blas.matmul(a.ptr, a.ptr, a.ptr, 64, 64, 64)),
        ("blas.matmul 64x64x64, batch 2",
         lambda: blas.matmul(a.ptr, a.ptr, a.ptr, 64, 32, 64, batch=2, stride_b=2048,
                             stride_c=2048)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch = harness.torch_or_none()
    rng = np.random.default_rng(0)
    layers = [("MobileNetV2 b64", bench_conv.conv(64, 960, 7, 960, 3, groups=960)),
              ("MobileNetV2 b64", bench_conv.conv(64, 144, 28, 32, 1)),
              ("MobileNetV2 b64", bench_conv.conv(64, 192, 14, 64, 1)),
              ("MobileNetV2 b1", bench_conv.conv(1, 192, 14, 64, 1)),
              ("MobileNetV2 b1", bench_conv.conv(1, 3, 224, 32, 3, stride=2)),
              ("VGG16 b1", bench_conv.conv(1, 3, 224, 64, 3)),
              ("VGG16 b1", bench_conv.conv(1, 64, 224, 64, 3))]
    rows, details = [], []
    for name, fn in primitives():
        rows.append([name, "-", f"{host_us(fn):.1f}", "-"])
    with gf.no_grad():
        for model, layer in layers:
            x_host, w_host = bench_conv.make_inputs(layer, rng)
            x = gf.tensor(x_host, device="cuda")
            w = gf.tensor(w_host, device="cuda")
            call = bench_conv.gdnflow_call(layer, x, w)
            label = f"{model} {bench_conv.describe(layer)}"
            algorithm = bench_conv.algorithm_name(layer, "forward")
            torch_us = "-"
            if torch is not None:
                tcall = bench_conv.torch_call(torch, layer, torch.from_numpy(x_host).cuda(),
                                              torch.from_numpy(w_host).cuda())
                with torch.no_grad():
                    torch_us = f"{torch_host_us(torch, tcall):.1f}"
            rows.append([label, algorithm, f"{host_us(call):.1f}", torch_us])
            details.append(f"\n### {label} ({algorithm})\n\n| µs per call | calls per call | "
                           "function |\n|---|---|---|\n" + "\n".join(
                               f"| {us:.2f} | {n:g} | `{where}` |"
                               for us, n, where in profile_lines(call)))
    table = harness.markdown_table(
        "Host time per call", ["call", "algorithm", "gdnflow host µs", "torch host µs"], rows,
        notes=[f"median of 5 runs of {CALLS} calls issued while a busy kernel holds the GPU "
               "(pure host time)", "below: cProfile's own time per call of the top functions "
               "(cProfile adds its own overhead to each function call)"])
    with open(args.out, "w") as f:
        f.write(table + "\n" + "\n".join(details) + "\n")
    print(table + "\n" + "\n".join(details))


if __name__ == "__main__":
    main()
