"""The sparse kernels' tiling (gdnflow.sparse.tiling): shared memory and bank conflicts."""
import pytest

from gdnflow.sparse import tiling
from gdnflow.sparse.tiling import choose_tiling


@pytest.mark.parametrize("n,c,size", [(1, 64, 224), (1, 512, 14), (16, 256, 56), (1, 3, 224),
                                      (64, 512, 7), (1, 128, 112), (2, 32, 9)])
@pytest.mark.parametrize("stride,span", [(1, 3), (2, 3), (1, 5), (2, 7)])
def test_tilings_fit_shared_memory_and_avoid_bank_conflicts(n, c, size, stride, span):
    t = choose_tiling(n, c, c, size, size, stride, stride, span, span, 132)
    assert t.cc * t.in_h * t.pitch * 4 <= 48 * 1024 and t.pitch >= t.in_w
    assert t.tw in (8, 16, 32) and t.rows in (1, 2, 4, 8) and t.cpw in (1, 2, 4)
    if stride == 1:
        assert tiling._bank_conflicts(t.tw, t.rows, 1, 1, t.pitch) == 1
