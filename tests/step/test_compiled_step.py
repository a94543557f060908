"""compile_step: a training step as one CUDA graph, against the same step run eagerly.

The NumPy tests run the step function's contract (the context, the
refusals, the finite flag, clipping without read back) where CI can; the
GPU tests check that the captured graph really replays and reproduces the
eager step, step after step.
"""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import nn
from gdnflow.optim import SGD, Adam, CosineLR, clip_grad_norm
from gdnflow.ops.entropy import uniform_noise, uniform_noise_values
from gdnflow.step import CompiledStepWarning, StepCounter, StepSyncError, compile_step
from gdnflow.step.scalar_log import ScalarLog

KEY = 1234567


def tiny_model(device, seed=0):
    """A small conv net whose step touches convolutions, GDN-free nonlinearity and a linear layer."""
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1, rng=rng), nn.ReLU(),
                          nn.Conv2d(5, 4, 3, stride=2, padding=1, rng=rng), nn.ReLU(),
                          nn.GlobalAvgPool2d(), nn.Flatten(), nn.Linear(4, 3, rng=rng))
    return model.to(device)


class Setup:
    """A model, its optimiser (+ schedule) and a step function with noise, clipping and guard."""

    def __init__(self, device, optimizer="adam", schedule=False, seed=0):
        self.model = tiny_model(device, seed)
        params = list(self.model.parameters())
        self.optimizer = (Adam(params, lr=1e-2) if optimizer == "adam"
                          else SGD(params, lr=0.05, momentum=0.9))
        self.schedule = CosineLR(self.optimizer, total_steps=20, warmup_steps=3) if schedule else None

    def step_function(self, batch, step):
        noisy = uniform_noise(batch, KEY, step.index)
        out = self.model(noisy)
        loss = (out * out).mean()
        self.optimizer.zero_grad()
        loss.backward()
        norm = clip_grad_norm(self.model.parameters(), 0.05, sync=False)
        step.guard_finite(loss.reshape(1), norm)
        self.optimizer.step()
        return {"loss": loss.reshape(1), "norm": norm}

    def eager_step(self, batch, index):
        """The same step without compile_step (reading the norm back, as eager code does)."""
        noisy = uniform_noise(gf.tensor(batch, device=self.device), KEY, index)
        out = self.model(noisy)
        loss = (out * out).mean()
        self.optimizer.zero_grad()
        loss.backward()
        norm = clip_grad_norm(self.model.parameters(), 0.05)
        self.optimizer.step()
        return loss.item(), norm

    @property
    def device(self):
        return next(iter(self.model.parameters())).device

    def parameters(self):
        return [p.numpy().copy() for p in self.model.parameters()]


def with_notices(step_function, **options):
    """(compile_step of ``step_function`` on the default batches, the list its notices go to)."""
    messages = []
    return compile_step(step_function, batches(1)[0], notify=messages.append, **options), messages


def batches(count, shape=(4, 3, 9, 11), seed=5):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]


def run_both(device, steps, **setup):
    """(compiled losses, norms, parameters, the CompiledStep), (the eager ones)."""
    data = batches(steps)
    compiled_side, eager_side = Setup(device, **setup), Setup(device, **setup)
    compiled = compile_step(compiled_side.step_function, data[0])
    losses, norms = [], []
    for batch in data:
        out = compiled(batch)
        losses.append(out["loss"].item())
        norms.append(out["norm"].item())
        if compiled_side.schedule is not None:
            compiled_side.schedule.step()
    eager = []
    for i, batch in enumerate(data):
        eager.append(eager_side.eager_step(batch, i))
        if eager_side.schedule is not None:
            eager_side.schedule.step()
    return ((losses, norms, compiled_side.parameters(), compiled),
            ([e[0] for e in eager], [e[1] for e in eager], eager_side.parameters()))


# ---------------------------------------------------------------- NumPy --
@pytest.mark.parametrize("optimizer,schedule", [("adam", True), ("sgd", False)])
def test_numpy_compiled_step_equals_the_eager_loop(optimizer, schedule):
    (losses, norms, params, compiled), (e_losses, e_norms, e_params) = run_both(
        "numpy", 8, optimizer=optimizer, schedule=schedule)
    assert compiled.mode((4, 3, 9, 11)) == "eager" and compiled.graphs == 0
    np.testing.assert_array_equal(losses, e_losses)
    np.testing.assert_allclose(norms, e_norms, rtol=1e-6)
    assert max(e_norms) > 0.05          # the clipping really clipped
    for a, b in zip(params, e_params):
        np.testing.assert_array_equal(a, b)
    assert compiled.step == 8 and compiled.first_nonfinite_step() is None


def test_reading_a_value_inside_the_step_is_refused():
    model = tiny_model("numpy")

    def step_function(batch, step):
        loss = model(batch).mean()
        if loss.item() > 0:                # Python control flow on a device value
            pass
        return loss

    with pytest.raises(StepSyncError, match=r"Tensor.numpy\(\) .* inside a compiled step "
                                            r"function.*Return the tensor"):
        compile_step(step_function, batches(1)[0])(batches(1)[0])


def test_clip_with_a_read_back_is_refused_and_names_sync_false():
    setup = Setup("numpy")

    def step_function(batch, step):
        loss = setup.model(batch).mean()
        setup.optimizer.zero_grad()
        loss.backward()
        clip_grad_norm(setup.model.parameters(), 1.0)
        return loss

    with pytest.raises(StepSyncError, match="sync=False"):
        compile_step(step_function, batches(1)[0])(batches(1)[0])


def test_noise_with_a_fixed_stream_is_refused_inside_a_step():
    def step_function(batch, step):
        return uniform_noise(batch, KEY, 3)

    with pytest.raises(StepSyncError, match=r"noise_stream=step\.index"):
        compile_step(step_function, batches(1)[0])(batches(1)[0])


@pytest.mark.parametrize("make", [lambda batch: batch + np.ones(batch.shape, np.float32),
                                  lambda batch: gf.tensor(np.ones(3))])
def test_host_data_inside_the_step_is_refused_on_every_backend(make):
    with pytest.raises(StepSyncError, match="host data .* replay the values it had at capture"):
        compile_step(lambda batch, step: make(batch), batches(1)[0])(batches(1)[0])


def test_steps_do_not_nest():
    inner = compile_step(lambda batch, step: batch * 2, batches(1)[0])
    outer = compile_step(lambda batch, step: inner(batch), batches(1)[0])
    with pytest.raises(StepSyncError, match="do not nest"):
        outer(batches(1)[0])


def test_noise_follows_the_step_counter():
    counter_values = []

    def step_function(batch, step):
        counter_values.append(step.index.value)
        return uniform_noise(batch, KEY, step.index)

    zeros = np.zeros((2, 3, 4, 5), np.float32)
    compiled = compile_step(step_function, zeros, start_step=2 ** 32 + 7)
    for i in range(3):
        out = compiled(zeros)
        expected = uniform_noise_values(zeros.shape, KEY, 2 ** 32 + 7 + i)
        np.testing.assert_array_equal(out.numpy(), expected)
    assert counter_values == [2 ** 32 + 7 + i for i in range(3)]
    compiled.step = 5
    np.testing.assert_array_equal(compiled(zeros).numpy(), uniform_noise_values(zeros.shape, KEY, 5))


def test_a_nan_step_is_flagged_and_no_later_update_runs():
    setup = Setup("numpy")
    data = batches(6)
    data[3][0, 0, 0, 0] = np.nan                     # step number 4 goes non-finite
    compiled = compile_step(setup.step_function, data[0])
    for batch in data[:3]:
        compiled(batch)
    before = setup.parameters()
    with np.errstate(invalid="ignore"):
        for batch in data[3:]:
            compiled(batch)
    assert compiled.first_nonfinite_step() == 4
    for a, b in zip(setup.parameters(), before):
        np.testing.assert_array_equal(a, b)          # steps 4, 5 and 6 updated nothing
    assert all(np.isfinite(p).all() for p in setup.parameters())


def test_the_flag_saturates_at_the_largest_int32_as_on_the_gpu():
    setup = Setup("numpy")
    data = batches(1)
    data[0][0, 0, 0, 0] = np.nan
    compiled = compile_step(setup.step_function, data[0], start_step=2 ** 31 - 1)
    with np.errstate(invalid="ignore"):
        compiled(data[0])
    assert compiled.first_nonfinite_step() == 2 ** 31 - 1


def test_clip_without_gradients_returns_a_zero_norm():
    params = [gf.tensor(np.ones(3), requires_grad=True)]
    assert clip_grad_norm(params, 1.0) == 0.0
    np.testing.assert_array_equal(clip_grad_norm(params, 1.0, sync=False).numpy(), [0.0])


def test_guard_finite_takes_one_to_eight_one_element_tensors():
    def step_function(batch, step):
        step.guard_finite(batch)                      # the whole batch: not a scalar
        return batch

    with pytest.raises(ValueError, match="one-element tensor"):
        compile_step(step_function, batches(1)[0])(batches(1)[0])


def test_clip_without_read_back_equals_clip_with_read_back(rng):
    grads = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (7,), (2, 2, 3))]
    results = []
    for sync in (True, False):
        params = [gf.tensor(np.zeros_like(g), requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = gf.tensor(g.copy())
        norm = clip_grad_norm(params, 0.5, sync=sync)
        results.append((float(norm) if sync else norm.item(), [p.grad.numpy() for p in params]))
    (norm_a, grads_a), (norm_b, grads_b) = results
    assert norm_b == pytest.approx(norm_a, rel=1e-6) and norm_a > 0.5
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_array_equal(a, b)


def test_batches_of_any_shape_run_and_bad_ones_are_refused():
    compiled = compile_step(lambda batch, step: batch * 2, np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(compiled(np.ones((2, 3))).numpy(), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(compiled(gf.tensor(np.ones((3, 2)))).numpy(), np.full((3, 2), 2))
    assert compiled.step == 2
    with pytest.raises(TypeError, match="real numbers"):
        compiled(np.array([["a", "b", "c"]] * 2))
    with pytest.raises(TypeError, match="fn must be callable"):
        compile_step(3, np.zeros(2))


def test_step_counter_range_and_int():
    counter = StepCounter("numpy", 9)
    assert int(counter) == 9 and [0, 1][StepCounter("numpy", 1)] == 1
    with pytest.raises(ValueError, match=r"\[0, 2\^64\)"):
        counter.set(-1)
    with pytest.raises(ValueError, match="not on the GPU"):
        counter.device_words()


def test_scalar_log_reads_back_in_batches():
    log = ScalarLog(("a", "b"), capacity=2)
    for step in range(1, 6):
        log.record(step, {"a": gf.tensor([float(step)]), "b": gf.tensor([step * 0.5])})
    assert len(log) == 5
    records = log.read()
    assert [label for label, _ in records] == [1, 2, 3, 4, 5]
    assert records[4][1] == {"a": 5.0, "b": 2.5}
    assert log.read() == [] and len(log) == 0


# ------------------------------------------------------------------ GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("optimizer,schedule", [("adam", True), ("sgd", False)])
def test_captured_step_equals_the_eager_loop_over_20_steps(optimizer, schedule):
    (losses, norms, params, compiled), (e_losses, e_norms, e_params) = run_both(
        "cuda", 20, optimizer=optimizer, schedule=schedule)
    assert compiled.graphs == 1 and compiled.mode((4, 3, 9, 11)) == "replay"
    np.testing.assert_allclose(losses, e_losses, rtol=1e-5)
    np.testing.assert_allclose(norms, e_norms, rtol=1e-5)
    for a, b in zip(params, e_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert len(set(losses)) == 20               # every replay computed a new step


@pytest.mark.gpu
def test_captured_noise_matches_the_numpy_twin_on_every_replay():
    def step_function(batch, step):
        return uniform_noise(batch, KEY, step.index)

    x = np.random.default_rng(3).standard_normal((3, 5, 7, 9)).astype(np.float32)
    compiled = compile_step(step_function, gf.tensor(x, device="cuda"), start_step=2 ** 32 - 2)
    for i in range(5):                          # crosses 2^32: both words of the stream
        out = compiled(x).numpy()
        stream = 2 ** 32 - 2 + i
        np.testing.assert_array_equal(out, x + uniform_noise_values(x.shape, KEY, stream))
    assert compiled.graphs == 1


@pytest.mark.gpu
def test_captured_nan_flag_names_the_first_bad_step_and_keeps_the_parameters():
    setup = Setup("cuda")
    data = batches(8)
    data[5][1, 2, 3, 4] = np.nan                 # step number 6, a replay
    compiled = compile_step(setup.step_function, data[0])
    for batch in data[:5]:
        compiled(batch)
    assert compiled.mode(data[0].shape) == "replay"
    before = setup.parameters()
    for batch in data[5:]:
        compiled(batch)
    assert compiled.first_nonfinite_step() == 6
    for a, b in zip(setup.parameters(), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
def test_a_new_batch_shape_gets_its_own_graph_then_runs_eagerly():
    setup = Setup("cuda")
    compiled, messages = with_notices(setup.step_function, max_graphs=2)
    shapes = [(4, 3, 9, 11), (2, 3, 9, 11), (3, 3, 8, 8)]
    for shape in shapes:
        for batch in batches(3, shape):
            compiled(batch)
    assert compiled.graphs == 2
    assert [compiled.mode(s) for s in shapes] == ["replay", "replay", "eager"]
    assert "capturing another graph for it (2 of at most 2)" in messages[0]
    assert "(3, 3, 8, 8)" in messages[1] and "runs eagerly" in messages[1]
    # Back to the first shape: its graph replays, with its own gradients.
    out = compiled(batches(1, shapes[0], seed=9)[0])
    assert np.isfinite(out["loss"].item())


@pytest.mark.gpu
def test_interleaved_shapes_keep_to_max_graphs():
    setup = Setup("cuda")
    compiled, _ = with_notices(setup.step_function, max_graphs=1)
    a, b = batches(3, (4, 3, 9, 11)), batches(3, (2, 3, 9, 11))
    for x, y in zip(a, b):                      # A, B, A, B, ...: both warm up first
        compiled(x)
        compiled(y)
    assert compiled.graphs == 1
    assert [compiled.mode(x.shape) for x in (a[0], b[0])] == ["replay", "eager"]


@pytest.mark.gpu
def test_zero_grad_after_the_update_still_replays():
    setup = Setup("cuda")

    def step_function(batch, step):
        out = setup.step_function(batch, step)
        setup.optimizer.zero_grad()             # the common idiom: clear after stepping
        return out

    compiled, messages = with_notices(step_function)
    for batch in batches(5):
        compiled(batch)
    assert compiled.mode((4, 3, 9, 11)) == "replay" and compiled.graphs == 1
    assert messages == []


@pytest.mark.gpu
def test_default_notices_are_warnings():
    compiled = compile_step(lambda batch, step: batch * 2, np.zeros((2, 2), np.float32),
                            max_graphs=1)
    compiled(np.zeros((2, 2), np.float32))
    compiled(np.zeros((2, 2), np.float32))      # captured: the one graph allowed
    with pytest.warns(CompiledStepWarning, match="runs eagerly"):
        compiled(np.zeros((3, 2), np.float32))
    assert compiled.graphs == 1 and compiled.mode((3, 2)) == "eager"


@pytest.mark.gpu
def test_replays_return_the_same_tensors_in_a_new_structure():
    setup = Setup("cuda")
    compiled = compile_step(setup.step_function, batches(1)[0])
    outputs = [compiled(batch) for batch in batches(4)]
    assert compiled.mode((4, 3, 9, 11)) == "replay"
    outputs[2].pop("loss")                        # the caller's dict, not the graph's
    assert "loss" in outputs[3] and outputs[3]["norm"].data is outputs[2]["norm"].data


@pytest.mark.gpu
def test_momentum_switched_on_after_capture_captures_again():
    setup = Setup("cuda", optimizer="sgd")
    setup.optimizer.param_groups[0]["momentum"] = 0.0
    compiled, messages = with_notices(setup.step_function)
    for batch in batches(3):
        compiled(batch)
    setup.optimizer.param_groups[0]["momentum"] = 0.9     # needs a buffer the graph lacks
    for batch in batches(3, seed=6):
        out = compiled(batch)
    assert any("capturing it again" in m for m in messages)
    assert np.isfinite(out["loss"].item()) and compiled.graphs == 1


@pytest.mark.gpu
def test_replaced_parameters_are_noticed_and_the_step_captured_again():
    setup = Setup("cuda")
    compiled, messages = with_notices(setup.step_function)
    for batch in batches(3):
        compiled(batch)
    state = setup.model.state_dict()
    setup.model.load_state_dict(state)          # new parameter arrays
    compiled(batches(1, seed=8)[0])
    assert any("capturing it again" in m for m in messages)
    for batch in batches(3, seed=10):
        compiled(batch)
    assert compiled.graphs == 1


@pytest.mark.gpu
def test_clip_without_read_back_equals_clip_with_read_back_on_the_gpu(rng):
    grads = [rng.standard_normal(s).astype(np.float32) for s in ((33, 17), (1001,), (5, 7, 3))]
    results = []
    for sync in (True, False):
        params = [gf.tensor(np.zeros_like(g), device="cuda", requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = gf.tensor(g.copy(), device="cuda")
        norm = clip_grad_norm(params, 2.0, sync=sync)
        results.append((float(norm) if sync else norm.item(), [p.grad.numpy() for p in params]))
    (norm_a, grads_a), (norm_b, grads_b) = results
    assert norm_b == pytest.approx(norm_a, rel=1e-6)
    reference = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    assert norm_a == pytest.approx(reference, rel=1e-5)
    for a, b, g in zip(grads_a, grads_b, grads):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, g * (2.0 / (reference + 1e-6)), rtol=1e-5)
