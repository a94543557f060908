"""16-bit tensors against float32 and TF32: matrix products, elementwise kernels, an MLP
training step and CNN inference under autocast; gdnflow and PyTorch side by side, at the
same dtypes.

    python benchmarks/bench_precision.py --out benchmarks/results/precision/half.md

Products: ``ops.matmul`` against ``torch.matmul`` (TF32 switched on only in the tf32
rows, on both sides). Elementwise: ReLU and an addition over 2^26 elements. MLP: three
linear layers (4096 -> 4096 -> 4096 -> 1024, batch 4096, ReLU) forward and backward with
float32 parameters, under ``gf.autocast`` / ``torch.autocast`` in the 16-bit rows. CNNs:
VGG16 and MobileNetV2 forward at batch 64 (random weights, eval mode, no gradient),
eager, in float32 and under autocast; torchvision's models beside them (cuDNN benchmark
mode). Plans: ``gf.compile(model, shape, dtype=...)`` replayed (one CUDA graph), against
torchvision's model captured in a CUDA graph, in float32 and under torch.autocast (fp16,
bf16), with the 16-bit plans' error against the float32 plan. Times: CUDA events, 10
warm-up calls, the median of 30.
"""
import argparse

import numpy as np

import gdnflow as gf
from gdnflow import benchmarking as harness
from gdnflow import ops

GEMMS = ((4096, 4096, 4096), (8192, 1024, 4096), (1000, 999, 1001))
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
ELEMENTS = 2 ** 26
MLP = (4096, (4096, 4096, 4096, 1024))


def torch_dtype(torch, precision):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def gdnflow_dtype(precision):
    return precision if precision in ("bf16", "fp16") else "float32"


def bench_gemms(torch, rows, repeats):
    rng = np.random.default_rng(0)
    for m, n, k in GEMMS:
        a_host = rng.standard_normal((m, k), dtype=np.float32)
        b_host = rng.standard_normal((k, n), dtype=np.float32)
        for precision in PRECISIONS:
            a = gf.tensor(a_host, device="cuda").astype(gdnflow_dtype(precision))
            b = gf.tensor(b_host, device="cuda").astype(gdnflow_dtype(precision))
            with gf.config.override(matmul_precision="tf32" if precision == "tf32" else "fp32"):
                ms = harness.time_gdnflow(lambda: ops.matmul(a, b), repeats=repeats)
                error = product_error(ops.matmul(a, b).astype("float32").numpy(), a_host, b_host)
            tflops = 2 * m * n * k / ms / 1e9
            cells = [f"{m}x{n}x{k}", precision, f"{ms:.3f}", f"{tflops:.0f}", f"{error:.1e}"]
            if torch is not None:
                torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                ta = torch.from_numpy(a_host).cuda().to(torch_dtype(torch, precision))
                tb = torch.from_numpy(b_host).cuda().to(torch_dtype(torch, precision))
                tms = harness.time_torch(lambda: torch.matmul(ta, tb), repeats=repeats)
                torch.backends.cuda.matmul.allow_tf32 = False
                cells += [f"{tms:.3f}", f"{tms / ms:.2f}"]
            rows.append(cells)


def product_error(result, a, b):
    """max |result - exact| / max |exact| against a float64 product."""
    exact = a.astype(np.float64) @ b
    return float(np.abs(result - exact).max() / np.abs(exact).max())


def bench_elementwise(torch, rows, repeats):
    host = np.random.default_rng(1).standard_normal(ELEMENTS, dtype=np.float32)
    for precision in ("fp32", "bf16", "fp16"):
        x = gf.tensor(host, device="cuda").astype(gdnflow_dtype(precision))
        y = gf.tensor(host[::-1].copy(), device="cuda").astype(gdnflow_dtype(precision))
        size = x.dtype.itemsize
        for name, fn, tfn, moved in (("relu", lambda: x.relu(), lambda t, u: torch.relu(t), 2),
                                     ("add", lambda: x + y, lambda t, u: t + u, 3)):
            ms = harness.time_gdnflow(fn, repeats=repeats)
            cells = [f"{name}, 2^26", precision, f"{ms:.3f}",
                     f"{moved * size * ELEMENTS / ms / 1e6:.0f}"]
            if torch is not None:
                t = torch.from_numpy(host).cuda().to(torch_dtype(torch, precision))
                u = torch.flip(t, (0,)).contiguous()
                tms = harness.time_torch(lambda: tfn(t, u), repeats=repeats)
                cells += [f"{tms:.3f}", f"{tms / ms:.2f}"]
            rows.append(cells)


def mlp_weights(rng):
    batch, widths = MLP
    return batch, [((rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32),
                    np.zeros(o, np.float32)) for i, o in zip(widths[:-1], widths[1:])]


def bench_mlp(torch, rows, repeats):
    rng = np.random.default_rng(2)
    batch, layers = mlp_weights(rng)
    x_host = rng.standard_normal((batch, MLP[1][0]), dtype=np.float32)
    for precision in PRECISIONS:
        params = [gf.tensor(a, device="cuda", requires_grad=True) for pair in layers for a in pair]
        x = gf.tensor(x_host, device="cuda")

        def step():
            with gf.config.override(matmul_precision="tf32" if precision == "tf32" else "fp32"):
                with gf.autocast(gdnflow_dtype(precision), enabled=precision in ("bf16", "fp16")):
                    h = x
                    for i in range(0, len(params), 2):
                        h = ops.linear(h, params[i], params[i + 1])
                        h = h.relu() if i + 2 < len(params) else h
                    loss = h.mean()     # a float32 mean: autocast widens a 16-bit h
                loss.backward()
                for p in params:
                    p.grad = None

        ms = harness.time_gdnflow(step, warmup=3, repeats=repeats)
        cells = [f"MLP step, batch {batch}", precision, f"{ms:.3f}", "-"]
        if torch is not None:
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            tparams = [torch.from_numpy(a).cuda().requires_grad_() for pair in layers for a in pair]
            tx = torch.from_numpy(x_host).cuda()

            def torch_step():
                with torch.autocast("cuda", dtype=torch_dtype(torch, precision),
                                    enabled=precision in ("bf16", "fp16")):
                    h = tx
                    for i in range(0, len(tparams), 2):
                        h = torch.nn.functional.linear(h, tparams[i], tparams[i + 1])
                        h = torch.relu(h) if i + 2 < len(tparams) else h
                    loss = h.float().mean()
                loss.backward()
                for p in tparams:
                    p.grad = None

            tms = harness.time_torch(torch_step, warmup=3, repeats=repeats)
            torch.backends.cuda.matmul.allow_tf32 = False
            cells += [f"{tms:.3f}", f"{tms / ms:.2f}"]
        rows.append(cells)


def bench_cnns(torch, rows, repeats):
    from gdnflow.models.mobilenet_v2 import mobilenet_v2
    from gdnflow.models.vgg import vgg16
    x_host = np.random.default_rng(3).random((64, 3, 224, 224), dtype=np.float32)
    x = gf.tensor(x_host, device="cuda")
    for name, build in (("vgg16", vgg16), ("mobilenet_v2", mobilenet_v2)):
        model = build(device="cuda", rng=np.random.default_rng(0)).eval()
        tmodel = None
        if torch is not None:
            import torchvision  # noqa: F401 (the baseline's models)
            tmodel = getattr(torchvision.models, name)().cuda().eval()
            tx = torch.from_numpy(x_host).cuda()
        for precision in ("fp32", "bf16", "fp16"):
            half = precision != "fp32"

            def run():
                with gf.no_grad(), gf.autocast(gdnflow_dtype(precision), enabled=half):
                    return model(x)
            ms = harness.time_gdnflow(run, warmup=3, repeats=repeats)
            cells = [f"{name}, batch 64", precision, f"{ms:.3f}", "-"]
            if tmodel is not None:
                def torch_run():
                    with torch.no_grad(), torch.autocast("cuda", dtype=torch_dtype(torch, precision),
                                                         enabled=half):
                        return tmodel(tx)
                tms = harness.time_torch(torch_run, warmup=3, repeats=repeats)
                cells += [f"{tms:.3f}", f"{tms / ms:.2f}"]
            rows.append(cells)


PLANS = (("mobilenet_v2", 1), ("mobilenet_v2", 64), ("vgg16", 64))


def torch_graph_ms(torch, model, x, precision, repeats):
    """Median ms of ``model(x)`` replayed from a CUDA graph, under autocast for 16 bits."""
    half = precision != "fp32"

    def forward():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch_dtype(torch, precision),
                                             enabled=half, cache_enabled=False):
            return model(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    return harness.time_torch(graph.replay, repeats=repeats)


def bench_plans(torch, rows, repeats):
    from gdnflow.models.mobilenet_v2 import mobilenet_v2
    from gdnflow.models.vgg import vgg16
    from gdnflow.testing import relative_error
    builders = {"vgg16": vgg16, "mobilenet_v2": mobilenet_v2}
    for name, batch in PLANS:
        shape = (batch, 3, 224, 224)
        x_host = np.random.default_rng(4).random(shape, dtype=np.float32)
        model = builders[name](device="cuda", rng=np.random.default_rng(0)).eval()
        tmodel = None
        if torch is not None:
            import torchvision  # noqa: F401 (the baseline's models)
            tmodel = getattr(torchvision.models, name)().cuda().eval()
            tx = torch.from_numpy(x_host).cuda()
        reference = None
        for precision in ("fp32", "bf16", "fp16"):
            compiled = gf.compile(model, shape, dtype=gdnflow_dtype(precision))
            plan = compiled.plan(shape)
            y = plan(x_host).numpy()
            reference = y if reference is None else reference
            error = "-" if precision == "fp32" else f"{relative_error(y, reference):.1e}"
            ms = harness.time_gdnflow(plan.replay, repeats=repeats)
            cells = [f"{name}, batch {batch}", precision, f"{ms:.3f}", error]
            if tmodel is not None:
                tms = torch_graph_ms(torch, tmodel, tx, precision, repeats)
                cells += [f"{tms:.3f}", f"{tms / ms:.2f}"]
            rows.append(cells)
            compiled.close()


def main():
    """Run the three benchmarks; print (and write) the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the markdown tables here")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch = harness.torch_or_none()
    torch_cells = ["PyTorch ms", "PyTorch / gdnflow"] if torch is not None else []
    gemm_rows, elementwise_rows, mlp_rows, cnn_rows, plan_rows = [], [], [], [], []
    bench_gemms(torch, gemm_rows, args.repeats)
    bench_elementwise(torch, elementwise_rows, args.repeats)
    bench_mlp(torch, mlp_rows, args.repeats)
    bench_cnns(torch, cnn_rows, args.repeats)
    bench_plans(torch, plan_rows, args.repeats)
    settings = (f"PyTorch {torch.__version__}: torch.matmul, TF32 on only in tf32 rows, "
                "torch.autocast in bf16/fp16 MLP rows" if torch is not None else "no PyTorch")
    tables = [
        harness.markdown_table("Matrix products (ops.matmul)", ["m x n x k", "dtype", "gdnflow ms",
                               "gdnflow TFLOP/s", "error vs float64"] + torch_cells, gemm_rows,
                               [settings, "error: max |C - exact| / max |exact|, operands rounded "
                                "to the dtype first in the 16-bit rows"]),
        harness.markdown_table("Elementwise kernels", ["op", "dtype", "gdnflow ms", "gdnflow GB/s"]
                               + torch_cells, elementwise_rows),
        harness.markdown_table("MLP forward + backward, float32 parameters",
                               ["step", "precision", "gdnflow ms", "-"] + torch_cells, mlp_rows,
                               ["GPU time of one eager step (events around it); autocast rows: "
                                "16-bit products and activations, float32 loss and gradients"]),
        harness.markdown_table("CNN inference, eager", ["model", "precision", "gdnflow ms", "-"]
                               + torch_cells, cnn_rows,
                               ["gdnflow: convolutions in 16 bits (1x1 and im2col GEMMs, the "
                                "depthwise forward), batch norm in float32 between two "
                                "conversions (eager runs do not fold it); PyTorch: cuDNN, "
                                "torch.autocast"]),
        harness.markdown_table("Inference plans (CUDA graphs)", ["model", "precision",
                               "gdnflow plan ms", "error vs fp32 plan"] + torch_cells, plan_rows,
                               ["gdnflow: gf.compile(model, shape, dtype) replayed; PyTorch: "
                                "torchvision's model captured in a CUDA graph, torch.autocast "
                                "(cache off) in the 16-bit rows, cuDNN benchmark mode, TF32 off; "
                                "error: max |y - y_fp32| / max |y_fp32| of the plans' outputs"]),
    ]
    harness.emit("\n".join(tables), args.out)


if __name__ == "__main__":
    main()
