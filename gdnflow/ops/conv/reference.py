"""The NumPy convolution: the reference every GPU algorithm is checked against.

The three linear maps of a :class:`~gdnflow.ops.conv.geometry.ConvGeometry`
(see :mod:`gdnflow.ops.conv`), by im2col through stride tricks and batched
matrix products.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gdnflow.ops.conv.epilogue import epilogue_numpy


class NumpyConv:
    """The reference: im2col by stride tricks, then batched matrix products.

    ``columns`` views the padded input under every tap without copying
    (``sliding_window_view``); reshaping it to [N, groups, C_in/groups*kh*kw,
    OH*OW] is the one copy, and the products run through BLAS.
    """

    name = "numpy"
    fuses_bias_activation = True

    @staticmethod
    def columns(g, x):
        """x [N, C_in, H, W] -> [N, groups, C_in/groups*kh*kw, OH*OW]: the input under each tap."""
        top, bottom, left, right = g.padding
        (sh, sw), (dh, dw) = g.stride, g.dilation
        padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
        windows = sliding_window_view(padded, (dh * (g.kh - 1) + 1, dw * (g.kw - 1) + 1),
                                      axis=(2, 3))
        taps = windows[:, :, ::sh, ::sw, ::dh, ::dw]         # N, C, OH, OW, kh, kw
        taps = taps.transpose(0, 1, 4, 5, 2, 3)               # N, C, kh, kw, OH, OW
        return taps.reshape(g.n, g.groups, -1, g.oh * g.ow)

    @staticmethod
    def forward(g, x, w, bias=None, activation=0):
        """y[n, g] = W[g] @ columns[n, g], then bias and activation (codes of ACTIVATIONS)."""
        weights = w.reshape(g.groups, g.c_out // g.groups, -1)
        y = np.matmul(weights, NumpyConv.columns(g, x)).reshape(g.y_shape)
        return epilogue_numpy(y, bias, None, activation)

    @staticmethod
    def backward_data(g, gy, w):
        """gx: columns' gradient W[g]^T @ gy[n, g], scattered back tap by tap (col2im)."""
        weights = w.reshape(g.groups, g.c_out // g.groups, -1)
        gy = gy.reshape(g.n, g.groups, -1, g.oh * g.ow)
        gcols = np.matmul(weights.transpose(0, 2, 1), gy).reshape(
            g.n, g.c_in, g.kh, g.kw, g.oh, g.ow)
        top, bottom, left, right = g.padding
        (sh, sw), (dh, dw) = g.stride, g.dilation
        gx = np.zeros((g.n, g.c_in, g.h + top + bottom, g.w + left + right), gcols.dtype)
        for i in range(g.kh):
            for j in range(g.kw):
                gx[:, :, i * dh:i * dh + sh * (g.oh - 1) + 1:sh,
                   j * dw:j * dw + sw * (g.ow - 1) + 1:sw] += gcols[:, :, i, j]
        return np.ascontiguousarray(gx[:, :, top:top + g.h, left:left + g.w])

    @staticmethod
    def backward_weight(g, x, gy):
        """gw[g] = sum_n gy[n, g] @ columns[n, g]^T."""
        gy = gy.reshape(g.n, g.groups, -1, g.oh * g.ow)
        cols = NumpyConv.columns(g, x)
        return np.einsum("ngop,ngkp->gok", gy, cols, optimize=True).reshape(g.w_shape)
