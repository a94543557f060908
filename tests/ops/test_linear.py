"""linear and matmul: forward against explicit loops, gradients against finite
differences, CUDA (cuBLAS) against NumPy, including VGG16's classifier shapes."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.ops.linear import MatMulOp
from gdnflow.testing import assert_backends_match, gradcheck


def t64(a):
    return gf.tensor(a, device="numpy", dtype=np.float64)


def naive_linear(x, w, b):
    """y[..., o] = b[o] + sum_i x[..., i] w[o, i], one output element at a time."""
    out_features, in_features = w.shape
    y = np.zeros(x.shape[:-1] + (out_features,))
    for lead in np.ndindex(x.shape[:-1]):
        for o in range(out_features):
            acc = 0.0 if b is None else b[o]
            for i in range(in_features):
                acc += x[lead + (i,)] * w[o, i]
            y[lead + (o,)] = acc
    return y


def naive_matmul(a, b):
    """Batched product with the batch broadcast by hand: a 2-D operand or batch 1 is shared."""
    a3 = a if a.ndim == 3 else a[None]
    b3 = b if b.ndim == 3 else b[None]
    batch = max(a3.shape[0], b3.shape[0])
    m, k, n = a3.shape[1], a3.shape[2], b3.shape[2]
    y = np.zeros((batch, m, n))
    for p in range(batch):
        ap, bp = a3[p if a3.shape[0] > 1 else 0], b3[p if b3.shape[0] > 1 else 0]
        for i in range(m):
            for j in range(n):
                y[p, i, j] = sum(ap[i, q] * bp[q, j] for q in range(k))
    return y if a.ndim == 3 or b.ndim == 3 else y[0]


LINEAR_SHAPES = [((3, 5), 4), ((1, 7), 1), ((2, 3, 5), 6), ((4, 1), 3)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape, out", LINEAR_SHAPES, ids=str)
def test_linear_forward_matches_loops(x_shape, out, bias, rng):
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal((out, x_shape[-1]))
    b = rng.standard_normal(out) if bias else None
    y = ops.linear(t64(x), t64(w), None if b is None else t64(b))
    np.testing.assert_allclose(y.numpy(), naive_linear(x, w, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("x_shape, out", LINEAR_SHAPES, ids=str)
def test_linear_gradient(x_shape, out, rng):
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal((out, x_shape[-1])), \
        rng.standard_normal(out)
    gradcheck(lambda x, w, b: ops.linear(x, w, b), [x, w, b])
    gradcheck(lambda x, w: ops.linear(x, w), [x, w])


def test_linear_gradients_are_the_stated_products(rng):
    # gx = gy @ w, gw = gy^T @ x, gb = sum over N: checked as products, not
    # only by finite differences.
    x, w, b, gy = (rng.standard_normal(s) for s in [(4, 3), (5, 3), (5,), (4, 5)])
    tx, tw, tb = (gf.tensor(a, device="numpy", dtype=np.float64, requires_grad=True)
                  for a in (x, w, b))
    ops.linear(tx, tw, tb).backward(t64(gy))
    np.testing.assert_allclose(tx.grad.numpy(), gy @ w, rtol=1e-12)
    np.testing.assert_allclose(tw.grad.numpy(), gy.T @ x, rtol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), gy.sum(axis=0), rtol=1e-12)


def test_linear_computes_only_requested_gradients(rng):
    x = gf.tensor(rng.standard_normal((2, 3)), device="numpy", requires_grad=True)
    w = gf.tensor(rng.standard_normal((4, 3)), device="numpy")
    ops.linear(x, w).sum().backward()
    assert x.grad is not None and w.grad is None


MATMUL_SHAPES = [((3, 4), (4, 5)), ((1, 1), (1, 1)), ((2, 3, 4), (2, 4, 5)),
                 ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((1, 3, 4), (3, 4, 2)),
                 ((3, 3, 4), (1, 4, 2))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_forward_matches_loops(shapes, rng):
    a, b = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    np.testing.assert_allclose(ops.matmul(t64(a), t64(b)).numpy(), naive_matmul(a, b),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_gradient(shapes, rng):
    gradcheck(ops.matmul, [rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])])


# NumPy's matmul semantics beyond 3-D, as ONNX MatMul needs: 1-D operands,
# several batch dimensions, batches broadcast against each other.
NUMPY_SEMANTICS = [((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((4,), (2, 4, 3)),
                   ((1, 2, 4, 3), (3,)), ((2, 2, 3, 4), (2, 2, 4, 3)), ((3, 1, 3, 4), (1, 2, 4, 2)),
                   ((2, 1, 3, 4), (4, 2)), ((3, 4), (2, 3, 4, 2))]


@pytest.mark.parametrize("shapes", NUMPY_SEMANTICS, ids=str)
def test_matmul_follows_numpy_semantics(shapes, rng):
    a, b = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    y = ops.matmul(t64(a), t64(b)).numpy()
    want = np.matmul(a, b)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    gradcheck(ops.matmul, [a, b])


@pytest.mark.parametrize("call, message", [
    (lambda: ops.linear(gf.zeros((2, 3), device="numpy"), gf.zeros((4, 5), device="numpy")),
     r"linear: input must be \[\.\.\., 5\] for a weight of shape \(4, 5\).*got \(2, 3\)"),
    (lambda: ops.linear(gf.zeros((2, 3), device="numpy"), gf.zeros((4, 3, 1), device="numpy")),
     r"linear: weight must be 2-D \[out, in\], got shape \(4, 3, 1\)"),
    (lambda: ops.linear(gf.zeros((2, 3), device="numpy"), gf.zeros((4, 3), device="numpy"),
                        gf.zeros((3,), device="numpy")),
     r"linear: bias must have shape \(4,\).*got \(3,\)"),
    (lambda: ops.matmul(gf.zeros((2, 3), device="numpy"), gf.zeros((4, 5), device="numpy")),
     r"matmul: inner dimensions differ: shapes \(2, 3\) and \(4, 5\)"),
    (lambda: ops.matmul(gf.zeros((2, 2, 3), device="numpy"), gf.zeros((3, 3, 5), device="numpy")),
     r"matmul: batch dimensions of shapes \(2, 2, 3\) and \(3, 3, 5\) do not broadcast"),
    (lambda: ops.matmul(gf.zeros((4,), device="numpy"), gf.zeros((3, 5), device="numpy")),
     r"matmul: inner dimensions differ: shapes \(4,\) and \(3, 5\)"),
    (lambda: ops.matmul(gf.zeros((), device="numpy"), gf.zeros((3, 5), device="numpy")),
     r"matmul: operands must have at least one dimension"),
    (lambda: MatMulOp()(gf.zeros((1, 2, 2, 3), device="numpy"), gf.zeros((3, 5), device="numpy")),
     r"matmul: operands must be 2-D or 3-D"),
    (lambda: MatMulOp()(gf.zeros((2, 2, 3), device="numpy"), gf.zeros((3, 3, 5), device="numpy")),
     r"matmul: batch sizes 2 and 3 differ"),
])
def test_shape_errors_name_operator_and_shapes(call, message):
    with pytest.raises(gf.ShapeError, match=message):
        call()


# -------------------------------------------------------------------- GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("x_shape, out", LINEAR_SHAPES + [((7, 33), 17), ((5, 2, 129), 65)],
                         ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_cuda_matches_numpy(x_shape, out, bias, rng):
    inputs = [rng.standard_normal(x_shape), rng.standard_normal((out, x_shape[-1]))]
    if bias:
        inputs.append(rng.standard_normal(out))
    assert_backends_match(lambda *t: ops.linear(*t), inputs, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("in_features, out", [(25088, 4096), (4096, 4096), (4096, 1000),
                                              (1280, 1000)], ids=str)
def test_linear_cuda_at_classifier_shapes(in_features, out, rng):
    # VGG16's three classifier layers and MobileNetV2's, at batch 1.
    inputs = [rng.standard_normal((1, in_features)),
              rng.standard_normal((out, in_features)) / np.sqrt(in_features),
              rng.standard_normal(out)]
    assert_backends_match(lambda *t: ops.linear(*t), inputs, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("shapes", MATMUL_SHAPES + NUMPY_SEMANTICS + [((5, 33, 17), (5, 17, 9)),
                                                    ((4, 31, 7), (7, 13)),
                                                    ((31, 7), (4, 7, 13))], ids=str)
def test_matmul_cuda_matches_numpy(shapes, rng):
    assert_backends_match(ops.matmul, [rng.standard_normal(shapes[0]),
                                       rng.standard_normal(shapes[1])], rtol=1e-4)
