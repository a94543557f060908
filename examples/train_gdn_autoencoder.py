"""Train a GDN image-compression autoencoder (Ballé et al.'s factorized prior, or with
--model hyperprior their scale hyperprior).

    python examples/train_gdn_autoencoder.py --data photos/ --out runs/q3 --quality 3
    python examples/train_gdn_autoencoder.py --out runs/q3 --quality 3 --resume

The same options as ``gdnflow train`` (see ``--help``). Without --data it
trains on scikit-image's bundled sample photos if scikit-image is installed
(``pip install 'gdnflow[data]'``). A quick look on a laptop without a GPU:

    python examples/train_gdn_autoencoder.py --data photos/ --device numpy \\
        --N 16 --M 24 --crop 64 --batch-size 4 --steps 200 --lr 1e-3

The run folder gets checkpoint.h5 (resume with --resume), history.jsonl and
eval.jsonl, curves.png and reconstructions.png. A folder that holds a run is
refused unless --resume continues it or --force moves it into previous-<n>/;
Ctrl-C or SIGTERM saves the last finished step (exit 130 / 143).
"""
import sys

from gdnflow.commandline import CommandParser, run
from gdnflow.train.cli import add_arguments, cmd_train


def main(argv=None):
    """Parse the options and train; returns the exit status (errors as ``gdnflow train``'s)."""
    parser = CommandParser(prog="train_gdn_autoencoder.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.set_defaults(run=cmd_train)
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
