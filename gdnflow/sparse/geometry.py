"""The geometry of a sparse convolution: the dense convolution's, from a CSR filter.

x [N, C_in, H, W] convolved with a :class:`~gdnflow.sparse.csr.CSRWeight` of
shape [C_out, C_in, kh, kw] (dilation part of the CSR, groups 1) gives y
[N, C_out, OH, OW] with OH, OW as for :func:`gdnflow.ops.conv2d`.
"""
from gdnflow.errors import ShapeError
from gdnflow.ops.conv import conv_geometry


def sparse_geometry(op, x_shape, weight, stride, padding):
    """The :class:`~gdnflow.ops.conv.ConvGeometry` of x convolved with the CSR ``weight``.

    ``stride`` is (sh, sw) and ``padding`` (top, bottom, left, right), as
    :func:`~gdnflow.ops.conv.conv_parameters` returns them. Raises ShapeError
    (naming ``op``) unless x is [N, C_in, H, W] with the filter's C_in.
    """
    if len(x_shape) != 4:
        raise ShapeError(f"{op}: expected x [N, C_in, H, W], got shape {tuple(x_shape)}")
    if x_shape[1] != weight.shape[1]:
        raise ShapeError(f"{op}: x has {x_shape[1]} channels, the filter expects "
                         f"{weight.shape[1]} (filter shape {weight.shape})")
    return conv_geometry(op, tuple(x_shape), weight.shape, stride, padding, weight.dilation, 1)


def padded_size(g):
    """(Hp, Wp): the input's size with its padding, for geometry ``g``."""
    top, bottom, left, right = g.padding
    return g.h + top + bottom, g.w + left + right
