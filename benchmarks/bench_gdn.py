"""GDN layer forward and forward+backward: gdnflow against CompressAI's GDN.

    python benchmarks/bench_gdn.py --out benchmarks/results/gdn.md

Both layers include their parameter reparameterisation, as they do in
training. gdnflow is timed twice in the same run: its current GPU path and,
in the "before" columns, the path before the last change (cuBLAS for the
channel sums, with elementwise kernels around them, instead of the fused
GEMM kernels: ``gdnflow.config``'s ``gdn_fused`` off); ``--no-before`` skips
that. x requires a gradient in every timing (a training forward). Before each
forward+backward the gradients of x and the parameters are reset, so that
neither side pays for accumulating into old ones. Timing: CUDA events on each library's own stream, warm-up, median (see
``gdnflow.benchmarking``).
"""
import argparse

import numpy as np

from gdnflow import benchmarking as harness
from gdnflow import config
import gdnflow as gf
from gdnflow.nn import GDN
from gdnflow.testing import relative_error

#: gdnflow.config knobs for the "before" columns.
BEFORE = {"gdn_fused": False}

CHANNELS = (128, 192)
BATCHES = (8, 16)
SIDES = (64, 128)


def compressai_gdn():
    """CompressAI's GDN class, or None if it is not installed."""
    try:
        from compressai.layers import GDN as CompressaiGDN
    except ImportError:
        return None
    return CompressaiGDN


def time_gdnflow(layer, x, gy, repeats):
    """(forward ms, forward+backward ms) of gdnflow's layer."""
    def forward_backward():
        x.grad = None
        layer.zero_grad()
        layer(x).backward(gy)
    forward_ms = harness.time_gdnflow(lambda: layer(x), repeats=repeats)
    return forward_ms, harness.time_gdnflow(forward_backward, repeats=repeats)


def time_gdnflow_before(layer, x, gy, repeats):
    """time_gdnflow with the knobs of BEFORE."""
    with config.override(**BEFORE):
        return time_gdnflow(layer, x, gy, repeats)


def time_compressai(torch, layer, x, gy, repeats):
    """(forward ms, forward+backward ms) of CompressAI's layer."""
    def forward_backward():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).backward(gy)
    forward_ms = harness.time_torch(lambda: layer(x), repeats=repeats)
    return forward_ms, harness.time_torch(forward_backward, repeats=repeats)


def agreement(torch, ours, theirs, x_host, gy_host):
    """Relative errors of gdnflow against CompressAI: output and input gradient."""
    x = gf.tensor(x_host, device="cuda", requires_grad=True)
    y = ours(x)
    y.backward(gf.tensor(gy_host, device="cuda"))
    tx = torch.tensor(x_host, device="cuda", requires_grad=True)
    ty = theirs(tx)
    ty.backward(torch.tensor(gy_host, device="cuda"))
    return (relative_error(y.numpy(), ty.detach().cpu().numpy()),
            relative_error(x.grad.numpy(), tx.grad.cpu().numpy()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--inverse", action="store_true", help="time inverse GDN instead")
    parser.add_argument("--no-before", action="store_true",
                        help="skip timing gdnflow's first GPU path")
    args = parser.parse_args()
    torch = harness.torch_or_none()
    baseline = compressai_gdn() if torch is not None else None
    rng = np.random.default_rng(0)
    rows, notes = [], []
    for channels in CHANNELS:
        ours = GDN(channels, inverse=args.inverse).to("cuda")
        theirs = None
        if baseline is not None:
            theirs = baseline(channels, inverse=args.inverse, beta_min=1e-6, gamma_init=0.1)
            # Same stored parameters, away from the initialisation's diagonal gamma.
            ours.load_state_dict({
                "beta": ours.beta_reparam.init(rng.uniform(0.5, 1.5, channels)),
                "gamma": ours.gamma_reparam.init(rng.uniform(0.0, 2.0 / channels,
                                                             (channels, channels)))})
            with torch.no_grad():
                theirs.beta.copy_(torch.from_numpy(ours.beta.numpy()))
                theirs.gamma.copy_(torch.from_numpy(ours.gamma.numpy()))
            theirs.to("cuda")
        for batch in BATCHES:
            for side in SIDES:
                shape = (batch, channels, side, side)
                x_host = rng.standard_normal(shape, dtype=np.float32)
                gy_host = rng.standard_normal(shape, dtype=np.float32)
                x = gf.tensor(x_host, device="cuda", requires_grad=True)
                gy = gf.tensor(gy_host, device="cuda")
                fwd, fwd_bwd = time_gdnflow(ours, x, gy, args.repeats)
                old_fwd = old_fwd_bwd = "-"
                if not args.no_before:
                    old = time_gdnflow_before(ours, x, gy, args.repeats)
                    old_fwd, old_fwd_bwd = f"{old[0]:.3f}", f"{old[1]:.3f}"
                row = ["×".join(map(str, shape)), f"{fwd:.3f}", old_fwd]
                if theirs is not None:
                    tx = torch.tensor(x_host, device="cuda", requires_grad=True)
                    tgy = torch.tensor(gy_host, device="cuda")
                    t_fwd, t_fwd_bwd = time_compressai(torch, theirs, tx, tgy, args.repeats)
                    row += [f"{t_fwd:.3f}", f"{t_fwd / fwd:.2f}", f"{fwd_bwd:.3f}", old_fwd_bwd,
                            f"{t_fwd_bwd:.3f}", f"{t_fwd_bwd / fwd_bwd:.2f}"]
                    if (batch, side) == (BATCHES[0], SIDES[0]):
                        err_y, err_gx = agreement(torch, ours, theirs, x_host, gy_host)
                        notes.append(f"C={channels}: relative error against CompressAI: output "
                                     f"{err_y:.1e}, input gradient {err_gx:.1e}")
                    del tx, tgy
                else:
                    row += ["-", "-", f"{fwd_bwd:.3f}", old_fwd_bwd, "-", "-"]
                rows.append(row)
                del x, gy
    if theirs is None:
        notes.append("CompressAI (or PyTorch with CUDA) is not installed here: gdnflow only")
    notes.append("times are medians of CUDA-event timings (ms) after warm-up; "
                 "ratio = CompressAI / gdnflow (above 1: gdnflow faster); TF32 off on both sides; "
                 "before: gdnflow with cuBLAS for the channel sums and elementwise kernels "
                 "around them instead of the fused GEMM kernels (gdnflow.config gdn_fused off)")
    name = "inverse GDN" if args.inverse else "GDN"
    harness.emit(harness.markdown_table(
        f"{name} layer: gdnflow against CompressAI",
        ["shape", "gdnflow fwd ms", "before", "CompressAI fwd ms", "ratio",
         "gdnflow fwd+bwd ms", "before", "CompressAI fwd+bwd ms", "ratio"], rows, notes),
        args.out)


if __name__ == "__main__":
    main()
