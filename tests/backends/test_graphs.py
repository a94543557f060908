"""CUDA graphs (gdnflow.backends.cuda.graphs): capture, replay on new data, cuBLAS inside a
capture, and a refused allocation (GPU only)."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops


@pytest.mark.gpu
def test_cuda_graph_replays_captured_kernels_on_new_data(rng):
    import pycuda.driver as drv
    from gdnflow.backends import cuda
    from gdnflow.backends.cuda.graphs import CudaGraph
    from gdnflow.backends.cuda.runtime import get_runtime
    runtime = get_runtime()
    host = rng.standard_normal(1000).astype(np.float32)
    x = runtime.from_numpy(host)
    y = runtime.full((1000,), np.nan)
    relu = cuda.kernel("elementwise.cu", "relu_forward", "PPiff")
    relu.launch(1000, x.ptr, y.ptr, 1000, 0.0, 0.0)     # compile and load before capture
    graph = CudaGraph()
    assert graph.capture(lambda: relu.launch(1000, x.ptr, y.ptr, 1000, 0.0, 0.0)) is None
    for _ in range(2):
        host = rng.standard_normal(1000).astype(np.float32)
        x2 = runtime.from_numpy(host)
        drv.memcpy_dtod_async(x.ptr, x2.ptr, x.nbytes, runtime.stream)
        graph.replay()
        np.testing.assert_array_equal(y.get(), np.maximum(host, 0))
    graph.close()
    graph.close()           # idempotent


@pytest.mark.gpu
def test_cublas_gemm_is_captured_without_allocating(rng):
    from gdnflow.backends.cuda import blas
    from gdnflow.backends.cuda.graphs import CudaGraph
    from gdnflow.backends.cuda.runtime import get_runtime
    runtime = get_runtime()
    a, b = (rng.standard_normal((64, 96)).astype(np.float32),
            rng.standard_normal((96, 80)).astype(np.float32))
    da, db, dc = runtime.from_numpy(a), runtime.from_numpy(b), runtime.full((64, 80), np.nan)
    blas.matmul(da.ptr, db.ptr, dc.ptr, 64, 80, 96)             # handle and kernels first
    runtime.stream.synchronize()
    graph = CudaGraph()
    graph.capture(lambda: blas.matmul(da.ptr, db.ptr, dc.ptr, 64, 80, 96), mode="global")
    graph.replay()
    np.testing.assert_allclose(dc.get(), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_capture_refuses_an_allocation_and_leaves_the_stream_usable():
    import pycuda.driver as drv
    from gdnflow.backends.cuda.graphs import CAPTURE_STATUS_NONE, CudaGraph, capture_status
    from gdnflow.backends.cuda.runtime import get_runtime
    graph = CudaGraph()
    with pytest.raises(Exception) as info:
        graph.capture(lambda: drv.mem_alloc(1 << 20))
    assert any("capturing a CUDA graph" in note for note in getattr(info.value, "__notes__", []))
    assert capture_status(get_runtime().stream) == CAPTURE_STATUS_NONE and not graph.captured
    x = gf.tensor([-1.0, 2.0], device="cuda")
    np.testing.assert_array_equal(ops.relu(x).numpy(), [0.0, 2.0])
