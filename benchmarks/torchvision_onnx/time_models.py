"""torchvision families on the GPU: gdnflow's inference plan of the exported ONNX
file against the same PyTorch model in a CUDA graph (issue #29's GPU half).

Runs on the GPU machine, where PyTorch and torchvision are, with gdnflow
importable (``source .gpu/env.sh``):

    python3 benchmarks/torchvision_onnx/time_models.py /tmp/tv_gpu \\
        --out benchmarks/torchvision_onnx/results_gpu.md

Per family (``export_models.FAMILIES``: the same seeded weights, the same
TorchScript export at opset 17) and batch (1 and 32), in one process:
the ONNX file exported at that batch is loaded by ``gdnflow.io.onnx.load``
on cuda and compiled (``gdnflow.inference.compile``: one CUDA-graph replay
per call); PyTorch runs the model it exported, in eval mode under no_grad,
captured in a CUDA graph (``torch.cuda.graphs``, each call copying its
input into the graph's static input, as the plan does). TF32 is off on
both sides; cudnn.benchmark on. Times are medians of CUDA-event timings
after warm-up; the error is max |gdnflow - torch| / max |torch| on one
seeded uniform [0, 1) batch. Goal: at least 1.3x PyTorch's time on every
family at batch 1 and 32, none slower, and agreement within 1e-5.
"""
import argparse
import datetime
import os
import sys

import numpy as np
import torch

import export_models     # this folder's exporter: FAMILIES, seeded_model, OutputOnly
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_train import kernel_profile  # noqa: E402  (benchmarks/, on the path above)
import gdnflow as gf
from gdnflow import benchmarking as harness
from gdnflow import inference
from gdnflow.inference_bench import _torch_graph
from gdnflow.io import onnx as gdnflow_onnx
from gdnflow.testing import relative_error

BATCHES = (1, 32)
OPSET = 17
GOAL = 1.3
TOLERANCE = 1e-5
SEGMENTATION = ("FCN", "DeepLabV3", "LRASPP")


def torch_model(family):
    """The family's seeded model on the GPU, in eval mode (segmentation: its "out")."""
    _, build, _ = export_models.FAMILIES[family]
    model = export_models.seeded_model(build)
    if family in SEGMENTATION:
        model = export_models.OutputOnly(model).eval()
    return model


def time_family(family, batch, folder, repeats, profiles=None):
    """One row of the table: timings, ratio and error, or the reason it did not run.
    With ``profiles`` (a list), the plan's kernels by time are appended to it."""
    name, _, shape = export_models.FAMILIES[family]
    shape = (batch,) + tuple(shape[1:])
    model = torch_model(family)
    path = os.path.join(folder, f"{name}_b{batch}_opset{OPSET}.onnx")
    torch.onnx.export(model, (torch.zeros(shape),), path, opset_version=OPSET,
                      input_names=["input"], output_names=["output"], dynamo=False)
    model = model.cuda()
    x_host = np.random.default_rng(batch).random(shape, dtype=np.float32)
    row = [family, name, str(batch)]
    try:
        plan = inference.compile(gdnflow_onnx.load(path, device="cuda"), shape, device="cuda")
    except Exception as error:      # a refusal is a result: report it, go on
        return row + ["-"] * 4 + [f"{type(error).__name__}: {str(error).splitlines()[0]}"]
    x = gf.tensor(x_host, device="cuda")
    got = plan(x).numpy()
    t_plan = harness.time_gdnflow(lambda: plan(x), repeats=repeats)
    if profiles is not None:
        profiles.append(kernel_profile(torch, lambda: plan(x), 3, top=12,
                                       title=f"{family} batch {batch}, gdnflow plan"))
    static_input = torch.from_numpy(x_host).cuda()
    graph, static_output = _torch_graph(torch, model, static_input)
    source = static_input.clone()

    def torch_graph():
        static_input.copy_(source)
        graph.replay()
    t_graph = harness.time_torch(torch_graph, repeats=repeats)
    with torch.no_grad():
        expected = model(source).cpu().numpy()
    error = relative_error(got, expected)
    ratio = t_graph / t_plan
    verdict = "met" if ratio >= GOAL else ("slower than PyTorch" if ratio < 1 else "missed")
    return row + [f"{t_graph:.3f}", f"{t_plan:.3f}", f"{ratio:.2f}", f"{error:.1e}", verdict]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="where the exported files go (outside the repository)")
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--families", nargs="*", default=list(export_models.FAMILIES))
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--profile", help="write each plan's kernels by time here")
    args = parser.parse_args(argv)
    os.makedirs(args.folder, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    rows, profiles = [], [] if args.profile else None
    for family in args.families:
        for batch in BATCHES:
            try:
                rows.append(time_family(family, batch, args.folder, args.repeats, profiles))
            except Exception as error:  # an export or PyTorch failure: one row, not the end
                rows.append([family, export_models.FAMILIES[family][0], str(batch)]
                            + ["-"] * 4 + [f"{type(error).__name__}: "
                                           f"{str(error).strip().splitlines()[0]}"])
            print(" | ".join(rows[-1]), flush=True)
            torch.cuda.empty_cache()     # the last graph's memory, before the next family
    timed = [r for r in rows if r[5] != "-"]
    notes = [f"{len(timed)} of {len(rows)} (family, batch) pairs ran; goal met (>= {GOAL}x "
             f"PyTorch's CUDA graph) on {sum(r[-1] == 'met' for r in timed)}, slower than "
             f"PyTorch on {sum(r[-1] == 'slower than PyTorch' for r in timed)}; agreement within "
             f"{TOLERANCE:g} on {sum(float(r[6]) <= TOLERANCE for r in timed)}",
             f"torch {torch.__version__}, torchvision {export_models.torchvision.__version__}; "
             f"opset {OPSET}, TorchScript exporter, seeded random weights "
             f"(export_models.seeded_model); TF32 off, cudnn.benchmark on; {datetime.date.today()}",
             "ms: medians of CUDA-event timings after warm-up; ratio = PyTorch graph / gdnflow "
             "plan (above 1: gdnflow faster); error = max |gdnflow - torch| / max |torch|"]
    harness.emit(harness.markdown_table(
        "torchvision families: gdnflow plans of the ONNX files against PyTorch CUDA graphs",
        ["family", "model", "batch", "torch graph ms", "gdnflow plan ms", "ratio", "error",
         "verdict"], rows, notes), args.out)
    if profiles:
        with open(args.profile, "w") as file:
            file.write("\n".join(profiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
