"""Training with flips and random downscaling: the options reach the crops, a resumed run
equals the uninterrupted one bit for bit, a checkpoint is not resumed with other options,
and checkpoints written before the options existed resume as runs of the defaults."""

import numpy as np
import pytest

from checkpoint_kit import drop_train_config_fields
from gdnflow.commandline import CommandParser
from gdnflow.io.checkpoint import read_checkpoint_info
from gdnflow.train import TrainConfig, Trainer
from gdnflow.train.cli import add_arguments, config_from_args

AUGMENTED = dict(flip="both", scale_range=(0.5, 1.0))


def test_the_options_reach_the_training_crops(tiny_config):
    trainer = Trainer(tiny_config(**AUGMENTED))
    plan = [p for step in range(6) for p in trainer.train_data.batch_plan(
        0, step, 2, trainer.config.augmentation)]
    assert any(p.scale < 1 for p in plan) and any(p.flip & 2 for p in plan)
    default = Trainer(tiny_config())
    np.testing.assert_array_equal(default.make_batch(3), default.train_data.batch(0, 3, 2))
    assert not np.array_equal(trainer.make_batch(3), default.make_batch(3))


def test_resumed_augmented_run_equals_uninterrupted_run(tiny_config, tmp_path):
    whole = Trainer(tiny_config(out_dir=str(tmp_path / "whole"), steps=4, **AUGMENTED))
    whole.run()
    first = Trainer(tiny_config(out_dir=str(tmp_path / "split"), steps=2, **AUGMENTED))
    first.run()
    second = Trainer(tiny_config(out_dir=str(tmp_path / "split"), steps=4, **AUGMENTED))
    assert second.resume() == 2
    second.run()
    assert second.history == whole.history
    for name, value in whole.model.state_dict().items():
        np.testing.assert_array_equal(second.model.state_dict()[name], value)
    saved = read_checkpoint_info(second.checkpoint_path())["extra"]["train_config"]
    assert (saved["flip"], saved["scale_range"]) == ("both", [0.5, 1.0])


def test_resume_refuses_other_flips_or_scales(tiny_config):
    Trainer(tiny_config(steps=1, **AUGMENTED)).run()
    with pytest.raises(ValueError, match="flip: checkpoint 'both', now 'horizontal'"):
        Trainer(tiny_config(scale_range=(0.5, 1.0))).resume()
    with pytest.raises(ValueError,
                       match=r"scale_range: checkpoint \[0.5, 1.0\], now \(0.25, 1.0\)"):
        Trainer(tiny_config(flip="both", scale_range=(0.25, 1.0))).resume()
    assert Trainer(tiny_config(steps=2, flip="both", scale_range=[0.5, 1])).resume() == 1


def test_a_checkpoint_from_before_the_options_resumes_as_the_defaults(tiny_config):
    trainer = Trainer(tiny_config(steps=1))
    trainer.run()
    path = trainer.checkpoint_path()
    drop_train_config_fields(path, "flip", "scale_range")
    assert "flip" not in read_checkpoint_info(path)["extra"]["train_config"]
    with pytest.raises(ValueError, match=r"scale_range: checkpoint \(1.0, 1.0\), now \(0.5, 1.0\)"):
        Trainer(tiny_config(scale_range=(0.5, 1.0))).resume()
    assert Trainer(tiny_config(steps=2)).resume() == 1


def parse(argv):
    parser = CommandParser(prog="gdnflow train")
    add_arguments(parser)
    return parser.parse_args(argv)


def test_command_line_flags(capsys):
    config = config_from_args(parse([]))
    assert (config.flip, config.scale_range) == ("horizontal", (1.0, 1.0)) == \
        (TrainConfig.flip, TrainConfig.scale_range)
    config = config_from_args(parse(["--flip", "both", "--scale-range", "0.25", "1"]))
    assert (config.flip, config.scale_range) == ("both", (0.25, 1.0))
    for argv, message in [(["--scale-range", "0.8", "0.5"], "--scale-range: expected LOW <= HIGH, "
                           "got 0.8 0.5"),
                          (["--scale-range", "0", "1"], "--scale-range: expected a number in "
                           "(0, 1], got '0'"),
                          (["--flip", "vertical"], "--flip: invalid choice: 'vertical'")]:
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
