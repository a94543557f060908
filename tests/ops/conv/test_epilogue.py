"""The convolution's epilogue pass (``conv_epilogue`` / ``conv_epilogue_vectors`` of
cuda_src/conv2d.cu) against NumPy, in float32 and in 16 bits, with and without vectors."""
import types

import numpy as np
import pytest

from gdnflow.backends import cuda
from gdnflow.ops.conv.epilogue import epilogue_cuda, epilogue_numpy, vector_bytes
from gdnflow.precision import as_dtype, emulate


def test_vector_bytes_need_whole_vectors_per_plane_and_aligned_arrays():
    def array(shape, itemsize, ptr=0):
        return types.SimpleNamespace(shape=shape, size=int(np.prod(shape)), ptr=ptr,
                                     dtype=np.dtype(f"f{itemsize}"))
    assert vector_bytes(array((2, 3, 4, 6), 2), None) == 16
    assert vector_bytes(array((2, 3, 4, 6), 4), array((2, 3, 4, 6), 4, 32)) == 16
    assert vector_bytes(array((2, 3, 2, 2), 4), None) == 16
    assert vector_bytes(array((2, 3, 2, 2), 2), None) == 8        # a plane of 4 halves
    assert vector_bytes(array((2, 3, 7, 2), 2), None) == 4
    assert vector_bytes(array((2, 3, 7, 2), 4), None) == 8
    assert vector_bytes(array((2, 3, 5, 7), 4), None) is None
    assert vector_bytes(array((2, 3, 5, 7), 2), None) is None
    assert vector_bytes(array((2, 3, 4, 6), 2, 8), None) == 8     # y 8-byte aligned
    assert vector_bytes(array((2, 3, 4, 6), 2), array((2, 3, 4, 6), 2, 2)) is None


# Planes of 24 (16-byte vectors in every dtype), 35 (none), 4 (16 bytes in float32, 8 in
# 16 bits) and 14 (8 bytes in float32, 4 in 16 bits).
SHAPES = [(2, 3, 4, 6), (3, 5, 5, 7), (1, 6, 2, 2), (2, 3, 7, 2)]


# (bias, residual, activation code, residual offset in values: 1 misaligns it).
TERMS = [(True, False, 2, 0), (True, True, 1, 0), (False, True, 0, 0), (True, True, 2, 0),
         (True, True, 2, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias,residual,activation,residual_offset", TERMS)
def test_epilogue_cuda_matches_numpy(dtype, shape, bias, residual, activation,
                                     residual_offset, rng):
    dtype = as_dtype(dtype)
    runtime = cuda.get_runtime()
    # Spread over relu6's range, so that both of its bounds clip some values.
    y = (4 * rng.standard_normal(shape) + 3).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype) if bias else None
    r = rng.standard_normal(shape).astype(dtype) if residual else None
    want = emulate(lambda *a: epilogue_numpy(a[0], *a[1:], activation), y, b, r)
    y_gpu = runtime.from_numpy(y)
    r_gpu = None
    if residual:
        # The residual residual_offset values into its allocation: unaligned when 1.
        base = runtime.from_numpy(np.concatenate([np.zeros(residual_offset, dtype), r.ravel()]))
        r_gpu = base.offset(residual_offset, shape)
    plane = shape[2] * shape[3]
    widths = [size for size in (16, 8, 4) if size > dtype.itemsize
              and plane % (size // dtype.itemsize) == 0]
    expected = None if residual_offset or not widths else widths[0]
    assert vector_bytes(y_gpu, r_gpu) == expected
    got = epilogue_cuda(y_gpu, None if b is None else runtime.from_numpy(b), r_gpu,
                        activation).get()
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
