"""Convolution benchmark: every distinct conv shape of MobileNetV2 (224², batch 1
and 64), VGG16 (224², batch 1 and 64) and the factorized-prior GDN autoencoder
(256², batch 16, N=128, M=192), gdnflow against torch.nn.functional.conv2d /
conv_transpose2d (cuDNN, benchmark mode, TF32 off) in the same process.

    python benchmarks/bench_conv.py --out benchmarks/results/conv.md [--quick]
        [--backward] [--autotune] [--models mobilenet_v2,vgg16,gdn,stems]

Each row is one distinct layer shape (``count`` = how often the model uses
it); the "all conv layers" rows weight each shape by its count. Forward only
(inference, no graph) unless ``--backward`` (then forward + gradients of x
and w). Times are medians of CUDA-event timings after warm-up; ratio =
torch / gdnflow, above 1 means gdnflow is faster.

For every layer Winograd can run (3x3, stride 1, groups 1: all of VGG16's)
the same call is also timed with the planner forced to im2col + GEMM, to
Winograd F(4x4) and to F(2x2) (for the stages each supports; the weight
gradient stays on im2col), so one run shows what each algorithm gives; and
every 1x1 layer with the planner forced to the per-image cuBLAS GEMMs
(``pointwise``) and to the direct kernel (``pointwise_direct``).

The per-layer times above are events around the Python call, so they include
gdnflow's (and torch's) host dispatch before the kernel starts, ~15-20 µs:
most of a small layer. The "gpu ms" columns time the same calls enqueued
behind a kernel that keeps the GPU busy until all are queued, so they run
back to back: the kernels' own time, what a batch-64 network (whose host
runs ahead of the GPU) or a CUDA graph sees. "floor ms" is the forward's
direct-convolution floor, max(bytes of x, w and y / 4.1 TB/s, 2 * multiply-adds
/ 50 TFLOP/s) (Winograd needs fewer multiplications; layers whose inputs fit
in L2, about 50 MB, can beat the HBM term in repeated runs).
"""
import argparse
import collections
import contextlib
import math
import statistics
import time

import numpy as np

from gdnflow import benchmarking as harness
import gdnflow as gf
from gdnflow import ops
from gdnflow.backends import cuda
from gdnflow.backends.cuda.sources import InlineSource
from gdnflow.config import override
from gdnflow.ops.conv.algorithms import winograd
from gdnflow.ops.conv.algorithms.grouped import GroupedDirect
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm, Pointwise
from gdnflow.ops.conv.algorithms.pointwise import Im2colDirect, PointwiseDirect
from gdnflow.ops.conv.algorithms.winograd import WinogradF2, WinogradF4
from gdnflow.ops.conv.geometry import STAGES, conv_geometry, normalize_padding
from gdnflow.ops.conv.planning import ConvPlanner, current_planner

#: The algorithms timed side by side (extra columns) where they apply.
COMPARED = (Im2colGemm, Im2colDirect, WinogradF4, WinogradF2, Pointwise, PointwiseDirect,
            GroupedDirect)
#: The floors of benchmarks/results (TARGETS.md): HBM copy rate, SGEMM rate.
HBM_BYTES_PER_S = 4.1e12
SGEMM_FLOP_PER_S = 50e12
#: A kernel that keeps the GPU busy for ``cycles`` clocks (gpu ms columns).
SPIN = InlineSource("""
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
""", "bench_conv_spin.cu")

Layer = collections.namedtuple(
    "Layer", "x_shape w_shape stride padding groups transposed output_padding")


def conv(n, c_in, size, c_out, k, stride=1, groups=1):
    """A conv2d layer with "same"-style padding k // 2 (every layer benchmarked here)."""
    return Layer((n, c_in, size, size), (c_out, c_in // groups, k, k), stride, k // 2, groups,
                 False, 0)


def mobilenet_v2_layers(n):
    """torchvision's MobileNetV2 at 224², width 1.0: stem, inverted residuals, last 1x1."""
    layers = [conv(n, 3, 224, 32, 3, stride=2)]
    c_in, size = 32, 112
    for t, c, repeats, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for r in range(repeats):
            stride = s if r == 0 else 1
            hidden = c_in * t
            if t != 1:
                layers.append(conv(n, c_in, size, hidden, 1))
            layers.append(conv(n, hidden, size, hidden, 3, stride=stride, groups=hidden))
            size //= stride
            layers.append(conv(n, hidden, size, c, 1))
            c_in = c
    layers.append(conv(n, 320, 7, 1280, 1))
    return layers


def vgg16_layers(n):
    """VGG16's thirteen 3x3 convolutions at 224²."""
    layers, c_in, size = [], 3, 224
    for c_out, repeats in [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]:
        for _ in range(repeats):
            layers.append(conv(n, c_in, size, c_out, 3))
            c_in = c_out
        size //= 2
    return layers


def gdn_autoencoder_layers(n=16, big=128, latent=192, size=256):
    """Factorized prior: analysis conv5x5/2 x4, synthesis transposed conv5x5/2 x4."""
    analysis = [conv(n, 3, size, big, 5, 2), conv(n, big, size // 2, big, 5, 2),
                conv(n, big, size // 4, big, 5, 2), conv(n, big, size // 8, latent, 5, 2)]
    synthesis = []
    for c_in, c_out, s in [(latent, big, size // 16), (big, big, size // 8),
                           (big, big, size // 4), (big, 3, size // 2)]:
        synthesis.append(Layer((n, c_in, s, s), (c_in, c_out, 5, 5), 2, 2, 1, True, 1))
    return analysis + synthesis


def stem_layers(n):
    """The first layers (RGB in, groups 1) of the torchvision families at 224², "same"
    padding: SqueezeNet 1.1's 3x3/2 to 64, ResNet's, GoogLeNet's and DenseNet's 7x7/2
    to 64, MobileNetV2's, EfficientNet's and RegNet's 3x3/2 to 32, MobileNetV3's to 16,
    and a 3x3/1 to 64 (VGG's)."""
    return [conv(n, 3, 224, 64, 3, 2), conv(n, 3, 224, 64, 7, 2), conv(n, 3, 224, 32, 3, 2),
            conv(n, 3, 224, 16, 3, 2), conv(n, 3, 224, 64, 3)]


MODELS = {
    "mobilenet_v2": [("MobileNetV2", 1, mobilenet_v2_layers(1)),
                     ("MobileNetV2", 64, mobilenet_v2_layers(64))],
    "vgg16": [("VGG16", 1, vgg16_layers(1)), ("VGG16", 64, vgg16_layers(64))],
    "gdn": [("GDN autoencoder", 16, gdn_autoencoder_layers())],
    "stems": [("RGB first layers", 1, stem_layers(1)), ("RGB first layers", 32, stem_layers(32))],
}


def describe(layer):
    n, c, h, w = layer.x_shape
    k = layer.w_shape[2]
    if layer.transposed:
        c_out = layer.w_shape[1] * layer.groups
        return f"{n}x{c}x{h}x{w} -> {c_out}, convT {k}x{k}/{layer.stride}"
    c_out = layer.w_shape[0]
    kind = ("dw " if layer.groups == c == c_out and layer.groups > 1
            else "pw " if k == 1 else "")
    return f"{n}x{c}x{h}x{w} -> {c_out}, {kind}{k}x{k}/{layer.stride}"


def geometry(layer):
    """The conv2d geometry of a (non-transposed) layer."""
    return conv_geometry("conv2d", layer.x_shape, layer.w_shape, (layer.stride,) * 2,
                         normalize_padding("conv2d", layer.padding), (1, 1), layer.groups)


def compared_algorithms(layer):
    """The algorithms to time one by one for this layer: im2col (GEMM and direct product) and
    Winograd's two, or the two 1x1 ones; for a first layer on image channels also the
    grouped kernel (as one group)."""
    if layer.transposed:
        return ()
    g = geometry(layer)
    stem = (GroupedDirect,) if g.groups == 1 and GroupedDirect.supports(g) else ()
    if winograd.supports(g):
        return (Im2colGemm, Im2colDirect, WinogradF4, WinogradF2) + stem
    if stem:
        return (Im2colGemm, Im2colDirect) + stem
    if PointwiseDirect.supports(g):
        return (Pointwise, PointwiseDirect)
    if Im2colDirect.supports(g):
        return (Im2colGemm, Im2colDirect)
    return ()


def floor_ms(layer):
    """The forward's floor: max(bytes of x, w, y at HBM rate, 2 * multiply-adds at SGEMM rate)."""
    y_shape = output_shape(layer)
    taps = math.prod(layer.w_shape[1:])         # per output (conv) or per input (transposed)
    macs = math.prod(layer.x_shape if layer.transposed else y_shape) * taps
    moved = 4 * (math.prod(layer.x_shape) + math.prod(layer.w_shape) + math.prod(y_shape))
    return 1e3 * max(moved / HBM_BYTES_PER_S, 2 * macs / SGEMM_FLOP_PER_S)


def _queued_ms(run, calls, repeats):
    """Median of run(seconds) -> (ms per call, whether the busy kernel outlasted the enqueueing).

    The busy time starts at twice the host time of one unqueued run and
    doubles whenever the GPU caught up with the host (a launch gap inside).
    """
    started = time.perf_counter()
    run(0.0)
    seconds = max(2 * (time.perf_counter() - started), 1e-3)
    times = []
    while len(times) < repeats:
        ms, covered = run(seconds)
        if covered:
            times.append(ms)
        elif seconds > 1.0:
            return float("nan")
        else:
            seconds *= 2
    return statistics.median(times)


def _clock_hz():
    import pycuda.driver as drv
    return 1e3 * cuda.get_runtime().device.get_attribute(drv.device_attribute.CLOCK_RATE)


def gdnflow_gpu_ms(fn, calls=10, repeats=5):
    """Milliseconds of GPU time per fn() call, the calls queued behind a busy kernel."""
    import pycuda.driver as drv
    stream = harness.gdnflow_stream()
    spin, hz = cuda.kernel(SPIN, "spin", "q"), _clock_hz()

    def run(seconds):
        slept, start, end = drv.Event(), drv.Event(), drv.Event()
        spin((1, 1, 1), (1, 1, 1), int(seconds * hz))
        slept.record(stream)
        start.record(stream)
        for _ in range(calls):
            fn()
        end.record(stream)
        covered = not slept.query()
        end.synchronize()
        return end.time_since(start) / calls, covered
    return _queued_ms(run, calls, repeats)


def torch_gpu_ms(torch, fn, calls=10, repeats=5):
    """As :func:`gdnflow_gpu_ms` for torch (torch.cuda._sleep keeps its stream busy)."""
    if not hasattr(torch.cuda, "_sleep"):
        return float("nan")
    hz = _clock_hz()

    def run(seconds):
        slept, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda._sleep(int(seconds * hz))
        slept.record()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        covered = not slept.query()
        end.synchronize()
        return start.elapsed_time(end) / calls, covered
    return _queued_ms(run, calls, repeats)


class ForcedPlanner:
    """Runs ``algorithm`` for every stage it offers and supports; asks ``fallback`` otherwise."""

    def __init__(self, algorithm, fallback):
        self.algorithm, self.fallback = algorithm, fallback

    def choose(self, g, stage):
        if stage in getattr(self.algorithm, "stages", STAGES) and self.algorithm.supports(g):
            return self.algorithm
        return self.fallback.choose(g, stage)


def forced(algorithm):
    """Within the block, conv2d runs ``algorithm`` where it can (None: the normal planner)."""
    if algorithm is None:
        return contextlib.nullcontext()
    return override(conv_planner=ForcedPlanner(algorithm, current_planner()))


def output_shape(layer):
    """[N, C_out, OH, OW] of the layer's output."""
    if not layer.transposed:
        return geometry(layer).y_shape
    n, _, h, w = layer.x_shape
    _, og, k, _ = layer.w_shape
    s, p, op = layer.stride, layer.padding, layer.output_padding
    return (n, og * layer.groups, (h - 1) * s - 2 * p + k + op, (w - 1) * s - 2 * p + k + op)


def algorithm_name(layer, stage):
    """What the planner runs for this layer (conv_transpose2d's forward is backward-data)."""
    if not layer.transposed:
        return current_planner().choose(geometry(layer), stage).name
    # The convolution whose input has this layer's output shape.
    g = geometry(layer._replace(x_shape=output_shape(layer), transposed=False))
    stage = {"forward": "backward_data", "backward_data": "forward"}.get(stage, stage)
    return current_planner().choose(g, stage).name


def make_inputs(layer, rng):
    x = rng.standard_normal(layer.x_shape, dtype=np.float32)
    fan_in = math.prod(layer.w_shape[1:])
    w = (rng.standard_normal(layer.w_shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
    return x, w


def gdnflow_call(layer, x, w):
    kw = dict(stride=layer.stride, padding=layer.padding, groups=layer.groups)
    if layer.transposed:
        return lambda: ops.conv_transpose2d(x, w, output_padding=layer.output_padding, **kw)
    return lambda: ops.conv2d(x, w, **kw)


def torch_call(torch, layer, x, w):
    F = torch.nn.functional
    kw = dict(stride=layer.stride, padding=layer.padding, groups=layer.groups)
    if layer.transposed:
        return lambda: F.conv_transpose2d(x, w, output_padding=layer.output_padding, **kw)
    return lambda: F.conv2d(x, w, **kw)


def time_gdnflow_layer(layer, x_host, w_host, gy_host, warmup, repeats, backward, gpu=False):
    """(median ms, forward output as NumPy) of gdnflow on this layer with the current planner;
    with ``gpu``, (median ms, GPU ms per call queued, output)."""
    x = gf.tensor(x_host, device="cuda", requires_grad=backward)
    w = gf.tensor(w_host, device="cuda", requires_grad=backward)
    forward = gdnflow_call(layer, x, w)
    with gf.no_grad():
        y_host = forward().numpy()
    if backward:
        gy = gf.tensor(gy_host, device="cuda")

        def step():
            x.grad = w.grad = None          # no accumulation kernel inside the timing
            forward().backward(gy)
        ms = harness.time_gdnflow(step, warmup, repeats)
        return (ms, gdnflow_gpu_ms(step), y_host) if gpu else (ms, y_host)
    with gf.no_grad():
        ms = harness.time_gdnflow(forward, warmup, repeats)
        return (ms, gdnflow_gpu_ms(forward), y_host) if gpu else (ms, y_host)


def relative_difference(y, ref):
    return float(np.max(np.abs(y - ref)) / max(np.max(np.abs(ref)), 1e-30))


def bench_layer(torch, layer, rng, warmup, repeats, backward):
    """(gdnflow ms, torch ms or None, {algorithm name: ms} for :func:`compared_algorithms`,
    the largest relative difference of any gdnflow output from torch's, or None,
    gdnflow GPU ms, torch GPU ms or None)."""
    x_host, w_host = make_inputs(layer, rng)
    gy_host = rng.standard_normal(output_shape(layer), dtype=np.float32) if backward else None
    ms, gpu_ms, y_host = time_gdnflow_layer(layer, x_host, w_host, gy_host, warmup, repeats,
                                            backward, gpu=True)
    outputs, compared = [y_host], {}
    for algorithm in compared_algorithms(layer):
        with forced(algorithm):
            compared[algorithm.name], y = time_gdnflow_layer(layer, x_host, w_host, gy_host,
                                                             warmup, repeats, backward)
        outputs.append(y)
    if torch is None:
        return ms, None, compared, None, gpu_ms, None
    tx = torch.from_numpy(x_host).cuda().requires_grad_(backward)
    tw = torch.from_numpy(w_host).cuda().requires_grad_(backward)
    tforward = torch_call(torch, layer, tx, tw)
    with torch.no_grad():
        ref = tforward().cpu().numpy()
    err = max(relative_difference(y, ref) for y in outputs)
    if backward:
        tgy = torch.from_numpy(gy_host).cuda()

        def tstep():
            return torch.autograd.grad(tforward(), (tx, tw), tgy)
        tms = harness.time_torch(tstep, warmup, repeats)
        tgpu_ms = torch_gpu_ms(torch, tstep)
    else:
        with torch.no_grad():
            tms = harness.time_torch(tforward, warmup, repeats)
            tgpu_ms = torch_gpu_ms(torch, tforward)
    del tx, tw
    return ms, tms, compared, err, gpu_ms, tgpu_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="10 timed runs instead of 30")
    parser.add_argument("--repeats", type=int, help="timed runs per layer (default 30)")
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--autotune", action="store_true",
                        help="let the planner time every supporting algorithm per shape")
    parser.add_argument("--models", default="mobilenet_v2,vgg16,gdn",
                        help="comma-separated subset of " + ",".join(MODELS))
    args = parser.parse_args()
    with override(conv_planner=ConvPlanner(autotune=args.autotune)):
        run(args)


def run(args):
    """Time every layer of the chosen models with the planner in effect; write the table."""
    repeats = args.repeats or (10 if args.quick else 30)
    warmup = 3 if args.quick else 10
    torch = harness.torch_or_none()
    rng = np.random.default_rng(0)
    rows, notes = [], []
    started = time.perf_counter()
    stage = "backward" if args.backward else "forward"
    for key in args.models.split(","):
        for model, batch, layers in MODELS[key]:
            counts = collections.Counter(layers)
            total_ms = total_tms = total_gpu = total_tgpu = total_floor = 0.0
            # Per compared algorithm: the model's total if that algorithm ran
            # wherever it can (the planner's choice elsewhere); and the best of all.
            totals = dict.fromkeys([a.name for a in COMPARED] + ["best"], 0.0)
            for layer in counts:                 # first-use order, each shape once
                ms, tms, compared, err, gpu, tgpu = bench_layer(torch, layer, rng, warmup,
                                                                repeats, args.backward)
                algo = algorithm_name(layer, "forward")
                floor = None if args.backward else floor_ms(layer)
                total_ms += counts[layer] * ms
                total_tms += counts[layer] * (tms or 0.0)
                total_gpu += counts[layer] * gpu
                total_tgpu += counts[layer] * (tgpu or 0.0)
                total_floor += counts[layer] * (floor or 0.0)
                for a in COMPARED:
                    totals[a.name] += counts[layer] * compared.get(a.name, ms)
                totals["best"] += counts[layer] * min([ms] + list(compared.values()))
                rows.append([f"{model} b{batch}", describe(layer), counts[layer], algo,
                             f"{ms:.3f}", "-" if tms is None else f"{tms:.3f}",
                             "-" if tms is None else f"{tms / ms:.2f}",
                             f"{gpu:.3f}", "-" if tgpu is None else f"{tgpu:.3f}",
                             "-" if tgpu is None else f"{tgpu / gpu:.2f}",
                             "-" if floor is None else f"{floor:.3f}"]
                            + [f"{compared[a.name]:.3f}" if a.name in compared else "-"
                               for a in COMPARED]
                            + ["-" if err is None else f"{err:.1e}"])
                print(" | ".join(str(c) for c in rows[-1]), flush=True)

            def bold_total(ms):
                ratio = f" ({total_tms / ms:.2f})" if torch else ""
                return f"**{ms:.3f}**{ratio}"
            rows.append([f"**{model} b{batch}**", "**all conv layers (x count)**",
                         len(layers), f"best of all: {bold_total(totals['best'])}",
                         f"**{total_ms:.3f}**", f"**{total_tms:.3f}**" if torch else "-",
                         f"**{total_tms / total_ms:.2f}**" if torch else "-",
                         f"**{total_gpu:.3f}**", f"**{total_tgpu:.3f}**" if torch else "-",
                         f"**{total_tgpu / total_gpu:.2f}**" if torch else "-",
                         "-" if args.backward else f"**{total_floor:.3f}**"]
                        + [bold_total(totals[a.name]) for a in COMPARED] + [""])
    notes.append(f"{stage}; median of {repeats} CUDA-event timings after {warmup} warm-up runs; "
                 "ratio = torch / gdnflow (above 1: gdnflow faster)")
    notes.append("torch: cudnn.benchmark=True, TF32 off (cudnn.allow_tf32 = "
                 "cuda.matmul.allow_tf32 = False); float32 NCHW; no bias")
    notes.append("algorithm: what gdnflow's planner ran for the forward ("
                 + ("measured per shape" if args.autotune else "heuristic choice") + "); "
                 "err: max |gdnflow - torch| / max |torch| of the forward output, the "
                 "largest over every algorithm timed for the layer")
    notes.append(", ".join(f"{a.name} ms" for a in COMPARED) + ": the same call with the "
                 "planner forced to that algorithm where it applies (im2col_direct: the "
                 "forward of groups-1 layers, the rest on im2col_gemm; 3x3 stride-1 layers: "
                 "Winograd runs forward and backward-data, the weight gradient stays on "
                 "im2col; 1x1 layers: pointwise = one cuBLAS GEMM per image, pointwise_direct "
                 "= the direct kernel, forward and backward-data; grouped_direct: the forward "
                 "of a first layer on image channels); their total rows count the "
                 "planner's time for the other layers, with the ratio to torch in parentheses; "
                 "best of all: the fastest per layer")
    notes.append("gpu ms, torch gpu ms: GPU time per call with the calls queued behind a "
                 "busy kernel (no host dispatch gaps), median of 5 x 10 calls; gpu ratio = "
                 "torch gpu / gpu; floor ms: the forward's max(bytes of x, w, y / 4.1 TB/s, "
                 "2 x multiply-adds / 50 TFLOP/s), so floor / gpu is the fraction of the "
                 "floor reached")
    notes.append("batch-1 inputs fit in L2, so those rows time L2-resident data")
    notes.append(f"benchmark wall time {time.perf_counter() - started:.0f} s")
    harness.emit(harness.markdown_table(
        f"Convolutions ({stage})",
        ["model", "layer (N x C x H x W -> C_out, kernel/stride)", "count", "algorithm",
         "gdnflow ms", "torch ms", "ratio", "gpu ms", "torch gpu ms", "gpu ratio", "floor ms"]
        + [f"{a.name} ms" for a in COMPARED] + ["err"],
        rows, notes), args.out)


if __name__ == "__main__":
    main()
