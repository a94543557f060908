"""Inference benchmark: MobileNetV2 and VGG16 at 224², batch 1 and 64; gdnflow eager,
gdnflow's compiled plan (folded, fused, static buffers, one CUDA graph) and
torchvision eager and with a CUDA graph, in one process (TF32 off, cuDNN
benchmark mode, random weights shared by both sides).

    PYTHONPATH=. python3 benchmarks/bench_inference.py --out benchmarks/results/inference.md
        [--models mobilenet_v2,vgg16] [--batches 1,64] [--repeats 50] [--quick]
        [--precision tf32]

``--precision tf32`` runs gdnflow's matrix products in TF32
(``gdnflow.set_matmul_precision``) and turns PyTorch's ``allow_tf32`` on
(matmul and cuDNN) for the same run.

The measurement itself is :mod:`gdnflow.inference_bench` (also behind
``gdnflow bench``); this script times with gdnflow.benchmarking and writes the
table. Ratios are PyTorch's time over the plan's: above 1, gdnflow is faster.

Prediction (before any GPU run; H200 figures of TARGETS.md as the baseline).
MobileNetV2, batch 1: the floor of the arithmetic (0.6 GFLOP) and of the bytes
(14 MB of weights, ~27 MB of activations) is ~15 µs; the chain of launches
bounds it. The plan leaves ~91 kernels (17 depthwise with fused epilogue, 34
pointwise = GEMM + epilogue, the stem's im2col + GEMM + epilogue, pool,
linear) against PyTorch's ~150, at 2-4 µs each inside a graph: 0.30 ms
(0.22-0.45), torch graph / plan ~2x (target 1.43x: likely met); eager
gdnflow ~1.5-2 ms (~150 operator calls of ~10-12 µs). Batch 64: GPU-bound, so
the graph buys little; fusion removes ~17 M floats of activation traffic per
image (batch norm and ReLU6 passes, the residual adds): ~4.4 GB, ~1.2 ms off
gdnflow's eager time. Expect ~1x PyTorch (0.85-1.15): the 2x target needs
faster pointwise/depthwise kernels, not the plan. VGG16, batch 64: the fused
ReLU saves ~6.9 GB of traffic (~1.7 ms) off gdnflow eager; the ratio to
PyTorch rests on the convolution kernels (Winograd): 1.3x (1.1-1.55). VGG16,
batch 1: ~60-70 kernels, GPU-bound (~1.2-2 ms of GEMMs), 1.2x PyTorch
(0.9-1.6).
"""
import argparse
import sys
import time

from gdnflow import benchmarking as harness
from gdnflow import inference_bench
from gdnflow.config import MATMUL_PRECISIONS, override


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--models", default=",".join(inference_bench.MODELS),
                        help="comma-separated model names")
    parser.add_argument("--batches", default=",".join(map(str, inference_bench.BATCHES)),
                        help="comma-separated batch sizes")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per variant")
    parser.add_argument("--quick", action="store_true", help="10 timed calls, 3 warm-up")
    parser.add_argument("--precision", choices=MATMUL_PRECISIONS, default="fp32",
                        help="matmul precision of both sides (default fp32: TF32 off)")
    args = parser.parse_args()
    torch = harness.torch_or_none()
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = \
            args.precision == "tf32"
    if torch is None:
        print("PyTorch with CUDA not found: timing gdnflow alone", file=sys.stderr)
    repeats, warmup = (10, 3) if args.quick else (args.repeats, 10)
    started = time.perf_counter()
    with override(matmul_precision=args.precision):
        rows, notes = inference_bench.run(
            [m for m in args.models.split(",") if m],
            [int(b) for b in args.batches.split(",") if b],
            warmup=warmup, repeats=repeats, torch=torch,
            timers=(harness.time_gdnflow, harness.time_torch),
            log=lambda line: print(line, file=sys.stderr, flush=True))
    notes.append(f"median of {repeats} CUDA-event timings after {warmup} warm-up calls, "
                 f"cycling over {inference_bench.INPUT_SETS} input batches; whole run "
                 f"{time.perf_counter() - started:.0f} s")
    notes.append(f"matmul precision {args.precision} on both sides (gdnflow "
                 f"matmul_precision={args.precision!r}; PyTorch allow_tf32 "
                 f"{'on' if args.precision == 'tf32' else 'off'} for matmul and cuDNN)")
    notes.append("'gdnflow fused' is the plan run operator by operator (no graph); "
                 "'torch graph' and 'gdnflow plan' include copying the input into the "
                 "graph's static input buffer")
    harness.emit(harness.markdown_table("Inference: gdnflow plans against PyTorch",
                                        inference_bench.HEADERS, rows, notes), args.out)


if __name__ == "__main__":
    main()
