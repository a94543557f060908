"""16-bit convolution layers: gdnflow's tensor-core implicit GEMM against its GEMM path
(im2col or 1x1 + cuBLAS GemmEx, then the epilogue pass) and PyTorch's cuDNN, one run.

    python benchmarks/bench_implicit_gemm.py --out benchmarks/results/precision/implicit_gemm.md
        [--dtype fp16] [--repeats 30]

Each layer is conv + bias + ReLU in the dtype (eager forward, no gradient),
timed with CUDA events (10 warm-up calls, the median of ``--repeats``).
gdnflow's implicit GEMM runs inside a frozen weight cache, as in an inference
plan (its weight matrix is made once); its GEMM path is the same call with
``half_conv_tensor_cores`` off. PyTorch: ``F.relu(F.conv2d(x, w, b))`` on
NCHW tensors of the dtype, cuDNN benchmark mode. The layers: VGG16's 3x3
convolutions at batch 64 (each distinct shape once) and MobileNetV2's 1x1
expansions and projections at batch 64. The planner leaves 1x1 layers on the
GEMM (``ImplicitGemm.preferred``), so their two gdnflow columns time the same
path (error 0): they show what the default does, beside cuDNN. The error
column is the default's against the GEMM path: max |difference| / max |GEMM
path|.
"""
import argparse

import numpy as np

import gdnflow as gf
from gdnflow import benchmarking as harness
from gdnflow import ops
from gdnflow.backends.cuda.weight_cache import weight_cache

#: (name, batch, C_in, C_out, H = W, kernel size, padding)
LAYERS = (
    ("VGG16 conv1_2", 64, 64, 64, 224, 3, 1),
    ("VGG16 conv2_1", 64, 64, 128, 112, 3, 1),
    ("VGG16 conv2_2", 64, 128, 128, 112, 3, 1),
    ("VGG16 conv3_1", 64, 128, 256, 56, 3, 1),
    ("VGG16 conv3_2", 64, 256, 256, 56, 3, 1),
    ("VGG16 conv4_1", 64, 256, 512, 28, 3, 1),
    ("VGG16 conv4_2", 64, 512, 512, 28, 3, 1),
    ("VGG16 conv5_x", 64, 512, 512, 14, 3, 1),
    ("MobileNetV2 1x1 24->144 @56", 64, 24, 144, 56, 1, 0),
    ("MobileNetV2 1x1 144->24 @56", 64, 144, 24, 56, 1, 0),
    ("MobileNetV2 1x1 64->384 @14", 64, 64, 384, 14, 1, 0),
    ("MobileNetV2 1x1 960->160 @7", 64, 960, 160, 7, 1, 0),
    ("MobileNetV2 1x1 320->1280 @7", 64, 320, 1280, 7, 1, 0),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch = harness.torch_or_none()
    rng = np.random.default_rng(0)
    rows = []
    for name, n, c_in, c_out, size, k, pad in LAYERS:
        x_host = rng.standard_normal((n, c_in, size, size), dtype=np.float32)
        w_host = rng.standard_normal((c_out, c_in, k, k), dtype=np.float32) / np.sqrt(c_in * k * k)
        b_host = rng.standard_normal(c_out, dtype=np.float32) * 0.1
        x, w, b = (gf.tensor(a, device="cuda", dtype=args.dtype) for a in (x_host, w_host, b_host))

        def layer():
            return ops.conv2d(x, w, b, padding=pad, activation="relu")
        with gf.no_grad(), weight_cache.frozen():
            implicit_ms = harness.time_gdnflow(layer, repeats=args.repeats)
            implicit = layer().numpy().astype(np.float32)
            with gf.config.override(half_conv_tensor_cores=False):
                gemm_ms = harness.time_gdnflow(layer, repeats=args.repeats)
                gemm = layer().numpy().astype(np.float32)
        error = np.abs(implicit - gemm).max() / np.abs(gemm).max()
        tflops = 2 * n * size * size * c_in * c_out * k * k / implicit_ms / 1e9
        cells = [name, f"{implicit_ms:.3f}", f"{tflops:.0f}", f"{gemm_ms:.3f}",
                 f"{gemm_ms / implicit_ms:.2f}", f"{error:.1e}"]
        if torch is not None:
            torch.backends.cudnn.benchmark = True
            tdtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
            tx, tw, tb = (torch.from_numpy(a).cuda().to(tdtype) for a in (x_host, w_host, b_host))
            fn = torch.nn.functional

            def torch_layer():
                with torch.no_grad():
                    return fn.relu(fn.conv2d(tx, tw, tb, padding=pad))
            torch_ms = harness.time_torch(torch_layer, repeats=args.repeats)
            cells += [f"{torch_ms:.3f}", f"{torch_ms / implicit_ms:.2f}"]
        rows.append(cells)
    torch_cells = ["PyTorch ms", "PyTorch / implicit"] if torch is not None else []
    harness.emit(harness.markdown_table(
        f"16-bit convolution layers ({args.dtype}, conv + bias + ReLU, forward)",
        ["layer", "implicit GEMM ms", "TFLOP/s", "GEMM path ms", "GEMM path / implicit",
         "error vs GEMM path"] + torch_cells, rows,
        [f"`python benchmarks/bench_implicit_gemm.py --dtype {args.dtype} --repeats "
         f"{args.repeats}`; CUDA events, 10 warm-up calls, median",
         "PyTorch: cuDNN (benchmark mode), NCHW, F.relu(F.conv2d(...)), no_grad"
         if torch is not None else "no PyTorch"]), args.out)


if __name__ == "__main__":
    main()
