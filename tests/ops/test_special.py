"""erf and the trigonometric and hyperbolic maps (gdnflow/ops/special.py): forward
against the math module, gradients against finite differences, CUDA against NumPy."""
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.testing import assert_backends_match, gradcheck


def normal(rng, shape):
    return rng.standard_normal(shape)


def inside_unit(rng, shape):
    return rng.uniform(-0.9, 0.9, shape)


def above_one(rng, shape):
    return rng.uniform(1.1, 4.0, shape)


# name -> (function, the math module's scalar function, input sampler)
SPECIAL = {
    "erf": (ops.erf, math.erf, lambda rng, s: rng.uniform(-4, 4, s)),
    "sin": (ops.sin, math.sin, lambda rng, s: rng.uniform(-7, 7, s)),
    "cos": (ops.cos, math.cos, lambda rng, s: rng.uniform(-7, 7, s)),
    "tan": (ops.tan, math.tan, lambda rng, s: rng.uniform(-1.3, 1.3, s)),
    "asin": (ops.asin, math.asin, inside_unit),
    "acos": (ops.acos, math.acos, inside_unit),
    "atan": (ops.atan, math.atan, lambda rng, s: rng.uniform(-5, 5, s)),
    "sinh": (ops.sinh, math.sinh, normal),
    "cosh": (ops.cosh, math.cosh, normal),
    "asinh": (ops.asinh, math.asinh, lambda rng, s: rng.uniform(-5, 5, s)),
    "acosh": (ops.acosh, math.acosh, above_one),
    "atanh": (ops.atanh, math.atanh, inside_unit),
}


@pytest.mark.parametrize("name", SPECIAL)
def test_forward_matches_the_math_module(name, rng):
    fn, reference, sample = SPECIAL[name]
    x = sample(rng, (4, 7))
    y = fn(gf.tensor(x, device="numpy", dtype=np.float64))
    np.testing.assert_allclose(y.numpy(), np.vectorize(reference)(x), rtol=1e-13, atol=1e-300)


def test_erf_keeps_relative_precision_near_zero_and_saturates():
    x = np.array([1e-30, -3e-8, 0.0, 6.0, -30.0, np.inf, -np.inf, np.nan])
    y = ops.erf(gf.tensor(x, device="numpy", dtype=np.float64)).numpy()
    np.testing.assert_allclose(y[:2], [math.erf(v) for v in x[:2]], rtol=1e-15)
    np.testing.assert_array_equal(y[2:7], [0.0, math.erf(6.0), -1.0, 1.0, -1.0])
    assert np.isnan(y[7])


@pytest.mark.parametrize("name", SPECIAL)
def test_gradient(name, rng):
    fn, _, sample = SPECIAL[name]
    gradcheck(fn, [sample(rng, (3, 5))])


@pytest.mark.gpu
@pytest.mark.parametrize("name", SPECIAL)
@pytest.mark.parametrize("shape", [(7,), (3, 5, 17, 19)], ids=str)
def test_cuda_matches_numpy(name, shape, rng):
    fn, _, sample = SPECIAL[name]
    assert_backends_match(fn, [sample(rng, shape)], rtol=1e-5)


@pytest.mark.gpu
def test_cuda_matches_numpy_at_the_edges_of_the_domains():
    """asin, acos outside [-1, 1] and acosh below 1 give NaN, atanh +-inf at +-1, as NumPy."""
    x = np.array([-2.0, -1.0, 0.5, 1.0, 2.0], np.float32)
    for name in ("asin", "acos", "acosh", "atanh"):
        fn = SPECIAL[name][0]
        with np.errstate(invalid="ignore", divide="ignore"):
            expected = fn(gf.tensor(x, device="numpy")).numpy()
        got = fn(gf.tensor(x, device="cuda")).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=name)
