"""batch_norm in both modes: forward against per-channel loops, running-stat
updates against PyTorch's rule written out by hand, gradients of x, gamma and
beta against finite differences, CUDA against NumPy; and fold_batch_norm."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.testing import assert_backends_match, gradcheck

EPS = 1e-5


def t64(a):
    return gf.tensor(a, device="numpy", dtype=np.float64)


def naive_batch_norm(x, gamma, beta, mean=None, var=None, eps=EPS):
    """Channel by channel with explicit sums; batch statistics when mean/var are None.

    Returns (y, batch mean, biased batch var, number of values per channel).
    """
    n, c = x.shape[:2]
    y = np.zeros_like(x)
    means, variances = np.zeros(c), np.zeros(c)
    count = 0
    for ch in range(c):
        values = [x[(b, ch) + rest] for b in range(n) for rest in np.ndindex(x.shape[2:])]
        count = len(values)
        mu = sum(values) / count
        means[ch] = mu
        variances[ch] = sum((v - mu) ** 2 for v in values) / count
        m = mu if mean is None else mean[ch]
        v = variances[ch] if var is None else var[ch]
        for b in range(n):
            y[b, ch] = gamma[ch] * (x[b, ch] - m) / np.sqrt(v + eps) + beta[ch]
    return y, means, variances, count


def pytorch_running_update(running_mean, running_var, batch_mean, batch_var_biased, count,
                           momentum):
    """PyTorch's BatchNorm rule: x_new = (1 - momentum) x_old + momentum x_batch, with the
    *unbiased* batch variance (count / (count - 1) times the biased one)."""
    new_mean = (1 - momentum) * running_mean + momentum * batch_mean
    new_var = (1 - momentum) * running_var + momentum * batch_var_biased * count / (count - 1)
    return new_mean, new_var


SHAPES = [(2, 3, 5, 7), (4, 2, 1, 1), (1, 3, 3, 5), (5, 4)]


def parameters(rng, c):
    gamma = rng.uniform(0.5, 2.0, c) * rng.choice([-1, 1], c)
    beta = rng.standard_normal(c)
    running_mean = rng.standard_normal(c)
    running_var = rng.uniform(0.5, 2.0, c)
    return gamma, beta, running_mean, running_var


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("momentum", [0.1, 0.3])
def test_training_forward_and_running_update(shape, momentum, rng):
    x = 2 * rng.standard_normal(shape) + 0.7
    gamma, beta, rm, rv = parameters(rng, shape[1])
    # Copies: on NumPy a float64 tensor adopts the array, and training updates it in place.
    trm, trv = t64(rm.copy()), t64(rv.copy())
    y = ops.batch_norm(t64(x), t64(gamma), t64(beta), trm, trv, training=True, momentum=momentum)
    want, mean, var, count = naive_batch_norm(x, gamma, beta)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-10, atol=1e-12)
    want_rm, want_rv = pytorch_running_update(rm, rv, mean, var, count, momentum)
    np.testing.assert_allclose(trm.numpy(), want_rm, rtol=1e-12)
    np.testing.assert_allclose(trv.numpy(), want_rv, rtol=1e-12)


def test_running_buffers_are_updated_in_place(rng):
    rm = gf.tensor(np.zeros(3), device="numpy")
    array = rm.data
    ops.batch_norm(gf.tensor(rng.standard_normal((4, 3, 2, 2)), device="numpy"),
                   gf.ones((3,), device="numpy"), gf.zeros((3,), device="numpy"),
                   rm, gf.ones((3,), device="numpy"), training=True)
    assert rm.data is array and np.any(array != 0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_eval_forward_uses_running_statistics(shape, rng):
    x = rng.standard_normal(shape)
    gamma, beta, rm, rv = parameters(rng, shape[1])
    trm, trv = t64(rm.copy()), t64(rv.copy())
    y = ops.batch_norm(t64(x), t64(gamma), t64(beta), trm, trv, training=False)
    np.testing.assert_allclose(y.numpy(), naive_batch_norm(x, gamma, beta, rm, rv)[0],
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(trm.numpy(), rm)      # untouched in eval
    np.testing.assert_array_equal(trv.numpy(), rv)


def test_training_without_running_statistics(rng):
    x = rng.standard_normal((3, 2, 4, 4))
    gamma, beta, _, _ = parameters(rng, 2)
    y = ops.batch_norm(t64(x), t64(gamma), t64(beta), training=True)
    np.testing.assert_allclose(y.numpy(), naive_batch_norm(x, gamma, beta)[0], rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_gradients_of_x_gamma_beta(shape, training, rng):
    x = rng.standard_normal(shape)
    gamma, beta, rm, rv = parameters(rng, shape[1])

    def fn(x, gamma, beta):
        # Fresh running statistics on each call: the finite differences call
        # fn many times, and training mode updates them.
        return ops.batch_norm(x, gamma, beta, t64(rm.copy()), t64(rv.copy()), training=training)
    gradcheck(fn, [x, gamma, beta])


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_gradient_of_x_alone(training, rng):
    gamma, beta, rm, rv = parameters(rng, 3)
    gradcheck(lambda x: ops.batch_norm(x, t64(gamma), t64(beta), t64(rm.copy()), t64(rv.copy()),
                                       training=training),
              [rng.standard_normal((2, 3, 3, 2))])


def test_fold_batch_norm_into_linear(rng):
    x = rng.standard_normal((6, 5))
    w, b = rng.standard_normal((4, 5)), rng.standard_normal(4)
    gamma, beta, mean, var = parameters(rng, 4)
    folded_w, folded_b = ops.fold_batch_norm(w, b, gamma, beta, mean, var, EPS)
    want = naive_batch_norm(x @ w.T + b, gamma, beta, mean, var)[0]
    np.testing.assert_allclose(x @ folded_w.T + folded_b, want, rtol=1e-10)


def test_fold_batch_norm_scales_conv_output_channels(rng):
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    gamma, beta, mean, var = parameters(rng, 3)
    folded_w, folded_b = ops.fold_batch_norm(gf.tensor(w, device="numpy"), None, gamma, beta,
                                             mean, var, EPS)
    assert folded_w.dtype == np.float32 and folded_b.dtype == np.float32
    for o in range(3):
        s = gamma[o] / np.sqrt(var[o] + EPS)
        np.testing.assert_allclose(folded_w[o], w[o] * s, rtol=1e-6)
        np.testing.assert_allclose(folded_b[o], beta[o] - mean[o] * s, rtol=1e-6, atol=1e-7)


def zeros(*shape):
    return gf.zeros(shape, device="numpy")


X = (2, 3, 4, 5)


@pytest.mark.parametrize("call, error, message", [
    (lambda: ops.batch_norm(zeros(*X), zeros(4), zeros(3), zeros(3), zeros(3), True),
     gf.ShapeError,
     r"batch_norm: gamma must have shape \(3,\) for an input of shape \(2, 3, 4, 5\), got \(4,\)"),
    (lambda: ops.batch_norm(zeros(*X), zeros(3), zeros(3), zeros(3), zeros(2), False),
     gf.ShapeError, r"batch_norm: running_var must have shape \(3,\).*got \(2,\)"),
    (lambda: ops.batch_norm(zeros(*X), zeros(3), zeros(3), training=False), ValueError,
     r"batch_norm: inference mode \(training=False\) needs running_mean and running_var"),
    (lambda: ops.batch_norm(zeros(1, 3, 1, 1), zeros(3), zeros(3), training=True), gf.ShapeError,
     r"batch_norm: training needs more than one value per channel"),
    (lambda: ops.batch_norm(zeros(120), zeros(3), zeros(3), training=True), gf.ShapeError,
     r"batch_norm: input must be \[N, C, \.\.\.\]"),
])
def test_errors_name_operator_and_shapes(call, error, message):
    with pytest.raises(error, match=message):
        call()


# -------------------------------------------------------------------- GPU --
GPU_SHAPES = SHAPES + [(3, 5, 17, 19), (1, 32, 112, 112), (4, 96, 56, 56), (2, 1280, 7, 7),
                       (64, 33)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_cuda_matches_numpy(shape, training, rng):
    gamma, beta, rm, rv = parameters(rng, shape[1])

    def fn(x, gamma, beta):
        stats = [gf.tensor(a, device=x.device, dtype=x.dtype) for a in (rm, rv)]
        return ops.batch_norm(x, gamma, beta, *stats, training=training)
    assert_backends_match(fn, [rng.standard_normal(shape), gamma, beta], rtol=1e-4)


@pytest.mark.gpu
def test_cuda_variance_of_a_channel_with_a_large_mean(rng):
    # Mean 50 against a spread of 0.1: sums of squares without a shift would
    # lose the variance in float32.
    shape = (8, 4, 31, 29)
    x = 50 + 0.1 * rng.standard_normal(shape)
    gamma, beta, rm, rv = parameters(rng, 4)
    assert_backends_match(lambda x, g, b: ops.batch_norm(x, g, b, training=True),
                          [x, gamma, beta], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 5, 17, 19), (2, 32, 112, 112), (7, 3)], ids=str)
def test_cuda_running_update_follows_pytorch_rule(shape, rng):
    x = (3 * rng.standard_normal(shape) - 1).astype(np.float32)
    gamma, beta, rm, rv = parameters(rng, shape[1])
    trm, trv = (gf.tensor(a, device="cuda") for a in (rm, rv))
    gf.ops.batch_norm(gf.tensor(x, device="cuda"), gf.tensor(gamma, device="cuda"),
                      gf.tensor(beta, device="cuda"), trm, trv, training=True, momentum=0.2)
    _, mean, var, count = naive_batch_norm(x.astype(np.float64), gamma, beta)
    want_rm, want_rv = pytorch_running_update(rm.astype(np.float32), rv.astype(np.float32),
                                              mean, var, count, 0.2)
    np.testing.assert_allclose(trm.numpy(), want_rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trv.numpy(), want_rv, rtol=1e-5, atol=1e-6)
