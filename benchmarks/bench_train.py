"""Codec training step (factorized prior or scale hyperprior): gdnflow against CompressAI,
same model, batch, loss and optimiser.

    python benchmarks/bench_train.py --out benchmarks/results/train.md
    python benchmarks/bench_train.py --model hyperprior --out benchmarks/results/train_hyperprior.md

``--model`` picks the model, by its name in ``gdnflow.models.CODEC_MODELS``:
``factorized_prior`` (the default) times gdnflow's FactorizedPrior(128, 192)
against ``compressai.models.FactorizedPrior(128, 192)``, ``hyperprior`` its
ScaleHyperprior(128, 192) against ``compressai.models.ScaleHyperprior(128,
192)``; one code path for both, and the table names the model. Both sides
train it on one batch of 16 random 256x256 images in [0, 1] with
CompressAI's recipe: loss lambda 255^2 MSE + bpp (lambda 0.0130), Adam
(1e-4) on every parameter but the quantiles, gradient clipping at norm 1,
and a second Adam (1e-3) on the quantiles' auxiliary
loss. gdnflow's eager step is ``Trainer.train_step`` (it reads the step's
scalars back once, to stop on NaN/inf); its captured step is
``Trainer.queue_step``, the one ``gdnflow train`` runs (one CUDA graph per
step, records read back every 10 steps), timed back to back, and its graph
alone gives the step's GPU busy time. CompressAI's step is the loop of its
``examples/train.py``. gdnflow starts from CompressAI's
initial weights, and the two models' evaluation losses (rounded latents) on
the batch are compared first. Timing: CUDA events on each library's stream,
warm-up, median (see ``gdnflow.benchmarking``). ``--precision tf32`` runs
gdnflow's matrix products in TF32 (``TrainConfig.precision``) and times
CompressAI both in fp32 and with ``allow_tf32`` on (matmul and cuDNN);
``--precision bf16`` runs gdnflow's steps under ``gdnflow.autocast("bf16")`` and times
CompressAI in fp32 and under ``torch.autocast(dtype=torch.bfloat16)`` with TF32 on
(issue #18's comparison). One precision per process: a second Trainer in the same process ran 2-8 ms
slower per step, whichever precision it had.
"""
import argparse

import numpy as np

from gdnflow import benchmarking as harness
import gdnflow as gf
from gdnflow.models import CODEC_MODELS
from gdnflow.models.compression import load_compressai_state_dict
from gdnflow.train import TrainConfig, Trainer
from gdnflow.train.train_config import TRAIN_PRECISIONS

N, M, BATCH, SIDE, LMBDA = 128, 192, 16, 256, 0.0130
#: gdnflow's name of each model -> the class of ``compressai.models`` it is compared with.
COMPRESSAI_CLASSES = {"factorized_prior": "FactorizedPrior", "hyperprior": "ScaleHyperprior"}
#: The speed-up goals set for a model, if any (a sentence of the table's notes).
TARGETS = {"factorized_prior": "target >= 1.5 for the training step in fp32; >= 2.5 against "
                               "CompressAI fp32 with gdnflow in tf32; >= 2.2 back to back, "
                               "captured, fp32 on both sides"}


def compressai_model(torch, model):
    """CompressAI's model of gdnflow's name ``model``, (N, M), on the GPU, or None if
    CompressAI is missing."""
    try:
        import compressai.models
    except ImportError:
        return None
    torch.manual_seed(0)
    return getattr(compressai.models, COMPRESSAI_CLASSES[model])(N, M).cuda().train()


def compressai_step(torch, net, x, bf16=False):
    """One training step of CompressAI's examples/train.py, as a function of nothing; with
    ``bf16`` its forward and loss under ``torch.autocast(dtype=torch.bfloat16)``."""
    from compressai.losses import RateDistortionLoss
    criterion = RateDistortionLoss(lmbda=LMBDA)
    main = [p for n, p in net.named_parameters() if not n.endswith(".quantiles")]
    aux = [p for n, p in net.named_parameters() if n.endswith(".quantiles")]
    optimizer = torch.optim.Adam(main, lr=1e-4)
    aux_optimizer = torch.optim.Adam(aux, lr=1e-3)

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16)

    def step():
        optimizer.zero_grad()
        aux_optimizer.zero_grad()
        with autocast():
            out = net(x)
            loss = criterion(out, x)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        aux_loss = net.aux_loss()
        aux_loss.backward()
        aux_optimizer.step()

    def forward():
        with autocast():
            return criterion(net(x), x)["loss"]

    return step, forward


def evaluation_terms_gdnflow(trainer, x):
    """(loss, bpp, mse) of gdnflow's model in eval mode (rounded latents) on x."""
    trainer.model.eval()
    with gf.no_grad():
        terms = trainer.criterion(trainer.model(x), x)
    trainer.model.train()
    return tuple(terms[k].item() for k in ("loss", "bpp", "mse"))


def evaluation_terms_compressai(torch, net, x):
    """(loss, bpp, mse) of CompressAI's model in eval mode (rounded latents) on x."""
    from compressai.losses import RateDistortionLoss
    net.eval()
    with torch.no_grad():
        terms = RateDistortionLoss(lmbda=LMBDA)(net(x), x)
    net.train()
    return tuple(float(terms[k]) for k in ("loss", "bpp_loss", "mse_loss"))


def main():
    """Time both training steps and print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(COMPRESSAI_CLASSES), default="factorized_prior",
                        help="the codec model both libraries train (default: factorized_prior)")
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--precision", choices=TRAIN_PRECISIONS, default="fp32",
                        help="gdnflow's training precision (CompressAI: fp32, and also tf32 "
                        "with tf32, torch.autocast bf16 with bf16)")
    parser.add_argument("--steps", type=int, default=50,
                        help="steps per round of the pipelined (back-to-back) timings")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also list the GPU kernels of this many captured gdnflow steps "
                        "(graph replays) by total "
                             "time (through PyTorch's CUPTI profiler, which sees every "
                             "kernel of the process)")
    args = parser.parse_args()
    torch = harness.torch_or_none()
    net = compressai_model(torch, args.model) if torch is not None else None
    rng = np.random.default_rng(0)
    x_host = rng.random((BATCH, 3, SIDE, SIDE), dtype=np.float32)
    x = gf.tensor(x_host, device="cuda")

    model_class = CODEC_MODELS[args.model]
    model = model_class(N, M, seed=0, device="cuda")
    notes = []
    if net is not None:
        skipped = load_compressai_state_dict(model, net.state_dict())
        notes.append(f"gdnflow loaded CompressAI's initial weights ({len(skipped)} CompressAI "
                     "buffers without a gdnflow counterpart skipped)")
    precision = args.precision
    trainer = Trainer(TrainConfig(model=args.model, N=N, M=M, lmbda=LMBDA, device="cuda",
                                  quiet=True, precision=precision), model=model)
    rows = []
    if net is not None:
        tx = torch.tensor(x_host, device="cuda")
        ours, theirs = evaluation_terms_gdnflow(trainer, x), evaluation_terms_compressai(torch, net, tx)
        errors = ", ".join(f"{name} {abs(a - b) / abs(b):.1e}" for name, a, b in
                           zip(("loss", "bpp", "mse"), ours, theirs))
        evaluated = "fp32" if precision in ("bf16", "fp16") else precision  # evaluation: float32
        notes.append(f"same weights, evaluation mode (rounded latents), gdnflow in {evaluated}, "
                     f"CompressAI in fp32: relative differences: {errors} (gdnflow loss "
                     f"{ours[0]:.5f}, CompressAI {theirs[0]:.5f})")
        step, forward = compressai_step(torch, net, tx)
    else:
        notes.append("CompressAI (or PyTorch with CUDA) is not installed here: gdnflow only")

    def gdnflow_forward():
        with gf.config.override(matmul_precision=trainer.config.matmul_precision), gf.autocast(
                enabled=precision == "bf16"):
            return trainer.criterion(trainer.model(x, noise_key=1, noise_stream=0), x)["loss"]

    ours = {"forward + loss (training mode)": harness.time_gdnflow(
                gdnflow_forward, warmup=args.warmup, repeats=args.repeats),
            "training step (fwd, bwd, clip, 2x Adam)": harness.time_gdnflow(
                lambda: trainer.train_step(x), warmup=args.warmup, repeats=args.repeats)}
    captured, busy = captured_step_timings(trainer, x_host, args)
    ours.update(captured)
    notes.append(busy)
    compared = {"tf32": ["fp32", "tf32"], "bf16": ["fp32", "bf16"]}.get(precision, ["fp32"])
    for theirs_precision in compared:
        theirs = {}
        if net is not None:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = \
                theirs_precision != "fp32"
            their_step, their_forward = ((step, forward) if theirs_precision != "bf16" else
                                         compressai_step(torch, net, tx, bf16=True))
            theirs = {"forward + loss (training mode)": harness.time_torch(
                          their_forward, warmup=args.warmup, repeats=args.repeats),
                      "training step (fwd, bwd, clip, 2x Adam)": harness.time_torch(
                          their_step, warmup=args.warmup, repeats=args.repeats)}
            theirs[PIPELINED] = harness.pipelined_ms(their_step, torch.cuda.synchronize,
                                                     steps=args.steps)
        for label, a in ours.items():
            b = theirs.get(label)
            rows.append([f"{label}; gdnflow {precision}, CompressAI {theirs_precision}",
                         f"{a:.2f}", f"{b:.2f}" if b else "-", f"{1000 / a:.1f}",
                         f"{1000 / b:.1f}" if b else "-", f"{b / a:.2f}" if b else "-"])
    last = trainer.history[-1]
    notes.append(f"gdnflow's last timed step: loss {last['loss']:.4f}, bpp {last['bpp']:.4f}, "
                 f"grad norm {last['grad_norm']:.3g} (finite: the steps really trained)")
    target = f"; {TARGETS[args.model]}" if args.model in TARGETS else ""
    notes.append(f"{model_class.__name__}(N={N}, M={M}) against CompressAI's "
                 f"{COMPRESSAI_CLASSES[args.model]}(N={N}, M={M}), batch {BATCH}x3x{SIDE}x{SIDE} "
                 f"random data, lambda {LMBDA}; medians of {args.repeats} CUDA-event timings "
                 f"after {args.warmup} warm-up steps; ratio = CompressAI ms / gdnflow ms (above "
                 f"1: gdnflow faster{target}); CompressAI tf32: PyTorch allow_tf32 on for "
                 "matmul and cuDNN; CompressAI bf16: torch.autocast(bfloat16) with TF32 on")
    notes.append("back to back: gdnflow's row is the captured step (Trainer.queue_step, as "
                 "`gdnflow train` runs it, batch copied from host memory each step), "
                 "CompressAI's its eager loop; wall time per step over "
                 f"{args.steps} steps, median of 3 rounds; the other gdnflow rows are the eager "
                 "step, timed with CUDA events around each call")
    table = harness.markdown_table(
        f"{model_class.__name__}(N={N}, M={M}) training step: gdnflow against CompressAI",
        ["workload", "gdnflow ms", "CompressAI ms", "gdnflow steps/s", "CompressAI steps/s",
         "ratio"], rows, notes)
    if args.profile and torch is not None:
        graph = captured_graph(trainer, x_host.shape)
        table += "\n" + kernel_profile(torch, graph.replay, args.profile)
    harness.emit(table, args.out)


PIPELINED = "training step, back to back (steps/s of a loop)"
CAPTURED_ONLY = "captured step: the graph alone (GPU busy)"


def captured_step_timings(trainer, x_host, args):
    """The captured step timed two ways, and a note comparing its wall time with its GPU time.

    ``PIPELINED``: ``Trainer.queue_step`` as ``gdnflow train`` runs it (batch
    copied from host memory, scalars written, graph replayed, records read
    back every 10 steps), steps back to back: the loop's step rate.
    ``CAPTURED_ONLY``: the graph replayed alone with CUDA events around it
    (no host work in between): the step's GPU busy time.
    """
    stream = harness.gdnflow_stream()
    queued = harness.pipelined_ms(lambda: trainer.queue_step(x_host), stream.synchronize,
                                  steps=args.steps)
    trainer.flush()
    graph = captured_graph(trainer, x_host.shape)
    if graph is None:
        raise RuntimeError("the trainer's compiled step holds no graph: nothing was captured")
    busy = harness.time_gdnflow(graph.replay, warmup=args.warmup, repeats=args.repeats)
    note = (f"captured step: wall {queued:.2f} ms per step back to back against {busy:.2f} ms "
            f"of GPU work (the graph alone): {queued / busy:.3f}x (goal <= 1.05x)")
    return {PIPELINED: queued, CAPTURED_ONLY: busy}, note


def captured_graph(trainer, shape):
    """The CUDA graph of the trainer's compiled step for batches of ``shape`` (or None)."""
    with gf.config.override(matmul_precision=trainer.config.matmul_precision):
        return trainer._queued.compiled.graph_for(shape)


def kernel_profile(torch, step, steps, top=45, title="gdnflow training step"):
    """A table of the GPU kernels (and copies) of ``steps`` calls of ``step``, by total time."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total, count = totals.get(event.name, (0.0, 0))
            totals[event.name] = (total + event.time_range.elapsed_us(), count + 1)
    every = sum(total for total, _ in totals.values())
    rows = [[name[:70], f"{total / steps / 1000:.3f}", f"{count / steps:g}",
             f"{100 * total / every:.1f}"]
            for name, (total, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]]
    return harness.markdown_table(
        f"{title}: GPU kernels by total time", ["kernel", "ms per step",
                                                             "launches per step", "% of GPU time"],
        rows, [f"all kernels: {every / steps / 1000:.3f} ms of GPU time per step "
               f"(over {steps} steps); top {top} shown"])


if __name__ == "__main__":
    main()
