"""lower_bound: max(x, bound), with a gradient that also passes below the
bound when it is negative."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import registry
from gdnflow.ops.bound import LowerBoundOp, lower_bound
from gdnflow.testing import assert_backends_match, gradcheck

from bound_inputs import values_around

DEVICES = ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_registered_as_lower_bound():
    assert registry.get("lower_bound") is LowerBoundOp


@pytest.mark.parametrize("device", DEVICES)
def test_lower_bound_forward(device):
    x = gf.tensor([-1.0, 0.5, 1.0, 2.5], device=device)
    np.testing.assert_array_equal(lower_bound(x, 1.0).numpy(), [1.0, 1.0, 1.0, 2.5])


@pytest.mark.parametrize("device", DEVICES)
def test_lower_bound_gradient_below_the_bound_passes_only_when_negative(device):
    # x:        below,  below,  at the bound, above, above
    x = gf.tensor([0.1, 0.2, 1.0, 3.0, 4.0], device=device, requires_grad=True)
    y = lower_bound(x, 1.0)
    y.backward(gf.tensor([-2.0, 3.0, 5.0, 7.0, -11.0], device=device))
    np.testing.assert_array_equal(x.grad.numpy(), [-2.0, 0.0, 5.0, 7.0, -11.0])


def test_lower_bound_gradient_above_the_bound(rng):
    gradcheck(lambda t: lower_bound(t, 0.3), [rng.uniform(0.35, 2.0, (3, 5))])


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(7,), (192,), (192, 192), (1000003,)], ids=str)
def test_cuda_matches_numpy(shape, rng):
    # Random-signed gradients, so that below the bound some pass and some do not.
    assert_backends_match(lambda t: lower_bound(t, 0.1), [values_around(rng, 0.1, shape)], rtol=1e-6)
