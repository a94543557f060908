"""Convolution benchmark: every distinct conv shape of MobileNetV2 (224², batch 1
and 64), VGG16 (224², batch 1 and 64) and the factorized-prior GDN autoencoder
(256², batch 16, N=128, M=192), gdnflow against torch.nn.functional.conv2d /
conv_transpose2d (cuDNN, benchmark mode, TF32 off) in the same process.

    python benchmarks/bench_conv.py --out benchmarks/results/conv.md [--quick]
        [--backward] [--autotune] [--models mobilenet_v2,vgg16,gdn]

Each row is one distinct layer shape (``count`` = how often the model uses
it); the "all conv layers" rows weight each shape by its count. Forward only
(inference, no graph) unless ``--backward`` (then forward + gradients of x
and w). Times are medians of CUDA-event timings after warm-up; ratio =
torch / gdnflow, above 1 means gdnflow is faster.
"""
import argparse
import collections
import math
import time

import numpy as np

import harness
import gdnflow as gf
from gdnflow import ops
from gdnflow.ops.conv import conv_geometry, normalize_padding, planner

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


MODELS = {
    "mobilenet_v2": [("MobileNetV2", 1, mobilenet_v2_layers(1)),
                     ("MobileNetV2", 64, mobilenet_v2_layers(64))],
    "vgg16": [("VGG16", 1, vgg16_layers(1)), ("VGG16", 64, vgg16_layers(64))],
    "gdn": [("GDN autoencoder", 16, gdn_autoencoder_layers())],
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


def algorithm_name(layer, stage):
    """What the planner runs for this layer (conv_transpose2d's forward is backward-data)."""
    if layer.transposed:
        n, c_in, h, w = layer.x_shape
        _, og, k, _ = layer.w_shape
        s, p, op = layer.stride, layer.padding, layer.output_padding
        size = ((h - 1) * s - 2 * p + k + op, (w - 1) * s - 2 * p + k + op)
        x_shape = (n, og * layer.groups) + size
        stage = {"forward": "backward_data", "backward_data": "forward"}.get(stage, stage)
    else:
        x_shape = layer.x_shape
    g = conv_geometry("conv2d", x_shape, layer.w_shape, (layer.stride,) * 2,
                      normalize_padding("conv2d", layer.padding), (1, 1), layer.groups)
    return planner.choose(g, stage).name


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


def bench_layer(torch, layer, rng, warmup, repeats, backward):
    """(gdnflow ms, torch ms or None, relative difference of the outputs)."""
    x_host, w_host = make_inputs(layer, rng)
    x = gf.tensor(x_host, device="cuda", requires_grad=backward)
    w = gf.tensor(w_host, device="cuda", requires_grad=backward)
    forward = gdnflow_call(layer, x, w)
    with gf.no_grad():
        y_host = forward().numpy()
    if backward:
        gy = gf.tensor(rng.standard_normal(y_host.shape, dtype=np.float32), device="cuda")

        def step():
            x.grad = w.grad = None          # no accumulation kernel inside the timing
            forward().backward(gy)
        ms = harness.time_gdnflow(step, warmup, repeats)
    else:
        with gf.no_grad():
            ms = harness.time_gdnflow(forward, warmup, repeats)
    del x, w
    if torch is None:
        return ms, None, None
    tx = torch.from_numpy(x_host).cuda().requires_grad_(backward)
    tw = torch.from_numpy(w_host).cuda().requires_grad_(backward)
    tforward = torch_call(torch, layer, tx, tw)
    with torch.no_grad():
        ref = tforward().cpu().numpy()
    err = float(np.max(np.abs(y_host - ref)) / max(np.max(np.abs(ref)), 1e-30))
    if backward:
        tgy = torch.from_numpy(rng.standard_normal(ref.shape, dtype=np.float32)).cuda()
        tms = harness.time_torch(lambda: torch.autograd.grad(tforward(), (tx, tw), tgy),
                                 warmup, repeats)
    else:
        with torch.no_grad():
            tms = harness.time_torch(tforward, warmup, repeats)
    del tx, tw
    return ms, tms, err


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
    repeats = args.repeats or (10 if args.quick else 30)
    warmup = 3 if args.quick else 10
    planner.autotune = args.autotune
    torch = harness.torch_or_none()
    rng = np.random.default_rng(0)
    rows, notes = [], []
    started = time.perf_counter()
    stage = "backward" if args.backward else "forward"
    for key in args.models.split(","):
        for model, batch, layers in MODELS[key]:
            counts = collections.Counter(layers)
            total_ms = total_tms = 0.0
            for layer in counts:                 # first-use order, each shape once
                ms, tms, err = bench_layer(torch, layer, rng, warmup, repeats, args.backward)
                algo = algorithm_name(layer, "forward")
                total_ms += counts[layer] * ms
                total_tms += counts[layer] * (tms or 0.0)
                rows.append([f"{model} b{batch}", describe(layer), counts[layer], algo,
                             f"{ms:.3f}", "-" if tms is None else f"{tms:.3f}",
                             "-" if tms is None else f"{tms / ms:.2f}",
                             "-" if err is None else f"{err:.1e}"])
                print(" | ".join(str(c) for c in rows[-1]), flush=True)
            rows.append([f"**{model} b{batch}**", "**all conv layers (x count)**",
                         len(layers), "", f"**{total_ms:.3f}**",
                         f"**{total_tms:.3f}**" if torch else "-",
                         f"**{total_tms / total_ms:.2f}**" if torch else "-", ""])
    notes.append(f"{stage}; median of {repeats} CUDA-event timings after {warmup} warm-up runs; "
                 "ratio = torch / gdnflow (above 1: gdnflow faster)")
    notes.append("torch: cudnn.benchmark=True, TF32 off (cudnn.allow_tf32 = "
                 "cuda.matmul.allow_tf32 = False); float32 NCHW; no bias")
    notes.append("algorithm: what gdnflow's planner ran for the forward ("
                 + ("measured per shape" if args.autotune else "heuristic choice") + "); "
                 "err: max |gdnflow - torch| / max |torch| of the forward output")
    notes.append("batch-1 inputs fit in L2, so those rows time L2-resident data")
    notes.append(f"benchmark wall time {time.perf_counter() - started:.0f} s")
    harness.emit(harness.markdown_table(
        f"Convolutions ({stage})",
        ["model", "layer (N x C x H x W -> C_out, kernel/stride)", "count", "algorithm",
         "gdnflow ms", "torch ms", "ratio", "err"], rows, notes), args.out)


if __name__ == "__main__":
    main()
