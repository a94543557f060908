"""Training in 16 bits (TrainConfig.precision "bf16" and "fp16"): each step's forward under
autocast, float32 parameters and gradients; fp16 with dynamic loss scaling."""
import numpy as np
import pytest

from gdnflow import precision
from gdnflow.train import Trainer


def test_an_unknown_precision_is_refused_listing_them(tiny_config):
    with pytest.raises(ValueError, match="fp32, tf32, bf16, fp16, got 'int8'"):
        Trainer(tiny_config(precision="int8"))


def bf16_and_fp32_steps(tiny_config, tmp_path, device, steps=4, names=("fp32", "bf16")):
    records = {}
    for name in names:
        trainer = Trainer(tiny_config(device=device, precision=name, lr=3e-3,
                                      out_dir=str(tmp_path / name)))
        if trainer.loss_scaler is not None:
            # This loss (~200) times the default 2^16 overflows float16: start where
            # no step is skipped, so that the runs compare step for step.
            trainer.loss_scaler.scale_value = 16.0
        for step in range(steps):
            record = trainer.train_step(trainer.train_data.batch(seed=0, step=step, batch_size=2))
        assert all(p.dtype == np.float32 for p in trainer.model.parameters())
        records[name] = record
    return records


def test_a_bf16_step_trains_like_a_float32_one_on_numpy(tiny_config, tmp_path):
    records = bf16_and_fp32_steps(tiny_config, tmp_path, "numpy")
    for key in ("loss", "bpp", "mse"):
        # bfloat16 keeps 8 bits: the two runs drift apart by a few percent in 4 steps.
        assert records["bf16"][key] == pytest.approx(records["fp32"][key], rel=5e-2), key
    assert records["bf16"]["loss"] != records["fp32"]["loss"]


def test_autocast_is_only_around_the_steps(tiny_config):
    trainer = Trainer(tiny_config(precision="bf16"))
    trainer.train_step(trainer.train_data.batch(seed=0, step=0, batch_size=2))
    assert precision.autocast_dtype() is None
    assert trainer.config.matmul_precision == "fp32" and trainer.config.autocast_dtype == "bf16"


def test_fp16_steps_scale_the_loss_and_train_like_float32(tiny_config, tmp_path):
    records = bf16_and_fp32_steps(tiny_config, tmp_path, "numpy", names=("fp32", "fp16"))
    for key in ("loss", "bpp", "mse"):
        assert records["fp16"][key] == pytest.approx(records["fp32"][key], rel=5e-2), key
    assert records["fp16"]["loss_scale"] == 16.0 and records["fp16"]["skipped"] is False


OVERFLOWS = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@OVERFLOWS
def test_an_overflowing_fp16_step_is_skipped_and_the_scale_lowered(tiny_config):
    trainer = Trainer(tiny_config(precision="fp16"))
    trainer.loss_scaler.scale_value = 2.0 ** 24     # float16 gradients overflow
    before = [p.numpy().copy() for p in trainer.main_parameters]
    record = trainer.train_step(trainer.train_data.batch(seed=0, step=0, batch_size=2))
    assert record["skipped"] is True and record["loss_scale"] == 2.0 ** 24
    assert trainer.loss_scaler.scale_value == 2.0 ** 23 and trainer.step == 1
    for p, old in zip(trainer.main_parameters, before):
        np.testing.assert_array_equal(p.numpy(), old)


@OVERFLOWS
def test_the_loss_scale_is_saved_and_resumed(tiny_config, tmp_path):
    config = tiny_config(precision="fp16", out_dir=str(tmp_path / "run"))
    trainer = Trainer(config)
    trainer.loss_scaler.scale_value = 2.0 ** 24
    trainer.train_step(trainer.train_data.batch(seed=0, step=0, batch_size=2))
    trainer.save()
    resumed = Trainer(config)
    assert resumed.resume() == 1
    assert resumed.loss_scaler.state_dict() == trainer.loss_scaler.state_dict()


@OVERFLOWS
def test_an_fp16_run_takes_eager_steps_even_with_graph_on(tiny_config):
    trainer = Trainer(tiny_config(precision="fp16", steps=16, graph=True))
    trainer.run()
    history = trainer.history
    assert [r["step"] for r in history] == list(range(1, 17))
    # The default scale, 2^16, overflows this loss's float16 gradients: the first steps
    # are skipped, each halving the scale, until the gradients fit.
    assert history[0]["skipped"] and history[0]["loss_scale"] == 2.0 ** 16
    for record, following in zip(history, history[1:]):
        if record["skipped"]:
            assert following["loss_scale"] == record["loss_scale"] / 2
    assert not history[-1]["skipped"]


@pytest.mark.gpu
def test_a_bf16_step_on_the_gpu_matches_numpy(tiny_config, tmp_path):
    on_gpu = bf16_and_fp32_steps(tiny_config, tmp_path / "gpu", "cuda", steps=1)
    on_cpu = bf16_and_fp32_steps(tiny_config, tmp_path / "cpu", "numpy", steps=1)
    for key in ("loss", "bpp", "mse"):
        assert on_gpu["bf16"][key] == pytest.approx(on_cpu["bf16"][key], rel=2e-2), key


@pytest.mark.gpu
def test_fp16_steps_on_the_gpu_match_numpy(tiny_config, tmp_path):
    on_gpu = bf16_and_fp32_steps(tiny_config, tmp_path / "gpu", "cuda", steps=2, names=("fp16",))
    on_cpu = bf16_and_fp32_steps(tiny_config, tmp_path / "cpu", "numpy", steps=2, names=("fp16",))
    for key in ("loss", "bpp", "mse"):
        assert on_gpu["fp16"][key] == pytest.approx(on_cpu["fp16"][key], rel=2e-2), key
