"""The trainer on NumPy: the loss falls, a resumed run equals an uninterrupted one
bit for bit, checkpoints are atomic, and NaN/inf stops name where they came from."""
import json
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.io.checkpoint import load_checkpoint
from gdnflow.train import NonFiniteError, Trainer
from gdnflow.train.numerics import nonfinite_gradients


def test_a_few_steps_lower_the_loss(tiny_config):
    trainer = Trainer(tiny_config(lr=5e-3))
    batch = trainer.train_data.batch(seed=0, step=0, batch_size=2)
    x = gf.tensor(batch, device="numpy")

    def loss():
        with gf.no_grad():
            return trainer.criterion(trainer.model(x, noise_key=1, noise_stream=0), x)["loss"].item()

    before = loss()
    for _ in range(15):
        record = trainer.train_step(batch)
    after = loss()
    assert after < 0.7 * before, (before, after)
    assert trainer.step == 15 and record["step"] == 15
    assert set(record) == {"step", "loss", "bpp", "mse", "psnr", "aux", "grad_norm"}
    assert record["psnr"] == pytest.approx(10 * math.log10(1 / record["mse"]))


def test_resumed_run_equals_uninterrupted_run(tiny_config, tmp_path):
    whole = Trainer(tiny_config(out_dir=str(tmp_path / "whole")))
    whole.run()
    assert [r["step"] for r in whole.history] == [1, 2, 3, 4, 5, 6]

    first_half = Trainer(tiny_config(out_dir=str(tmp_path / "split"), steps=3))
    first_half.run()
    second_half = Trainer(tiny_config(out_dir=str(tmp_path / "split")))
    # Scramble the fresh model: resume must replace every value.
    for p in second_half.model.parameters():
        p.data += np.float32(0.01)
    assert second_half.resume() == 3
    second_half.run()
    assert second_half.history == whole.history           # every step's loss, bpp, aux, norm
    for name, value in whole.model.state_dict().items():
        np.testing.assert_array_equal(second_half.model.state_dict()[name], value)
    lines = (tmp_path / "split" / "history.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    assert logged == whole.history


def test_resume_refuses_another_run(tiny_config):
    Trainer(tiny_config(steps=1)).run()
    with pytest.raises(ValueError, match="seed"):
        Trainer(tiny_config(seed=1)).resume()
    with pytest.raises(ValueError, match="batch_size"):
        Trainer(tiny_config(batch_size=3)).resume()


def test_checkpoint_holds_model_optimisers_and_progress(tiny_config):
    trainer = Trainer(tiny_config(steps=2))
    trainer.run()
    checkpoint = load_checkpoint(trainer.checkpoint_path())
    assert checkpoint["config"] == {"model": "factorized_prior", "N": 8, "M": 12}
    assert checkpoint["extra"]["step"] == 2
    assert checkpoint["extra"]["train_config"]["lmbda"] == trainer.config.lmbda
    assert checkpoint["optimizer"]["state"][0]["step"] == 2
    assert checkpoint["extra"]["aux_optimizer"]["state"]["0"]["step"] == 2


def test_a_failed_save_leaves_the_last_checkpoint_intact(tiny_config):
    trainer = Trainer(tiny_config(steps=2))
    trainer.run()
    path = trainer.checkpoint_path()
    trainer.train_step(trainer.train_data.batch(0, 2, 2))
    # A write that fails part way, for real: the last parameter's values are
    # objects HDF5 cannot store, so h5py raises after the others were written.
    last = trainer.model.parameters()[-1]
    last.data = np.full(last.shape, None, dtype=object)
    with pytest.raises(TypeError, match="dtype"):
        trainer.save()
    assert load_checkpoint(path)["extra"]["step"] == 2
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def _parameters(trainer):
    return {name: p.numpy().copy() for name, p in trainer.model.named_parameters()}


def test_nan_parameter_stops_before_any_update(tiny_config):
    trainer = Trainer(tiny_config())
    batch = trainer.train_data.batch(0, 0, 2)
    trainer.train_step(batch)
    trainer.model.g_s[2].weight.data[0, 0, 0, 0] = np.nan
    before = _parameters(trainer)
    with pytest.raises(NonFiniteError, match="step 2") as info:
        trainer.train_step(batch)
    assert info.value.step == 2 and info.value.where == "g_s.2.weight"
    assert "g_s.2.weight" in str(info.value)
    after = _parameters(trainer)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    assert trainer.step == 1 and len(trainer.history) == 1


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_overflowing_layer_is_named(tiny_config):
    trainer = Trainer(tiny_config())
    trainer.model.g_a[0].weight.data[...] = np.float32(1e38)
    with pytest.raises(NonFiniteError) as info:
        trainer.train_step(trainer.train_data.batch(0, 0, 2))
    assert info.value.where == "g_a.0"
    assert "g_a.0 (Conv2d)" in str(info.value)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_non_finite_input_is_named(tiny_config):
    trainer = Trainer(tiny_config())
    batch = trainer.train_data.batch(0, 0, 2)
    batch[1, 2, 3, 4] = np.inf
    with pytest.raises(NonFiniteError) as info:
        trainer.train_step(batch)
    assert info.value.where == "input"


def test_nonfinite_gradients_lists_parameters_in_model_order(tiny_config):
    model = Trainer(tiny_config()).model
    for name, p in model.named_parameters():
        p.grad = gf.zeros(p.shape, device="numpy")
    model.g_s[3].gamma.grad.data[0, 0] = np.inf
    model.g_a[1].beta.grad.data[0] = np.nan
    assert nonfinite_gradients(model) == ["g_a.1.beta", "g_s.3.gamma"]


def test_run_writes_curves_and_reconstructions(tiny_config):
    from PIL import Image
    trainer = Trainer(tiny_config(steps=4, eval_every=2))
    result = trainer.run()
    assert set(result) >= {"loss", "bpp", "psnr", "ms_ssim"} and result["images"] == 2
    assert math.isnan(result["ms_ssim"])             # 40x52 images: too small for 5 scales
    assert [r["step"] for r in trainer.eval_history] == [2, 4]
    with Image.open(trainer.out_dir / "curves.png") as curves:
        assert curves.size[0] > 1000 and curves.mode == "RGB"
    with Image.open(trainer.out_dir / "reconstructions.png") as sheet:
        assert sheet.size[1] > 2 * 192
    assert len((trainer.out_dir / "eval.jsonl").read_text().splitlines()) == 2


# ------------------------------------------------------------------ GPU --
@pytest.mark.gpu
def test_cuda_first_step_matches_numpy(tiny_config, tmp_path):
    records = {}
    for device in ("numpy", "cuda"):
        trainer = Trainer(tiny_config(device=device, out_dir=str(tmp_path / device)))
        records[device] = trainer.train_step(trainer.train_data.batch(0, 0, 2))
    for key in ("loss", "bpp", "mse", "aux", "grad_norm"):
        assert records["cuda"][key] == pytest.approx(records["numpy"][key], rel=1e-4), key


@pytest.mark.gpu
def test_cuda_run_checkpoint_and_resume(tiny_config, tmp_path):
    whole = Trainer(tiny_config(device="cuda", out_dir=str(tmp_path / "whole"), eval_every=2))
    whole.run()
    Trainer(tiny_config(device="cuda", out_dir=str(tmp_path / "split"), steps=3)).run()
    resumed = Trainer(tiny_config(device="cuda", out_dir=str(tmp_path / "split")))
    assert resumed.resume() == 3
    resumed.run()
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(resumed.history, whole.history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    assert (tmp_path / "whole" / "reconstructions.png").exists()


def test_init_starts_from_another_runs_weights_with_a_fresh_optimiser(tiny_config, tmp_path):
    source = Trainer(tiny_config(out_dir=str(tmp_path / "source"), steps=3))
    source.run()
    saved = source.model.state_dict()
    tuned = Trainer(tiny_config(out_dir=str(tmp_path / "tuned"), seed=5, steps=2,
                                init=str(tmp_path / "source" / "checkpoint.h5")))
    for name, value in saved.items():      # seed 5 alone would give other weights
        np.testing.assert_array_equal(tuned.model.state_dict()[name], value)
    assert tuned.step == 0 and not tuned.optimizer.state_dict()["state"]
    tuned.run()
    assert [r["step"] for r in tuned.history] == [1, 2]
    info = load_checkpoint(tmp_path / "tuned" / "checkpoint.h5")
    assert info["extra"]["train_config"]["init"] == str(tmp_path / "source" / "checkpoint.h5")
    # Resumed without --init, the run keeps its starting weights on record.
    resumed = Trainer(tiny_config(out_dir=str(tmp_path / "tuned"), seed=5, steps=4))
    resumed.resume()
    resumed.run()
    info = load_checkpoint(tmp_path / "tuned" / "checkpoint.h5")
    assert info["extra"]["step"] == 4
    assert info["extra"]["train_config"]["init"] == str(tmp_path / "source" / "checkpoint.h5")


def test_init_refuses_another_model_or_size(tiny_config, tmp_path):
    Trainer(tiny_config(out_dir=str(tmp_path / "source"), steps=1)).run()
    path = str(tmp_path / "source" / "checkpoint.h5")
    with pytest.raises(ValueError, match="holds a factorized_prior model, this run trains "
                       "hyperprior"):
        Trainer(tiny_config(out_dir=str(tmp_path / "hp"), model="hyperprior", crop=64, init=path))
    config = tiny_config(out_dir=str(tmp_path / "wide"), init=path)
    config.N += 1
    with pytest.raises(gf.io.checkpoint.CheckpointError, match="source/checkpoint.h5"):
        Trainer(config)


def test_init_is_checked_before_the_run_folder_is_touched(tiny_config, tmp_path):
    from gdnflow.train import train
    first = tiny_config(out_dir=str(tmp_path / "run"), steps=1)
    train(first)
    inside = str(tmp_path / "run" / "checkpoint.h5")
    with pytest.raises(ValueError, match="which --force moves aside"):
        train(tiny_config(out_dir=str(tmp_path / "run"), init=inside), force=True)
    with pytest.raises(FileNotFoundError, match="--init .*missing.h5: no such file"):
        train(tiny_config(out_dir=str(tmp_path / "new"), init=str(tmp_path / "missing.h5")))
    with pytest.raises(ValueError, match="--init starts a new run .* pass one of them"):
        train(tiny_config(out_dir=str(tmp_path / "run"), init=inside), resume=True)
    assert (tmp_path / "run" / "checkpoint.h5").exists()
    assert not (tmp_path / "run" / "previous-1").exists() and not (tmp_path / "new").exists()
