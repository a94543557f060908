"""reshape and flatten."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.testing import assert_backends_match, gradcheck


def test_reshape_infers_minus_one_and_keeps_order(rng):
    x = rng.standard_normal((2, 3, 4))
    t = gf.tensor(x, device="numpy", dtype=np.float64)
    np.testing.assert_array_equal(t.reshape(4, -1).numpy(), x.reshape(4, 6))
    np.testing.assert_array_equal(t.reshape((24,)).numpy(), x.ravel())


def test_flatten(rng):
    t = gf.tensor(rng.standard_normal((2, 3, 4, 5)), device="numpy")
    assert ops.flatten(t).shape == (2, 60)
    assert ops.flatten(t, 2).shape == (2, 3, 20)
    assert ops.flatten(t, 0).shape == (120,)


def test_reshape_gradient(rng):
    gradcheck(lambda t: ops.reshape(t, (3, 4)) * ops.reshape(t, (3, 4)), [rng.standard_normal((2, 6))])


@pytest.mark.parametrize("shape", [(5, 7), (2, -1, -1), (-2, 35)], ids=str)
def test_bad_reshape_names_shapes(shape):
    with pytest.raises(gf.ShapeError, match=r"reshape"):
        ops.reshape(gf.zeros((5, 6), device="numpy"), shape)


@pytest.mark.gpu
def test_reshape_cuda_matches_numpy(rng):
    assert_backends_match(lambda t: ops.flatten(t).relu(), [rng.standard_normal((3, 5, 17, 19))])
