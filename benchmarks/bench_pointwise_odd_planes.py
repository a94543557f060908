"""1x1 layers on odd planes (MobileNetV2's 7x7 ones) in 16 bits, by batch: gdnflow's GEMM
path (cuBLAS GemmEx, then the epilogue pass) against its tensor-core implicit GEMM, beside
PyTorch's AMP CUDA graph of the same layer, one run.

    python benchmarks/bench_pointwise_odd_planes.py \\
        --out benchmarks/results/precision/pointwise_odd_planes_fp16.md [--dtype fp16]

Each cell is an inference plan of one layer (conv 1x1 + bias + ReLU6, float32 in and
out, so the plan's input and output casts are in every gdnflow column alike) replayed as
a CUDA graph, timed with CUDA events (20 warm-up replays, the median of ``--repeats``).
The GEMM path is the plan built with ``half_conv_tensor_cores`` off; the implicit GEMM's
is built with :meth:`ImplicitGemm.preferred` answering yes for the layer, whatever the
rule says, so both sides of the rule's threshold
(:data:`~gdnflow.ops.conv.algorithms.implicit_gemm.MIN_POINTWISE_COLUMN_TILES`) are
timed; "default" names the one the planner takes. PyTorch: the same layer (float32 module
and input) under ``torch.autocast`` of the dtype, captured in a CUDA graph, cuDNN benchmark
mode; there the convolution and ReLU6 return 16 bits (no output cast, where gdnflow's
columns have one), and autocast's weight cache is off, as capture needs, so each replay
also casts the weights: the two differences pull opposite ways.
"""
import argparse
import contextlib

import numpy as np

import gdnflow as gf
from gdnflow import benchmarking as harness
from gdnflow import inference, inference_bench
from gdnflow.backends import cuda
from gdnflow.ops.conv.algorithms import implicit_gemm
from gdnflow.ops.conv.geometry import ConvGeometry

#: (C_in, C_out) of MobileNetV2's 1x1 layers on 7x7 planes.
LAYERS = ((576, 160), (160, 960), (960, 160), (960, 320), (320, 1280))
BATCHES = (1, 2, 4, 8, 16, 32, 64)
PLANE = 7


@contextlib.contextmanager
def implicit_gemm_everywhere():
    """ImplicitGemm.preferred says yes to every layer while this runs (to time the path the
    rule declines)."""
    rule = implicit_gemm.ImplicitGemm.__dict__["preferred"]
    implicit_gemm.ImplicitGemm.preferred = staticmethod(lambda g: True)
    try:
        yield
    finally:
        implicit_gemm.ImplicitGemm.preferred = rule


def plan_microseconds(model, x, dtype, repeats):
    """(median µs of the model's ``dtype`` plan's replay, its output as float32 NumPy)."""
    plan = inference.compile(model, dtype=dtype).plan(x.shape)
    microseconds = harness.time_gdnflow(plan.replay, 20, repeats) * 1000
    return microseconds, plan(x).numpy()


def main():
    """Time every (layer, batch) and print (and with --out, write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch = harness.torch_or_none()
    rng = np.random.default_rng(0)
    rows = []
    for c_in, c_out in LAYERS:
        model = gf.nn.Conv2d(c_in, c_out, 1, activation="relu6", device="cuda",
                             rng=rng).eval()
        reference = None
        if torch is not None:
            reference = torch.nn.Sequential(torch.nn.Conv2d(c_in, c_out, 1),
                                            torch.nn.ReLU6()).cuda().eval()
            with torch.no_grad():
                reference[0].weight.copy_(torch.from_numpy(model.weight.numpy()))
                reference[0].bias.copy_(torch.from_numpy(model.bias.numpy()))
        for n in BATCHES:
            x_host = rng.standard_normal((n, c_in, PLANE, PLANE), dtype=np.float32)
            x = gf.tensor(x_host, device="cuda")
            with gf.config.override(half_conv_tensor_cores=False):
                gemm_us, gemm = plan_microseconds(model, x, args.dtype, args.repeats)
            with implicit_gemm_everywhere():
                implicit_us, implicit = plan_microseconds(model, x, args.dtype,
                                                          args.repeats)
            g = ConvGeometry(n, c_in, PLANE, PLANE, c_out, 1, 1, (1, 1), (0, 0, 0, 0),
                             (1, 1), 1)
            rows_of_tiles, column_tiles = implicit_gemm.grid(
                g, implicit_gemm.row_tile(c_out, cuda.max_shared_bytes()))
            default = "implicit" if implicit_gemm.ImplicitGemm.preferred(g) else "GEMM"
            error = np.abs(implicit - gemm).max() / np.abs(gemm).max()
            cells = [f"{c_in} -> {c_out}", str(n), str(column_tiles),
                     str(rows_of_tiles * column_tiles), f"{gemm_us:.1f}", f"{implicit_us:.1f}",
                     f"{gemm_us / implicit_us:.2f}", default, f"{error:.1e}"]
            if torch is not None:
                xt = torch.from_numpy(x_host).cuda()
                graph, _ = inference_bench._torch_graph(
                    torch, reference, xt, gf.precision.as_dtype(args.dtype))
                torch_us = harness.time_torch(graph.replay, 20, args.repeats) * 1000
                chosen_us = implicit_us if default == "implicit" else gemm_us
                cells += [f"{torch_us:.1f}", f"{torch_us / chosen_us:.2f}"]
            rows.append(cells)
            print(" | ".join(cells), flush=True)
    torch_cells = ["PyTorch graph µs", "PyTorch / default"] if torch is not None else []
    harness.emit(harness.markdown_table(
        f"1x1 layers on {PLANE}x{PLANE} planes, {args.dtype} plans of one layer "
        f"(conv + bias + ReLU6)",
        ["C_in -> C_out", "batch", "column tiles", "blocks", "GEMM path µs",
         "implicit GEMM µs", "GEMM / implicit", "default", "implicit vs GEMM error"]
        + torch_cells, rows,
        [f"`python benchmarks/bench_pointwise_odd_planes.py --dtype {args.dtype} "
         f"--repeats {args.repeats}`; plan replays (CUDA graphs), CUDA events, 20 warm-up "
         f"replays, median; every column includes the plan's float32 input and output casts",
         "PyTorch: torch.autocast of the dtype, CUDA graph, cuDNN benchmark mode"
         if torch is not None else "no PyTorch"]), args.out)


if __name__ == "__main__":
    main()
