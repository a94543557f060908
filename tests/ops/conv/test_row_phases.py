"""The NumPy convolution on row-flattened stride phases (gdnflow.ops.conv.row_phases):
forward and backward-data against sums written tap by tap on the padded arrays, with
blocks down to one position, and NumpyConv taking that path for large layers."""
import numpy as np
import pytest

from gdnflow.ops.conv.geometry import conv_geometry
from gdnflow.ops.conv.reference import NumpyConv
from gdnflow.ops.conv.row_phases import backward_data_rows, forward_rows


def tap_sum_forward(g, x, w):
    """y[n, o, p, q] = sum_{c,i,j} w[o, c, i, j] * padded[n, c, p*sh + i*dh, q*sw + j*dw]."""
    (sh, sw), (dh, dw) = g.stride, g.dilation
    top, bottom, left, right = g.padding
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    y = np.zeros(g.y_shape, np.float64)
    for i in range(g.kh):
        for j in range(g.kw):
            window = padded[:, :, i * dh:i * dh + sh * (g.oh - 1) + 1:sh,
                            j * dw:j * dw + sw * (g.ow - 1) + 1:sw]
            y += np.tensordot(w[:, :, i, j], window, axes=(1, 1)).transpose(1, 0, 2, 3)
    return y


def tap_scatter_backward_data(g, gy, w):
    """gx: each gy[n, o, p, q] * w[o, c, i, j] added at padded (p*sh + i*dh, q*sw + j*dw),
    then the padding cut off."""
    (sh, sw), (dh, dw) = g.stride, g.dilation
    top, bottom, left, right = g.padding
    gx = np.zeros((g.n, g.c_in, g.h + top + bottom, g.w + left + right), np.float64)
    for i in range(g.kh):
        for j in range(g.kw):
            gx[:, :, i * dh:i * dh + sh * (g.oh - 1) + 1:sh,
               j * dw:j * dw + sw * (g.ow - 1) + 1:sw] += np.tensordot(
                   w[:, :, i, j], gy, axes=(0, 1)).transpose(1, 0, 2, 3)
    return gx[:, :, top:top + g.h, left:left + g.w]


GEOMETRIES = {
    # (x shape, w shape, stride, padding (top, bottom, left, right), dilation)
    "codec 5x5 stride 2": ((1, 4, 13, 11), (3, 4, 5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),
    "3x3 stride 1, batch 2": ((2, 3, 7, 9), (5, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "mixed strides, dilation, uneven padding": ((1, 2, 12, 10), (3, 2, 3, 4), (3, 1), (0, 2, 3, 1),
                                                (1, 2)),
    "dilation sharing residues with the stride": ((1, 2, 15, 15), (2, 2, 3, 3), (2, 2),
                                                  (1, 0, 0, 1), (2, 2)),
    "stride past the kernel (phases without taps)": ((1, 3, 11, 10), (2, 3, 2, 2), (3, 3),
                                                     (0, 0, 0, 0), (1, 1)),
}


def _case(name, rng, dtype=np.float64):
    x_shape, w_shape, stride, padding, dilation = GEOMETRIES[name]
    g = conv_geometry("conv2d", x_shape, w_shape, stride, padding, dilation, 1)
    return (g, rng.standard_normal(g.x_shape).astype(dtype),
            rng.standard_normal(g.w_shape).astype(dtype),
            rng.standard_normal(g.y_shape).astype(dtype))


@pytest.mark.parametrize("block_elements", [1, 37, 1 << 22])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_forward_rows_matches_tap_sums(name, block_elements, rng):
    g, x, w, _ = _case(name, rng)
    y = forward_rows(g, x, w, block_elements)
    assert y.shape == g.y_shape and y.flags.c_contiguous
    np.testing.assert_allclose(y, tap_sum_forward(g, x, w), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("block_elements", [1, 37, 1 << 22])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_backward_data_rows_matches_tap_scatter(name, block_elements, rng):
    g, _, w, gy = _case(name, rng)
    gx = backward_data_rows(g, gy, w, block_elements)
    assert gx.shape == g.x_shape and gx.flags.c_contiguous
    np.testing.assert_allclose(gx, tap_scatter_backward_data(g, gy, w), rtol=1e-12, atol=1e-12)


def test_large_layers_take_row_phases_and_stay_float32(rng):
    # 16 channels each side, 5x5 stride 2, 208x208 outputs: more than one block of columns.
    g = conv_geometry("conv2d", (1, 16, 416, 416), (16, 16, 5, 5), (2, 2), (2, 2, 2, 2),
                      (1, 1), 1)
    assert NumpyConv.blocks_pay(g)
    assert not NumpyConv.blocks_pay(conv_geometry("conv2d", (1, 3, 416, 416), (16, 3, 5, 5),
                                                  (2, 2), (2, 2, 2, 2), (1, 1), 1))
    x = rng.standard_normal(g.x_shape).astype(np.float32)
    w = (rng.standard_normal(g.w_shape) / 20).astype(np.float32)
    gy = rng.standard_normal(g.y_shape).astype(np.float32)
    y, gx = NumpyConv.forward(g, x, w), NumpyConv.backward_data(g, gy, w)
    assert y.dtype == gx.dtype == np.float32
    want_y, want_gx = tap_sum_forward(g, x, w), tap_scatter_backward_data(g, gy, w)
    assert np.abs(y - want_y).max() <= 1e-5 * np.abs(want_y).max()
    assert np.abs(gx - want_gx).max() <= 1e-5 * np.abs(want_gx).max()
