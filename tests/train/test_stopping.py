"""SIGINT and SIGTERM in a training run: the step in progress finishes, a checkpoint of
it is saved, a second signal never interrupts a save; signals sent to this process."""
import json
import os
import signal

import numpy as np
import pytest

from gdnflow.io.checkpoint import load_checkpoint
from gdnflow.train import Trainer
from gdnflow.train.stopping import RunStopped, StopSignals


def send(signum):
    """Deliver ``signum`` to this process; its Python handler runs before this returns."""
    os.kill(os.getpid(), signum)


def test_first_signal_is_a_request_second_stops_at_once():
    previous = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        send(signal.SIGTERM)
        assert stop.requested and stop.received == signal.SIGTERM
        with pytest.raises(RunStopped) as stopped:
            send(signal.SIGINT)
        assert stopped.value.exit_status == 128 + signal.SIGTERM     # the first signal's
        assert "without saving" in str(stopped.value)
    assert signal.getsignal(signal.SIGTERM) is previous


def test_signals_during_a_protected_block_do_not_interrupt_it():
    with StopSignals() as stop:
        with stop.protect():
            send(signal.SIGINT)
            send(signal.SIGINT)
            finished = True
        assert finished and stop.received == signal.SIGINT
        with pytest.raises(RunStopped):            # protection ends with the block
            send(signal.SIGINT)


def test_outside_the_loop_a_signal_stops_at_once():
    with pytest.raises(RunStopped) as stopped:
        with StopSignals(defer=False):
            send(signal.SIGINT)
            pytest.fail("the signal must stop the block")
    assert stopped.value.exit_status == 130
    assert isinstance(stopped.value, KeyboardInterrupt)


class SignalAtStep:
    """Wraps the trainer's step (``queue_step``, or ``train_step`` without graphs): sends
    ``signum`` to this process during step ``step``."""

    def __init__(self, trainer, step, signum=signal.SIGTERM):
        name = "queue_step" if trainer.config.graph else "train_step"
        self.original, self.step, self.signum = getattr(trainer, name), step, signum
        setattr(trainer, name, self)

    def __call__(self, batch):
        if self.original.__self__.step + 1 == self.step:
            send(self.signum)           # mid-step: the step must still complete
        return self.original(batch)


def test_sigterm_saves_the_finished_step_and_resume_equals_an_uninterrupted_run(
        tiny_config, tmp_path):
    whole = Trainer(tiny_config(out_dir=str(tmp_path / "whole")))
    whole.run()

    stopped = Trainer(tiny_config(out_dir=str(tmp_path / "split")))
    SignalAtStep(stopped, 4)
    with pytest.raises(RunStopped) as error:
        stopped.run()
    assert error.value.exit_status == 143
    message = str(error.value)
    assert "SIGTERM at step 4 of 6" in message and "--resume" in message
    assert str(tmp_path / "split" / "checkpoint.h5") in message
    assert load_checkpoint(tmp_path / "split" / "checkpoint.h5")["extra"]["step"] == 4
    assert not (tmp_path / "split" / "curves.png").exists()       # the run did not end
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    resumed = Trainer(tiny_config(out_dir=str(tmp_path / "split")))
    assert resumed.resume() == 4
    resumed.run()
    assert resumed.history == whole.history
    for name, value in whole.model.state_dict().items():
        np.testing.assert_array_equal(resumed.model.state_dict()[name], value)
    logged = [json.loads(line) for line in
              (tmp_path / "split" / "history.jsonl").read_text().splitlines()]
    assert logged == whole.history


def test_a_second_signal_during_the_save_does_not_break_it(tiny_config, tmp_path):
    trainer = Trainer(tiny_config())
    SignalAtStep(trainer, 2, signal.SIGINT)
    save = trainer.save

    def save_interrupted(*args):
        send(signal.SIGINT)             # the user presses Ctrl-C again while it saves
        return save(*args)

    trainer.save = save_interrupted
    with pytest.raises(RunStopped) as error:
        trainer.run()
    assert error.value.exit_status == 130 and "saved" in str(error.value)
    assert load_checkpoint(trainer.checkpoint_path())["extra"]["step"] == 2
    assert not list(trainer.out_dir.glob(".*.tmp"))


def test_a_checkpoint_already_written_is_not_written_again(tiny_config):
    trainer = Trainer(tiny_config(checkpoint_every=3))
    SignalAtStep(trainer, 3)
    with pytest.raises(RunStopped, match="step 3 of 6: checkpoint .* is up to date"):
        trainer.run()
    assert load_checkpoint(trainer.checkpoint_path())["extra"]["step"] == 3
    assert len(trainer.checkpoint_path().parent.joinpath("history.jsonl").read_text()
               .splitlines()) == 3
