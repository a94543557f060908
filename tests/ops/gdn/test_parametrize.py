"""The non-negative reparameterisation of GDN's parameters: the stored form
(NonNegativeReparametrization) and the operator (NonNegativeParametrize),
against lower_bound, square and shift composed. lower_bound alone:
tests/ops/test_bound.py."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import registry
from gdnflow.ops.bound import lower_bound
from gdnflow.ops.gdn.parametrize import (PEDESTAL, NonNegativeParametrizeOp,
                                         NonNegativeReparametrization)
from gdnflow.testing import assert_backends_match, gradcheck

from bound_inputs import values_around

DEVICES = ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_pedestal_and_bounds_are_compressais():
    assert PEDESTAL == 2.0 ** -36
    assert NonNegativeReparametrization(0.0).bound == 2.0 ** -18
    beta_bound = NonNegativeReparametrization(1e-6).bound
    assert beta_bound == pytest.approx(np.sqrt(1e-6 + 2.0 ** -36), rel=1e-15)


def test_registered_as_nonnegative_parametrize():
    assert registry.get("nonnegative_parametrize") is NonNegativeParametrizeOp


def test_init_then_effective_gives_the_value_back(rng):
    param = NonNegativeReparametrization(1e-6)
    value = rng.uniform(0.0, 3.0, (4, 5))
    value[0, 0] = 1e-3
    stored = param.init(value)
    effective = param(gf.tensor(stored, device="numpy", dtype=np.float64)).numpy()
    np.testing.assert_allclose(effective, value, rtol=1e-12, atol=1e-18)


def test_values_below_the_minimum_come_back_at_the_minimum():
    param = NonNegativeReparametrization(0.01)
    stored = param.init(np.array([-5.0, 0.0, 0.004, 0.02]))
    np.testing.assert_allclose(stored[:2], [2.0 ** -18, np.sqrt(PEDESTAL)], rtol=1e-15)
    effective = param(gf.tensor(stored, device="numpy", dtype=np.float64)).numpy()
    np.testing.assert_allclose(effective, [0.01, 0.01, 0.01, 0.02], rtol=1e-12)


def test_zero_minimum_maps_zero_to_exactly_zero():
    # gamma's off-diagonal at initialisation: stored 2^-18, effective 0 exactly (float32 too).
    param = NonNegativeReparametrization(0.0)
    stored = param.init(np.zeros(3))
    assert np.all(stored == 2.0 ** -18)
    effective = param(gf.tensor(stored, device="numpy", dtype=np.float32)).numpy()
    assert np.all(effective == 0.0)


def test_effective_value_gradient_above_the_bound(rng):
    param = NonNegativeReparametrization(1e-6)
    gradcheck(param, [rng.uniform(0.01, 2.0, (3, 4))])


@pytest.mark.parametrize("device", DEVICES)
def test_effective_value_gradient_at_and_below_the_bound(device):
    # d(max(p, b)^2)/dp = 2 max(p, b) where the gradient passes: for p below
    # the bound, 2b, and only for a negative incoming gradient.
    param = NonNegativeReparametrization(0.25)
    bound = param.bound
    p = gf.tensor([0.0, 0.0, 2.0], device=device, requires_grad=True)
    param(p).backward(gf.tensor([-1.0, 1.0, 1.0], device=device))
    np.testing.assert_allclose(p.grad.numpy(), [-2 * bound, 0.0, 4.0], rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(7,), (192,), (192, 192), (1000003,)], ids=str)
def test_cuda_matches_numpy(shape, rng):
    # Random-signed gradients, so that below the bound some pass and some do not.
    param = NonNegativeReparametrization(1e-2)
    assert_backends_match(param, [values_around(rng, param.bound, shape)], rtol=1e-5)


# ------------------------------------------------ the fused reparameterisation --
def composed(p, bound):
    """The three operators the fused one replaces."""
    return gf.ops.affine(gf.ops.pow(lower_bound(p, bound), 2.0), 1.0, -PEDESTAL)


@pytest.mark.parametrize("minimum", [0.0, 1e-6, 0.3])
def test_fused_equals_composed_values_and_gradients(minimum):
    rng = np.random.default_rng(3)
    bound = (minimum + PEDESTAL) ** 0.5
    p = rng.uniform(-0.2, 1.0, (5, 7))
    p[0, :3] = bound                       # on the bound exactly
    g = rng.standard_normal(p.shape)
    results = []
    for fn in (lambda t: NonNegativeParametrizeOp(bound, PEDESTAL)(t), lambda t: composed(t, bound)):
        t = gf.tensor(p, device="numpy", dtype=np.float64, requires_grad=True)
        y = fn(t)
        y.backward(gf.tensor(g, device="numpy", dtype=np.float64))
        results.append((y.numpy(), t.grad.numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-12, atol=1e-15)


@pytest.mark.gpu
def test_fused_cuda_matches_numpy():
    rng = np.random.default_rng(4)
    bound = (1e-6 + PEDESTAL) ** 0.5
    assert_backends_match(lambda t: NonNegativeParametrizeOp(bound, PEDESTAL)(t),
                          [rng.uniform(-0.5, 1.0, (193, 7))], rtol=1e-5)
