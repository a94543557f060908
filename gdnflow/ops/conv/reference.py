"""The NumPy convolution: the reference every GPU algorithm is checked against.

The three linear maps of a :class:`~gdnflow.ops.conv.geometry.ConvGeometry`
(see :mod:`gdnflow.ops.conv`), as matrix products through NumPy's BLAS.
The forward: a 1x1 layer's input already is the matrix of the product;
any other ungrouped layer is one product with the column matrix built on
the input's row-flattened stride phases (:mod:`gdnflow.ops.conv.row_phases`:
contiguous copies, no strided gather, in blocks); grouped ones
(depthwise) and the gradients use im2col by stride tricks.
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided

from gdnflow.ops.conv.epilogue import epilogue_numpy
from gdnflow.ops.conv.row_phases import backward_data_rows, forward_rows

#: Channels each side needs for the row-phase path (see NumpyConv.blocks_pay).
MIN_ROW_CHANNELS = 16
#: Column-matrix elements past which the row-phase path pays (16 MB of float32).
MIN_ROW_COLUMN_ELEMENTS = 1 << 22
#: Column elements per block of groups in a grouped (depthwise) forward: 512 KB of
#: float32, copied and multiplied while in cache (10-30% faster than the whole
#: column matrix at once on MobileNetV2's depthwise layers, one thread).
GROUP_BLOCK_ELEMENTS = 1 << 17


def padded_input(g, x):
    """x [N, C_in, H, W] with ``g.padding`` zeros around H and W (x itself if there are none)."""
    top, bottom, left, right = g.padding
    if not (top or bottom or left or right):
        return x
    padded = np.zeros((g.n, g.c_in, g.h + top + bottom, g.w + left + right), x.dtype)
    padded[:, :, top:top + g.h, left:left + g.w] = x
    return padded


class NumpyConv:
    """The reference: matrix products through BLAS on im2col or on row phases.

    ``taps`` views the padded input under every tap without copying
    (``as_strided``); reshaping it to [N, groups, C_in/groups*kh*kw,
    OH*OW] (``columns``) is the one copy, which the forward of a 1x1 layer
    skips. Large ungrouped layers (:meth:`blocks_pay`) build their columns on
    row phases instead (:mod:`gdnflow.ops.conv.row_phases`).
    """

    name = "numpy"
    fuses_bias_activation = True

    @staticmethod
    def taps(g, x):
        """[N, C_in, kh, kw, OH, OW], a view of the padded input: the input under each tap."""
        (sh, sw), (dh, dw) = g.stride, g.dilation
        padded = padded_input(g, x)
        batch, channel, row, column = padded.strides
        # taps[n, c, i, j, p, q] = padded[n, c, p*sh + i*dh, q*sw + j*dw]
        return as_strided(padded, (g.n, g.c_in, g.kh, g.kw, g.oh, g.ow),
                          (batch, channel, dh * row, dw * column, sh * row, sw * column),
                          writeable=False)

    @staticmethod
    def columns(g, x):
        """x [N, C_in, H, W] -> [N, groups, C_in/groups*kh*kw, OH*OW]: the input under each tap."""
        return NumpyConv.taps(g, x).reshape(g.n, g.groups, -1, g.oh * g.ow)

    @staticmethod
    def grouped_forward(g, x, w):
        """y[n, g] = W[g] @ columns[n, g], a few groups at a time: each block's columns
        (about GROUP_BLOCK_ELEMENTS) are copied while still in cache, then multiplied."""
        taps = NumpyConv.taps(g, x)
        per_group = g.c_in // g.groups
        weights = w.reshape(g.groups, g.c_out // g.groups, -1)
        step = max(1, GROUP_BLOCK_ELEMENTS // (weights.shape[2] * g.oh * g.ow))
        if step >= g.groups:        # one block: one product, no loop (small layers)
            return np.matmul(weights, taps.reshape(g.n, g.groups, -1, g.oh * g.ow))
        y = np.empty((g.n, g.groups, g.c_out // g.groups, g.oh * g.ow), x.dtype)
        for first in range(0, g.groups, step):
            columns = taps[:, first * per_group:(first + step) * per_group].reshape(
                g.n, -1, weights.shape[2], g.oh * g.ow)
            np.matmul(weights[first:first + step], columns, out=y[:, first:first + step])
        return y

    @staticmethod
    def forward(g, x, w, bias=None, activation=0):
        """y = conv(x, w), then bias and activation (codes of ACTIVATIONS)."""
        if g.is_pointwise and g.groups == 1:
            # 1x1: the input [C_in, H*W] of each image is already the column matrix.
            y = np.matmul(w.reshape(g.c_out, g.c_in), x.reshape(g.n, g.c_in, g.h * g.w))
        elif NumpyConv.blocks_pay(g):
            y = forward_rows(g, x, w)
        else:
            y = NumpyConv.grouped_forward(g, x, w)
        return epilogue_numpy(y.reshape(g.y_shape), bias, None, activation, in_place=True)

    @staticmethod
    def blocks_pay(g):
        """Whether to work on row phases: an ungrouped layer whose column matrix has more
        than MIN_ROW_COLUMN_ELEMENTS, with at least MIN_ROW_CHANNELS channels on each side.

        Below that size the Python work per block is not repaid; with a few channels
        (an RGB side) im2col's gather is cheap and the per-phase products of the
        adjoint would have a few rows only (measured on the codec's layers: 1.5x to 7x
        slower there, 1.3x to 3x faster on its 128-channel layers).
        """
        return (g.groups == 1 and min(g.c_in, g.c_out) >= MIN_ROW_CHANNELS
                and g.c_in * g.kh * g.kw * g.oh * g.ow > MIN_ROW_COLUMN_ELEMENTS)

    @staticmethod
    def backward_data(g, gy, w):
        """gx, the adjoint of the forward in x: on row phases (:func:`backward_data_rows`)
        for an ungrouped layer with a large column matrix, else im2col's (below)."""
        if not g.is_pointwise and NumpyConv.blocks_pay(g):
            return backward_data_rows(g, gy, w)
        return NumpyConv.backward_data_columns(g, gy, w)

    @staticmethod
    def backward_data_columns(g, gy, w):
        """gx: columns' gradient W[g]^T @ gy[n, g], added back tap by tap (col2im).

        Tap (i, j) read the padded input's rows ``i*dh + sh*p`` (columns
        likewise): rows of one residue modulo the stride. Each residue class
        (a phase of the padded input) is accumulated as a contiguous array
        and interleaved into gx once at the end: the same sums as adding
        every tap into strided views of gx, with contiguous additions.
        """
        (sh, sw), (dh, dw) = g.stride, g.dilation
        top, bottom, left, right = g.padding
        height, width = g.h + top + bottom, g.w + left + right
        weights = w.reshape(g.groups, g.c_out // g.groups, -1)
        gy = gy.reshape(g.n, g.groups, -1, g.oh * g.ow)
        gcols = np.matmul(weights.transpose(0, 2, 1), gy).reshape(
            g.n, g.c_in, g.kh, g.kw, g.oh, g.ow)
        phases = {}     # (row residue, column residue) -> that phase of the padded gx
        for i in range(g.kh):
            row, first_row = (i * dh) % sh, (i * dh) // sh
            for j in range(g.kw):
                column, first_column = (j * dw) % sw, (j * dw) // sw
                if (row, column) not in phases:
                    phases[row, column] = np.zeros(
                        (g.n, g.c_in, -(-(height - row) // sh), -(-(width - column) // sw)),
                        gcols.dtype)
                phases[row, column][:, :, first_row:first_row + g.oh,
                                    first_column:first_column + g.ow] += gcols[:, :, i, j]
        gx = np.zeros((g.n, g.c_in, height, width), gcols.dtype)
        for (row, column), phase in phases.items():
            gx[:, :, row::sh, column::sw] = phase
        return np.ascontiguousarray(gx[:, :, top:top + g.h, left:left + g.w])

    @staticmethod
    def backward_weight(g, x, gy):
        """gw[g] = sum_n gy[n, g] @ columns[n, g]^T."""
        gy = gy.reshape(g.n, g.groups, -1, g.oh * g.ow)
        cols = NumpyConv.columns(g, x)
        return np.einsum("ngop,ngkp->gok", gy, cols, optimize=True).reshape(g.w_shape)
