"""2-D convolution, NCHW. CUDA kernels: ``cuda_src/conv2d.cu`` (lowering and
epilogue) and ``cuda_src/depthwise.cu``; GEMMs through
:mod:`gdnflow.backends.cuda.blas`.

Shapes and formula (cross-correlation, as in every framework)::

    x [N, C_in, H, W],  w [C_out, C_in/groups, kh, kw],  b [C_out]
    y[n, o, p, q] = b[o] + sum_{c, i, j} w[o, c, i, j]
                    * x[n, g*C_in/groups + c, p*sh - top + i*dh, q*sw - left + j*dw]

with g = o // (C_out/groups) and zero outside the input. Output size::

    OH = floor((H + top + bottom - dh*(kh - 1) - 1) / sh) + 1
    OW = floor((W + left + right - dw*(kw - 1) - 1) / sw) + 1

Three linear maps make up the operator and its gradients; every algorithm,
on both backends, provides all three for a :class:`ConvGeometry`:

``forward(g, x, w)``            x -> y
``backward_data(g, gy, w)``     gy -> gx, the adjoint of forward in x
``backward_weight(g, x, gy)``   (x, gy) -> gw

``conv_transpose2d`` (:mod:`gdnflow.ops.conv_transpose`) is the same three
maps in another order. On the GPU :class:`ConvPlanner` picks, per geometry
and stage, between im2col + SGEMM (:class:`Im2colGemm`, any convolution), one
GEMM per image for 1x1 convolutions (:class:`Pointwise`), a direct kernel for
memory-bound 1x1 convolutions (:class:`gdnflow.ops.pointwise.PointwiseDirect`,
forward and backward-data) and after im2col for memory-bound products such as
the RGB first layers (:class:`gdnflow.ops.pointwise.Im2colDirect`, forward),
the direct depthwise kernels
(:class:`gdnflow.ops.depthwise.Depthwise`), Winograd F(4x4, 3x3) /
F(2x2, 3x3) for 3x3 stride-1 convolutions
(:mod:`gdnflow.ops.winograd`, forward and backward-data), and strided
convolutions rewritten as stride-1 ones on the sub-pixel grid
(:mod:`gdnflow.ops.subpixel`, forward and backward-data: 5x5 / 2 becomes
3x3 / 1, so Winograd).

An algorithm is a class with ``name``, ``supports(g)``, the three maps and
``fuses_bias_activation`` (its forward takes ``bias`` and ``activation``);
optionally ``stages`` (the maps it offers the planner, default all three),
``preferred(g)`` (whether the heuristic takes it for a geometry it supports,
default yes), ``fuses_residual`` (its forward also takes ``residual``) and
``backward_data_fuses_bias`` (its backward_data takes ``bias``, for
conv_transpose2d).
"""
import dataclasses
import functools
import os

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gdnflow.autograd import Operator, grad_enabled
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.registry import register

SOURCE = "conv2d.cu"
FLOAT = 4                       # bytes per float32: pointer offsets are in bytes

#: Fused activations: name -> the code conv2d.cu and depthwise.cu switch on.
ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "relu6": 2}

#: Bytes of column matrix (im2col output) one GEMM may use. A VGG16 layer at
#: 224² needs 115 MB per image, so the batch is lowered in chunks of images:
#: large enough that each GEMM keeps the GPU busy, small enough not to matter
#: next to the activations.
WORKSPACE_BYTES = 256 << 20

#: The three linear maps every algorithm provides (see the module docstring).
STAGES = ("forward", "backward_data", "backward_weight")


# ---------------------------------------------------------------- geometry --
def _ints(op, name, value, count, minimum):
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
        return _ints(op, "padding", padding, 4, 0)
    padding = tuple(padding)
    if len(padding) == 2:
        ph, pw = _ints(op, "padding", padding, 2, 0)
        return ph, ph, pw, pw
    if len(padding) == 4:
        return _ints(op, "padding", padding, 4, 0)
    raise ValueError(f"{op}: padding must be an int, a pair (ph, pw) or four values "
                     f"(top, bottom, left, right), got {padding!r}")


def conv_parameters(op, stride, padding, dilation, groups):
    """(stride pair, padding quadruple, dilation pair, groups), validated.

    Cached: a network calls its convolutions with the same few settings, and
    normalising them afresh cost about 5 µs of a ~15 µs call budget.
    """
    try:
        return _conv_parameters_cached(op, stride, padding, dilation, groups)
    except TypeError:           # unhashable (lists): normalise without the cache
        return _conv_parameters(op, stride, padding, dilation, groups)


def _conv_parameters(op, stride, padding, dilation, groups):
    return (_ints(op, "stride", stride, 2, 1), normalize_padding(op, padding),
            _ints(op, "dilation", dilation, 2, 1), _ints(op, "groups", groups, 1, 1)[0])


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


# ----------------------------------------------------------- NumPy backend --
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


def epilogue_numpy(y, bias, residual, activation):
    """act(y + bias[c] + residual); None skips a term, activation 0 is the identity."""
    if bias is not None:
        y = y + bias.reshape(1, -1, 1, 1)
    if residual is not None:
        y = y + residual
    if activation == 1:
        y = np.maximum(y, 0)
    elif activation == 2:
        y = np.clip(y, 0, 6)
    return y


def activation_grad_numpy(gy, y, activation):
    """gy where the activation passed its input (read from its output y), else 0."""
    passed = (y > 0) if activation == 1 else (y > 0) & (y < 6)
    return np.where(passed, gy, 0).astype(gy.dtype)


# ------------------------------------------------------------ CUDA backend --
def _ptr(array, elements=0):
    """The device address ``elements`` floats into ``array``."""
    return array.ptr + FLOAT * elements


def _chunk_images(n, floats_per_image):
    """How many images to lower at once within :data:`WORKSPACE_BYTES` (at least one)."""
    chunk = max(1, min(n, WORKSPACE_BYTES // (FLOAT * max(floats_per_image, 1))))
    from gdnflow.backends.cuda.kernels import check_index_range
    check_index_range(chunk * floats_per_image, "conv2d workspace")
    return chunk


def _im2col(g, x_ptr, cols, nb, row_stride, image_stride):
    """cols <- the column matrices of ``nb`` images starting at ``x_ptr`` (see conv2d.cu)."""
    kernel = cuda.kernel(SOURCE, "im2col", "PP" + "i" * 14, (("KH", g.kh), ("KW", g.kw)))
    kernel.launch(nb * g.c_in * g.oh * g.ow, x_ptr, cols.ptr, nb, g.c_in, g.h, g.w, g.oh, g.ow,
                  *g.stride, *g.dilation, g.padding[0], g.padding[2], row_stride, image_stride)


def _col2im(g, cols, x_ptr, nb, row_stride, image_stride):
    """``nb`` images of gx at ``x_ptr`` <- the adjoint of im2col applied to cols."""
    kernel = cuda.kernel(SOURCE, "col2im", "PP" + "i" * 14, (("KH", g.kh), ("KW", g.kw)))
    kernel.launch(nb * g.c_in * g.h * g.w, cols.ptr, x_ptr, nb, g.c_in, g.h, g.w, g.oh, g.ow,
                  *g.stride, *g.dilation, g.padding[0], g.padding[2], row_stride, image_stride)


def _nchw_to_cnhw(src_ptr, dst, nb, channels, pixels):
    """dst [C, nb, P] <- src [nb, C, P]."""
    cuda.kernel(SOURCE, "nchw_to_cnhw", "PPiii").launch(
        nb * channels * pixels, src_ptr, dst.ptr, nb, channels, pixels)


def epilogue_cuda(y, bias, residual, activation):
    """y <- act(y + bias[c] + residual) in one pass, in place; returns y."""
    n, c = y.shape[:2]
    cuda.kernel(SOURCE, "conv_epilogue", "PPPPiiii").launch(
        y.size, y.ptr, 0 if bias is None else bias.ptr, 0 if residual is None else residual.ptr,
        y.ptr, y.size, c, y.size // max(n * c, 1), activation)
    return y


def activation_grad_cuda(gy, y, activation):
    """As :func:`activation_grad_numpy`, one kernel."""
    gz = cuda.empty(gy.shape, gy.dtype)
    cuda.kernel(SOURCE, "conv_activation_backward", "PPPii").launch(
        gy.size, gy.ptr, y.ptr, gz.ptr, gy.size, activation)
    return gz


def _zeros_cuda(shape):
    from gdnflow.backends.cuda.runtime import get_runtime
    return get_runtime().full(shape, 0.0, np.float32)


def gemm_backward_weight(g, x, gy, lower):
    """gw[grp] = sum_n gy[n, grp] @ cols[n, grp]^T as one GEMM per chunk of images.

    ``lower(x_ptr, cols, nb)`` writes the chunk's column matrix with the
    images side by side ([C_in*kh*kw, nb*OH*OW]); the chunk's gy is brought
    to the same layout ([C_out, nb*OH*OW], a transpose unless nb == 1), so
    the GEMM's inner dimension runs over all pixels of all images of the
    chunk and accumulates (beta = 1) over chunks. Groups are the GEMM's batch.
    """
    from gdnflow.backends.cuda import blas
    if g.n == 0:
        return _zeros_cuda(g.w_shape)
    gw = cuda.empty(g.w_shape)
    ohw, k_rows = g.oh * g.ow, g.c_in * g.kh * g.kw
    chunk = _chunk_images(g.n, (k_rows + g.c_out) * ohw)
    cols = cuda.empty((chunk * k_rows * ohw,))
    gyt = cuda.empty((chunk * g.c_out * ohw,)) if chunk > 1 else None
    og, kg = g.c_out // g.groups, k_rows // g.groups
    for n0 in range(0, g.n, chunk):
        nb = min(chunk, g.n - n0)
        width = nb * ohw
        lower(_ptr(x, n0 * g.c_in * g.h * g.w), cols, nb)
        gy_ptr = _ptr(gy, n0 * g.c_out * ohw)
        if nb > 1:
            _nchw_to_cnhw(gy_ptr, gyt, nb, g.c_out, ohw)
            gy_ptr = gyt.ptr
        blas.matmul(gy_ptr, cols.ptr, gw.ptr, og, kg, width, trans_b=True,
                    beta=0.0 if n0 == 0 else 1.0, batch=g.groups,
                    stride_a=og * width, stride_b=kg * width, stride_c=og * kg)
    return gw


class Im2colGemm:
    """Any convolution: lower the input to column matrices, multiply with cuBLAS SGEMM.

    forward:          y[n, grp] = W[grp] @ cols[n, grp], strided-batched over
                      the images of a chunk (the weight's batch stride is 0),
                      one call per group;
    backward_data:    gcols[n, grp] = W[grp]^T @ gy[n, grp], then col2im;
    backward_weight:  :func:`gemm_backward_weight` with im2col as the lowering.
    """

    name = "im2col_gemm"
    fuses_bias_activation = False

    @staticmethod
    def supports(g):
        """Every geometry."""
        return True

    @staticmethod
    def forward(g, x, w, bias=None, activation=0):
        """y [N, C_out, OH, OW] from x and w (bias and activation: the caller's epilogue)."""
        from gdnflow.backends.cuda import blas
        y = cuda.empty(g.y_shape)
        ohw, k_rows = g.oh * g.ow, g.c_in * g.kh * g.kw
        per_image = k_rows * ohw
        chunk = _chunk_images(g.n, per_image)
        cols = cuda.empty((chunk * per_image,))
        og, kg = g.c_out // g.groups, k_rows // g.groups
        for n0 in range(0, g.n, chunk):
            nb = min(chunk, g.n - n0)
            _im2col(g, _ptr(x, n0 * g.c_in * g.h * g.w), cols, nb, ohw, per_image)
            for grp in range(g.groups):
                blas.matmul(_ptr(w, grp * og * kg), _ptr(cols, grp * kg * ohw),
                            _ptr(y, (n0 * g.c_out + grp * og) * ohw), og, ohw, kg,
                            batch=nb, stride_a=0, stride_b=per_image, stride_c=g.c_out * ohw)
        return y

    @staticmethod
    def backward_data(g, gy, w):
        """gx [N, C_in, H, W] from gy [N, C_out, OH, OW] and w."""
        from gdnflow.backends.cuda import blas
        gx = cuda.empty(g.x_shape)
        ohw, k_rows = g.oh * g.ow, g.c_in * g.kh * g.kw
        per_image = k_rows * ohw
        chunk = _chunk_images(g.n, per_image)
        gcols = cuda.empty((chunk * per_image,))
        og, kg = g.c_out // g.groups, k_rows // g.groups
        for n0 in range(0, g.n, chunk):
            nb = min(chunk, g.n - n0)
            for grp in range(g.groups):
                blas.matmul(_ptr(w, grp * og * kg), _ptr(gy, (n0 * g.c_out + grp * og) * ohw),
                            _ptr(gcols, grp * kg * ohw), kg, ohw, og, trans_a=True,
                            batch=nb, stride_a=0, stride_b=g.c_out * ohw, stride_c=per_image)
            _col2im(g, gcols, _ptr(gx, n0 * g.c_in * g.h * g.w), nb, ohw, per_image)
        return gx

    @staticmethod
    def backward_weight(g, x, gy):
        """gw [C_out, C_in/groups, kh, kw] from x and gy."""
        ohw = g.oh * g.ow
        return gemm_backward_weight(
            g, x, gy, lambda x_ptr, cols, nb: _im2col(g, x_ptr, cols, nb, nb * ohw, ohw))


class Pointwise:
    """1x1 convolution, stride 1, no padding: no lowering at all.

    Each image's input already is the column matrix X_n [C_in, H*W], so
    y_n = W [C_out, C_in] @ X_n is one strided-batched GEMM over the images
    (weight stride 0), per group; gx_n = W^T @ gy_n likewise; the weight
    gradient transposes x and gy to [C, N*H*W] and makes one GEMM of it.
    """

    name = "pointwise"
    fuses_bias_activation = False

    @staticmethod
    def supports(g):
        """1x1 kernels at stride 1 without padding (any groups)."""
        return g.is_pointwise

    @staticmethod
    def forward(g, x, w, bias=None, activation=0):
        """y_n[grp] = W[grp] @ x_n[grp] (bias and activation: the caller's epilogue)."""
        from gdnflow.backends.cuda import blas
        y = cuda.empty(g.y_shape)
        hw, og, cg = g.h * g.w, g.c_out // g.groups, g.c_in // g.groups
        for grp in range(g.groups):
            blas.matmul(_ptr(w, grp * og * cg), _ptr(x, grp * cg * hw), _ptr(y, grp * og * hw),
                        og, hw, cg, batch=g.n, stride_a=0, stride_b=g.c_in * hw,
                        stride_c=g.c_out * hw)
        return y

    @staticmethod
    def backward_data(g, gy, w):
        """gx_n[grp] = W[grp]^T @ gy_n[grp]."""
        from gdnflow.backends.cuda import blas
        gx = cuda.empty(g.x_shape)
        hw, og, cg = g.h * g.w, g.c_out // g.groups, g.c_in // g.groups
        for grp in range(g.groups):
            blas.matmul(_ptr(w, grp * og * cg), _ptr(gy, grp * og * hw), _ptr(gx, grp * cg * hw),
                        cg, hw, og, trans_a=True, batch=g.n, stride_a=0,
                        stride_b=g.c_out * hw, stride_c=g.c_in * hw)
        return gx

    @staticmethod
    def backward_weight(g, x, gy):
        """gw[grp] = sum_n gy_n[grp] @ x_n[grp]^T, x transposed to [C_in, N*H*W] as the columns."""
        hw = g.h * g.w

        def lower(x_ptr, cols, nb):
            _nchw_to_cnhw(x_ptr, cols, nb, g.c_in, hw)
        return gemm_backward_weight(g, x, gy, lower)


# ---------------------------------------------------------------- planner --
class ConvPlanner:
    """Chooses the CUDA algorithm for each (geometry, stage): the one place that does.

    ``stage`` is ``"forward"``, ``"backward_data"`` or ``"backward_weight"``.
    By default the choice is a heuristic: the first algorithm of
    :meth:`candidates` that supports the geometry and stage and is
    ``preferred`` for it, in the order depthwise (direct kernel), pointwise
    direct kernel (memory-bound 1x1 layers), pointwise (GEMM, no lowering),
    Winograd F(4x4) (wide 3x3 stride-1 layers; F(2x2) is
    never preferred), the sub-pixel rewrite (strided layers whose stride-1
    form would run F(4x4)), im2col + the direct kernel's product
    (memory-bound products, groups 1, forward only), im2col + GEMM. With
    ``autotune`` on (or ``GDNFLOW_CONV_AUTOTUNE=1``) every algorithm
    supporting the geometry and stage is timed once on random data with CUDA
    events and the fastest is kept. Either way the answer is cached per (geometry, stage), so it is
    decided once per shape; autotune before capturing a CUDA graph (timing
    allocates).
    """

    def __init__(self, autotune=None):
        if autotune is None:
            autotune = os.environ.get("GDNFLOW_CONV_AUTOTUNE", "") not in ("", "0")
        self.autotune = autotune
        self.cache = {}
        #: (geometry, stage) -> {algorithm name: milliseconds}, for what was measured.
        self.timings = {}

    @staticmethod
    def candidates():
        """Every algorithm class, in the heuristic's order of preference."""
        from gdnflow.ops.depthwise import Depthwise
        from gdnflow.ops.pointwise import Im2colDirect, PointwiseDirect
        from gdnflow.ops.subpixel import Subpixel
        from gdnflow.ops.winograd import WinogradF2, WinogradF4
        return (Depthwise, PointwiseDirect, Pointwise, WinogradF4, WinogradF2, Subpixel,
                Im2colDirect, Im2colGemm)

    @staticmethod
    def supported(g, stage):
        """The candidates that can run ``stage`` of ``g``, in order of preference."""
        return [a for a in ConvPlanner.candidates()
                if stage in getattr(a, "stages", STAGES) and a.supports(g)]

    def choose(self, g, stage):
        """The algorithm class to run ``stage`` of geometry ``g`` with."""
        key = (g, stage)
        algorithm = self.cache.get(key)
        if algorithm is None:
            supported = self.supported(g, stage)
            algorithm = next(a for a in supported
                             if getattr(a, "preferred", None) is None or a.preferred(g))
            if self.autotune and len(supported) > 1:
                algorithm = self.measure(g, stage, supported)
            self.cache[key] = algorithm
        return algorithm

    def measure(self, g, stage, algorithms, repeats=5):
        """Time ``stage`` of ``g`` with each algorithm; return the fastest."""
        import pycuda.driver as drv
        from gdnflow.backends.cuda.runtime import get_runtime
        runtime = get_runtime()
        rng = np.random.default_rng(0)
        x = runtime.from_numpy(rng.standard_normal(g.x_shape, dtype=np.float32))
        w = runtime.from_numpy(rng.standard_normal(g.w_shape, dtype=np.float32))
        gy = runtime.from_numpy(rng.standard_normal(g.y_shape, dtype=np.float32))
        args = {"forward": (x, w), "backward_data": (gy, w), "backward_weight": (x, gy)}[stage]
        start, end = drv.Event(), drv.Event()
        times = {}
        for algorithm in algorithms:
            run = getattr(algorithm, stage)
            run(g, *args)                       # compile and warm up
            start.record(runtime.stream)
            for _ in range(repeats):
                run(g, *args)
            end.record(runtime.stream)
            end.synchronize()
            times[algorithm.name] = end.time_since(start) / repeats
        self.timings[(g, stage)] = times
        return min(algorithms, key=lambda a: times[a.name])


#: The process's planner; ``planner.autotune = True`` to measure instead of guess.
planner = ConvPlanner()


def conv_algorithm(device, g, stage):
    """The object whose ``forward``/``backward_data``/``backward_weight`` runs ``stage``."""
    return NumpyConv if device == "numpy" else planner.choose(g, stage)


# --------------------------------------------------------------- operator --
def _arrays_to_keep(x, w, *others):
    """(keep x, keep w, recording) for the backward: x feeds gw, w feeds gx.

    Decided in ``check``, where the tensors (and so ``requires_grad``) are
    still at hand; nothing is kept when no graph is recorded.
    """
    recording = grad_enabled() and any(t.requires_grad for t in (x, w) + others)
    return recording and w.requires_grad, recording and x.requires_grad, recording


def _bias_grad(device, gy):
    """gy summed over N, H, W: [C]."""
    if device == "numpy":
        return gy.sum(axis=(0, 2, 3))
    from gdnflow.ops.reduction import sum_cuda
    return sum_cuda(gy, (0, 2, 3), 1.0).reshape((gy.shape[1],))


@register("conv2d")
class Conv2d(Operator):
    """y = act(conv(x, w) + b + residual); see the module docstring for the formula.

    Inputs: x [N, C_in, H, W], w [C_out, C_in/groups, kh, kw], then the
    optional b [C_out] and residual [N, C_out, OH, OW] in that order (the
    constructor says which are present). ``activation`` (None, "relu",
    "relu6") and the residual are applied in the same pass as the bias (one
    kernel after a GEMM; inside the depthwise kernel). The fused activation
    is differentiable: its gradient is taken from the saved output y (relu
    passes where y > 0, relu6 where 0 < y < 6), so training through a fused
    conv + bias + ReLU6 costs one more saved tensor and no extra pass.
    """

    def __init__(self, stride=1, padding=0, dilation=1, groups=1, activation=None,
                 has_bias=False, has_residual=False):
        self.stride, self.padding, self.dilation, self.groups = conv_parameters(
            "conv2d", stride, padding, dilation, groups)
        try:
            self.activation = ACTIVATIONS[activation]
        except (KeyError, TypeError):
            names = [a for a in ACTIVATIONS if a]
            raise ValueError(f"conv2d: activation must be one of {names} or None, "
                             f"got {activation!r}") from None
        self.has_bias, self.has_residual = bool(has_bias), bool(has_residual)

    def check(self, x, w, *extras):
        expected = 2 + self.has_bias + self.has_residual
        if 2 + len(extras) != expected:
            raise TypeError(f"{self.label}: expected {expected} input tensors, "
                            f"got {2 + len(extras)}")
        self.geometry = g = conv_geometry(self.label, x.shape, w.shape, self.stride,
                                          self.padding, self.dilation, self.groups)
        self.keep = _arrays_to_keep(x, w, *extras)
        if self.has_bias and extras[0].shape != (g.c_out,):
            raise ShapeError(f"{self.label}: bias must have shape ({g.c_out},) (one per output "
                             f"channel), got {extras[0].shape}")
        if self.has_residual and extras[-1].shape != g.y_shape:
            raise ShapeError(f"{self.label}: residual must have the output's shape {g.y_shape}, "
                             f"got {extras[-1].shape}")

    def _forward(self, x, w, *extras):
        g = self.geometry
        bias = extras[0] if self.has_bias else None
        residual = extras[-1] if self.has_residual else None
        algorithm = conv_algorithm(self.device, g, "forward")
        fused = algorithm.fuses_bias_activation and (
            residual is None or getattr(algorithm, "fuses_residual", False))
        if fused and residual is not None:
            y = algorithm.forward(g, x, w, bias, self.activation, residual=residual)
        else:
            y = algorithm.forward(g, x, w, bias if fused else None,
                                  self.activation if fused else 0)
        if not fused and (bias is not None or residual is not None or self.activation):
            y = self.dispatch("epilogue", y, bias, residual, self.activation)
        keep_x, keep_w, recording = self.keep
        self.saved = (x if keep_x else None, w if keep_w else None,
                      y if recording and self.activation else None)
        return y

    forward_numpy = forward_cuda = _forward

    def epilogue_numpy(self, y, bias, residual, activation):
        return epilogue_numpy(y, bias, residual, activation)

    def epilogue_cuda(self, y, bias, residual, activation):
        return epilogue_cuda(y, bias, residual, activation)

    def activation_grad_numpy(self, gy, y):
        return activation_grad_numpy(gy, y, self.activation)

    def activation_grad_cuda(self, gy, y):
        return activation_grad_cuda(gy, y, self.activation)

    def backward(self, grad_output):
        g = self.geometry
        x, w, y = self.saved
        gz = grad_output.data
        if self.activation:
            gz = self.dispatch("activation_grad", gz, y)
        need = self.needs_grad
        gx = gw = None
        if need[0]:
            gx = conv_algorithm(self.device, g, "backward_data").backward_data(g, gz, w)
        if need[1]:
            gw = conv_algorithm(self.device, g, "backward_weight").backward_weight(g, x, gz)
        grads = [gx, gw]
        if self.has_bias:
            grads.append(_bias_grad(self.device, gz) if need[2] else None)
        if self.has_residual:
            grads.append(gz if need[-1] else None)
        return tuple(None if a is None else self.wrap(a) for a in grads)


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, activation=None,
           residual=None):
    """2-D convolution (cross-correlation) of x [N, C_in, H, W] with w [C_out, C_in/groups, kh, kw].

    ``y[n, o, p, q] = act(b[o] + residual[n, o, p, q] + sum_{c,i,j} w[o, c, i, j]
    * x[n, g*C_in/groups + c, p*sh - top + i*dh, q*sw - left + j*dw])``, g the
    group of o, zeros outside the input; y is [N, C_out, OH, OW] with
    ``OH = floor((H + top + bottom - dh*(kh-1) - 1)/sh) + 1`` (OW likewise).

    ``stride``, ``dilation``: an int or (h, w). ``padding``: an int, (ph, pw)
    or (top, bottom, left, right). ``groups`` must divide C_in and C_out;
    groups == C_in == C_out is a depthwise convolution. ``b`` [C_out] and
    ``residual`` (y's shape) are optional; ``activation`` is None, "relu" or
    "relu6". The bias, residual and activation are fused into one pass after
    the convolution and remain differentiable (see :class:`Conv2d`).
    """
    inputs = [t for t in (x, w, b, residual) if t is not None]
    return Conv2d(stride, padding, dilation, groups, activation,
                  has_bias=b is not None, has_residual=residual is not None)(*inputs)
