"""The trainer's compiled step (``TrainConfig.graph``) against its eager step."""
import numpy as np
import pytest

from gdnflow.train import NonFiniteError, Trainer
from gdnflow.train.queued import SYNC_EVERY


def _parameters(trainer):
    return {name: p.numpy().copy() for name, p in trainer.model.named_parameters()}


def _run_both(tiny_config, tmp_path, device, steps):
    runs = {}
    for graph in (True, False):
        trainer = Trainer(tiny_config(device=device, steps=steps, graph=graph, lr_schedule="cosine",
                                      warmup_steps=3, out_dir=str(tmp_path / f"graph-{graph}")))
        trainer.run()
        runs[graph] = trainer
    return runs[True], runs[False]


def test_numpy_compiled_run_equals_the_eager_run(tiny_config, tmp_path):
    compiled, eager = _run_both(tiny_config, tmp_path, "numpy", SYNC_EVERY + 3)
    # The norm comes back as float32 from the device (eager: float64 on the host).
    for a, b in zip(compiled.history, eager.history):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-7)
    assert [{**r, "grad_norm": 0} for r in compiled.history] == \
        [{**r, "grad_norm": 0} for r in eager.history]
    assert [r["step"] for r in compiled.history] == list(range(1, SYNC_EVERY + 4))
    for name, value in _parameters(eager).items():
        np.testing.assert_array_equal(_parameters(compiled)[name], value)
    assert compiled._queued.compiled is not None and eager._queued.compiled is None


def test_compiled_nan_stops_at_the_first_bad_step_with_the_parameters_before_it(tiny_config):
    trainer = Trainer(tiny_config(steps=20))
    data = trainer.train_data
    for step in range(3):
        trainer.queue_step(data.batch(0, step, 2))
    trainer.model.g_s[2].weight.data[0, 0, 0, 0] = np.nan        # poisons step 4 on
    before = _parameters(trainer)
    with pytest.raises(NonFiniteError, match="step 4") as info:
        for step in range(3, 7):
            trainer.queue_step(data.batch(0, step, 2))
        trainer.flush()
    assert info.value.step == 4 and info.value.where == "g_s.2.weight"
    assert trainer.step == 3 and [r["step"] for r in trainer.history] == [1, 2, 3]
    after = _parameters(trainer)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    # The skipped steps are not counted: Adam's bias corrections go on from step 3.
    steps = {state["step"] for opt in (trainer.optimizer, trainer.aux_optimizer)
             for state in opt.state.values()}
    assert steps == {3}
    trainer.flush()                 # the dropped steps' records do not come back
    assert trainer.step == 3 and len(trainer.history) == 3


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_compiled_nan_in_a_user_batch_reruns_that_batch(tiny_config):
    trainer = Trainer(tiny_config(steps=20))
    batches = [trainer.train_data.batch(0, step, 2) for step in range(5)]
    batches[3][1, 2, 3, 4] = np.nan                               # not the data's own batch 3
    with pytest.raises(NonFiniteError, match="step 4") as info:
        for batch in batches:
            trainer.queue_step(batch)
        trainer.flush()
    assert info.value.where == "input"


@pytest.mark.gpu
def test_captured_run_equals_the_eager_run_over_20_steps(tiny_config, tmp_path):
    compiled, eager = _run_both(tiny_config, tmp_path, "cuda", 20)
    assert compiled._queued.compiled.graphs == 1
    for a, b in zip(compiled.history, eager.history):
        assert a["step"] == b["step"]
        for key in ("loss", "bpp", "mse", "aux", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)
    for name, value in _parameters(eager).items():
        np.testing.assert_allclose(_parameters(compiled)[name], value, rtol=1e-4, atol=1e-6,
                                   err_msg=name)
