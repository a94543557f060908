"""NumPy backend against onnxruntime on the CPU: MobileNetV2 batch 1, a small three-conv
network, and the shipped codec's compress/decompress, in one process.

    PYTHONPATH=. python3 benchmarks/bench_numpy.py --out benchmarks/results/numpy_cpu.md
        [--repeats 20] [--threads N]

Both sides run the same ONNX file (built here with onnx.helper, random
weights): onnxruntime with its CPUExecutionProvider, ``--threads`` intra-op
threads (default: every core), and gdnflow through
``gdnflow.io.onnx.load(path, device="numpy")`` under ``no_grad``, and that module's
inference plan on NumPy (``gdnflow.inference.compile(..., device="numpy")``). NumPy's BLAS
uses its own thread pool (OpenBLAS: every core unless ``OPENBLAS_NUM_THREADS``
says otherwise; on a shared machine its waiting threads dominate small products, and
``OPENBLAS_NUM_THREADS=1 ... --threads 1`` compares the code on one core). The codec is the shipped factorized prior q2 on a
photo-like 768x512 image (smooth colour fields plus noise, as
bench_cold_start.py's), timed in seconds per megapixel. Every figure is
the median of ``--repeats`` timed calls after warm-up calls.
"""
import argparse
import os
import pathlib
import sys
import tempfile

import numpy as np

import gdnflow as gf
from gdnflow import benchmarking as harness
from gdnflow import inference
from gdnflow.codec import pretrained
from gdnflow.io import onnx as gdnflow_onnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from onnx_mobilenet import mobilenet_v2_onnx  # noqa: E402  (tests/: the ONNX file builder)

#: The small network: (input channels, output channels) of its 3x3 convolutions on 24x24.
SMALL_CONVS = ((3, 16), (16, 32), (32, 10))
SMALL_SIZE = 24


def small_net_onnx(path, seed=0):
    """Write the three-conv network (3x3, padding 1, ReLU between) on 1x3x24x24 to ``path``."""
    import onnx     # local import: onnx is optional, needed only here
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "input"
    for i, (c_in, c_out) in enumerate(SMALL_CONVS):
        w = rng.standard_normal((c_out, c_in, 3, 3)) * np.sqrt(2 / (9 * c_in))
        weights += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                    numpy_helper.from_array(0.1 * rng.standard_normal(c_out).astype(np.float32),
                                            f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"conv{i}"],
                                      kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        x = f"conv{i}"
        if i + 1 < len(SMALL_CONVS):
            nodes.append(helper.make_node("Relu", [x], [f"relu{i}"]))
            x = f"relu{i}"
    c_last = SMALL_CONVS[-1][1]
    graph = helper.make_graph(
        nodes, "three_conv",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, SMALL_SIZE, SMALL_SIZE])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT,
                                       [1, c_last, SMALL_SIZE, SMALL_SIZE])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def onnx_rows(name, path, shape, threads, repeats):
    """Two rows [name, gdnflow ms, onnxruntime ms, ratio, error] for the ONNX file at
    ``path`` on one input: the module called eagerly (under no_grad), and its
    inference plan on NumPy (``gdnflow.inference.compile``: batch norms folded,
    activations and residual adds fused into the convolutions, no autograd)."""
    import onnxruntime  # local import: the baseline, optional
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    model = gdnflow_onnx.load(path, device="numpy")
    model.eval()
    plan = inference.compile(model, shape, device="numpy")
    reference = session.run(None, {"input": x})[0]
    theirs_ms = harness.median_wall_ms(lambda: session.run(None, {"input": x}), repeats)
    rows = []
    for label, run in (("", model), (", inference plan", plan)):
        with gf.no_grad():
            ours = run(gf.tensor(x, device="numpy")).numpy()
            error = float(np.abs(ours - reference).max() / (np.abs(reference).max() + 1e-12))
            ours_ms = harness.median_wall_ms(lambda: run(gf.tensor(x, device="numpy")), repeats)
        rows.append([name.replace(" (ms)", label + " (ms)"), f"{ours_ms:.2f}",
                     f"{theirs_ms:.2f}", f"{ours_ms / theirs_ms:.1f}x", f"{error:.1e}"])
    return rows


def photo_like(height=512, width=768, seed=0):
    """A uint8 (H, W, 3) image: smooth colour fields (a coarse grid, upsampled) plus noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (height // 32 + 1, width // 32 + 1, 3))
    rows = np.linspace(0, coarse.shape[0] - 1, height)
    columns = np.linspace(0, coarse.shape[1] - 1, width)
    smooth = np.stack([[np.interp(columns, np.arange(coarse.shape[1]), coarse[int(r), :, c])
                        for r in rows] for c in range(3)], axis=-1)
    return np.clip(smooth + rng.normal(0, 3, smooth.shape), 0, 255).astype(np.uint8)


def codec_rows(repeats):
    """Rows for the codec's compress and decompress in seconds per megapixel."""
    image = photo_like()
    megapixels = image.shape[0] * image.shape[1] / 1e6
    codec = pretrained("factorized_prior", quality=2, device="numpy")
    data = codec.compress(image)
    compress_ms = harness.median_wall_ms(lambda: codec.compress(image), repeats, warmup=1)
    decompress_ms = harness.median_wall_ms(lambda: codec.decompress(data), repeats, warmup=1)
    size = f"{image.shape[1]}x{image.shape[0]}"
    return [[f"codec q2 compress, {size} (s/MP)", f"{compress_ms / 1000 / megapixels:.3f}",
             "-", "-", "-"],
            [f"codec q2 decompress, {size} (s/MP)", f"{decompress_ms / 1000 / megapixels:.3f}",
             "-", "-", "-"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per row")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="onnxruntime intra-op threads (default: every core)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        rows += onnx_rows("MobileNetV2, batch 1, 224x224 (ms)",
                          mobilenet_v2_onnx(folder / "mobilenet_v2.onnx"),
                          (1, 3, 224, 224), args.threads, args.repeats)
        rows += onnx_rows(f"three 3x3 convs {SMALL_CONVS}, batch 1, 24x24 (ms)",
                          small_net_onnx(folder / "three_conv.onnx"),
                          (1, 3, SMALL_SIZE, SMALL_SIZE), args.threads, args.repeats * 10)
        for row in rows:
            print(" | ".join(row), flush=True)
    rows += codec_rows(max(args.repeats // 4, 3))
    harness.emit(harness.markdown_table(
        "NumPy backend against onnxruntime (CPU)",
        ["workload", "gdnflow NumPy", "onnxruntime", "gdnflow / onnxruntime",
         "max |difference| / max |onnxruntime|"], rows,
        [f"{os.cpu_count()} cores; onnxruntime CPUExecutionProvider with {args.threads} "
         f"intra-op threads; NumPy {np.__version__}, OPENBLAS_NUM_THREADS="
         f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset (every core)')}",
         f"median wall time of {args.repeats} calls (the small network {args.repeats * 10}, "
         f"the codec {max(args.repeats // 4, 3)}) after warm-up, gdnflow under no_grad; other "
         "jobs may share the machine",
         "both sides run the same ONNX file (random weights, tests/onnx_mobilenet.py for "
         "MobileNetV2)",
         "codec: the shipped factorized prior q2 (N=128, M=192) on a photo-like image, "
         "whole compress (bytes out) and decompress (uint8 image out)",
         "targets (issue #28): MobileNetV2 within 2x of onnxruntime, the small network within "
         "10x, the codec at most 0.5 s/MP each way"],
        gpu="none (CPU only)"), args.out)


if __name__ == "__main__":
    main()
