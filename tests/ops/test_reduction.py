"""sum, mean and broadcast_to: forward against NumPy, gradients, CUDA against NumPy."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.testing import assert_backends_match, gradcheck

AXES = [None, 0, 1, -1, (0, 2, 3), (1,), (1, 3), (0, 1, 2, 3), (2, 3)]


def naive_sum(x, axes):
    """Sum by explicit iteration over every index (independent of np.sum's axis handling)."""
    axes = tuple(range(x.ndim)) if axes is None else tuple(a % x.ndim for a in np.atleast_1d(axes))
    out_shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    out = np.zeros(out_shape)
    for index in np.ndindex(x.shape):
        out[tuple(0 if i in axes else k for i, k in enumerate(index))] += x[index]
    return out


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_forward_matches_naive_loop(op, axis, rng):
    x = rng.standard_normal((2, 3, 4, 5))
    t = gf.tensor(x, device="numpy", dtype=np.float64)
    got = getattr(ops, op)(t, axis, keepdims=True).numpy()
    want = naive_sum(x, axis)
    if op == "mean":
        want = want / (x.size / want.size)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_keepdims_false_drops_axes(rng):
    t = gf.tensor(rng.standard_normal((2, 3, 4)), device="numpy")
    assert ops.sum(t, (0, 2)).shape == (3,)
    assert ops.mean(t).shape == ()
    assert ops.sum(t, -1, keepdims=True).shape == (2, 3, 1)


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_gradient(op, axis, keepdims, rng):
    gradcheck(lambda t: getattr(ops, op)(t, axis, keepdims), [rng.standard_normal((2, 3, 2, 3))])


def test_bad_axis_names_operator_and_shape():
    with pytest.raises(gf.ShapeError, match=r"sum: axis 4 out of range for shape \(2, 3\)"):
        ops.sum(gf.zeros((2, 3), device="numpy"), 4)


def test_broadcast_to_and_its_gradient(rng):
    x = rng.standard_normal((3, 1, 5))
    out = ops.broadcast_to(gf.tensor(x, device="numpy"), (2, 3, 4, 5))
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(x.astype(np.float32), (2, 3, 4, 5)))
    gradcheck(lambda t: ops.broadcast_to(t, (2, 3, 4, 5)), [x])


# -------------------------------------------------------------------- GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 1023, 1024, 1025, 1000003, 2 ** 22 + 3])
def test_full_sum_cuda_matches_numpy(n, rng):
    assert_backends_match(lambda t: ops.sum(t), [rng.standard_normal(n) + 0.5], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("shape", [(3, 5, 17, 19), (1, 7, 1, 3), (64, 3, 40, 41)], ids=str)
def test_axis_reductions_cuda_match_numpy(op, axis, shape, rng):
    assert_backends_match(lambda t: getattr(ops, op)(t, axis), [rng.standard_normal(shape) + 0.25],
                          rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis", [((5, 3000), 1), ((3000, 5), 0), ((2, 100000, 3), 1),
                                        ((9, 5000, 2), (0, 2))], ids=str)
def test_long_rows_and_columns_cuda(shape, axis, rng):
    assert_backends_match(lambda t: ops.sum(t, axis), [rng.standard_normal(shape)], rtol=1e-4)


@pytest.mark.gpu
def test_broadcast_to_cuda_matches_numpy(rng):
    assert_backends_match(lambda t: ops.broadcast_to(t, (3, 5, 17, 19)),
                          [rng.standard_normal((5, 1, 19))], rtol=1e-5)
