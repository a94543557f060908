"""Shared cases of the sparse convolution tests (tests/sparse/): layer shapes, pruned weights."""
import numpy as np

from gdnflow.ops.conv import normalize_padding
from gdnflow.sparse.csr import to_csr
from gdnflow.sparse.geometry import sparse_geometry

# name -> (x shape, w shape, keyword arguments of the call, dilation); odd sizes throughout.
CASES = {
    "s1_p1": ((2, 5, 9, 11), (7, 5, 3, 3), dict(padding=1), 1),
    "s1_p0": ((1, 4, 8, 7), (6, 4, 3, 3), dict(padding=0), 1),
    "s2_p1_odd": ((2, 3, 9, 7), (5, 3, 3, 3), dict(stride=2, padding=1), 1),
    "s2_p0": ((1, 4, 10, 9), (3, 4, 3, 3), dict(stride=2, padding=0), 1),
    "asymmetric": ((2, 3, 8, 9), (4, 3, 3, 3), dict(padding=(0, 2, 1, 0)), 1),
    "s2_asymmetric": ((1, 3, 8, 9), (4, 3, 3, 3), dict(stride=2, padding=(1, 0, 0, 1)), 1),
    "rect_stride_5x5": ((1, 2, 11, 10), (3, 2, 5, 5), dict(stride=(2, 1), padding=2), 1),
    "dilation2": ((1, 3, 9, 10), (4, 3, 3, 3), dict(padding=2), 2),
    "1x1_s2": ((2, 6, 7, 7), (3, 6, 1, 1), dict(stride=2), 1),
    "padding_past_kernel": ((1, 2, 5, 6), (3, 2, 3, 3), dict(padding=3), 1),
}
SPARSITIES = (0.5, 0.9, 0.98)


def padded_size_of(x_shape, padding):
    """(Hp, Wp) of an input of ``x_shape`` with ``padding`` as sparse_conv2d takes it."""
    top, bottom, left, right = ((padding,) * 4 if isinstance(padding, int) else
                                (padding[0], padding[0], padding[1], padding[1])
                                if len(padding) == 2 else padding)
    return x_shape[2] + top + bottom, x_shape[3] + left + right


def pruned_weight(rng, w_shape, sparsity):
    """N(0, 1/fan_in) weights with round(sparsity * size) zeros, never all of a filter
    unless the sparsity asks for it."""
    size = int(np.prod(w_shape))
    w = rng.standard_normal(size) / np.sqrt(np.prod(w_shape[1:]))
    w[rng.choice(size, int(round(sparsity * size)), replace=False)] = 0.0
    return w.reshape(w_shape)


def case(rng, name, sparsity):
    """(x, dense pruned w, its CSR, the call's keyword arguments, dilation) of CASES[name]."""
    x_shape, w_shape, kwargs, dilation = CASES[name]
    w = pruned_weight(rng, w_shape, sparsity)
    csr = to_csr(w, padded_size_of(x_shape, kwargs.get("padding", 0)), dilation)
    return rng.standard_normal(x_shape), w, csr, kwargs, dilation


def geometry_of(x_shape, csr, kwargs):
    """The ConvGeometry of a call of sparse_conv2d with the keyword arguments ``kwargs``."""
    stride = kwargs.get("stride", 1)
    stride = (stride, stride) if isinstance(stride, int) else stride
    return sparse_geometry("t", x_shape, csr, stride,
                           normalize_padding("t", kwargs.get("padding", 0)))
