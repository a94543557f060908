"""Binary arithmetic with broadcasting: forward against NumPy, gradients
against finite differences, CUDA against NumPy at odd sizes and broadcasts."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.testing import assert_backends_match, gradcheck


def positive(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


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


def test_incompatible_shapes_name_operator_and_shapes():
    a = gf.zeros((3, 4), device="numpy")
    b = gf.zeros((5,), device="numpy")
    with pytest.raises(gf.ShapeError, match=r"mul: shapes \(3, 4\) and \(5,\)"):
        a * b


# -------------------------------------------------------------------- GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shapes", BROADCASTS + [((1000003,), (1000003,)), ((1,), (1,))], ids=str)
def test_binary_cuda_matches_numpy(name, shapes, rng):
    fn, _ = BINARY[name]
    assert_backends_match(fn, [rng.standard_normal(shapes[0]), positive(rng, shapes[1])], rtol=1e-5)
