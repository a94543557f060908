"""examples/train_captured_classifier.py: a user's own model trained through compile_step.

The example runs as a user would run it (its main function, its train
function) on NumPy with small options, and has to learn: the loss falls, the
held-out accuracy is far above chance, the compiled step gives what the
eager step (``graph=False``) gives, and a non-finite step stops the updates.
"""
import importlib.util
import pathlib

import numpy as np
import pytest

import gdnflow as gf

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_captured_classifier.py"
#: Small options: about a second per run on NumPy, and enough steps to learn.
OPTIONS = dict(steps=150, batch_size=32, seed=0, log_every=10)


@pytest.fixture(scope="module")
def example():
    """The example script, imported as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("train_captured_classifier", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compiled_run(example):
    """(result, progress lines) of one run through the compiled step on NumPy."""
    lines = []
    return example.train("numpy", **OPTIONS, log=lines.append), lines


def _loss_values(result):
    return [loss for _, loss in result.losses]


def test_the_loss_falls_and_the_classifier_beats_chance(example, compiled_run):
    result, lines = compiled_run
    assert result.first_nonfinite_step is None and result.steps == OPTIONS["steps"]
    # Read back every log_every steps, and nowhere else.
    assert [step for step, _ in result.losses] == list(range(10, 151, 10))
    losses = _loss_values(result)
    assert np.isfinite(losses).all()
    # Three classes: an untrained model starts near log 3 = 1.10.
    assert np.mean(losses[:3]) > 0.9
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])
    chance = 1 / len(example.CLASSES)
    assert result.accuracy >= chance + 0.45
    assert lines[-1].startswith(f"held-out accuracy {result.accuracy:.3f}")


def test_the_compiled_step_trains_as_the_eager_step(example, compiled_run):
    # On NumPy both run the step function eagerly: the same losses to the bit
    # show that nothing in the run depends on the compiled-step path taken.
    eager = example.train("numpy", **OPTIONS, graph=False, log=lambda line: None)
    compiled, _ = compiled_run
    assert eager.losses == compiled.losses
    assert eager.accuracy == compiled.accuracy


def test_a_nonfinite_step_leaves_the_parameters_of_the_step_before(example):
    rng = np.random.default_rng(0)
    model = example.build_model(rng)
    optimizer = gf.optim.Adam(model.parameters(), lr=1e-2)
    batch_shape = (8, example.PIXELS + len(example.CLASSES))
    compiled = gf.compile_step(example.make_train_step(model, optimizer, max_grad_norm=1.0),
                               gf.zeros(batch_shape, device="numpy"))
    batches = [example.pack_batch(*example.stripe_images(rng, 8)) for _ in range(5)]
    batches[2][0, 0] = np.nan            # a NaN pixel in the third step's batch
    snapshots = []
    for batch in batches:
        compiled(batch)
        snapshots.append([p.numpy().copy() for p in model.parameters()])
    assert compiled.first_nonfinite_step() == 3
    assert compiled.step == 5
    assert not np.array_equal(snapshots[0][0], snapshots[1][0])     # steps 1-2 updated
    for after_step_2, now in zip(snapshots[1], model.parameters()):
        np.testing.assert_array_equal(now.numpy(), after_step_2)


def test_main_trains_and_exits_with_success(example, capsys):
    status = example.main(["--device", "numpy", "--steps", "20", "--batch-size", "8",
                           "--log-every", "10"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert out[0].startswith("step    10  loss ") and out[1].startswith("step    20  loss ")
    assert out[-1].startswith("held-out accuracy ")


def test_main_refuses_a_bad_option(example, capsys):
    with pytest.raises(SystemExit) as stop:
        example.main(["--steps", "0"])
    assert stop.value.code == 2
    assert "--steps: expected a whole number >= 1, got '0'" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_the_gpu_the_replayed_graph_trains_as_the_eager_step(example):
    options = dict(OPTIONS, steps=60, batch_size=16)
    captured = example.train("cuda", **options, log=lambda line: None)
    eager = example.train("cuda", **options, graph=False, log=lambda line: None)
    # Steps 3 to 60 replay the graph; float sums may add in another order.
    np.testing.assert_allclose(_loss_values(captured), _loss_values(eager), rtol=1e-3, atol=1e-4)
    assert abs(captured.accuracy - eager.accuracy) <= 0.02
