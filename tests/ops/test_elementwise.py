"""Elementwise operators: forward against NumPy formulas, gradients against
finite differences, CUDA against NumPy at odd sizes."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
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

BINARY = {
    "add": (ops.add, np.add),
    "sub": (ops.sub, np.subtract),
    "mul": (ops.mul, np.multiply),
    "div": (ops.div, np.divide),
}

# (shape of a, shape of b): same shapes, scalars, per-channel vectors, rows, columns
BROADCASTS = [
    ((3, 5, 17, 19), (3, 5, 17, 19)),
    ((3, 5, 17, 19), (5, 1, 1)),
    ((3, 5, 17, 19), (1, 5, 1, 1)),
    ((5, 1, 1), (3, 5, 17, 19)),
    ((7, 9), (9,)),
    ((7, 1), (1, 9)),
    ((3, 5, 17, 19), ()),
    ((2, 3, 4, 5, 6), (3, 1, 5, 1)),
]


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


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shapes", BROADCASTS[:1] + BROADCASTS[4:6] + BROADCASTS[-1:], ids=str)
def test_binary_forward_matches_numpy(name, shapes, rng):
    fn, reference = BINARY[name]
    a, b = rng.standard_normal(shapes[0]), positive(rng, shapes[1])
    out = fn(gf.tensor(a, device="numpy", dtype=np.float64), gf.tensor(b, device="numpy", dtype=np.float64))
    np.testing.assert_allclose(out.numpy(), reference(a, b), rtol=1e-12)


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (3, 1, 1)), ((4, 1), (1, 3)), ((3, 4), ()),
                                    ((3, 4), (3, 4))], ids=str)
def test_binary_gradient(name, shapes, rng):
    fn, _ = BINARY[name]
    gradcheck(fn, [rng.standard_normal(shapes[0]), positive(rng, shapes[1])])


def test_same_tensor_used_twice_accumulates(rng):
    x = rng.standard_normal((3, 4))
    gradcheck(lambda t: t * t + t, [x])


def test_scalar_arithmetic_on_both_sides(rng):
    x = rng.standard_normal((2, 3))
    t = gf.tensor(x, device="numpy", dtype=np.float64)
    for got, want in [(t + 2, x + 2), (2 + t, 2 + x), (t - 2, x - 2), (2 - t, 2 - x),
                      (t * 3, x * 3), (3 * t, 3 * x), (t / 4, x / 4), (-t, -x)]:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_broadcast_to_and_its_gradient(rng):
    x = rng.standard_normal((3, 1, 5))
    out = ops.broadcast_to(gf.tensor(x, device="numpy"), (2, 3, 4, 5))
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(x.astype(np.float32), (2, 3, 4, 5)))
    gradcheck(lambda t: ops.broadcast_to(t, (2, 3, 4, 5)), [x])


def test_incompatible_shapes_name_operator_and_shapes():
    a = gf.zeros((3, 4), device="numpy")
    b = gf.zeros((5,), device="numpy")
    with pytest.raises(gf.ShapeError, match=r"mul: shapes \(3, 4\) and \(5,\)"):
        a * b


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


@pytest.mark.gpu
@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shapes", BROADCASTS + [((1000003,), (1000003,)), ((1,), (1,))], ids=str)
def test_binary_cuda_matches_numpy(name, shapes, rng):
    fn, _ = BINARY[name]
    assert_backends_match(fn, [rng.standard_normal(shapes[0]), positive(rng, shapes[1])], rtol=1e-5)


@pytest.mark.gpu
def test_broadcast_to_cuda_matches_numpy(rng):
    assert_backends_match(lambda t: ops.broadcast_to(t, (3, 5, 17, 19)),
                          [rng.standard_normal((5, 1, 19))], rtol=1e-5)
