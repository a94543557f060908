"""Inference timing: gdnflow eager, gdnflow's compiled plan, and torchvision (eager, CUDA graph).

Used by ``benchmarks/bench_inference.py`` (which writes the committed
table) and by the ``gdnflow bench`` command (:func:`add_bench_parser`).
For each model and batch size, in one process on one GPU:

``torch eager``    torchvision's model, eval, no_grad (TF32 off, cudnn.benchmark on)
``torch graph``    the same forward captured with ``torch.cuda.graphs``; each call
                   copies the input into the graph's static input, then replays
``gdnflow eager``  gdnflow's model (same weights), operator by operator
``gdnflow fused``  the compiled plan without a CUDA graph: BN folded, activations
                   and residual adds fused, still one Python call per operator
``gdnflow plan``   the compiled plan: input copied into the static buffer, one graph replay

With ``dtype`` "bf16" or "fp16" (``gdnflow bench --dtype``) gdnflow's plans are
built in that dtype (``compile(..., dtype=)``), its eager runs and PyTorch's (eager
and graph) run under autocast of that dtype, and the targets are issue #18's.

Every timing is the median of ``repeats`` CUDA-event timings after
``warmup`` calls; successive calls cycle through :data:`INPUT_SETS` different
inputs. The torch models get random weights and non-trivial batch-norm
statistics, and gdnflow's models load the same state dict, so the table also
reports the plan's error against PyTorch.
"""
import argparse
import contextlib
import datetime
import sys

import numpy as np

from gdnflow import benchmarking, inference, models as zoo
from gdnflow.autograd import no_grad
from gdnflow.backends import cuda, cuda_available
from gdnflow.benchmarking import time_gdnflow, time_torch
from gdnflow.commandline import nonnegative_int, positive_int, positive_int_list
from gdnflow.errors import BackendUnavailableError
from gdnflow.inference.plan import plan_dtype
from gdnflow.precision import autocast
from gdnflow.io.files import check_outputs, write_bytes_atomic
from gdnflow.tensor import tensor
from gdnflow.testing import relative_error

#: Models and batch sizes timed by default.
MODELS = ("mobilenet_v2", "vgg16")
BATCHES = (1, 64)
#: Distinct input batches each timed loop cycles through.
INPUT_SETS = 4
#: What TARGETS.md asks of the plan, as (ratio to compare, minimum): the
#: ratio is PyTorch's time over the plan's.
TARGETS = {("mobilenet_v2", 1): ("torch graph", 1 / 0.7),
           ("mobilenet_v2", 64): ("best torch", 2.0),
           ("vgg16", 64): ("best torch", 1.25),
           ("vgg16", 1): ("best torch", 1.0)}
#: The same for 16-bit plans (``--dtype``), against torch.autocast in a CUDA graph.
TARGETS_16_BIT = {("mobilenet_v2", 64): ("torch graph", 2.0),
                  ("vgg16", 64): ("torch graph", 1.5)}
HEADERS = ["model", "batch", "torch eager ms", "torch graph ms", "gdnflow eager ms",
           "gdnflow fused ms", "gdnflow plan ms", "torch graph / plan", "best torch / plan",
           "target", "plan vs torch (rel. err)"]


# ------------------------------------------------------------------ timing --
def torch_or_none():
    """PyTorch and torchvision set up as the baseline, or None where they cannot run."""
    return benchmarking.torch_or_none(need_torchvision=True)


def _cycle(items):
    """A function returning the items in turn, forever."""
    state = {"i": -1}

    def next_item():
        state["i"] = (state["i"] + 1) % len(items)
        return items[state["i"]]
    return next_item


# ------------------------------------------------------------------ models --
def random_state(name, torch=None, seed=0):
    """(state dict of NumPy arrays, torchvision model on the GPU or None) with random weights.

    Batch-norm statistics and affine parameters are drawn away from their
    initial 0/1, so that folding them is really exercised. Without PyTorch
    the state is gdnflow's own initialisation with the same statistics drawn.
    """
    rng = np.random.default_rng(seed)
    reference = None
    if torch is not None:
        import torchvision  # local import: torchvision, optional (the baseline models)
        torch.manual_seed(seed)
        reference = getattr(torchvision.models, name)(weights=None).eval()
        state = {k: v.numpy().copy() for k, v in reference.state_dict().items()
                 if not k.endswith("num_batches_tracked")}
    else:
        state = zoo.get(name)(device="numpy").state_dict()
    for key, value in state.items():
        if key.endswith("running_mean"):
            state[key] = rng.uniform(-0.1, 0.1, value.shape).astype(np.float32)
        elif key.endswith("running_var"):
            state[key] = rng.uniform(0.5, 1.5, value.shape).astype(np.float32)
    if reference is not None:
        reference.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()},
                                  strict=False)
        reference = reference.cuda()
    return state, reference


def _torch_autocast(torch, dtype):
    """torch.autocast of gdnflow's 16-bit ``dtype`` (cache off: graph capture), or a no-op."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=getattr(torch, dtype.name), cache_enabled=False)


def _torch_graph(torch, reference, static_input, dtype=None):
    """(CUDAGraph, static output) of ``reference(static_input)``, warmed up on a side stream;
    under autocast for a 16-bit ``dtype``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side), _torch_autocast(torch, dtype):
        for _ in range(3):
            reference(static_input)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph), _torch_autocast(torch, dtype):
        static_output = reference(static_input)
    return graph, static_output


def _ms(value):
    return "—" if value is None else f"{value:.3f}"


def _ratio(numerator, denominator):
    return None if numerator is None or denominator is None else numerator / denominator


# --------------------------------------------------------------------- run --
def run(models=MODELS, batches=BATCHES, warmup=10, repeats=50, torch=None,
        timers=(time_gdnflow, time_torch), log=print, device="cuda", image_size=224, dtype=None):
    """Time every (model, batch); returns (rows of cells for :data:`HEADERS`, notes).

    ``dtype``: None (float32), "bf16" or "fp16" (see the module docstring).
    ``torch``: the module from :func:`torch_or_none`, or None to time gdnflow
    alone. ``timers``: the (gdnflow, torch) timing functions, each called as
    ``timer(fn, warmup, repeats)`` and returning milliseconds. ``device`` and
    ``image_size`` other than "cuda" and 224 are for testing this code (VGG16
    needs 224).
    """
    time_g, time_t = timers
    dtype = plan_dtype(dtype)
    targets = TARGETS if dtype is None else TARGETS_16_BIT
    rows, notes = [], []
    for name in models:
        state, reference = random_state(name, torch)
        model = zoo.get(name)(device=device).eval()
        model.load_state_dict(state)
        model.eval()
        compiled = inference.compile(model, dtype=dtype)
        fused = inference.compile(model, graph=False, dtype=dtype)
        for batch in batches:
            rng = np.random.default_rng(batch)
            shape = (batch, 3, image_size, image_size)
            hosts = [rng.standard_normal(shape).astype(np.float32) for _ in range(INPUT_SETS)]
            xs = [tensor(h, device=device) for h in hosts]
            log(f"{name} batch {batch}: building plans")
            plan = compiled.plan(shape)
            fused_plan = fused.plan(shape)

            def eager(next_x=_cycle(xs)):
                with no_grad(), autocast(dtype or "bf16", enabled=dtype is not None):
                    model(next_x())
            t_eager = time_g(eager, warmup, repeats)
            next_x = _cycle(xs)
            t_fused = time_g(lambda: fused_plan(next_x()), warmup, repeats)
            t_plan = time_g(lambda: plan(next_x()), warmup, repeats)
            got = plan(xs[0]).numpy()
            t_torch = t_graph = error = None
            if torch is not None:
                xs_t = [torch.from_numpy(h).cuda() for h in hosts]
                next_t = _cycle(xs_t)

                def torch_eager():
                    with torch.no_grad(), _torch_autocast(torch, dtype):
                        reference(next_t())
                t_torch = time_t(torch_eager, warmup, repeats)
                static_input = xs_t[0].clone()
                graph, static_output = _torch_graph(torch, reference, static_input, dtype)

                def torch_graph():
                    static_input.copy_(next_t())
                    graph.replay()
                t_graph = time_t(torch_graph, warmup, repeats)
                with torch.no_grad():
                    expected = reference(xs_t[0]).cpu().numpy()
                error = relative_error(got, expected)
                del graph, static_output, static_input, xs_t
                torch.cuda.empty_cache()
            best = None if torch is None else min(t_torch, t_graph)
            target = targets.get((name, batch))
            target_text = "—"
            if target and torch is not None:
                achieved = _ratio(t_graph if target[0] == "torch graph" else best, t_plan)
                verdict = "met" if achieved >= target[1] else "missed"
                target_text = f"≥ {target[1]:.2f} vs {target[0]}: {verdict}"
            rows.append([name, batch, _ms(t_torch), _ms(t_graph), _ms(t_eager), _ms(t_fused),
                         _ms(t_plan), _fmt_ratio(_ratio(t_graph, t_plan)),
                         _fmt_ratio(_ratio(best, t_plan)), target_text,
                         "—" if error is None else f"{error:.1e}"])
            s = plan.stats
            memory = (f"; arena {s['arena_bytes'] / 2**20:.1f} MiB for {s['allocations']} "
                      f"buffers of {s['allocated_bytes'] / 2**20:.1f} MiB, filter transforms "
                      f"{s['derived_weight_bytes'] / 2**20:.1f} MiB"
                      if "arena_bytes" in s else "")
            notes.append(f"{name} batch {batch}: {s['traced_steps']} traced operators -> "
                         f"{s['steps']} ({s['folded_batch_norm']} batch norms folded, "
                         f"{s['fused_activation']} activations and {s['fused_residual']} "
                         f"residual adds fused){memory}; built in {s['build_seconds']:.2f} s")
            compiled.invalidate()
            fused.invalidate()
    return rows, notes


def _fmt_ratio(value):
    return "—" if value is None else f"{value:.2f}x"


def markdown(rows, notes, title="Inference: gdnflow plans against PyTorch"):
    """The table as markdown, headed by the GPU's name and the date."""
    lines = [f"## {title}", "", f"GPU: {benchmarking.gpu_name()}; date: "
             f"{datetime.date.today().isoformat()}", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n"


# --------------------------------------------------------------------- CLI --
def model_list(text):
    """An argparse type: comma-separated names of :data:`MODELS` (``--models vgg16``), a list."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        raise argparse.ArgumentTypeError(f"expected names among {', '.join(MODELS)}, got "
                                         f"{', '.join(map(repr, unknown))}")
    return names


def add_bench_parser(subparsers):
    """Add the ``bench`` command to the ``gdnflow`` CLI's subparsers."""
    bench = subparsers.add_parser(
        "bench", help="time inference: gdnflow eager and compiled plans (and torchvision, "
        "eager and with a CUDA graph, when PyTorch is installed)")
    bench.add_argument("--models", type=model_list, default=list(MODELS),
                       help=f"comma-separated model names (default {','.join(MODELS)})")
    bench.add_argument("--batches", type=positive_int_list, default=list(BATCHES),
                       help="comma-separated batch sizes (default 1,64)")
    bench.add_argument("--repeats", type=positive_int, default=50,
                       help="timed calls (median; default 50)")
    bench.add_argument("--warmup", type=nonnegative_int, default=10,
                       help="untimed calls first (default 10)")
    bench.add_argument("--no-torch", action="store_true", help="time gdnflow alone")
    bench.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                       help="plans in this dtype, eager runs (both sides) under autocast "
                       "(default fp32; docs/precision.md)")
    bench.add_argument("--out", help="also write the markdown table to this file")
    bench.add_argument("--force", action="store_true", help="overwrite the --out file")
    bench.set_defaults(run=cmd_bench)
    return bench


def cmd_bench(args):
    """Run the benchmark for ``gdnflow bench`` (BackendUnavailableError without a GPU)."""
    if not cuda_available():
        raise BackendUnavailableError(f"needs a CUDA device ({cuda.unavailable_reason()})")
    if args.out:
        check_outputs([args.out], force=args.force)
    torch = None if args.no_torch else torch_or_none()
    rows, notes = run(args.models, args.batches, args.warmup, args.repeats, torch,
                      log=lambda line: print(line, file=sys.stderr), dtype=args.dtype)
    title = "Inference: gdnflow plans against PyTorch" + (
        "" if args.dtype == "fp32" else f", {args.dtype} (both under autocast)")
    table = markdown(rows, notes, title)
    print(table)
    if args.out:
        write_bytes_atomic(args.out, table.encode(), overwrite=True)
    return 0
