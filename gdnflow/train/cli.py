"""``gdnflow train``: train a codec model (factorized prior or scale hyperprior) from the
command line.

    gdnflow train --data photos/ --out runs/q3 --quality 3 --steps 200000
    gdnflow train --out runs/q3 --resume          # continue the same run
    gdnflow train --out runs/q3 --force           # a new run; the old one moves aside
    gdnflow train --gpus 4 --batch-size 64 ...    # data parallel on 4 GPUs of this host
    mpirun -np 8 gdnflow train ...                # or on the ranks of any MPI launch

:func:`add_train_parser` adds the subcommand to the ``gdnflow`` parser;
``examples/train_gdn_autoencoder.py`` uses the same options on its own.
"""
import argparse
import dataclasses
import sys

from gdnflow import distributed as dist
from gdnflow.backends import default_device
from gdnflow.commandline import (REPORTED, USAGE_ERROR, describe_error, add_max_pixels_option,
                                 downscale_factor, nonnegative_int, positive_float, positive_int,
                                 positive_multiple_of)
from gdnflow.data.augment import FLIPS
from gdnflow.models import CODEC_MODELS
from gdnflow.models.factorized_prior import DOWNSAMPLING
from gdnflow.train.losses import LAMBDAS
from gdnflow.train.stopping import RunStopped
from gdnflow.train.launch import train
from gdnflow.train.spawn import check_gpus, find_mpiexec, gpu_count, rank_command, spawn
from gdnflow.train.train_config import TRAIN_PRECISIONS
from gdnflow.train.trainer import TrainConfig


class ScaleRangeAction(argparse.Action):
    """``--scale-range LOW HIGH``: stores (LOW, HIGH); LOW > HIGH is a usage error."""

    def __call__(self, parser, namespace, values, option_string=None):
        low, high = values
        if low > high:
            parser.error(f"{option_string}: expected LOW <= HIGH, got {low:g} {high:g}")
        setattr(namespace, self.dest, (low, high))


def add_arguments(parser):
    """Add the training options to an ``argparse`` parser."""
    defaults = TrainConfig()
    data = parser.add_argument_group("data")
    data.add_argument("--data", metavar="DIR",
                      help="folder of training images (PNG/JPEG, searched recursively; any size). "
                      "Default: scikit-image's sample photos, if scikit-image is installed")
    data.add_argument("--eval-data", metavar="DIR",
                      help="folder of evaluation images (default: the first --eval-images "
                      "training images, which are then not held out)")
    data.add_argument("--crop", type=positive_multiple_of(DOWNSAMPLING), default=defaults.crop,
                      help=f"side of the random training crops (default {defaults.crop})")
    data.add_argument("--small-images", choices=["pad", "skip"], default=defaults.small_images,
                      help="images smaller than the crop: pad by reflection or skip (default pad)")
    data.add_argument("--flip", choices=FLIPS, default=defaults.flip,
                      help="random flips of the training crops, each half the time: horizontal "
                      "(left to right; the default), both (also upside down) or none")
    data.add_argument("--scale-range", nargs=2, type=downscale_factor, action=ScaleRangeAction,
                      metavar=("LOW", "HIGH"), default=defaults.scale_range,
                      help="downscale each training sample's image by a random factor in "
                      "[LOW, HIGH] (log-uniform, 0 < LOW <= HIGH <= 1; never below the crop) "
                      "before cropping, e.g. --scale-range 0.25 1 (default 1 1: never)")
    data.add_argument("--workers", type=nonnegative_int, default=defaults.workers,
                      help=f"threads decoding and resampling the training crops (default "
                      f"{defaults.workers})")
    add_max_pixels_option(data)
    model = parser.add_argument_group("model and loss")
    model.add_argument("--model", choices=sorted(CODEC_MODELS), default=defaults.model,
                       help="factorized_prior (Ballé et al. 2017) or hyperprior (the scale "
                       "hyperprior of Ballé et al. 2018: crops multiples of 64; default "
                       f"{defaults.model})")
    model.add_argument("--quality", type=int, choices=range(1, 9), metavar="1-8",
                       help="CompressAI's quality: sets lambda (0.0018 ... 0.18) and, for 6-8, "
                       "N=192, M=320")
    model.add_argument("--lambda", dest="lmbda", type=positive_float,
                       help=f"rate-distortion trade-off (default {defaults.lmbda})")
    model.add_argument("--N", type=positive_int,
                       help=f"channels of the transforms (default {defaults.N})")
    model.add_argument("--M", type=positive_int,
                       help=f"channels of the latent (default {defaults.M})")
    optim = parser.add_argument_group("optimisation")
    optim.add_argument("--steps", type=positive_int, default=defaults.steps,
                       help=f"total training steps (default {defaults.steps})")
    optim.add_argument("--batch-size", type=positive_int, default=defaults.batch_size,
                       help=f"crops per step (default {defaults.batch_size})")
    optim.add_argument("--lr", type=positive_float, default=defaults.lr,
                       help=f"Adam learning rate of the main loss (default {defaults.lr:g})")
    optim.add_argument("--aux-lr", type=positive_float, default=defaults.aux_lr,
                       help=f"Adam learning rate of the quantile loss (default {defaults.aux_lr:g})")
    optim.add_argument("--clip-norm", type=positive_float, default=defaults.clip_norm,
                       help=f"gradient clipping by global norm (default {defaults.clip_norm:g})")
    optim.add_argument("--lr-schedule", choices=["constant", "cosine"],
                       default=defaults.lr_schedule,
                       help="learning rate over the run: constant, or cosine decay to 0 at "
                       f"--steps (default {defaults.lr_schedule})")
    optim.add_argument("--warmup-steps", type=nonnegative_int, default=defaults.warmup_steps,
                       help="steps of linear warm-up before the cosine schedule (default "
                       f"{defaults.warmup_steps})")
    optim.add_argument("--precision", choices=TRAIN_PRECISIONS, default=defaults.precision,
                       help="fp32 (exact float32), tf32 (the GPU's matrix products on the tensor "
                       "cores, float32 accumulation: faster, about 1e-3 relative error), bf16 "
                       "(each step's forward under autocast: products and convolutions in "
                       "bfloat16, float32 weights) or fp16 (the same in float16 with dynamic "
                       "loss scaling, eager steps; docs/precision.md) (default "
                       f"{defaults.precision})")
    optim.add_argument("--no-graph", dest="graph", action="store_false",
                       help="run every step eagerly, reading its values back before the update "
                       "(default: each step is one CUDA graph replayed without Python, its "
                       "values read back every 10 steps; see docs/compiled_step.md)")
    run = parser.add_argument_group("run")
    run.add_argument("--out", dest="out_dir", default=defaults.out_dir, metavar="DIR",
                     help=f"run folder: checkpoint, logs, pictures (default {defaults.out_dir})")
    run.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                     help="continue the run from its checkpoint (DIR/checkpoint.h5, or the "
                     "file given): same step, optimiser state and random streams")
    run.add_argument("--init", metavar="CHECKPOINT",
                     help="start from the weights of this checkpoint of the same model and size "
                     "(fine-tuning, e.g. from checkpoints/hyperprior_q3.h5); the optimisers, the "
                     "learning-rate schedule and the step count start afresh")
    run.add_argument("--force", action="store_true",
                     help="start a new run in a folder that holds one: the old run's files move "
                     "into DIR/previous-<n>/ (nothing is deleted)")
    run.add_argument("--eval-every", type=nonnegative_int, default=defaults.eval_every,
                     help=f"evaluate every K steps (0: only at the end; default "
                     f"{defaults.eval_every})")
    run.add_argument("--eval-images", type=nonnegative_int, default=defaults.eval_images,
                     help=f"evaluation images used (0: all; default {defaults.eval_images})")
    run.add_argument("--checkpoint-every", type=nonnegative_int, default=defaults.checkpoint_every,
                     help=f"checkpoint every K steps (0: only at the end; default "
                     f"{defaults.checkpoint_every})")
    run.add_argument("--seed", type=nonnegative_int, default=defaults.seed,
                     help="seed of the initial weights, the data order and crops, and the "
                     f"quantisation noise (default {defaults.seed})")
    run.add_argument("--device", choices=["numpy", "cuda"],
                     help="default: GDNFLOW_DEVICE, else cuda when usable, else numpy")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--gpus", type=positive_int, metavar="N",
                     help="data parallel on N GPUs of this host: starts N processes (through "
                     "mpiexec if installed), each training on --batch-size / N crops of every "
                     "batch on GPU LOCAL_RANK, gradients averaged over NCCL; the run equals the "
                     "one-GPU run. Across hosts, or on NumPy: mpirun -np N gdnflow train ... "
                     "(see docs/distributed_training.md)")
    return parser


def config_from_args(args):
    """The :class:`~gdnflow.train.trainer.TrainConfig` that parsed ``args`` describe."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    if args.quality is not None:
        values.setdefault("lmbda", LAMBDAS[args.quality - 1])
        large = args.quality >= 6
        values.setdefault("N", 192 if large else 128)
        values.setdefault("M", 320 if large else 192)
    return TrainConfig(**values)


def cmd_train(args):
    """Run (or resume) training; exit status 0, 2 on a usage error, 128 + the signal's number
    when stopped by SIGINT or SIGTERM; any other failure (bad data, run folder, checkpoint,
    NaN/inf) is raised for the command's one-line report (exit status 1)."""
    if args.resume and args.force:
        print("gdnflow train: --resume continues the run in --out and --force moves it aside: "
              "pass one of them", file=sys.stderr)
        return USAGE_ERROR
    config = config_from_args(args)
    world = dist.init()
    if args.gpus and args.gpus > 1 and world.size == 1:
        return start_gpus(config, args.gpus)
    if args.gpus and world.size not in (1, args.gpus):
        raise ValueError(f"--gpus {args.gpus} in a world of {world.size} ranks started by a "
                         "launcher (mpirun): leave --gpus out")
    try:
        train(config, resume=args.resume, force=args.force)
    except RunStopped as stop:
        if world.rank == 0:
            print(f"gdnflow train: {stop}", file=sys.stderr)
        return stop.exit_status
    except REPORTED as exc:
        if world.size == 1 or getattr(exc, "from_peer", False):
            raise
        dist.report_failure(exc)        # the other ranks stop, naming this one
        raise dist.DistributedError(f"rank {world.rank} of {world.size}: {describe_error(exc)}",
                                    failed_rank=world.rank) from exc
    return 0


def start_gpus(config, gpus):
    """``--gpus N`` outside a launch: check the host's GPUs, start N ranks of this command."""
    if (config.device or default_device()) != "cuda":
        raise ValueError(f"--gpus {gpus} trains on GPUs, and this run is on NumPy (--device "
                         f"numpy, or no usable GPU): start {gpus} processes with "
                         f"mpirun -np {gpus} gdnflow train ... instead")
    check_gpus(gpus, gpu_count())
    return spawn(rank_command(sys.argv[1:]), gpus, find_mpiexec())


def add_train_parser(subparsers):
    """Add ``train`` to the ``gdnflow`` command's subparsers; returns the new parser."""
    parser = subparsers.add_parser(
        "train", help="train a GDN image-compression autoencoder (factorized prior or "
        "scale hyperprior)",
        description="Train a factorized-prior or scale-hyperprior autoencoder (Ballé et al.) "
        "by the rate-distortion "
        "loss lambda * 255^2 * MSE + bpp, with checkpoints, evaluation and --resume.")
    add_arguments(parser)
    parser.set_defaults(run=cmd_train)
    return parser
