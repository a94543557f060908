"""The broadcast layout handed to the CUDA kernels, checked in Python:
offsets computed the way the kernel computes them must address the element
NumPy's broadcasting picks."""
import numpy as np
import pytest

from gdnflow.errors import ShapeError
from gdnflow.ops.broadcast import broadcast_shape, kernel_layout, reduced_axes

CASES = [((3, 5, 17, 19), (5, 1, 1)), ((3, 5, 17, 19), ()), ((7, 1), (1, 9)),
         ((2, 3, 4, 5, 6), (3, 1, 5, 1)), ((2, 1, 4, 1, 6, 1), (1, 3, 1, 5, 1, 7)),
         ((4, 5), (4, 5)), ((1,), (1,))]


def kernel_offsets(index, dims, strides):
    """What broadcast_offsets in elementwise.cu computes for one flat index."""
    offset = 0
    for d, s in zip(reversed(dims), reversed(strides[1:])):
        if d > 1:
            offset += (index % d) * s
            index //= d
    return offset + index * strides[0]


@pytest.mark.parametrize("a_shape,b_shape", CASES, ids=str)
def test_layout_addresses_the_broadcast_element(a_shape, b_shape):
    out_shape = broadcast_shape("test", a_shape, b_shape)
    dims, strides = kernel_layout(out_shape, a_shape, b_shape)
    assert len(dims) == 5 and all(len(s) == 6 for s in strides)
    for shape, st in zip((a_shape, b_shape), strides):
        ids = np.arange(int(np.prod(shape))).reshape(shape)
        want = np.broadcast_to(ids, out_shape).ravel()
        got = [kernel_offsets(i, dims, st) for i in range(want.size)]
        np.testing.assert_array_equal(got, want)


def test_per_channel_layout_merges_to_three_dimensions():
    dims, _ = kernel_layout((8, 16, 32, 32), (8, 16, 32, 32), (16, 1, 1))
    assert dims == (1, 1, 8, 16, 1024)


def test_too_many_alternations_are_refused():
    with pytest.raises(NotImplementedError, match="index dimensions"):
        kernel_layout((2,) * 8, (2, 1) * 4)


def test_broadcast_shape_and_reduced_axes():
    assert broadcast_shape("x", (3, 1, 5), (4, 1)) == (3, 4, 5)
    assert reduced_axes((2, 3, 4, 5), (3, 1, 1)) == (0, 2, 3)
    with pytest.raises(ShapeError, match=r"x: shapes \(2,\) and \(3,\)"):
        broadcast_shape("x", (2,), (3,))
