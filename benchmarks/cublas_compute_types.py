"""cuBLAS's float32 GEMM under each compute type, through nvmath-python's bindings.

    python3 benchmarks/cublas_compute_types.py [--out FILE]

Measures what issue #18 needs to decide: whether cuBLAS's "fast" compute types
on float32 storage (CUBLAS_COMPUTE_32F_FAST_16BF / _16F) buy anything over
TF32, or whether 16-bit speed needs 16-bit storage. Needs PyCUDA and
nvmath-python (with cuda-bindings and cuda-pathfinder) on a GPU machine; not
part of gdnflow's dependencies. Timing: CUDA events, 10 calls after one
warm-up; error: max |C - exact| / max |exact| against a float64 product, on
standard-normal operands (zero mean, so rounding errors do not average away).
"""
import argparse
import datetime

import numpy as np
import pycuda.autoinit  # noqa: F401 (a context for the probe)
import pycuda.driver as drv
import pycuda.gpuarray as gpuarray
from nvmath.bindings import cublas

COMPUTE_TYPES = ("COMPUTE_32F", "COMPUTE_32F_FAST_TF32", "COMPUTE_32F_FAST_16BF",
                 "COMPUTE_32F_FAST_16F")
SHAPES = ((257, 193, 321), (4096, 4096, 4096))
CUDA_R_32F = 0


def time_gemm(handle, m, n, k, compute_type, rng):
    """(relative error, ms) of a row-major float32 C = A @ B under ``compute_type``."""
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    da, db, dc = gpuarray.to_gpu(a), gpuarray.to_gpu(b), gpuarray.zeros((m, n), np.float32)
    alpha, beta = np.array(1.0, np.float32), np.array(0.0, np.float32)

    def call():     # row-major C = A B is column-major C^T = B^T A^T
        cublas.gemm_ex(handle, 0, 0, n, m, k, alpha.ctypes.data, int(db.gpudata), CUDA_R_32F,
                       n, int(da.gpudata), CUDA_R_32F, k, beta.ctypes.data, int(dc.gpudata),
                       CUDA_R_32F, n, compute_type, -1)

    call()
    start, end = drv.Event(), drv.Event()
    start.record()
    for _ in range(10):
        call()
    end.record()
    end.synchronize()
    exact = a.astype(np.float64) @ b
    return np.abs(dc.get() - exact).max() / np.abs(exact).max(), start.time_till(end) / 10


def main():
    """Print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the markdown table here")
    args = parser.parse_args()
    handle = cublas.create()
    rng = np.random.default_rng(0)
    lines = ["## cuBLAS float32 GEMM by compute type", "",
             f"GPU: {drv.Context.get_device().name()}; cuBLAS {cublas.get_version(handle)}; "
             f"date: {datetime.date.today().isoformat()}", "",
             "| m x n x k | compute type | rel. error | ms | TFLOP/s |", "|---|---|---|---|---|"]
    for m, n, k in SHAPES:
        for name in COMPUTE_TYPES:
            error, ms = time_gemm(handle, m, n, k, getattr(cublas.ComputeType, name), rng)
            lines.append(f"| {m}x{n}x{k} | {name} | {error:.2e} | {ms:.3f} | "
                         f"{2 * m * n * k / ms / 1e9:.0f} |")
    cublas.destroy(handle)
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
