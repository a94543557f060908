"""A convolution's index arithmetic: parameters, shapes, output size, and their checks.

Shapes and formula (cross-correlation, as in every framework)::

    x [N, C_in, H, W],  w [C_out, C_in/groups, kh, kw],  b [C_out]
    y[n, o, p, q] = b[o] + sum_{c, i, j} w[o, c, i, j]
                    * x[n, g*C_in/groups + c, p*sh - top + i*dh, q*sw - left + j*dw]

with g = o // (C_out/groups) and zero outside the input. Output size::

    OH = floor((H + top + bottom - dh*(kh - 1) - 1) / sh) + 1
    OW = floor((W + left + right - dw*(kw - 1) - 1) / sw) + 1

A transposed convolution is the adjoint of the convolution whose input has
its output's shape (:func:`conv_transpose_geometry`).
"""
import dataclasses
import functools

import numpy as np

from gdnflow.errors import ShapeError

#: Fused activations: name -> the code conv2d.cu and depthwise.cu switch on.
ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "relu6": 2}

#: The three linear maps every algorithm provides (see :mod:`gdnflow.ops.conv`).
STAGES = ("forward", "backward_data", "backward_weight")

#: Bytes per float32 element: workspace bounds and pointer alignment are in bytes.
FLOAT_BYTES = 4


def int_tuple(op, name, value, count, minimum):
    """``value`` (an int or a sequence of ``count`` ints) as a tuple of ``count`` ints."""
    values = (value,) * count if isinstance(value, (int, np.integer)) else tuple(value)
    if len(values) != count or not all(isinstance(v, (int, np.integer)) for v in values):
        raise ValueError(f"{op}: {name} must be an int or {count} ints, got {value!r}")
    if any(v < minimum for v in values):
        raise ValueError(f"{op}: {name} must be at least {minimum}, got {value!r}")
    return tuple(int(v) for v in values)


def normalize_padding(op, padding):
    """Padding as (top, bottom, left, right) from an int, a pair (ph, pw) or four values.

    Four values are what ONNX and Keras "same" padding need for even kernels
    or strides (more after than before).
    """
    if isinstance(padding, (int, np.integer)):
        return int_tuple(op, "padding", padding, 4, 0)
    padding = tuple(padding)
    if len(padding) == 2:
        ph, pw = int_tuple(op, "padding", padding, 2, 0)
        return ph, ph, pw, pw
    if len(padding) == 4:
        return int_tuple(op, "padding", padding, 4, 0)
    raise ValueError(f"{op}: padding must be an int, a pair (ph, pw) or four values "
                     f"(top, bottom, left, right), got {padding!r}")


def conv_parameters(op, stride, padding, dilation, groups):
    """(stride pair, padding quadruple, dilation pair, groups), validated.

    Cached: a network calls its convolutions with the same few settings, and
    normalising them afresh is a visible part of a call's host time.
    """
    # Lists (as ONNX attributes come) are looked up as tuples.
    stride, padding, dilation = (tuple(v) if isinstance(v, list) else v
                                 for v in (stride, padding, dilation))
    try:
        return _conv_parameters_cached(op, stride, padding, dilation, groups)
    except TypeError:           # unhashable otherwise: normalise without the cache
        return _conv_parameters(op, stride, padding, dilation, groups)


def _conv_parameters(op, stride, padding, dilation, groups):
    return (int_tuple(op, "stride", stride, 2, 1), normalize_padding(op, padding),
            int_tuple(op, "dilation", dilation, 2, 1), int_tuple(op, "groups", groups, 1, 1)[0])


_conv_parameters_cached = functools.lru_cache(maxsize=256)(_conv_parameters)


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """Everything that fixes a convolution's index arithmetic (hashable: a cache key).

    ``n, c_in, h, w``: the input [N, C_in, H, W]; ``c_out, kh, kw``: the
    weight [C_out, C_in/groups, kh, kw]; ``stride`` (sh, sw), ``padding``
    (top, bottom, left, right), ``dilation`` (dh, dw), ``groups``.
    """

    n: int
    c_in: int
    h: int
    w: int
    c_out: int
    kh: int
    kw: int
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int

    @property
    def oh(self):
        """Output height: floor((H + top + bottom - dh*(kh-1) - 1) / sh) + 1."""
        top, bottom = self.padding[:2]
        return (self.h + top + bottom - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def ow(self):
        """Output width: floor((W + left + right - dw*(kw-1) - 1) / sw) + 1."""
        left, right = self.padding[2:]
        return (self.w + left + right - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1

    @property
    def x_shape(self):
        """[N, C_in, H, W]."""
        return (self.n, self.c_in, self.h, self.w)

    @property
    def w_shape(self):
        """[C_out, C_in/groups, kh, kw]."""
        return (self.c_out, self.c_in // self.groups, self.kh, self.kw)

    @property
    def y_shape(self):
        """[N, C_out, OH, OW]."""
        return (self.n, self.c_out, self.oh, self.ow)

    @property
    def is_pointwise(self):
        """1x1, stride 1, no padding: the convolution is a matrix product per image."""
        return (self.kh == self.kw == 1 and self.stride == (1, 1)
                and self.padding == (0, 0, 0, 0))

    @property
    def is_depthwise(self):
        """One filter per channel: groups == C_in == C_out."""
        return self.groups == self.c_in == self.c_out

    @property
    def window_defines(self):
        """The kernel window as compile-time defines (-D): KH, KW (taps), SH, SW (strides),
        DH, DW (dilations), as depthwise.cu and grouped.cu take them."""
        return (("KH", self.kh), ("KW", self.kw), ("SH", self.stride[0]),
                ("SW", self.stride[1]), ("DH", self.dilation[0]), ("DW", self.dilation[1]))


@functools.lru_cache(maxsize=1024)
def conv_geometry(op, x_shape, w_shape, stride, padding, dilation, groups):
    """Validate a convolution's shapes and return its :class:`ConvGeometry`.

    ``x_shape`` is [N, C_in, H, W] and ``w_shape`` [C_out, C_in/groups, kh, kw]
    (conv_transpose2d passes its output as x and its weight as is). Raises
    ShapeError naming ``op``, what was expected and what came.
    """
    if len(x_shape) != 4:
        raise ShapeError(f"{op}: input must be 4-D [N, C, H, W], got shape {x_shape}")
    if len(w_shape) != 4:
        raise ShapeError(f"{op}: weight must be 4-D, got shape {w_shape}")
    n, c_in, h, w = x_shape
    c_out, c_per_group, kh, kw = w_shape
    if c_in % groups:
        raise ShapeError(f"{op}: groups={groups} does not divide the {c_in} input channels")
    if c_out % groups:
        raise ShapeError(f"{op}: groups={groups} does not divide the {c_out} output channels")
    if c_per_group * groups != c_in:
        raise ShapeError(f"{op}: input has C_in={c_in} channels but the weight {w_shape} with "
                         f"groups={groups} expects w.shape[1]*groups = {c_per_group * groups}")
    top, bottom, left, right = padding
    extent = (dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1)
    padded = (h + top + bottom, w + left + right)
    if extent[0] > padded[0] or extent[1] > padded[1]:
        raise ShapeError(f"{op}: kernel extent {extent[0]}x{extent[1]} (kernel {kh}x{kw}, "
                         f"dilation {dilation}) is larger than the padded input "
                         f"{padded[0]}x{padded[1]} (input {h}x{w}, padding {padding})")
    return ConvGeometry(n, c_in, h, w, c_out, kh, kw, stride, padding, dilation, groups)



def conv_transpose_geometry(op, x_shape, w_shape, stride, padding, output_padding, dilation,
                            groups):
    """Validate a transposed convolution's shapes; return the :class:`ConvGeometry` of the
    convolution it is the adjoint of.

    ``x_shape`` is [N, C_in, H, W] and ``w_shape`` [C_in, C_out/groups, kh, kw]; the output
    is [N, C_out, OH, OW] with ``OH = (H - 1)*sh - top - bottom + dh*(kh - 1) +
    output_padding_h + 1`` (OW likewise). The geometry returned has that output as its input
    (so its ``c_in`` is C_out) and x's size as its output size. Raises ShapeError naming ``op``.
    """
    if len(x_shape) != 4:
        raise ShapeError(f"{op}: input must be 4-D [N, C, H, W], got shape {x_shape}")
    if len(w_shape) != 4:
        raise ShapeError(f"{op}: weight must be 4-D [C_in, C_out/groups, kh, kw], "
                         f"got shape {w_shape}")
    n, c_in, h, width = x_shape
    if c_in % groups:
        raise ShapeError(f"{op}: groups={groups} does not divide the {c_in} input channels")
    if w_shape[0] != c_in:
        raise ShapeError(f"{op}: input has C_in={c_in} channels but the weight "
                         f"{w_shape} expects w.shape[0] = {w_shape[0]}")
    top, bottom, left, right = padding
    (sh, sw), (dh, dw), (oph, opw) = stride, dilation, output_padding
    out_h = (h - 1) * sh - top - bottom + dh * (w_shape[2] - 1) + oph + 1
    out_w = (width - 1) * sw - left - right + dw * (w_shape[3] - 1) + opw + 1
    if out_h < 1 or out_w < 1:
        raise ShapeError(f"{op}: output size {out_h}x{out_w} is not positive "
                         f"(input {h}x{width}, padding {padding})")
    c_out = w_shape[1] * groups
    # The convolution this operator is the adjoint of: input = our output.
    g = conv_geometry(op, (n, c_out, out_h, out_w), w_shape, stride, padding, dilation, groups)
    assert (g.oh, g.ow) == (h, width), "output_padding < stride makes the sizes round-trip"
    return g
