"""gdnflow's one cuBLAS module: blas.matmul against NumPy (GPU)."""
import itertools

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def run_matmul(rng, m, n, k, trans_a, trans_b, batch=1, alpha=1.0, beta=0.0, share_a=False):
    """(blas.matmul's C, the float64 product) for random operands."""
    from gdnflow.backends.cuda import blas
    from gdnflow.backends.cuda.runtime import get_runtime
    runtime = get_runtime()
    a = rng.standard_normal((1 if share_a else batch,) + ((k, m) if trans_a else (m, k)))
    b = rng.standard_normal((batch,) + ((n, k) if trans_b else (k, n)))
    c = rng.standard_normal((batch, m, n))
    a, b, c = (x.astype(np.float32) for x in (a, b, c))
    c_dev = runtime.from_numpy(c)
    blas.matmul(runtime.from_numpy(a).ptr, runtime.from_numpy(b).ptr, c_dev.ptr, m, n, k,
                trans_a, trans_b, alpha, beta, batch, stride_a=0 if share_a else a[0].size,
                stride_b=b[0].size, stride_c=m * n)
    op_a = np.swapaxes(a, 1, 2) if trans_a else a
    op_b = np.swapaxes(b, 1, 2) if trans_b else b
    want = alpha * np.matmul(op_a.astype(np.float64), op_b.astype(np.float64)) + beta * c
    return runtime.to_numpy(c_dev), want


def assert_close(got, want):
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product((False, True), repeat=2)))
def test_matmul_matches_numpy_at_odd_sizes(trans_a, trans_b, rng):
    assert_close(*run_matmul(rng, 37, 53, 29, trans_a, trans_b))


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product((False, True), repeat=2)))
def test_batched_matmul_with_one_shared_a(trans_a, trans_b, rng):
    # GDN's products: one gamma for every chunk (stride 0).
    assert_close(*run_matmul(rng, 19, 40, 23, trans_a, trans_b, batch=5, share_a=True))


def test_alpha_and_beta_accumulate(rng):
    assert_close(*run_matmul(rng, 33, 18, 47, False, True, batch=3, alpha=-0.5, beta=0.75))


def test_16_bit_products_without_nvmath_say_what_to_install(monkeypatch):
    import sys
    from gdnflow.backends.cuda import blas
    blas._half_handle.cache_clear()             # the next 16-bit product imports again
    # None in sys.modules makes an import fail; a submodule imported before would be found
    # without its parent, so every one of them is hidden.
    for name in [n for n in sys.modules if n.split(".")[0] == "nvmath"] + ["nvmath"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"need nvmath-python \(pip install 'gdnflow\[cuda\]'\)"):
        blas._half_handle()
