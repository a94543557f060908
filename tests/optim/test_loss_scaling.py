"""DynamicLossScaler: scaled losses and gradients, exact unscaling against unscaled runs,
skipped steps that leave parameters and optimiser state untouched, the scale's schedule,
unscale-then-clip, state dicts, refusals, and the CUDA path against the NumPy one."""
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import nn
from gdnflow.optim import SGD, Adam, DynamicLossScaler, clip_grad_norm
from gdnflow.step import StepSyncError, compile_step


def two_layer_model(seed=0, device="numpy"):
    rng = np.random.default_rng(seed)
    return nn.Sequential(nn.Linear(6, 5, rng=rng), nn.ReLU(), nn.Linear(5, 2, rng=rng)).to(device)


def regression_data(seed=1):
    """Inputs and targets a 2-layer model can fit: a fixed random linear map of the inputs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((32, 6)).astype(np.float32)
    return x, (x @ rng.standard_normal((6, 2)) * 0.5).astype(np.float32)


def mse(model, x, target):
    diff = model(gf.tensor(x)) - gf.tensor(target)
    return (diff * diff).mean()


def parameter_arrays(model):
    return [p.numpy().copy() for p in model.parameters()]


def assert_bitwise_equal(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{what} {i} changed"


def adam_state_arrays(opt):
    return [np.asarray(v) for entry in opt.state_dict()["state"].values()
            for _, v in sorted(entry.items())]


def test_scaled_loss_is_loss_times_scale_and_gradients_come_out_scaled():
    x, target = regression_data()
    model = two_layer_model()
    loss = mse(model, x, target)
    loss.backward()
    plain = [p.grad.numpy().copy() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    scaler = DynamicLossScaler(init_scale=2.0 ** 10)
    scaled = scaler.scale(mse(model, x, target))
    assert scaled.item() == np.float32(loss.item() * 2.0 ** 10)
    scaled.backward()
    for p, g in zip(model.parameters(), plain):
        np.testing.assert_array_equal(p.grad.numpy(), g * np.float32(2.0 ** 10))


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.05, momentum=0.9),
                                  lambda ps: Adam(ps, lr=0.01)], ids=["sgd", "adam"])
def test_finite_steps_match_an_unscaled_run(make):
    x, target = regression_data()
    reference, scaled_model = two_layer_model(), two_layer_model()
    reference_opt, opt = make(list(reference.parameters())), make(list(scaled_model.parameters()))
    # growth_interval 2: the scale changes during the run, which must not show in the result.
    scaler = DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=2)
    for _ in range(6):
        reference_opt.zero_grad()
        mse(reference, x, target).backward()
        reference_opt.step()
        opt.zero_grad()
        scaler.scale(mse(scaled_model, x, target)).backward()
        assert scaler.step(opt) is True
        for a, b in zip(parameter_arrays(scaled_model), parameter_arrays(reference)):
            np.testing.assert_array_equal(a, b)
    assert scaler.scale_value == 2.0 ** 11 and scaler.skipped_steps == 0


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_nonfinite_gradient_skips_the_step_and_backs_off(bad):
    x, target = regression_data()
    model = two_layer_model()
    opt = Adam(list(model.parameters()), lr=0.01)
    scaler = DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=5)
    for _ in range(2):      # Adam has state, the scaler a count of clean steps
        opt.zero_grad()
        scaler.scale(mse(model, x, target)).backward()
        assert scaler.step(opt)
    assert scaler.clean_steps == 2
    opt.zero_grad()
    scaler.scale(mse(model, x, target)).backward()
    list(model.parameters())[1].grad.data[3] = bad
    params, state = parameter_arrays(model), adam_state_arrays(opt)
    steps = [e["step"] for e in opt.state_dict()["state"].values()]
    assert scaler.step(opt) is False
    assert_bitwise_equal(parameter_arrays(model), params, "parameter")
    assert_bitwise_equal(adam_state_arrays(opt), state, "Adam state array")
    assert [e["step"] for e in opt.state_dict()["state"].values()] == steps
    assert (scaler.scale_value, scaler.clean_steps, scaler.skipped_steps) == (2.0 ** 7, 0, 1)


def single_parameter(grad_value):
    p = gf.nn.Parameter(np.ones(3, np.float32))
    p.grad = gf.tensor(np.full(3, grad_value, np.float32))
    return p


def test_the_scale_grows_after_growth_interval_clean_steps_up_to_max_scale():
    scaler = DynamicLossScaler(init_scale=2.0, growth_interval=3, max_scale=6.0)
    p = single_parameter(1.0)
    opt = SGD([p], lr=0.0)
    scales = []
    for _ in range(9):
        p.grad = gf.tensor(np.ones(3, np.float32))
        assert scaler.step(opt)
        scales.append(scaler.scale_value)
    assert scales == [2.0, 2.0, 4.0, 4.0, 4.0, 6.0, 6.0, 6.0, 6.0]


def test_the_scale_backs_off_down_to_min_scale():
    scaler = DynamicLossScaler(init_scale=8.0, backoff_factor=0.25, min_scale=0.75)
    p = single_parameter(1.0)
    opt = SGD([p], lr=1.0)
    scales = []
    for _ in range(3):
        p.grad = gf.tensor(np.full(3, np.nan, np.float32))
        assert not scaler.step(opt)
        scales.append(scaler.scale_value)
    assert scales == [2.0, 0.75, 0.75] and scaler.skipped_steps == 3
    np.testing.assert_array_equal(p.numpy(), np.ones(3, np.float32))


def test_unscale_then_clip_then_step_unscales_once():
    scaler = DynamicLossScaler(init_scale=4.0)
    p = single_parameter(4.0 * 3.0)         # true gradient: 3 per element
    opt = SGD([p], lr=0.5)
    assert scaler.unscale(opt) is True
    np.testing.assert_array_equal(p.grad.numpy(), np.full(3, 3.0, np.float32))
    norm = clip_grad_norm([p], max_norm=1.0)
    assert norm == pytest.approx(3.0 * math.sqrt(3.0))
    clipped = p.grad.numpy().copy()
    with pytest.raises(RuntimeError, match="already called"):
        scaler.unscale(opt)
    assert scaler.step(opt)
    np.testing.assert_allclose(p.numpy(), 1.0 - 0.5 * clipped, rtol=1e-7)
    np.testing.assert_allclose(p.numpy(), 1.0 - 0.5 / math.sqrt(3.0), rtol=1e-6)
    p.grad = gf.tensor(np.full(3, 8.0, np.float32))
    assert scaler.unscale([p])              # the next step unscales again
    np.testing.assert_array_equal(p.grad.numpy(), np.full(3, 2.0, np.float32))


def test_a_gradient_shared_by_two_parameters_is_unscaled_once():
    a, b = single_parameter(0.0), single_parameter(0.0)
    a.grad = b.grad = gf.tensor(np.full(3, 8.0, np.float32))
    assert DynamicLossScaler(init_scale=4.0).unscale([a, b])
    np.testing.assert_array_equal(a.grad.numpy(), np.full(3, 2.0, np.float32))


def test_state_dict_round_trip():
    scaler = DynamicLossScaler(init_scale=16.0, growth_interval=4)
    p = single_parameter(1.0)
    opt = SGD([p], lr=0.0)
    for value in (1.0, np.inf, 1.0, 1.0):
        p.grad = gf.tensor(np.full(3, value, np.float32))
        scaler.step(opt)
    state = scaler.state_dict()
    assert state == {"scale": 8.0, "clean_steps": 2, "skipped_steps": 1}
    other = DynamicLossScaler(growth_interval=4)
    other.load_state_dict(state)
    for s in (scaler, other):
        for _ in range(2):
            p.grad = gf.tensor(np.ones(3, np.float32))
            s.step(opt)
    assert other.state_dict() == scaler.state_dict() == {"scale": 16.0, "clean_steps": 0,
                                                         "skipped_steps": 1}


@pytest.mark.parametrize("state, message", [
    ({"scale": 8.0, "clean_steps": 0}, "keys"),
    ({"scale": 8.0, "clean_steps": 0, "skipped_steps": 0, "extra": 1}, "keys"),
    ([8.0, 0, 0], "got list"),
    ({"scale": 2.0 ** 30, "clean_steps": 0, "skipped_steps": 0}, "scale must be"),
    ({"scale": "8", "clean_steps": 0, "skipped_steps": 0}, "scale must be"),
    ({"scale": 8.0, "clean_steps": -1, "skipped_steps": 0}, "clean_steps must be"),
    ({"scale": 8.0, "clean_steps": 0, "skipped_steps": 1.5}, "skipped_steps must be"),
])
def test_a_malformed_state_dict_is_refused_and_changes_nothing(state, message):
    scaler = DynamicLossScaler(init_scale=4.0)
    with pytest.raises(ValueError, match=message):
        scaler.load_state_dict(state)
    assert scaler.state_dict() == {"scale": 4.0, "clean_steps": 0, "skipped_steps": 0}


@pytest.mark.parametrize("arguments, name", [
    (dict(growth_factor=1.0), "growth_factor must be > 1"),
    (dict(backoff_factor=1.0), "backoff_factor"),
    (dict(backoff_factor=0.0), "backoff_factor"),
    (dict(growth_interval=0), "growth_interval"),
    (dict(growth_interval=2.0), "growth_interval"),
    (dict(min_scale=0.0), "min_scale"),
    (dict(init_scale=0.5), "init_scale"),
    (dict(init_scale=2.0 ** 25), "max_scale"),
    (dict(init_scale=math.inf), "init_scale must be a finite number"),
    (dict(max_scale=math.nan), "max_scale must be a finite number"),
    (dict(growth_factor=True), "growth_factor must be a finite number"),
])
def test_bad_arguments_are_refused_by_name(arguments, name):
    with pytest.raises(ValueError, match=name):
        DynamicLossScaler(**arguments)


def test_wrong_argument_types_are_named():
    with pytest.raises(TypeError, match="loss as a Tensor"):
        DynamicLossScaler().scale(1.0)
    with pytest.raises(TypeError, match="expected an Optimizer"):
        DynamicLossScaler().step([single_parameter(1.0)])


def test_loss_scaling_inside_a_compiled_step_is_refused():
    model = two_layer_model()
    opt = SGD(list(model.parameters()), lr=0.1)
    scaler = DynamicLossScaler()
    x, target = regression_data()
    target = gf.tensor(target)

    def step_function(batch, step):
        diff = model(batch) - target
        loss = (diff * diff).mean()
        opt.zero_grad()
        loss.backward()
        scaler.step(opt)
        return loss.reshape(1)

    with pytest.raises(StepSyncError, match=r"DynamicLossScaler.step\(\).*eager steps"):
        compile_step(step_function, x)(x)


# The overflow is the point: NumPy's warnings about it are expected.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_training_with_the_scaler_reaches_the_loss_of_training_without_it():
    x, target = (4 * array for array in regression_data())
    losses = []
    # 2^127 makes the first scaled gradients overflow: the scaler skips steps and backs off.
    for scaler in (None, DynamicLossScaler(init_scale=2.0 ** 127, max_scale=2.0 ** 127,
                                           backoff_factor=2.0 ** -20, growth_interval=50)):
        model = two_layer_model(seed=3)
        opt = Adam(list(model.parameters()), lr=0.02)
        for _ in range(300):
            opt.zero_grad()
            loss = mse(model, x, target)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
        losses.append(mse(model, x, target).item())
    assert scaler.skipped_steps >= 1
    assert losses[0] < 0.05 * mse(two_layer_model(seed=3), x, target).item()
    assert losses[1] == pytest.approx(losses[0], rel=0.05, abs=1e-4)


@pytest.mark.gpu
def test_cuda_steps_and_skips_match_numpy(rng):
    shapes = [(5, 7), (3,), (70_000,)]
    inits = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) * 2.0 ** 12 for s in shapes]
             for _ in range(3)]
    grads[1][2][12_345] = np.inf            # the second step overflows
    results = {}
    for device in ("numpy", "cuda"):
        params = [gf.nn.Parameter(v, device=device) for v in inits]
        opt = Adam(params, lr=0.01)
        scaler = DynamicLossScaler(init_scale=2.0 ** 12)
        taken = []
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = gf.tensor(g, device=device)
            before = [p.numpy().copy() for p in params]
            taken.append(scaler.step(opt))
            if not taken[-1]:
                assert_bitwise_equal([p.numpy() for p in params], before, "parameter")
        results[device] = (taken, scaler.state_dict(), [p.numpy() for p in params])
    assert results["cuda"][0] == results["numpy"][0] == [True, False, True]
    assert results["cuda"][1] == results["numpy"][1] == {"scale": 2.0 ** 11, "clean_steps": 1,
                                                         "skipped_steps": 1}
    for a, b in zip(results["cuda"][2], results["numpy"][2]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
