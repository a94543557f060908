"""gdnflow.commandline: option types, one-line usage errors and the exit statuses of run()."""
import argparse

import pytest

from gdnflow.commandline import (FAILURE, INTERRUPTED, USAGE_ERROR, add_max_pixels_option,
                                 command_parser, fraction,
                                 nonnegative_int, positive_float, positive_int,
                                 positive_int_list, positive_multiple_of, run)
from gdnflow.config import settings
from gdnflow.errors import GdnflowError


@pytest.mark.parametrize("option_type, good, bad", [
    (positive_float, {"1e-4": 1e-4, "3": 3.0}, ["0", "-0.01", "nan", "inf", "x", ""]),
    (positive_int, {"1": 1, "64": 64}, ["0", "-3", "1.5", "two"]),
    (nonnegative_int, {"0": 0, "7": 7}, ["-1", "0.5"]),
    (fraction, {"0": 0.0, "0.9": 0.9}, ["1", "1.5", "-0.1", "nan"]),
    (positive_multiple_of(16), {"16": 16, "256": 256}, ["0", "7", "40", "-16"]),
    (positive_int_list, {"1,64": [1, 64], "8": [8]}, ["1,0", "", "1,,2"]),
])
def test_option_types_accept_and_refuse(option_type, good, bad):
    for text, value in good.items():
        assert option_type(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match="expected .*got"):
            option_type(text)


def command(run_it):
    """A parser with one command ``go --n N`` whose work is ``run_it(args)``."""
    parser, subparsers = command_parser("tool", "a test command")
    go = subparsers.add_parser("go")
    go.add_argument("--n", type=positive_int, default=1)
    go.set_defaults(run=run_it)
    return parser


def test_usage_errors_are_one_line_naming_the_command(capsys):
    for argv, needle in (
            (["go", "--n", "0"], "tool go: --n: expected a whole number >= 1, got '0'"),
            (["go", "--m"], "tool go: unrecognized arguments: --m"),
            (["stop"], "tool: COMMAND: invalid choice: 'stop'")):
        with pytest.raises(SystemExit) as exited:
            run(command(lambda args: 0), argv)
        assert exited.value.code == USAGE_ERROR
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err and "(see tool" in err, err


def fails_with(error):
    def go(args):
        raise error
    return go


def test_reported_errors_are_one_line_and_exit_1(capsys):
    cases = [(GdnflowError("model.h5: no such thing\nsecond line"),
              "tool go: model.h5: no such thing; second line\n"),
             (IsADirectoryError(21, "Is a directory", "runs"), "tool go: runs: Is a directory\n"),
             (ModuleNotFoundError("No module named 'onnx'", name="onnx"),
              "tool go: this needs the Python package 'onnx', which is not installed "
              "(pip install onnx)\n")]
    for error, message in cases:
        assert run(command(fails_with(error)), ["go"]) == FAILURE
        assert capsys.readouterr().err == message


def test_ctrl_c_bugs_and_debug(capsys, monkeypatch):
    assert run(command(fails_with(KeyboardInterrupt())), ["go"]) == INTERRUPTED
    assert capsys.readouterr().err == "tool go: interrupted\n"
    with pytest.raises(ZeroDivisionError):      # a bug keeps its traceback
        run(command(fails_with(ZeroDivisionError("bug"))), ["go"])
    with pytest.raises(GdnflowError):
        run(command(fails_with(GdnflowError("shown with its traceback"))), ["--debug", "go"])
    monkeypatch.setenv("GDNFLOW_DEBUG", "1")
    with pytest.raises(GdnflowError):
        run(command(fails_with(GdnflowError("shown with its traceback"))), ["go"])


def test_max_pixels_sets_the_image_limit_for_the_command_only():
    default = settings.max_image_pixels
    seen = []
    parser, subparsers = command_parser("tool", "test")
    go = subparsers.add_parser("go")
    add_max_pixels_option(go)
    go.set_defaults(run=lambda args: seen.append(settings.max_image_pixels) or 0)
    assert run(parser, ["go", "--max-pixels", "1234"]) == 0
    assert run(parser, ["go"]) == 0
    assert seen == [1234, default] and settings.max_image_pixels == default


def test_every_argument_of_every_command_says_what_it_is():
    import argparse
    from gdnflow.cli import build_parser
    parser = build_parser()
    assert "``" not in parser.description          # plain text, not reStructuredText
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    silent = [f"{name} {(a.option_strings or [a.dest])[0]}"
              for name, sub in commands.choices.items() for a in sub._actions
              if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not silent, f"arguments without help: {silent}"
