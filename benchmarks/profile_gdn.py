"""Where a GDN forward+backward spends its time on the GPU, stage by stage.

    python benchmarks/profile_gdn.py --out benchmarks/results/gdn_profile.md

For 8x192x64x64 and 16x128x128x128, two GPU paths of ``gdnflow.ops.gdn``
(``gdnflow.config`` knobs): "before" runs the channel sums as cuBLAS GEMMs with
the elementwise kernels around them, "after" the fused GEMM kernels
(``gdn_fused``); both take dL/dbeta from segment sums of U and cut the
parameter GEMM into chunks. (Earlier versions of this script compared the
ones row of S1 against the segment sums; those tables are in git history.
The first version, one GEMM over all pixels, is the sweep's one-chunk row.)
Four tables:

1. Stages. Each stage method of :class:`gdnflow.ops.gdn.cuda_plan.CudaPlan` alone:
   CUDA events on gdnflow's stream around the one call, with a 256 MB memset
   queued just before the start event. The memset keeps the GPU busy while
   Python queues the stage (so the time is the GPU's, not the launch's) and
   evicts L2 (50 MB), so every stage reads cold from HBM, as its floor
   assumes. "host us" is the Python time of the call. Floor: the larger of
   bytes / 4.1 TB/s (each operand read once, each result written once) and
   FLOPs / 50 TFLOP/s (measured FP32 SGEMM, no TF32; TARGETS.md).
2. Whole calls. The operator alone (effective beta and gamma given) and the
   layer (with its reparameterisation, fused into the operator since: one
   small launch in the forward, none in the backward): "events" brackets the Python dispatch like bench_gdn.py,
   "GPU busy" queues a 2 GB memset first so that only device time counts,
   "host" is the Python time of one call (no waiting). Launches that Python
   queues faster than the GPU runs them are hidden; events - GPU busy is
   the time the GPU waited for Python.
3. The parameter-gradient GEMM and the forward GEMM against the chunk count.
4. Agreement of the two paths (relative error, after against before).

Prediction for the fused kernels (written after bench_gdn's first run of
them, before the profile): the forward reads x once and writes y, D and S
(~100 MB, 25 us at HBM speed) around a 2.4 GFLOP product (48 us at the SGEMM
rate); overlapped, ~55-75 us against 110 us for its three stages; the
backward, ~60-80 us against 131 us. Measured: 84 and 87 us, the product
at 28-32 TFLOP/s (docs/performance.md has why); 77 and 86 us once the
forward applied s(x) once per element.

Predictions (written before any run; first principles, H200 floors)
-------------------------------------------------------------------
8x192x64x64: M = 6.29 M floats, 25.2 MB per tensor; P = 32768 pixels.

    stage             floor   bound         predicted before   predicted after
    statistic         12 us   HBM 50 MB     18 us (~65%)       14 us (~85%)
    norm GEMM         48 us   2.4 GFLOP     70-95 us (50-70%)  same (same tiles)
    forward           25 us   HBM 101 MB    35 us (~70%)       29 us (~85%)
    backward_norm     31 us   HBM 126 MB    45 us (~70%)       36 us (~85%)
    param GEMM        49 us   2.4 GFLOP     80-150 us          60-65 us (~80%)
    split / reduce    0 / 2   -             3 us               4 us
    input GEMM        48 us   2.4 GFLOP     70-95 us           same
    backward_input    31 us   HBM 126 MB    45 us (~70%)       36 us (~85%)
    device total     246 us                 ~370-490 us        ~320-370 us

- Budget of the measured layer fwd+bwd (0.532 ms): ~70-90 us of Python
  before the first GDN kernel (6 reparameterisation launches, ~12-15 us each
  through Operator.__call__, while the GPU idles), then device-bound: after
  the first kernel Python queues the rest (~150-200 us) faster than the GPU
  runs it (~350-450 us). The forward alone (0.253 ms) is the same prefix plus
  ~130-170 us of device time.
- The param GEMM [192, 32768] @ [32768, 193] has 4 output tiles of 128 x 128
  for 132 SMs: unless cuBLAS splits K well on its own (it may: the balance
  above leaves ~80-150 us for it) it runs on a few SMs. Cut into 64 chunks of
  512 pixels it is 256 CTAs (~2 per SM) plus a 9.5 MB sum. At C = 128 the
  ones row makes N = 129, one column past a 128-wide tile: if cuBLAS takes
  128-wide tiles there, half the param GEMM's tiles are almost empty, and it
  runs at about half the rate it has at C = 192 (the sweep table's "without
  ones row" column prices this).
- The elementwise kernels did two 32-bit divisions and one 4-byte access per
  operand per element: ~16 KB in flight per SM, ~65-75% of HBM; 16-byte
  accesses (4x the bytes in flight per instruction, the index arithmetic
  once per 4 elements) should reach ~85%. The "before" path here runs the
  new 4-byte kernels with one chunk: they do one more (multiply-high)
  division per element than the first version's kernels, so "before" may
  be a few us slower than the first version was; bench_gdn's "before" column
  against the table of the first version (0.532 ms) shows how far.
- The K = 192 GEMMs (norm, input) are short in K, and 192 = 1.5 tiles of 128:
  50-70% of the SGEMM rate; not changed here (they would need a GEMM of our
  own with the elementwise work fused into its prologue and epilogue).

So: the layer's fwd+bwd at 8x192x64x64 from 0.53 to ~0.40-0.45 ms
(2.1-2.9x CompressAI's 0.95-1.18 ms). What is left towards 3x (~0.35 ms):
the ~70-90 us Python prefix of the reparameterisation (outside
gdnflow/ops/gdn/: one fused launch per parameter, or computing the
effective beta and gamma once per optimizer step), and the K = 192 GEMMs.
(Later: the reparameterisation went into the GDN operator itself, one
launch for both parameters in the forward and the chain rule inside the
gradient reduction; see gdnflow/ops/gdn/operator.py.)

Prediction for the segment sums of dL/dbeta (before the run): the sweep
priced the ones row at ~11 us of the param GEMM at 64 chunks (91.7 against
80.4 us without it, H200). The backward_norm kernel adds a warp sum and one
store per 128 values (under 1 us) and writes no ones row (P floats less);
the reduce reads 49k more floats (~1 us). So ~10 us less per fwd+bwd at
8x192x64x64, and at C = 128, where the ones row makes N = 129, more.
"""
import argparse
import statistics
import sys
import time

import numpy as np

from gdnflow import benchmarking as harness
from gdnflow import config
import gdnflow as gf
from gdnflow.backends import cuda
from gdnflow.nn import GDN
from gdnflow.ops.gdn.cuda_plan import cuda_plan
from gdnflow.testing import relative_error

SHAPES = ((8, 192, 64, 64), (16, 128, 128, 128))
HBM_BYTES_PER_S = 4.1e12        # measured copy, read + write (TARGETS.md)
SGEMM_FLOP_PER_S = 50e12        # measured 8192^3 SGEMM, no TF32 (TARGETS.md)
FLUSH_FLOATS = 64 << 20         # 256 MB > L2 (50 MB), ~80 us of memset: covers a launch
BUSY_FLUSHES = 8                # 2 GB, ~0.6 ms: covers a whole fwd+bwd call's Python
#: gdnflow.config knobs per path: "before" the cuBLAS products with
#: elementwise kernels around them, "after" the fused GEMM kernels.
PATHS = {"before": {"gdn_fused": False}, "after": {"gdn_fused": True}}
SWEEP_CHUNKS = (1, 8, 16, 32, 64, 128, 256)


class Timer:
    """Median device and host times of callables on gdnflow's stream."""

    def __init__(self, repeats, warmup=5):
        import pycuda.driver as drv
        self.drv, self.repeats, self.warmup = drv, repeats, warmup
        self.runtime = cuda.get_runtime()
        self.stream = self.runtime.stream
        self.flush = self.runtime.empty((BUSY_FLUSHES * FLUSH_FLOATS,), np.float32)
        self.start, self.end = drv.Event(), drv.Event()

    def delay(self, flushes=1):
        """Queue a memset of ``flushes`` x 256 MB: ~80 us of GPU time each, L2 evicted."""
        self.drv.memset_d32_async(self.flush.ptr, 0, flushes * FLUSH_FLOATS, self.stream)

    def time(self, fn, flushes=1):
        """(median device ms, median host us of fn()), ``flushes`` x 256 MB memset first."""
        for _ in range(self.warmup):
            fn()
        self.stream.synchronize()
        device, host = [], []
        for _ in range(self.repeats):
            if flushes:
                self.delay(flushes)
            self.start.record(self.stream)
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e6)
            self.end.record(self.stream)
            self.end.synchronize()
            device.append(self.end.time_since(self.start))
        return statistics.median(device), statistics.median(host)


def on_path(path):
    """Context manager: a GPU path of gdnflow.ops.gdn for every call within."""
    return config.override(**PATHS[path])


def device(array):
    """A float32 copy of a host array on the GPU."""
    return cuda.get_runtime().from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def empty(shape):
    """An uninitialised float32 GPU array."""
    return cuda.empty(shape, np.float32)


def inputs(rng, shape):
    """x, gy (standard normal), beta in [0.5, 1.5], gamma in [0, 2/C] (host arrays)."""
    channels = shape[1]
    return (rng.standard_normal(shape, dtype=np.float32),
            rng.standard_normal(shape, dtype=np.float32),
            rng.uniform(0.5, 1.5, channels).astype(np.float32),
            rng.uniform(0.0, 2.0 / channels, (channels, channels)).astype(np.float32))


def stage_rows(timer, shape, path, host):
    """One row per stage of ``path`` at ``shape``; also returns the summed device ms."""
    plan = cuda_plan("gdn", shape, config.settings.gdn_param_gemm_chunks)
    vec = plan.can_vectorize
    fused = PATHS[path]["gdn_fused"] and plan.fusable
    x, gy, beta, gamma = (device(a) for a in host)
    c, p, m = plan.channels, plan.pixels, plan.total
    y, gx = empty(shape), empty(shape)
    s, norm, u, g = (plan.empty(c) for _ in range(4))
    segments = plan.fused_segments if fused else plan.beta_segments(vec)
    columns = c if segments else c + 1
    s1 = plan.empty(columns)
    beta_sums = empty((shape[0] * c * segments,)) if segments else None
    sums_floats = shape[0] * c * segments
    partial = device(np.zeros((plan.chunks, c, columns)))
    ggamma, gbeta = device(np.zeros((c, c))), device(np.zeros(c))
    gamma_t = empty((c, c))
    plan.transpose_gamma(gamma, gamma_t)
    # The forward first (it fills D), then every stage on its own.
    plan.statistic(x, s, vec)
    plan.norm_gemm(gamma, s, norm)
    plan.forward(x, norm, beta, y, True, vec)
    gemm = 2 * c * c * p
    f4 = 4.0
    gemm_stages = [
        ("param GEMM", lambda: plan.param_gemm(u, s if segments else s1, partial, columns),
         f4 * (2 * m + (columns - c) * p + plan.chunks * c * columns), 2 * c * columns * p),
        ("split" if plan.chunks == 1 else "reduce",
         lambda: plan.reduce_param_grads(partial, beta_sums, ggamma, gbeta),
         f4 * (plan.chunks * c * columns + sums_floats + c * (c + 1)), 0)]
    # The fused forward reads x (and again, from L2, in its epilogue) and
    # writes y, D and S; the fused backward reads x, gy and D (again from L2
    # in its epilogue) and writes U, gx and the segment sums.
    fused_stages = [
        ("fused forward", lambda: plan.fused_forward(x, gamma_t, beta, y, norm, s), f4 * 4 * m,
         gemm),
        ("fused backward", lambda: plan.fused_backward(x, gy, norm, gamma, u, None, beta_sums, gx),
         f4 * (5 * m + sums_floats), gemm)] + gemm_stages
    stages = fused_stages if fused else [
        ("statistic", lambda: plan.statistic(x, s, vec), f4 * 2 * m, 0),
        ("norm GEMM", lambda: plan.norm_gemm(gamma, s, norm), f4 * 2 * m, gemm),
        # Writes D over D: values stay positive and finite, the work is the same.
        ("forward", lambda: plan.forward(x, norm, beta, y, True, vec), f4 * 4 * m, 0),
        # With segment sums the operator keeps the forward's S: not written again.
        ("backward_norm", lambda: plan.backward_norm(x, gy, norm, u, None if segments else s1,
                                                     beta_sums, vec),
         f4 * ((4 if segments else 5) * m + (columns - c) * p + sums_floats), 0),
    ] + gemm_stages + [
        ("input GEMM", lambda: plan.input_gemm(gamma, u, g), f4 * 2 * m, gemm),
        ("backward_input", lambda: plan.backward_input(x, gy, norm, g, gx, vec), f4 * 5 * m, 0),
    ]
    rows, total_ms = [], 0.0
    for name, fn, nbytes, flops in stages:
        ms, host_us = timer.time(fn)
        total_ms += ms
        floor_ms = max(nbytes / HBM_BYTES_PER_S, flops / SGEMM_FLOP_PER_S) * 1e3
        achieved = (f"{flops / ms / 1e9:.1f} TFLOP/s" if flops else "") + \
            (", " if flops else "") + f"{nbytes / ms / 1e6:.0f} GB/s"
        rows.append([name, f"{ms * 1e3:.1f}", f"{host_us:.1f}", achieved,
                     f"{floor_ms * 1e3:.1f}", f"{100 * floor_ms / ms:.0f}%"])
    rows.append(["sum of stages", f"{total_ms * 1e3:.1f}", "", "", "", ""])
    layout = f"{plan.chunks} chunk{'s' if plan.chunks > 1 else ''} of {plan.chunk} px, " \
             f"{'fused GEMM kernels' if fused else 'cuBLAS products, 16-byte kernels'}, " \
             "dL/dbeta " + \
             (f"from {segments} segment sums per row" if segments else "by the ones row")
    return rows, layout, total_ms


def call_rows(timer, shape, path, host):
    """Whole forward+backward calls of the operator and of the layer, on ``path``."""
    x_h, gy_h, beta_h, gamma_h = host
    x = gf.tensor(x_h, device="cuda", requires_grad=True)
    gy = gf.tensor(gy_h, device="cuda")
    beta = gf.tensor(beta_h, device="cuda", requires_grad=True)
    gamma = gf.tensor(gamma_h, device="cuda", requires_grad=True)
    layer = GDN(shape[1]).to("cuda")

    def op_forward():
        return gf.ops.gdn(x, beta, gamma)

    def op_forward_backward():
        x.grad = beta.grad = gamma.grad = None
        gf.ops.gdn(x, beta, gamma).backward(gy)

    def layer_forward_backward():
        x.grad = None
        layer.zero_grad()
        layer(x).backward(gy)

    rows, summary = [], {}
    for name, fn in (("op forward", op_forward), ("op fwd+bwd", op_forward_backward),
                     ("layer fwd+bwd", layer_forward_backward)):
        with on_path(path):
            events_ms, host_us = timer.time(fn, flushes=0)
            busy_ms, _ = timer.time(fn, flushes=BUSY_FLUSHES)
        rows.append([name, f"{events_ms * 1e3:.1f}", f"{busy_ms * 1e3:.1f}",
                     f"{max(0.0, events_ms - busy_ms) * 1e3:.1f}", f"{host_us:.1f}"])
        summary[name] = (events_ms, busy_ms, host_us)
    return rows, summary


def sweep_rows(timer, shape, host):
    """Parameter GEMM (+ its reduction) and the forward GEMM against the chunk count."""
    x_h, gy_h, beta_h, gamma_h = host
    rows = []
    for request in SWEEP_CHUNKS:
        plan = cuda_plan("gdn", shape, request)
        if plan.chunks != request:
            continue
        c, p = plan.channels, plan.pixels
        gamma = device(gamma_h)
        u, s = plan.empty(c), plan.empty(c)
        s1 = plan.empty(c + 1)
        for a in (u, s, s1):
            timer.drv.memset_d32_async(a.ptr, int(np.float32(0.5).view(np.uint32)), a.size,
                                       timer.stream)
        partial = device(np.zeros((plan.chunks, c, c + 1)))
        ggamma, gbeta = device(np.zeros((c, c))), device(np.zeros(c))
        gemm_ms, host_us = timer.time(lambda: plan.param_gemm(u, s1, partial, c + 1))
        k = plan.chunk

        def without_ones_row():     # gamma's part alone: N = C, S1's first C rows per chunk
            plan.matmul(u.ptr, s1.ptr, partial.ptr, c, c, k, trans_b=True, batch=plan.chunks,
                        stride_a=c * k, stride_b=(c + 1) * k, stride_c=c * (c + 1))
        no_ones_ms, _ = timer.time(without_ones_row)
        reduce_ms, _ = timer.time(lambda: plan.reduce_param_grads(partial, None, ggamma, gbeta))
        norm_ms, _ = timer.time(lambda: plan.norm_gemm(gamma, s, u))
        flops = 2 * c * (c + 1) * p
        rows.append([str(plan.chunks), str(k), f"{gemm_ms * 1e3:.1f}",
                     f"{flops / gemm_ms / 1e9:.1f}", f"{host_us:.1f}", f"{no_ones_ms * 1e3:.1f}",
                     f"{reduce_ms * 1e3:.1f}", f"{(gemm_ms + reduce_ms) * 1e3:.1f}",
                     f"{norm_ms * 1e3:.1f}", f"{2 * c * c * p / norm_ms / 1e9:.1f}"])
    return rows


def agreement(shape, host):
    """Relative errors of the after path against the before path: y, gx, gbeta, ggamma."""
    results = {}
    for path in PATHS:
        x = gf.tensor(host[0], device="cuda", requires_grad=True)
        beta = gf.tensor(host[2], device="cuda", requires_grad=True)
        gamma = gf.tensor(host[3], device="cuda", requires_grad=True)
        with on_path(path):
            y = gf.ops.gdn(x, beta, gamma)
            y.backward(gf.tensor(host[1], device="cuda"))
        results[path] = [y.numpy(), x.grad.numpy(), beta.grad.numpy(), gamma.grad.numpy()]
    return [f"{relative_error(a, b):.1e}" for a, b in zip(results["after"], results["before"])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown tables here")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    started = time.perf_counter()
    timer = Timer(args.repeats)
    rng = np.random.default_rng(0)
    tables, summary = [], []
    for shape in SHAPES:
        name = "×".join(map(str, shape))
        host = inputs(rng, shape)
        stage_table, notes, stage_sums = [], [], {}
        for path in PATHS:
            rows, layout, stage_sums[path] = stage_rows(timer, shape, path, host)
            stage_table += [[path] + r for r in rows]
            notes.append(f"{path}: {layout}")
        notes.append("us: median device time, cold L2; floor: max(bytes / 4.1 TB/s, "
                     "FLOPs / 50 TFLOP/s); % of floor = floor / time")
        tables.append(harness.markdown_table(
            f"GDN {name}: stages", ["path", "stage", "us", "host us", "achieved",
                                    "floor us", "% of floor"], stage_table, notes))
        call_table = []
        for path in PATHS:
            rows, calls = call_rows(timer, shape, path, host)
            call_table += [[path] + r for r in rows]
            layer_events, layer_busy, layer_host = calls["layer fwd+bwd"]
            summary.append([name, path, f"{stage_sums[path] * 1e3:.0f}",
                            f"{calls['op fwd+bwd'][0] * 1e3:.0f}",
                            f"{layer_events * 1e3:.0f}", f"{layer_busy * 1e3:.0f}",
                            f"{layer_host:.0f}"])
        tables.append(harness.markdown_table(
            f"GDN {name}: whole calls",
            ["path", "call", "events us", "GPU busy us", "GPU waits for Python us",
             "host us"], call_table,
            ["events: as bench_gdn.py times (brackets Python dispatch); GPU busy: a 2 GB "
             "memset queued before the start event, so Python gaps vanish (cold L2, so "
             "it can exceed events); host: Python time of one call"]))
        tables.append(harness.markdown_table(
            f"GDN {name}: parameter GEMM against the chunk count",
            ["chunks", "K", "param GEMM us", "TFLOP/s", "host us", "without ones row us",
             "reduce us", "GEMM + reduce us", "norm GEMM us", "norm TFLOP/s"],
            sweep_rows(timer, shape, host),
            ["chunks = 1 is one GEMM over all pixels (the before path); without ones row: "
             "the same GEMM with N = C instead of C + 1 (no gbeta), to price the ones row "
             "(C + 1 = 129 is one column past a 128-wide tile at C = 128)"]))
        tables.append(harness.markdown_table(
            f"GDN {name}: after against before",
            ["y", "gx", "gbeta", "ggamma"], [agreement(shape, host)],
            ["relative error (max |difference| / max |before|), float32 on both"]))
    tables.append(harness.markdown_table(
        "GDN profile: summary (us)",
        ["shape", "path", "sum of stages", "op fwd+bwd events", "layer fwd+bwd events",
         "layer fwd+bwd GPU busy", "layer fwd+bwd host"], summary,
        [f"profile ran in {time.perf_counter() - started:.1f} s"]))
    harness.emit("\n".join(tables), args.out)


if __name__ == "__main__":
    sys.exit(main())
