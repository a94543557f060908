"""``gdnflow prune MODEL.h5 --sparsity 0.9 [--per-layer] -o OUT.h5``.

Loads a checkpoint (pruned or not), magnitude-prunes its convolutions
(:func:`gdnflow.sparse.prune`), and writes a checkpoint with the pruned
weights and their masks; the run's settings go to the checkpoint's
``extra["pruning"]``. OUT.h5 is checked before the work: never MODEL.h5
itself, and not overwritten without ``--force``.
"""
import sys

from gdnflow.commandline import fraction
from gdnflow.io.checkpoint import CheckpointError, save_checkpoint
from gdnflow.io.files import check_outputs
from gdnflow.io.formats import require_checkpoint
from gdnflow.sparse.checkpoint import load_pruned
from gdnflow.sparse.prune import prune, sparsity_report


def add_prune_parser(subparsers):
    """Add the ``prune`` command to an argparse ``subparsers`` object; returns its parser."""
    parser = subparsers.add_parser(
        "prune", help="magnitude-prune a checkpoint's convolutions and save it with masks")
    parser.add_argument("model", metavar="MODEL.h5", help="a gdnflow checkpoint")
    parser.add_argument("--sparsity", type=fraction, required=True,
                        help="fraction of conv weights to zero, in [0, 1)")
    parser.add_argument("--per-layer", action="store_true",
                        help="prune that fraction of each layer (default: one global threshold)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.h5",
                        help="where to write the pruned checkpoint (never MODEL.h5 itself)")
    parser.add_argument("--force", action="store_true", help="overwrite OUT.h5 if it exists")
    parser.set_defaults(run=cmd_prune)
    return parser


def cmd_prune(args):
    """Prune ``args.model`` and write ``args.output``; prints the per-layer sparsity."""
    require_checkpoint(args.model, "gdnflow prune")
    check_outputs([args.output], inputs=[args.model], force=args.force)
    try:
        model, checkpoint = load_pruned(args.model, device="numpy")
    except KeyError as exc:     # models.get: the checkpoint's model is none gdnflow builds
        raise CheckpointError(f"{args.model}: {exc.args[0]}; prune rebuilds gdnflow's own "
                              "models only") from None
    prune(model, args.sparsity, per_layer=args.per_layer)
    report = sparsity_report(model)
    zeros = sum(z for z, _, _ in report.values())
    total = sum(n for _, n, _ in report.values())
    extra = dict(checkpoint["extra"])
    extra["pruning"] = {"sparsity": args.sparsity, "per_layer": bool(args.per_layer),
                        "source": str(args.model), "achieved": zeros / total}
    save_checkpoint(args.output, model, extra=extra)
    width = max(len(name) for name in report)
    for name, (z, n, _) in report.items():
        print(f"{name:<{width}}  {n:>10} weights  {z / n:7.2%} zero")
    print(f"{'all conv layers':<{width}}  {total:>10} weights  {zeros / total:7.2%} zero "
          f"-> {args.output}")
    emptied = [name for name, (z, n, _) in report.items() if z == n]
    if emptied:
        print(f"warning: {len(emptied)} layer(s) have no weight left ({', '.join(emptied[:5])}"
              f"{', ...' if len(emptied) > 5 else ''}): a global threshold over layers of "
              "different weight scales; consider --per-layer", file=sys.stderr)
    return 0
