"""softmax, log_softmax and dropout: forward against explicit loops, stability,
gradients against finite differences, CUDA against NumPy on every kernel path
(warp per row, block per row, columns)."""
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.ops.dropout import dropout_mask
from gdnflow.testing import assert_backends_match, gradcheck


def t64(a, requires_grad=False):
    return gf.tensor(a, device="numpy", dtype=np.float64, requires_grad=requires_grad)


def naive_softmax(x, axis, log=False):
    """Each line along ``axis`` on its own, with math.exp / math.log on Python floats."""
    axis %= x.ndim
    y = np.zeros_like(x)
    other = [range(s) if i != axis else [slice(None)] for i, s in enumerate(x.shape)]
    for index in np.ndindex(*[len(o) for o in other]):
        line = tuple(o[k] for o, k in zip(other, index))
        values = [float(v) for v in x[line]]
        top = max(values)
        total = sum(math.exp(v - top) for v in values)
        y[line] = [v - top - math.log(total) if log else math.exp(v - top) / total
                   for v in values]
    return y


CASES = [((4, 7), -1), ((4, 7), 0), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), -1), ((1, 1), -1),
         ((3, 1, 6), 1), ((9,), 0)]


@pytest.mark.parametrize("shape, axis", CASES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_forward_matches_loops(shape, axis, log, rng):
    x = 3 * rng.standard_normal(shape)
    fn = ops.log_softmax if log else ops.softmax
    np.testing.assert_allclose(fn(t64(x), axis).numpy(), naive_softmax(x, axis, log),
                               rtol=1e-12, atol=1e-15)


def test_large_inputs_do_not_overflow():
    x = np.array([[1000.0, 999.0, -1000.0], [-1e4, -1e4, -1e4]], dtype=np.float32)
    y = ops.softmax(gf.tensor(x, device="numpy")).numpy()
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y.sum(axis=-1), 1, rtol=1e-6)
    log_y = ops.log_softmax(gf.tensor(x, device="numpy")).numpy()
    np.testing.assert_allclose(log_y[0], [-0.31326169, -1.31326169, -2000.31326169], rtol=1e-6)


@pytest.mark.parametrize("shape, axis", CASES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_gradient(shape, axis, log, rng):
    fn = ops.log_softmax if log else ops.softmax
    gradcheck(lambda t: fn(t, axis), [rng.standard_normal(shape)])


def test_axis_out_of_range_names_operator_and_shape():
    with pytest.raises(gf.ShapeError, match=r"softmax: axis 2 out of range for shape \(3, 4\)"):
        ops.softmax(gf.zeros((3, 4), device="numpy"), 2)


# --------------------------------------------------------------- dropout --
def test_dropout_is_the_identity_in_eval_and_at_p0(rng):
    x = gf.tensor(rng.standard_normal((3, 4)), device="numpy")
    assert ops.dropout(x, 0.5, training=False) is x
    assert ops.dropout(x, 0.0, training=True) is x


def test_dropout_keeps_1_minus_p_and_scales_them(rng):
    x = rng.uniform(1, 2, (200, 500))
    y = ops.dropout(t64(x), 0.3, training=True, rng=np.random.default_rng(5)).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.01
    np.testing.assert_allclose(y[kept], x[kept] / 0.7, rtol=1e-12)


def test_dropout_gradient_is_the_mask_and_masks_repeat_with_the_seed(rng):
    x = t64(rng.standard_normal((6, 7)), requires_grad=True)
    y = ops.dropout(x, 0.4, training=True, rng=np.random.default_rng(11))
    y.backward(t64(np.ones((6, 7))))
    mask = dropout_mask((6, 7), 0.4, np.random.default_rng(11), np.float64)
    np.testing.assert_array_equal(x.grad.numpy(), mask)
    np.testing.assert_array_equal(y.numpy(), x.numpy() * mask)


def test_dropout_p1_zeroes_everything_and_bad_p_is_refused(rng):
    x = t64(rng.standard_normal((2, 3)))
    assert not np.any(ops.dropout(x, 1.0, training=True).numpy())
    with pytest.raises(ValueError, match=r"dropout: p must be in \[0, 1\], got 1.5"):
        ops.dropout(x, 1.5)


# -------------------------------------------------------------------- GPU --
GPU_CASES = CASES + [
    ((1, 1000), -1),        # ImageNet classes at batch 1: warp per row
    ((64, 1000), -1),
    ((3, 5000), -1),        # block per row
    ((2, 512), -1),         # the first row length that gets a block
    ((2, 511), -1),
    ((5, 7, 33, 3), 1),     # columns
    ((2, 1000, 1, 1), 1),
    ((300, 37), 0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape, axis", GPU_CASES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_cuda_matches_numpy(shape, axis, log, rng):
    fn = ops.log_softmax if log else ops.softmax
    assert_backends_match(lambda t: fn(t, axis), [4 * rng.standard_normal(shape)], rtol=1e-5)


@pytest.mark.gpu
def test_cuda_dropout_draws_the_numpy_mask(rng):
    x = rng.standard_normal((7, 4096))
    y_np = ops.dropout(gf.tensor(x, device="numpy"), 0.5, True, np.random.default_rng(3))
    y_gpu = ops.dropout(gf.tensor(x, device="cuda"), 0.5, True, np.random.default_rng(3))
    np.testing.assert_array_equal(y_gpu.numpy(), y_np.numpy())
    assert_backends_match(lambda t: ops.dropout(t, 0.5, True, np.random.default_rng(3)), [x],
                          rtol=1e-6)
