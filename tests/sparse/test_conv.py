"""sparse_conv2d: against the dense convolution, finite differences, CUDA against NumPy,
and its registration by name."""
import subprocess
import sys

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.errors import ShapeError
from gdnflow.sparse.conv import sparse_conv2d
from gdnflow.sparse.csr import to_csr
from gdnflow.sparse.geometry import sparse_geometry
from gdnflow.testing import assert_backends_match, gradcheck, relative_error
from sparse_cases import CASES, SPARSITIES, case, padded_size_of, pruned_weight


def _tensors(*arrays, dtype=np.float64, requires_grad=False):
    return [gf.tensor(a, device="numpy", dtype=dtype, requires_grad=requires_grad)
            for a in arrays]


# ------------------------------------------------------- sparse vs dense --
@pytest.mark.parametrize("sparsity", SPARSITIES)
@pytest.mark.parametrize("name", CASES)
def test_forward_matches_dense_conv2d(name, sparsity, rng):
    x, w, csr, kwargs, dilation = case(rng, name, sparsity)
    b = rng.standard_normal(w.shape[0])
    for dtype in (np.float64, np.float32):
        tx, tv, tb = _tensors(x, csr.values, b, dtype=dtype)
        got = sparse_conv2d(tx, csr, tv, tb, **kwargs).numpy()
        tw = gf.tensor(csr.to_dense(), device="numpy", dtype=dtype)
        want = ops.conv2d(tx, tw, tb, dilation=dilation, **kwargs).numpy()
        assert got.dtype == dtype
        assert relative_error(got, want) <= (1e-12 if dtype == np.float64 else 1e-5)


@pytest.mark.parametrize("sparsity", SPARSITIES)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_dense_conv2d(name, sparsity, rng):
    # The transpose and the values' gradient, against conv2d's gx and gw at the pattern.
    x, w, csr, kwargs, dilation = case(rng, name, sparsity)
    b = rng.standard_normal(w.shape[0])
    tx, tv, tb = _tensors(x, csr.values, b, requires_grad=True)
    y = sparse_conv2d(tx, csr, tv, tb, **kwargs)
    gy = rng.standard_normal(y.shape)
    y.backward(gf.tensor(gy, device="numpy", dtype=np.float64))
    dx, dw, db = _tensors(x, csr.to_dense().astype(np.float64), b, requires_grad=True)
    ops.conv2d(dx, dw, db, dilation=dilation, **kwargs).backward(
        gf.tensor(gy, device="numpy", dtype=np.float64))
    np.testing.assert_allclose(tx.grad.numpy(), dx.grad.numpy(), rtol=1e-10, atol=1e-12)
    gw = dw.grad.numpy()[csr.rows, csr.channel, csr.tap_row, csr.tap_col]
    np.testing.assert_allclose(tv.grad.numpy(), gw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), db.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["s1_p1", "s2_asymmetric", "rect_stride_5x5", "dilation2"])
def test_gradcheck(name, rng):
    x, w, csr, kwargs, _ = case(rng, name, 0.7)
    b = rng.standard_normal(w.shape[0])
    gradcheck(lambda x, v, b: sparse_conv2d(x, csr, v, b, **kwargs), [x, csr.values, b])


def test_offsets_for_another_input_size_are_recomputed(rng):
    # The CSR's offsets were made for another padded size; the result must not change.
    x, w, csr, kwargs, _ = case(rng, "s1_p1", 0.8)
    stale = to_csr(w, (40, 41))
    tx, = _tensors(x)
    np.testing.assert_allclose(sparse_conv2d(tx, stale, **kwargs).numpy(),
                               sparse_conv2d(tx, csr, **kwargs).numpy(), rtol=1e-12)


def test_all_zero_filter_gives_bias_only(rng):
    csr = to_csr(np.zeros((3, 2, 3, 3)), (7, 7))
    tx, tv, tb = _tensors(rng.standard_normal((1, 2, 5, 5)), np.zeros(0), [1.0, 2.0, 3.0],
                          requires_grad=True)
    y = sparse_conv2d(tx, csr, tv, tb, padding=1)
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to([[[[1.0]], [[2.0]], [[3.0]]]],
                                                              (1, 3, 5, 5)))
    y.backward(gf.tensor(np.ones(y.shape), device="numpy", dtype=np.float64))
    assert not tx.grad.numpy().any() and tv.grad.shape == (0,)


def test_errors_name_what_is_wrong(rng):
    csr = to_csr(pruned_weight(rng, (4, 3, 3, 3), 0.5), (7, 7))
    x, = _tensors(rng.standard_normal((1, 3, 5, 5)))
    with pytest.raises(ShapeError, match="x has 2 channels, the filter expects 3"):
        sparse_conv2d(_tensors(rng.standard_normal((1, 2, 5, 5)))[0], csr)
    with pytest.raises(ShapeError, match=rf"values must have shape \({csr.nnz},\)"):
        sparse_conv2d(x, csr, _tensors(np.ones(5))[0])
    with pytest.raises(ShapeError, match=r"bias must have shape \(4,\)"):
        sparse_conv2d(x, csr, bias=_tensors(np.ones(3))[0])
    with pytest.raises(TypeError, match="CSRWeight"):
        sparse_conv2d(x, np.ones((4, 3, 3, 3)))
    assert sparse_geometry("t", (1, 3, 5, 5), csr, (1, 1), (1, 1, 1, 1)).y_shape == (1, 4, 5, 5)


# ------------------------------------------------------------------ GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("sparsity", SPARSITIES)
@pytest.mark.parametrize("name", CASES)
def test_cuda_matches_numpy(name, sparsity, rng):
    x, w, csr, kwargs, _ = case(rng, name, sparsity)
    b = rng.standard_normal(w.shape[0])
    assert_backends_match(lambda x, v, b: sparse_conv2d(x, csr, v, b, **kwargs),
                          [x, csr.values, b], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("per_sm", [1, 4, 64])
@pytest.mark.parametrize("name", ["s1_p1", "s2_p1_odd", "rect_stride_5x5", "dilation2"])
def test_cuda_every_tiling_matches_numpy(name, per_sm, rng):
    x, w, csr, kwargs, _ = case(rng, name, 0.8)
    with gf.config.override(sparse_blocks_per_sm=per_sm):
        assert_backends_match(lambda x, v: sparse_conv2d(x, csr, v, **kwargs), [x, csr.values],
                              rtol=1e-4)


# VGG16 3x3 layers (and a stride-2 one) at 90%: chunks, groups and wide tiles for real.
REAL_LAYERS = {
    "vgg16_64_64_56_b1": ((1, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    "vgg16_256_256_28_b2": ((2, 256, 28, 28), (256, 256, 3, 3), dict(padding=1)),
    "vgg16_512_512_14_b1": ((1, 512, 14, 14), (512, 512, 3, 3), dict(padding=1)),
    "vgg16_3_64_224_b1": ((1, 3, 224, 224), (64, 3, 3, 3), dict(padding=1)),
    "stride2_128_256_28": ((2, 128, 28, 28), (256, 128, 3, 3), dict(stride=2, padding=1)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", REAL_LAYERS)
def test_cuda_real_layers_match_numpy(name, rng):
    x_shape, w_shape, kwargs = REAL_LAYERS[name]
    csr = to_csr(pruned_weight(rng, w_shape, 0.9), padded_size_of(x_shape, kwargs["padding"]))
    b = rng.standard_normal(w_shape[0])
    assert_backends_match(lambda x, v, b: sparse_conv2d(x, csr, v, b, **kwargs),
                          [rng.standard_normal(x_shape), csr.values, b], rtol=1e-4)


@pytest.mark.gpu
def test_cuda_sparse_matches_dense_conv2d_on_the_gpu(rng):
    x_shape, w_shape, kwargs = REAL_LAYERS["vgg16_256_256_28_b2"]
    w = pruned_weight(rng, w_shape, 0.95).astype(np.float32)
    csr = to_csr(w, padded_size_of(x_shape, 1))
    x = gf.tensor(rng.standard_normal(x_shape), device="cuda")
    dense = ops.conv2d(x, gf.tensor(w, device="cuda"), **kwargs).numpy()
    assert relative_error(sparse_conv2d(x, csr, **kwargs).numpy(), dense) <= 1e-4


@pytest.mark.gpu
def test_cuda_packed_entries_follow_new_values(rng):
    # The packed (value, offset) pairs are cached per values array; new values repack.
    x, w, csr, kwargs, _ = case(rng, "s1_p1", 0.5)
    tx = gf.tensor(x, device="cuda")
    first = sparse_conv2d(tx, csr, gf.tensor(csr.values, device="cuda"), **kwargs).numpy()
    second = sparse_conv2d(tx, csr, gf.tensor(2 * csr.values, device="cuda"), **kwargs).numpy()
    np.testing.assert_allclose(second, 2 * first, rtol=1e-5, atol=1e-6)


def test_operator_found_by_name_without_importing_sparse_first():
    # import gdnflow leaves gdnflow.sparse unloaded; asking the registry for its operator
    # by name loads it (the front door's unknown-name hook).
    script = ("import sys, gdnflow\n"
              "assert not [m for m in sys.modules if m.startswith('gdnflow.sparse')]\n"
              "from gdnflow import registry\n"
              "print(registry.get('sparse_conv2d').__name__)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "SparseConv2dOp"
