"""What every ``gdnflow`` command shares: checked option values, one-line errors, exit codes.

- **Option values** are checked when parsed: the types below (``positive_float``,
  ``positive_int``, ``nonnegative_int``, ``fraction`` ...) refuse ``--lr nan``,
  ``--steps 0`` or ``--sparsity 1.5`` with a message naming what they expect
  and the value given; argparse names the option.
- **Usage errors** (an unknown option, a bad value, a missing argument) print
  one line ``gdnflow CMD: --option: what is wrong (see gdnflow CMD --help)``
  to stderr and exit with :data:`USAGE_ERROR` (2): :class:`CommandParser`.
- **Failures**: :func:`run` runs the chosen command; a
  :class:`~gdnflow.errors.GdnflowError`, ``OSError`` or ``ValueError`` (every
  message naming the user's file, option or value) and a missing optional
  package print one line ``gdnflow CMD: message`` and exit with
  :data:`FAILURE` (1). Anything else is a bug and shows its traceback.
  ``--debug`` (before the command) or ``GDNFLOW_DEBUG=1`` shows the traceback
  of every error instead.
- **Ctrl-C** prints ``gdnflow CMD: interrupted`` and exits with 130; a closed
  pipe (``gdnflow info FILE | head -1``) ends quietly with 141, what a shell
  reports for a program killed by SIGPIPE (128 + 13), so ``set -o pipefail``
  scripts see gdnflow like any other Unix tool.
"""
import argparse
import contextlib
import math
import os
import sys

from gdnflow.config import override
from gdnflow.errors import GdnflowError

#: Exit statuses: success, failure (a file, a value the work could not use), usage error.
SUCCESS, FAILURE, USAGE_ERROR = 0, 1, 2
#: Exit statuses of an interrupted command (128 + SIGINT) and of a closed pipe (128 + SIGPIPE).
INTERRUPTED, BROKEN_PIPE = 130, 141
#: Environment variable: set to 1 to show tracebacks (as ``--debug`` does).
DEBUG_VARIABLE = "GDNFLOW_DEBUG"
#: The errors a command reports as one line; anything else is a bug and keeps its traceback.
REPORTED = (GdnflowError, OSError, ValueError, ImportError)


# ------------------------------------------------------------ option types --
def _number(text, convert, expected):
    try:
        value = convert(text)
    except (TypeError, ValueError):
        value = None
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _checked(convert, test, expected):
    """An argparse type: ``convert(text)`` if ``test`` accepts it (``expected``: what passes)."""
    def option_type(text):
        value = _number(text, convert, expected)
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    option_type.__name__ = expected         # argparse's fallback message names the type
    return option_type


#: A finite number > 0 (learning rates, lambda, norms).
positive_float = _checked(float, lambda v: v > 0, "a finite number > 0")
#: A finite number >= 0.
nonnegative_float = _checked(float, lambda v: v >= 0, "a finite number >= 0")
#: A whole number >= 1 (steps, batch sizes, channels, sizes).
positive_int = _checked(int, lambda v: v >= 1, "a whole number >= 1")
#: A whole number >= 0 (counts where 0 means "none" or "only at the end", seeds).
nonnegative_int = _checked(int, lambda v: v >= 0, "a whole number >= 0")
#: A fraction in [0, 1) (sparsity: 1 would remove every weight).
fraction = _checked(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
#: A factor in (0, 1] (how much an image is downscaled: 1 keeps its size).
downscale_factor = _checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def positive_multiple_of(step):
    """An argparse type for a whole number that is a positive multiple of ``step`` (crop sides)."""
    return _checked(int, lambda v: v >= step and v % step == 0,
                    f"a whole number that is a multiple of {step} (>= {step})")


def positive_int_list(text):
    """An argparse type: comma-separated whole numbers >= 1 (``--batches 1,64``), as a list."""
    return [positive_int(part.strip()) for part in text.split(",")]


# ------------------------------------------------------------------ parser --
class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line ``PROG: message (see PROG --help)``.

    It exits with :data:`USAGE_ERROR`.

    Its subparsers are CommandParsers too (argparse makes them of the
    parent's class), so ``gdnflow compress --level x`` says
    ``gdnflow compress: ...``. ``parse_args`` names the subcommand in an
    unrecognized-argument error as well.
    """

    def error(self, message):
        """Print the one-line usage error for ``message`` and exit with :data:`USAGE_ERROR`."""
        self.fail(self.prog, message)

    @staticmethod
    def fail(prog, message):
        """Print ``PROG: message (see PROG --help)`` on one stderr line; exit with USAGE_ERROR."""
        if message.startswith("argument "):     # "argument --lr: ..." -> "--lr: ..."
            message = message[len("argument "):]
        print(f"{prog}: {one_line(message)} (see {prog} --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)

    def parse_args(self, args=None, namespace=None):
        """argparse's parse_args; an unrecognized argument is reported by its subcommand's name."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.fail(command_name(self.prog, parsed),
                      f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def command_parser(prog, description):
    """The top-level parser of a ``gdnflow``-style command: ``--debug``, then a subcommand.

    Returns (parser, subparsers); each subcommand sets ``run`` (a function
    of the parsed arguments returning the exit status) with ``set_defaults``.
    """
    parser = CommandParser(prog=prog, description=description)
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of an error (also: {DEBUG_VARIABLE}=1)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    return parser, subparsers


def command_name(prog, args):
    """``PROG CMD`` for the parsed ``args`` (``PROG`` where no command was chosen)."""
    command = getattr(args, "command", None)
    return f"{prog} {command}" if command else prog


def one_line(text):
    """``text`` on one line: its non-blank lines, stripped, joined by '; '."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def describe_error(exc):
    """The one-line message of an error a command reports (see :data:`REPORTED`)."""
    if isinstance(exc, ImportError) and not isinstance(exc, GdnflowError) and exc.name:
        return f"this needs the Python package {exc.name!r}, which is not installed " \
            f"(pip install {exc.name.split('.')[0]})"
    if isinstance(exc, OSError) and not isinstance(exc, GdnflowError) and exc.filename:
        # "[Errno 21] Is a directory: 'x'" -> "x: Is a directory"
        return f"{exc.filename}: {exc.strerror or exc}"
    return one_line(exc) or type(exc).__name__


# ------------------------------------------------------- shared options --
def add_max_pixels_option(parser):
    """Add ``--max-pixels N`` (the image-size limit of every image the command reads)."""
    parser.add_argument("--max-pixels", type=positive_int, metavar="N",
                        help="refuse images of more than N pixels, read from each file's header "
                        "before decoding (default: Pillow's decompression-bomb limit, "
                        "gdnflow.config.settings.max_image_pixels)")


def _image_limit(args):
    """The block in which the command runs: ``--max-pixels``, where given, sets the knob."""
    limit = getattr(args, "max_pixels", None)
    return contextlib.nullcontext() if limit is None else override(max_image_pixels=limit)


# --------------------------------------------------------------------- run --
def run(parser, argv=None):
    """Parse ``argv`` with ``parser``, run the chosen command; the exit status (module docstring).

    The one place where a command's errors become one line and an exit
    status: every ``gdnflow`` command (and ``python -m gdnflow.codec.cli``)
    ends here.
    """
    args = parser.parse_args(argv)
    name = command_name(parser.prog, args)
    debug = getattr(args, "debug", False) or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")
    try:
        with _image_limit(args):
            status = args.run(args)
        sys.stdout.flush()      # inside the try: a closed pipe is reported here, not at exit
        return status
    except BrokenPipeError:
        # Python's advice: point stdout at devnull so the flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{name}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except REPORTED as exc:
        if debug:
            raise
        print(f"{name}: {describe_error(exc)}", file=sys.stderr)
        return FAILURE
