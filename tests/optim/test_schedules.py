"""Learning-rate schedules: their rate sequences, groups, state dicts."""
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.nn import Parameter
from gdnflow.optim import SGD, Adam, CosineLR, StepLR


def two_group_optimizer(lrs=(0.1, 0.01)):
    params = [Parameter(np.ones(2), device="numpy") for _ in lrs]
    return SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)], lr=lrs[0])


def rates(schedule, steps):
    """The groups' rates at steps 0 .. steps - 1 (step() after each)."""
    seen = []
    for _ in range(steps):
        seen.append(schedule.last_lrs)
        schedule.step()
    return seen


def test_step_lr_decays_every_step_size_steps():
    opt = two_group_optimizer()
    got = rates(StepLR(opt, step_size=3, gamma=0.5), 10)
    want = [[base * 0.5 ** (t // 3) for base in (0.1, 0.01)] for t in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_cosine_lr_without_warmup():
    opt = two_group_optimizer()
    total = 8
    got = np.array(rates(CosineLR(opt, total_steps=total, min_lr=0.001), total + 3))
    for t, row in enumerate(got):
        for base, lr in zip((0.1, 0.01), row):
            expected = (0.001 + (base - 0.001) * (1 + math.cos(math.pi * t / total)) / 2
                        if t < total else 0.001)
            assert lr == pytest.approx(expected, rel=1e-12)
    assert got[0, 0] == 0.1                                  # the first step uses the base rate
    assert got[4, 0] == pytest.approx((0.1 + 0.001) / 2)     # half way
    assert np.all(np.diff(got[:, 0]) <= 0)


def test_cosine_lr_with_warmup():
    opt = two_group_optimizer((0.4,))
    got = [lr for (lr,) in rates(CosineLR(opt, total_steps=10, warmup_steps=3), 12)]
    np.testing.assert_allclose(got[:4], [0.1, 0.2, 0.3, 0.4], rtol=1e-12)   # never 0
    np.testing.assert_allclose(got[4:10], [0.4 * (1 + math.cos(math.pi * (t - 3) / 7)) / 2
                                           for t in range(4, 10)], rtol=1e-12)
    assert got[10:] == [0.0, 0.0]


def test_schedule_drives_the_optimizer_step():
    p = Parameter(np.zeros(1), device="numpy")
    opt = SGD([p], lr=1.0)
    schedule = StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        p.grad = gf.tensor(np.ones(1), device="numpy")
        opt.step()
        schedule.step()
    assert p.item() == pytest.approx(-(1 + 0.5 + 0.25))


@pytest.mark.parametrize("make", [lambda o: StepLR(o, step_size=2, gamma=0.3),
                                  lambda o: CosineLR(o, total_steps=9, min_lr=1e-4,
                                                     warmup_steps=2)],
                         ids=["step", "cosine"])
def test_state_dict_round_trip(make):
    opt = two_group_optimizer()
    schedule = make(opt)
    rates(schedule, 4)
    state = schedule.state_dict()
    other_opt = two_group_optimizer((0.5, 0.5))      # other rates: the state brings the base ones
    other = make(other_opt)
    other.load_state_dict(state)
    assert other.last_lrs == schedule.last_lrs
    assert rates(other, 7) == rates(schedule, 7)
    assert other.state_dict() == schedule.state_dict()


def test_load_state_dict_refuses_other_schedules_and_group_counts():
    state = StepLR(two_group_optimizer(), step_size=2).state_dict()
    with pytest.raises(ValueError, match="StepLR"):
        CosineLR(two_group_optimizer(), total_steps=5).load_state_dict(state)
    with pytest.raises(ValueError, match="2 base rates for 1 groups"):
        StepLR(two_group_optimizer((0.1,)), step_size=2).load_state_dict(state)


@pytest.mark.parametrize("bad", [
    lambda o: StepLR(o, step_size=0),
    lambda o: StepLR(o, step_size=2, gamma=0),
    lambda o: CosineLR(o, total_steps=0),
    lambda o: CosineLR(o, total_steps=5, warmup_steps=5),
    lambda o: CosineLR(o, total_steps=5, min_lr=-1),
])
def test_invalid_settings_are_refused(bad):
    with pytest.raises(ValueError):
        bad(two_group_optimizer())


def test_works_with_adam_groups():
    params = [Parameter(np.ones(2), device="numpy") for _ in range(2)]
    opt = Adam([{"params": params[:1], "lr": 0.2}, {"params": params[1:]}], lr=0.02)
    schedule = CosineLR(opt, total_steps=4)
    rates(schedule, 4)
    assert schedule.last_lrs == [0.0, 0.0]
