"""``gdnflow train`` through its argument parser: a run, a resume, bad input."""
import pytest

from gdnflow.commandline import command_parser, run
from gdnflow.train.cli import add_train_parser, config_from_args


def make_parser():
    parser, subparsers = command_parser("gdnflow", "test")
    add_train_parser(subparsers)
    return parser


def parse(argv):
    return make_parser().parse_args(argv)


def command(argv):
    """The exit status of ``gdnflow ARGV`` (errors reported as the command reports them)."""
    return run(make_parser(), argv)


def tiny_args(image_folder, out, *more):
    return ["train", "--data", str(image_folder), "--out", str(out), "--crop", "32", "--N", "8",
            "--M", "12", "--batch-size", "2", "--device", "numpy", "--quiet", "--workers", "2",
            "--eval-images", "1", *more]


def test_train_then_resume(image_folder, tmp_path, capsys):
    out = tmp_path / "run"
    args = parse(tiny_args(image_folder, out, "--steps", "3", "--eval-every", "2",
                           "--checkpoint-every", "2"))
    assert args.run(args) == 0
    for name in ("checkpoint.h5", "curves.png", "reconstructions.png", "history.jsonl"):
        assert (out / name).exists(), name
    assert len((out / "history.jsonl").read_text().splitlines()) == 3
    args = parse(tiny_args(image_folder, out, "--steps", "5", "--resume"))
    assert args.run(args) == 0
    assert "resumed at step 3" in capsys.readouterr().out
    assert len((out / "history.jsonl").read_text().splitlines()) == 5


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    assert command(["train", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"),
                    "--device", "numpy", "--quiet"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_quality_sets_lambda_and_size():
    config = config_from_args(parse(["train", "--quality", "7"]))
    assert (config.lmbda, config.N, config.M) == (0.0932, 192, 320)
    config = config_from_args(parse(["train", "--quality", "2", "--lambda", "0.5", "--M", "64"]))
    assert (config.lmbda, config.N, config.M) == (0.5, 128, 64)
    assert config_from_args(parse(["train"])).lmbda == 0.0130


def test_the_compiled_step_is_the_default_and_no_graph_opts_out():
    assert config_from_args(parse(["train"])).graph is True
    assert config_from_args(parse(["train", "--no-graph"])).graph is False


def test_bad_values_are_refused(tmp_path, capsys):
    # Refused when parsed (a usage error, exit status 2), before any work.
    with pytest.raises(SystemExit) as exited:
        parse(["train", "--crop", "40", "--out", str(tmp_path), "--device", "numpy"])
    assert exited.value.code == 2
    assert "--crop: expected a whole number that is a multiple of 16" in capsys.readouterr().err


def test_resume_and_force_together_are_a_usage_error(tmp_path, capsys):
    args = parse(["train", "--out", str(tmp_path / "run"), "--resume", "--force"])
    assert args.run(args) == 2
    assert "pass one of them" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_large_run_on_numpy_gets_a_cpu_size_hint(tiny_config):
    from gdnflow.train import TrainConfig
    from gdnflow.train.launch import CPU_SIZE, cpu_hint, train
    assert cpu_hint(tiny_config(), "numpy") is None                   # N=8, 2 crops of 32
    assert cpu_hint(TrainConfig(), "cuda") is None
    hint = cpu_hint(TrainConfig(), "numpy")
    assert "N=128 with 16 crops of 256x256" in hint and CPU_SIZE in hint
    lines = []
    train(tiny_config(steps=1, crop=160, batch_size=8, N=16, M=24), log=lines.append)
    assert lines == [cpu_hint(tiny_config(crop=160, batch_size=8, N=16), "numpy")]
    assert lines[0] is not None
