"""Elementwise maps: forward against NumPy formulas, gradients against
finite differences, CUDA against NumPy at odd sizes."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops, registry
from gdnflow.testing import assert_backends_match, gradcheck


def positive(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def away_from(rng, shape, kinks, margin=0.05):
    """Normal samples kept at least ``margin`` from each kink (for relu, clamp)."""
    x = rng.uniform(-8, 8, shape)
    for k in kinks:
        close = np.abs(x - k) < margin
        x[close] = k + np.sign(x[close] - k + 1e-12) * margin * 2
    return x


# name -> (function, reference formula, input sampler)
UNARY = {
    "neg": (ops.neg, lambda x: -x, lambda rng, s: rng.standard_normal(s)),
    "exp": (ops.exp, np.exp, lambda rng, s: rng.standard_normal(s)),
    "log": (ops.log, np.log, positive),
    "sqrt": (ops.sqrt, np.sqrt, positive),
    "pow": (lambda x: ops.pow(x, 2.5), lambda x: x ** 2.5, positive),
    "pow_negative": (lambda x: x ** -1.5, lambda x: x ** -1.5, positive),
    "relu": (ops.relu, lambda x: np.where(x > 0, x, 0), lambda rng, s: away_from(rng, s, [0])),
    "relu6": (ops.relu6, lambda x: np.minimum(np.maximum(x, 0), 6),
              lambda rng, s: away_from(rng, s, [0, 6])),
    "sigmoid": (ops.sigmoid, lambda x: 1 / (1 + np.exp(-x)), lambda rng, s: rng.standard_normal(s)),
    "clamp": (lambda x: ops.clamp(x, -0.5, 1.5), lambda x: np.minimum(np.maximum(x, -0.5), 1.5),
              lambda rng, s: away_from(rng, s, [-0.5, 1.5]) / 4),
    "affine": (lambda x: 3 * x - 2, lambda x: 3 * x - 2, lambda rng, s: rng.standard_normal(s)),
    "rdiv": (lambda x: 2 / x, lambda x: 2 / x, positive),
}

@pytest.mark.parametrize("name", UNARY)
def test_unary_forward_matches_formula(name, rng):
    fn, reference, sample = UNARY[name]
    x = sample(rng, (4, 7))
    y = fn(gf.tensor(x, device="numpy", dtype=np.float64))
    np.testing.assert_allclose(y.numpy(), reference(x), rtol=1e-12)


@pytest.mark.parametrize("name", UNARY)
def test_unary_gradient(name, rng):
    fn, _, sample = UNARY[name]
    gradcheck(fn, [sample(rng, (3, 5))])


def test_unary_keeps_nothing_without_a_graph(rng):
    x = gf.tensor(rng.standard_normal((3, 4)), device="numpy", requires_grad=True)
    exp = registry.get("exp")
    op = exp()
    with gf.no_grad():
        op(x)
    assert op.saved == ()
    op = exp()
    op(x)
    assert op.saved.y is not None and op.saved.x is None    # exp's backward reads its output


def test_clamp_rejects_reversed_bounds():
    with pytest.raises(ValueError, match="low"):
        ops.clamp(gf.zeros((2,), device="numpy"), 1.0, -1.0)


# -------------------------------------------------------------------- GPU --
SIZES = [(1,), (7,), (1000003,), (3, 5, 17, 19)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_unary_cuda_matches_numpy(name, shape, rng):
    fn, _, sample = UNARY[name]
    assert_backends_match(fn, [sample(rng, shape)], rtol=1e-5)
