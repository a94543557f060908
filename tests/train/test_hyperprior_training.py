"""Training the scale hyperprior (``gdnflow train --model hyperprior``) on NumPy:
the loss falls, a resumed run equals an uninterrupted one bit for bit, runs of
another model are not resumed, crops must suit the model, and the checkpoint
opens as a hyperprior codec."""

import numpy as np
import pytest

from checkpoint_kit import drop_train_config_fields
from gdnflow.codec import Codec
from gdnflow.codec.hyperprior import HyperpriorCodec
from gdnflow.io.checkpoint import load_checkpoint, read_checkpoint_info
from gdnflow.train import TrainConfig, Trainer
from gdnflow.train.cli import add_arguments, config_from_args


def hyper_config(tiny_config, **changes):
    values = dict(model="hyperprior", crop=64, N=4, M=6, steps=4)
    values.update(changes)
    return tiny_config(**values)


def test_a_few_steps_lower_the_loss(tiny_config):
    trainer = Trainer(hyper_config(tiny_config, lr=5e-3))
    batch = trainer.train_data.batch(seed=0, step=0, batch_size=2)
    first = trainer.train_step(batch)
    for _ in range(14):
        record = trainer.train_step(batch)
    assert record["loss"] < 0.7 * first["loss"], (first, record)
    assert np.isfinite(record["aux"]) and record["bpp"] > 0


def test_resumed_run_equals_uninterrupted_run(tiny_config, tmp_path):
    whole = Trainer(hyper_config(tiny_config, out_dir=str(tmp_path / "whole")))
    whole.run()
    first_half = Trainer(hyper_config(tiny_config, out_dir=str(tmp_path / "split"), steps=2))
    first_half.run()
    second_half = Trainer(hyper_config(tiny_config, out_dir=str(tmp_path / "split")))
    assert second_half.resume() == 2
    second_half.run()
    assert [r["step"] for r in whole.history] == [1, 2, 3, 4]
    assert second_half.history == whole.history
    for name, value in whole.model.state_dict().items():
        np.testing.assert_array_equal(second_half.model.state_dict()[name], value)
    checkpoint = load_checkpoint(whole.checkpoint_path())
    assert checkpoint["config"] == {"model": "hyperprior", "N": 4, "M": 6}
    assert isinstance(Codec.from_checkpoint(whole.checkpoint_path()), HyperpriorCodec)


def test_resume_refuses_a_run_of_another_model(tiny_config):
    Trainer(tiny_config(steps=1, crop=64)).run()              # a factorized prior
    with pytest.raises(ValueError, match="model: checkpoint 'factorized_prior', now 'hyperprior'"):
        Trainer(hyper_config(tiny_config)).resume()


def test_resume_of_a_checkpoint_without_the_model_field(tiny_config):
    """Checkpoints written before the model choice have no train_config["model"]: the model
    they hold (model_name) is compared instead."""
    trainer = Trainer(tiny_config(steps=1, crop=64))
    trainer.run()
    path = trainer.checkpoint_path()
    drop_train_config_fields(path, "model")
    assert "model" not in read_checkpoint_info(path)["extra"]["train_config"]
    with pytest.raises(ValueError, match="model: checkpoint 'factorized_prior', now 'hyperprior'"):
        Trainer(hyper_config(tiny_config, N=8, M=12)).resume()
    assert Trainer(tiny_config(steps=2, crop=64)).resume() == 1


def test_a_given_model_must_be_the_configured_one(tiny_config):
    from gdnflow.models import FactorizedPrior
    with pytest.raises(ValueError, match="a FactorizedPrior given for model='hyperprior'"):
        Trainer(hyper_config(tiny_config), model=FactorizedPrior(4, 6, device="numpy"))


def test_crops_must_be_multiples_of_64(tiny_config):
    with pytest.raises(ValueError, match="crop must be a multiple of 64 for the hyperprior model"):
        hyper_config(tiny_config, crop=32).check()
    with pytest.raises(ValueError, match="model must be one of"):
        TrainConfig(model="vgg16").check()


def test_command_line_chooses_the_model():
    import argparse
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--model", "hyperprior", "--quality", "7"]))
    assert (config.model, config.N, config.M, config.lmbda) == ("hyperprior", 192, 320, 0.0932)
    assert config_from_args(parser.parse_args([])).model == "factorized_prior"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "resnet"])
