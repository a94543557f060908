"""GDN in 16 bits: gdnflow's tensor-core kernels against its float32 fused kernels,
with CompressAI's GDN in float32 and under torch.autocast(bfloat16) beside them.

    python benchmarks/bench_gdn_half.py --out benchmarks/results/precision/gdn_half.md

The GDN layer (with its parameter reparameterisation, as in training),
forward and forward+backward, x and the output gradient in the dtype named
(parameters float32). Two timings of each gdnflow call (``profile_gdn.Timer``):
"events" brackets the Python call with CUDA events, as ``bench_gdn.py`` does
(what an eager loop sees); "GPU" queues 2 GB of memset first, so that Python
hides behind it and only device time counts (what a captured step sees; L2
is cold). CompressAI is timed with events; TF32 off on both sides, except
that CompressAI's autocast runs its convolution in bfloat16 (cuDNN).
Issue #18's target: bf16 forward+backward at 8x192x64x64 at least 2x
gdnflow's float32 fused kernels.
"""
import argparse

import numpy as np

import gdnflow as gf
from gdnflow import benchmarking as harness
from gdnflow.nn import GDN
from gdnflow.testing import relative_error
from profile_gdn import BUSY_FLUSHES, Timer

SHAPES = ((8, 192, 64, 64), (16, 128, 128, 128), (16, 128, 64, 64))
DTYPES = ("fp32", "bf16", "fp16")


def gdnflow_calls(layer, x_host, gy_host, dtype):
    """(forward, forward+backward) callables of the layer on x and gy in ``dtype``."""
    x = gf.tensor(x_host, device="cuda", dtype=dtype, requires_grad=True)
    gy = gf.tensor(gy_host, device="cuda", dtype=dtype)

    def forward_backward():
        x.grad = None
        layer.zero_grad()
        layer(x).backward(gy)
    return (lambda: layer(x)), forward_backward


def compressai_calls(torch, layer, x_host, gy_host, bf16):
    """(forward, forward+backward) of CompressAI's layer, under autocast with ``bf16``."""
    x = torch.tensor(x_host, device="cuda", requires_grad=True)
    gy = torch.tensor(gy_host, device="cuda")

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            return layer(x)

    def forward_backward():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        forward().backward(gy.to(torch.bfloat16) if bf16 else gy)
    return forward, forward_backward


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch = harness.torch_or_none()
    try:
        from compressai.layers import GDN as CompressaiGDN
    except ImportError:
        CompressaiGDN = None
    timer = Timer(args.repeats)
    rng = np.random.default_rng(0)
    rows, notes = [], []
    for shape in SHAPES:
        channels = shape[1]
        layer = GDN(channels).to("cuda")
        layer.load_state_dict({
            "beta": layer.beta_reparam.init(rng.uniform(0.5, 1.5, channels)),
            "gamma": layer.gamma_reparam.init(rng.uniform(0.0, 2.0 / channels,
                                                          (channels, channels)))})
        x_host = rng.standard_normal(shape, dtype=np.float32)
        gy_host = rng.standard_normal(shape, dtype=np.float32)
        label = "×".join(map(str, shape))
        fp32_busy = None
        outputs = {}
        for dtype in DTYPES:
            forward, forward_backward = gdnflow_calls(layer, x_host, gy_host, dtype)
            fwd_events = harness.time_gdnflow(forward, repeats=args.repeats)
            both_events = harness.time_gdnflow(forward_backward, repeats=args.repeats)
            fwd_busy = timer.time(forward, BUSY_FLUSHES)[0]
            both_busy = timer.time(forward_backward, BUSY_FLUSHES)[0]
            if dtype == "fp32":
                fp32_busy = (fwd_busy, both_busy)
            outputs[dtype] = forward().numpy().astype(np.float32)
            rows.append([label, f"gdnflow {dtype}", f"{fwd_events:.3f}", f"{fwd_busy:.3f}",
                         f"{both_events:.3f}", f"{both_busy:.3f}",
                         f"{fp32_busy[0] / fwd_busy:.2f}", f"{fp32_busy[1] / both_busy:.2f}"])
        for dtype in DTYPES[1:]:
            notes.append(f"{label}: gdnflow {dtype} output against gdnflow fp32: relative "
                         f"error {relative_error(outputs[dtype], outputs['fp32']):.1e}")
        if CompressaiGDN is not None:
            theirs = CompressaiGDN(channels, beta_min=1e-6, gamma_init=0.1)
            with torch.no_grad():
                theirs.beta.copy_(torch.from_numpy(layer.beta.numpy()))
                theirs.gamma.copy_(torch.from_numpy(layer.gamma.numpy()))
            theirs.to("cuda")
            for bf16 in (False, True):
                forward, forward_backward = compressai_calls(torch, theirs, x_host, gy_host, bf16)
                rows.append([label, "CompressAI " + ("autocast bf16" if bf16 else "fp32"),
                             f"{harness.time_torch(forward, repeats=args.repeats):.3f}", "-",
                             f"{harness.time_torch(forward_backward, repeats=args.repeats):.3f}",
                             "-", "-", "-"])
            del theirs
    if CompressaiGDN is None:
        notes.append("CompressAI (or PyTorch with CUDA) is not installed here: gdnflow only")
    notes.append("medians (ms) of CUDA-event timings after warm-up; \"GPU\": 2 GB of memset "
                 "queued before the start event, so only device time counts (cold L2); speed-up = gdnflow fp32's GPU time / this row's; x and the "
                 "output gradient in the row's dtype, parameters float32; TF32 off")
    harness.emit(harness.markdown_table(
        "GDN layer in 16 bits: gdnflow fp32 / bf16 / fp16 and CompressAI",
        ["shape", "run", "fwd ms (events)", "fwd ms (GPU)", "fwd+bwd ms (events)",
         "fwd+bwd ms (GPU)", "fwd speed-up (GPU)", "fwd+bwd speed-up (GPU)"], rows, notes),
        args.out)


if __name__ == "__main__":
    main()
