"""Optimisers: updates against hand-written NumPy versions of PyTorch's rules,
groups, skipped parameters, state dicts, clipping, a model that learns, and
the fused CUDA step against the NumPy step."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.nn import Module, Parameter
from gdnflow.optim import SGD, Adam, clip_grad_norm
from gdnflow.testing import relative_error
from gdnflow.tensor import weights_version


# ------------------------------------------------ reference implementations --
# PyTorch's torch.optim.SGD / Adam single-tensor code paths, written out in
# float64 with a None gradient meaning "skipped this step".
def reference_sgd(params, grad_steps, lr, momentum=0.0, weight_decay=0.0, nesterov=False):
    params = [p.copy() for p in params]
    buffers = [None] * len(params)
    for grads in grad_steps:
        for i, g in enumerate(grads):
            if g is None:
                continue
            d = g + weight_decay * params[i] if weight_decay else g
            if momentum:
                if buffers[i] is None:
                    buffers[i] = d.copy()
                else:
                    buffers[i] = momentum * buffers[i] + d      # dampening 0
                d = d + momentum * buffers[i] if nesterov else buffers[i]
            params[i] = params[i] - lr * d
    return params


def reference_adam(params, grad_steps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    params = [p.copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    steps = [0] * len(params)
    beta1, beta2 = betas
    for grads in grad_steps:
        for i, g in enumerate(grads):
            if g is None:
                continue
            steps[i] += 1
            t = steps[i]
            g = g + weight_decay * params[i] if weight_decay else g
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            step_size = lr / (1 - beta1 ** t)
            denom = np.sqrt(v[i]) / np.sqrt(1 - beta2 ** t) + eps
            params[i] = params[i] - step_size * m[i] / denom
    return params


SHAPES = [(3, 4), (5,), (2, 1, 3)]


def random_run(rng, shapes=SHAPES, steps=4, skip=()):
    """Initial values and per-step gradients; ``skip``: (step, index) pairs with no gradient."""
    inits = [rng.standard_normal(s) for s in shapes]
    grads = [[None if (k, i) in skip else rng.standard_normal(s) for i, s in enumerate(shapes)]
             for k in range(steps)]
    return inits, grads


def run_optimizer(make, inits, grad_steps, device="numpy", dtype=np.float64):
    """Parameters after ``make(params).step()`` for each step's gradients, and the optimiser."""
    # Copies: on NumPy a tensor adopts a float64 array without copying, and
    # the update works in place.
    params = [Parameter(x.copy(), device=device, dtype=dtype) for x in inits]
    opt = make(params)
    for grads in grad_steps:
        for p, g in zip(params, grads):
            p.grad = None if g is None else gf.tensor(g, device=device, dtype=dtype)
        opt.step()
    return [p.numpy() for p in params], opt


SGD_CONFIGS = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "nesterov": dict(lr=0.05, momentum=0.8, nesterov=True),
    "weight_decay": dict(lr=0.1, weight_decay=0.01),
    "all": dict(lr=0.03, momentum=0.9, weight_decay=0.1, nesterov=True),
}

ADAM_CONFIGS = {
    "default": dict(),
    "lr_betas": dict(lr=0.01, betas=(0.8, 0.99)),
    "weight_decay": dict(lr=0.01, weight_decay=0.1, eps=1e-6),
}


@pytest.mark.parametrize("config", SGD_CONFIGS)
def test_sgd_matches_pytorch_rule(config, rng):
    inits, grads = random_run(rng)
    kwargs = SGD_CONFIGS[config]
    got, _ = run_optimizer(lambda ps: SGD(ps, **kwargs), inits, grads)
    for a, b in zip(got, reference_sgd(inits, grads, **kwargs)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("config", ADAM_CONFIGS)
def test_adam_matches_pytorch_rule(config, rng):
    inits, grads = random_run(rng)
    kwargs = ADAM_CONFIGS[config]
    got, _ = run_optimizer(lambda ps: Adam(ps, **kwargs), inits, grads)
    for a, b in zip(got, reference_adam(inits, grads, **kwargs)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_float32_parameters_stay_float32_and_are_updated_in_place(rng):
    p = Parameter(rng.standard_normal((4, 3)), device="numpy")
    array = p.data
    before = array.copy()
    opt = Adam([p], lr=0.1, weight_decay=0.01)
    p.grad = gf.tensor(rng.standard_normal((4, 3)), device="numpy")
    opt.step()
    assert p.data is array and array.dtype == np.float32
    assert not np.array_equal(array, before)
    assert opt.state[id(p)]["exp_avg"].dtype == np.float32


def test_step_records_no_autograd_history(rng):
    p = Parameter(rng.standard_normal(3), device="numpy")
    opt = SGD([p], lr=0.1, momentum=0.9)
    (p * p).sum().backward()
    opt.step()
    assert p.creator is None and p.requires_grad
    # A second backward sees a leaf again: its gradient is 2p for the new p.
    opt.zero_grad()
    (p * p).sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), 2 * p.numpy(), rtol=1e-6)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_parameter_groups_have_their_own_hyperparameters(kind, rng):
    inits, grads = random_run(rng)
    if kind == "sgd":
        make = lambda ps: SGD([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.5, "nesterov": True}],
                              lr=0.1, momentum=0.9)
        first = reference_sgd(inits[:2], [g[:2] for g in grads], lr=0.1, momentum=0.9)
        second = reference_sgd(inits[2:], [g[2:] for g in grads], lr=0.5, momentum=0.9,
                               nesterov=True)
    else:
        make = lambda ps: Adam([{"params": ps[:1], "lr": 0.05}, {"params": ps[1:]}],
                               lr=0.01, weight_decay=0.1)
        first = reference_adam(inits[:1], [g[:1] for g in grads], lr=0.05, weight_decay=0.1)
        second = reference_adam(inits[1:], [g[1:] for g in grads], lr=0.01, weight_decay=0.1)
    got, opt = run_optimizer(make, inits, grads)
    assert len(opt.param_groups) == 2
    for a, b in zip(got, first + second):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_parameters_without_gradient_are_skipped(kind, rng):
    # Parameter 1 has no gradient on steps 0 and 2: it is left alone, and its
    # Adam step count (bias correction) lags behind the others'.
    skip = {(0, 1), (2, 1)}
    inits, grads = random_run(rng, steps=5, skip=skip)
    if kind == "sgd":
        got, opt = run_optimizer(lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
                                 inits, grads)
        want = reference_sgd(inits, grads, lr=0.1, momentum=0.9, weight_decay=0.01)
    else:
        got, opt = run_optimizer(lambda ps: Adam(ps, lr=0.01), inits, grads)
        want = reference_adam(inits, grads, lr=0.01)
        assert [opt.state_dict()["state"][i]["step"] for i in range(3)] == [5, 3, 5]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_never_updated_parameter_is_unchanged_and_has_no_state(rng):
    inits, grads = random_run(rng, steps=2, skip={(0, 0), (1, 0)})
    got, opt = run_optimizer(lambda ps: Adam(ps, lr=0.1), inits, grads)
    np.testing.assert_array_equal(got[0], inits[0])
    assert 0 not in opt.state_dict()["state"]


def test_zero_grad_forgets_every_gradient(rng):
    params = [Parameter(rng.standard_normal(s), device="numpy") for s in SHAPES]
    opt = SGD([{"params": params[:1]}, {"params": params[1:]}], lr=0.1)
    for p in params:
        p.grad = gf.tensor(np.ones(p.shape), device="numpy")
    opt.zero_grad()
    assert all(p.grad is None for p in params)


# -------------------------------------------------------------- a model --
class Line(Module):
    """y = w * x + b with scalar w and b."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(np.zeros(1), device="numpy")
        self.b = Parameter(np.zeros(1), device="numpy")

    def forward(self, x):
        return self.w * x + self.b


def mse(model, x, y):
    return ((model(x) - y) ** 2).mean()


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: Adam(ps, lr=0.05)], ids=["sgd", "adam"])
def test_fitting_a_line_decreases_the_loss(make, rng):
    x_np = rng.uniform(-1, 1, 64)
    x = gf.tensor(x_np, device="numpy")
    y = gf.tensor(3 * x_np - 2, device="numpy")
    model = Line()
    opt = make(model.parameters())
    losses = []
    for _ in range(300):
        opt.zero_grad()
        loss = mse(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 1e-3 * losses[0]
    np.testing.assert_allclose([model.w.item(), model.b.item()], [3, -2], atol=0.05)


# ---------------------------------------------------------- state dicts --
@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
                                  lambda ps: Adam([{"params": ps[:1], "lr": 0.03},
                                                   {"params": ps[1:]}], lr=0.01)],
                         ids=["sgd", "adam"])
def test_state_dict_round_trip_continues_identically(make, rng):
    inits, grads = random_run(rng, steps=6, skip={(1, 2)})
    params, opt = run_optimizer(make, inits, grads[:3], dtype=np.float32)
    state = opt.state_dict()
    saved = {i: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in e.items()}
             for i, e in state["state"].items()}
    # A second optimiser on copies of the parameters, loaded from the state.
    copies = [Parameter(p.copy(), device="numpy") for p in params]
    other = make(copies)
    other.load_state_dict(state)
    assert other.state_dict()["param_groups"] == state["param_groups"]
    originals = [p for g in opt.param_groups for p in g["params"]]
    for grads_now in grads[3:]:
        for a, b, g in zip(originals, copies, grads_now):
            a.grad = None if g is None else gf.tensor(g, device="numpy")
            b.grad = None if g is None else gf.tensor(g, device="numpy")
        opt.step()
        other.step()
    for a, b in zip(originals, copies):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # The state dict was a copy: the later steps did not change it.
    for i, entry in saved.items():
        for k, v in entry.items():
            np.testing.assert_array_equal(state["state"][i][k], v)


def test_load_state_dict_rejects_what_does_not_fit(rng):
    inits, grads = random_run(rng, steps=1)
    _, adam = run_optimizer(lambda ps: Adam(ps), inits, grads)
    state = adam.state_dict()
    params = [Parameter(x, device="numpy") for x in inits]
    with pytest.raises(ValueError, match="of a Adam, not a SGD"):
        SGD(params, lr=0.1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"groups of \[3\] parameters, this optimiser \[2\]"):
        Adam(params[:2]).load_state_dict(state)
    bad = Adam(params)
    state["state"][1]["exp_avg"] = np.zeros((9, 9))
    del state["state"][2]["step"]
    with pytest.raises(ValueError) as error:
        bad.load_state_dict(state)
    assert "parameter 1 exp_avg: shape (9, 9)" in str(error.value)
    assert "missing ['step']" in str(error.value)
    assert bad.state == {}      # nothing loaded


@pytest.mark.parametrize("bad", [
    lambda ps: SGD(ps, lr=-1.0),
    lambda ps: SGD(ps, lr=0.1, nesterov=True),
    lambda ps: Adam(ps, betas=(0.9, 1.0)),
    lambda ps: Adam(ps, betas=0.9),
    lambda ps: Adam([{"params": ps, "momentum": 0.9}]),
    lambda ps: Adam([ps[0], ps[0]]),
    lambda ps: SGD([{"params": ps[:1]}, {"params": ps[:1]}], lr=0.1),
    lambda ps: Adam([]),
])
def test_invalid_settings_are_refused(bad, rng):
    params = [Parameter(rng.standard_normal(2), device="numpy") for _ in range(2)]
    with pytest.raises((ValueError, TypeError)):
        bad(params)


def test_gradient_of_wrong_shape_is_refused(rng):
    p = Parameter(rng.standard_normal(3), device="numpy")
    p.grad = gf.tensor(np.ones(4), device="numpy")
    with pytest.raises(gf.ShapeError, match=r"shape \(3,\).*gradient of shape \(4,\)"):
        SGD([p], lr=0.1).step()


# ------------------------------------------------------------- clipping --
def with_grads(rng, shapes, device="numpy"):
    params = [Parameter(rng.standard_normal(s), device=device) for s in shapes]
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    for p, g in zip(params, grads):
        p.grad = gf.tensor(g.copy(), device=device)     # a copy: clipping works in place
    return params, grads


def test_clip_grad_norm_scales_down_to_max_norm(rng):
    params, grads = with_grads(rng, SHAPES)
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
    got = clip_grad_norm(params, max_norm=0.5)
    assert got == pytest.approx(norm, rel=1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.numpy(), g * 0.5 / (norm + 1e-6), rtol=1e-6)
    clipped = np.sqrt(sum(np.sum(p.grad.numpy().astype(np.float64) ** 2) for p in params))
    assert clipped == pytest.approx(0.5, rel=1e-5)


def test_clip_grad_norm_leaves_small_gradients_alone(rng):
    params, grads = with_grads(rng, SHAPES)
    extra = Parameter(np.ones(3), device="numpy")       # no gradient: ignored
    norm = clip_grad_norm(params + [extra], max_norm=1e6)
    assert norm == pytest.approx(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)),
                                 rel=1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.numpy(), g)
    assert extra.grad is None


def test_clip_grad_norm_scales_a_shared_gradient_once(rng):
    # Autograd gives a and b the same gradient tensor for a + b.
    a = Parameter(rng.standard_normal(4), device="numpy")
    b = Parameter(rng.standard_normal(4), device="numpy")
    ((a + b) * gf.tensor(np.arange(1.0, 5.0), device="numpy")).sum().backward()
    assert a.grad.data is b.grad.data
    norm = clip_grad_norm([a, b], max_norm=1.0)
    assert norm == pytest.approx(np.sqrt(2 * np.sum(np.arange(1.0, 5.0) ** 2)), rel=1e-6)
    np.testing.assert_allclose(a.grad.numpy(), np.arange(1.0, 5.0) / (norm + 1e-6), rtol=1e-6)


def test_clip_grad_norm_without_gradients_returns_zero():
    assert clip_grad_norm([Parameter(np.ones(2), device="numpy")], 1.0) == 0.0


# -------------------------------------------------------------------- GPU --
GPU_SHAPES = [(1,), (7,), (1000003,), (3, 5, 17, 19)]

GPU_CONFIGS = {
    "sgd": lambda ps: SGD(ps, lr=0.05),
    "sgd_momentum_wd": lambda ps: SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
    "sgd_nesterov": lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda ps: Adam(ps, lr=0.01),
    "adam_wd_groups": lambda ps: Adam([{"params": ps[::2], "lr": 0.03}, {"params": ps[1::2]}],
                                      lr=0.01, weight_decay=0.1, betas=(0.8, 0.99)),
}


def assert_runs_match(make, rng, skip=(), steps=3):
    inits, grads = random_run(rng, GPU_SHAPES, steps=steps, skip=skip)
    want, want_opt = run_optimizer(make, inits, grads, device="numpy", dtype=np.float32)
    got, got_opt = run_optimizer(make, inits, grads, device="cuda", dtype=np.float32)
    for i, (a, b) in enumerate(zip(got, want)):
        err = relative_error(a, b)
        assert err <= 1e-5, f"parameter {i} of shape {b.shape}: relative error {err:.3g}"
    want_state, got_state = want_opt.state_dict(), got_opt.state_dict()
    assert want_state["state"].keys() == got_state["state"].keys()
    for i, entry in want_state["state"].items():
        for key, value in entry.items():
            err = relative_error(got_state["state"][i][key], value)
            assert err <= 1e-5, f"state {key} of parameter {i}: relative error {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS)
def test_fused_cuda_step_matches_numpy(config, rng):
    assert_runs_match(GPU_CONFIGS[config], rng)


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["sgd_momentum_wd", "adam", "adam_wd_groups"])
def test_fused_cuda_step_skips_parameters_without_gradient(config, rng):
    # Parameter 2 (a million elements) has no gradient on step 1, parameter 0
    # none on step 0: Adam's step counts then differ within a group, which
    # takes one launch per distinct step count.
    assert_runs_match(GPU_CONFIGS[config], rng, skip={(1, 2), (0, 0)}, steps=4)


@pytest.mark.gpu
def test_cuda_state_dict_loads_on_numpy_and_back(rng):
    inits, grads = random_run(rng, [(7,), (3, 5)], steps=5)
    params, opt = run_optimizer(lambda ps: Adam(ps, lr=0.01), inits, grads[:3], device="cuda",
                                dtype=np.float32)
    on_numpy = [Parameter(p, device="numpy") for p in params]
    other = Adam(on_numpy, lr=0.01)
    other.load_state_dict(opt.state_dict())
    cuda_params = [p for g in opt.param_groups for p in g["params"]]
    for grads_now in grads[3:]:
        for a, b, g in zip(cuda_params, on_numpy, grads_now):
            a.grad = gf.tensor(g, device="cuda")
            b.grad = gf.tensor(g, device="numpy")
        opt.step()
        other.step()
    for a, b in zip(cuda_params, on_numpy):
        assert relative_error(a.numpy(), b.numpy()) <= 1e-5


@pytest.mark.gpu
def test_clip_grad_norm_on_cuda_matches_numpy(rng):
    params, grads = with_grads(rng, GPU_SHAPES, device="cuda")
    norm = clip_grad_norm(params, max_norm=1.0)
    want = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
    assert norm == pytest.approx(want, rel=1e-5)
    for p, g in zip(params, grads):
        assert relative_error(p.grad.numpy(), g / (want + 1e-6)) <= 1e-5


def test_step_marks_exactly_the_updated_parameters_changed():
    updated = gf.nn.Parameter(np.ones(3, np.float32), device="numpy")
    untouched = gf.nn.Parameter(np.ones(2, np.float32), device="numpy")
    clock = weights_version()
    (updated * 2).sum().backward()
    gf.optim.SGD([updated, untouched], lr=0.1).step()
    assert (updated.version, untouched.version) == (1, 0)
    assert weights_version() > clock       # compiled plans of the model see the change
