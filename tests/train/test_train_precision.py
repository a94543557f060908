"""Training in bfloat16 (TrainConfig.precision="bf16"): each step's forward under autocast,
float32 parameters and gradients; fp16 refused until the loop scales its loss."""
import numpy as np
import pytest

from gdnflow import precision
from gdnflow.train import Trainer


def test_fp16_training_is_refused_naming_bf16(tiny_config):
    with pytest.raises(ValueError, match="fp16 training needs loss scaling.*use bf16"):
        tiny_config(precision="fp16").check()
    with pytest.raises(ValueError, match="fp32, tf32, bf16"):
        Trainer(tiny_config(precision="int8"))


def bf16_and_fp32_steps(tiny_config, tmp_path, device, steps=4):
    records = {}
    for name in ("fp32", "bf16"):
        trainer = Trainer(tiny_config(device=device, precision=name, lr=3e-3,
                                      out_dir=str(tmp_path / name)))
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


@pytest.mark.gpu
def test_a_bf16_step_on_the_gpu_matches_numpy(tiny_config, tmp_path):
    on_gpu = bf16_and_fp32_steps(tiny_config, tmp_path / "gpu", "cuda", steps=1)
    on_cpu = bf16_and_fp32_steps(tiny_config, tmp_path / "cpu", "numpy", steps=1)
    for key in ("loss", "bpp", "mse"):
        assert on_gpu["bf16"][key] == pytest.approx(on_cpu["bf16"][key], rel=2e-2), key
