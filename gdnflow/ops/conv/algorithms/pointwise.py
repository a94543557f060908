"""1x1 convolutions as one direct kernel (``cuda_src/pointwise.cu``): no cuBLAS, epilogue fused.

For x [N, C_in, H, W] and w [C_out, C_in, 1, 1] (stride 1, no padding,
groups 1)::

    y[n, o, p] = act(b[o] + residual[n, o, p] + sum_c w[o, c] x[n, c, p])

a matrix product whose columns are all N*H*W pixels of the batch
(:class:`~gdnflow.ops.conv.algorithms.im2col.Pointwise` runs it as one
cuBLAS GEMM per image instead). Backward-data is the same kernel with w
transposed (gx[n, c, p] = sum_o w[o, c] gy[n, o, p]); the weight gradient
stays with the GEMM path. :class:`Im2colDirect` runs the same product after
im2col. The kernel's tiling comes from
:func:`~gdnflow.ops.conv.algorithms.pointwise_tiles.choose_config`, or from
``settings.pointwise_config_chooser`` where that is set. When each path pays,
measured: docs/conv.md.
"""
from gdnflow.backends import cuda
from gdnflow.config import settings
from gdnflow.ops.conv.algorithms.im2col import Pointwise, chunk_images, im2col
from gdnflow.ops.conv.algorithms.pointwise_tiles import (choose_config, intensity,
                                                         product_intensity)

#: Columns (pixels of one image) the product copies at once (pointwise.cu's VEC_X 4),
#: where an image's plane is a multiple of this many pixels; other planes go one at a time.
VECTOR_COLUMNS = 4

SOURCE = "pointwise.cu"
cuda.declare_variants(SOURCE)   # every module is built for a tile chosen per layer

#: The heuristic prefers this kernel for layers of at most this many flop per
#: byte moved (:func:`intensity`); above it, cuBLAS's GEMM.
MAX_INTENSITY = 16.0
#: ... and for small products whatever their intensity: at most this many
#: multiply-adds, C_in and C_out at most SMALL_PRODUCT_MAX_K (the inner
#: dimension of the forward and of backward-data). There the GPU time is a
#: few µs and the call's host time decides: a launch costs less host time
#: than a cuBLAS call (the measurements: docs/conv.md).
SMALL_PRODUCT_FMAS = 32e6
SMALL_PRODUCT_MAX_K = 384


def _aligned(*arrays):
    """True if every given array's address is 16-byte aligned (None is skipped)."""
    return all(a is None or a.ptr % 16 == 0 for a in arrays)


def pointwise_product(a, x, y, m, k, n, hw, trans_a=False, bias=None, residual=None,
                      activation=0):
    """y [n, m, hw] <- act(A @ x_image + bias + residual) for every image (see pointwise.cu).

    A is ``a`` as [m, k] (``trans_a`` False) or its [k, m] transpose; x is
    [n, k, hw]. Returns y. The tiling: ``settings.pointwise_config_chooser`` if set, else
    :func:`~gdnflow.ops.conv.algorithms.pointwise_tiles.choose_config`.
    """
    columns = n * hw
    cuda.check_index_range(columns, "pointwise pixels")
    if columns == 0 or m == 0:
        return y
    vec_x = VECTOR_COLUMNS if hw % VECTOR_COLUMNS == 0 and _aligned(x, y, residual) else 1
    chooser = settings.pointwise_config_chooser or choose_config
    config = chooser(m, k, hw, columns, vec_x, cuda.sm_count())
    m_tiles = -(-m // config.bm)
    blocks = m_tiles * -(-columns // config.bn)
    kernel = cuda.kernel(SOURCE, "pointwise_conv", "PPPPP" + "i" * 6, config.defines(trans_a))
    kernel((blocks, 1, 1), (config.threads, 1, 1), a.ptr, x.ptr,
           0 if bias is None else bias.ptr, 0 if residual is None else residual.ptr, y.ptr,
           m, k, hw, columns, m_tiles, activation)
    return y


class PointwiseDirect:
    """1x1 convolution by the direct kernel: forward (epilogue fused) and backward-data.

    The weight gradient is the GEMM path's
    (:meth:`gdnflow.ops.conv.algorithms.im2col.Pointwise.backward_weight`); the planner does
    not ask this class for it.
    """

    name = "pointwise_direct"
    stages = ("forward", "backward_data")
    fuses_bias_activation = True
    fuses_residual = True

    @staticmethod
    def supports(g):
        """1x1, stride 1, no padding, groups 1."""
        return g.is_pointwise and g.groups == 1

    @staticmethod
    def preferred(g):
        """Memory-bound layers (:func:`intensity` at most :data:`MAX_INTENSITY`) and small
        products (see :data:`SMALL_PRODUCT_FMAS`)."""
        small = (g.n * g.h * g.w * g.c_in * g.c_out <= SMALL_PRODUCT_FMAS
                 and max(g.c_in, g.c_out) <= SMALL_PRODUCT_MAX_K)
        return intensity(g) <= MAX_INTENSITY or small

    @staticmethod
    def forward(g, x, w, bias=None, activation=0, residual=None):
        """y = act(w @ x + bias + residual) per image, one pass over x and one over y."""
        y = cuda.empty(g.y_shape)
        return pointwise_product(w, x, y, g.c_out, g.c_in, g.n, g.h * g.w, bias=bias,
                                 residual=residual, activation=activation)

    @staticmethod
    def backward_data(g, gy, w):
        """gx = w^T @ gy per image (the same kernel reading w transposed)."""
        gx = cuda.empty(g.x_shape)
        return pointwise_product(w, gy, gx, g.c_in, g.c_out, g.n, g.h * g.w, trans_a=True)

    @staticmethod
    def backward_weight(g, x, gy):
        """The GEMM path's (not offered to the planner; here for completeness)."""
        return Pointwise.backward_weight(g, x, gy)


class Im2colDirect:
    """Any convolution with groups 1, forward only: im2col, then the direct kernel's product.

    After im2col an image's columns are [C_in*kh*kw, OH*OW], laid out as a
    1x1 layer's input of C_in*kh*kw channels, so :func:`pointwise_product`
    multiplies them by w [C_out, C_in*kh*kw] with the epilogue fused, where
    :class:`~gdnflow.ops.conv.algorithms.im2col.Im2colGemm` runs cuBLAS and
    then a separate epilogue pass. Preferred for the same memory-bound shapes
    as :class:`PointwiseDirect` (:func:`intensity` of C_out and C_in*kh*kw at
    most :data:`MAX_INTENSITY`): the RGB first layers, K = 27, whose GEMM is
    all memory traffic (and whose cuBLAS call costs more host time than a
    launch: docs/conv.md).
    """

    name = "im2col_direct"
    stages = ("forward",)
    fuses_bias_activation = True
    fuses_residual = True

    @staticmethod
    def supports(g):
        """Groups 1 (the product has one weight matrix)."""
        return g.groups == 1

    @staticmethod
    def preferred(g):
        """Memory-bound products: :func:`product_intensity` of (C_out, C_in*kh*kw) at most
        :data:`MAX_INTENSITY`."""
        return product_intensity(g.c_out, g.c_in * g.kh * g.kw) <= MAX_INTENSITY

    @staticmethod
    def forward(g, x, w, bias=None, activation=0, residual=None):
        """y = act(w @ im2col(x) + bias + residual), lowered a chunk of images at a time."""
        y = cuda.empty(g.y_shape)
        ohw, k = g.oh * g.ow, g.c_in * g.kh * g.kw
        chunk = chunk_images(g.n, k * ohw)
        cols = cuda.empty((chunk * k * ohw,))
        for n0 in range(0, g.n, chunk):
            nb = min(chunk, g.n - n0)
            im2col(g, x.offset(n0 * g.c_in * g.h * g.w, (nb, g.c_in, g.h, g.w)), cols, nb, ohw,
                   k * ohw)
            out_shape = (nb, g.c_out, g.oh, g.ow)
            pointwise_product(w, cols, y.offset(n0 * g.c_out * ohw, out_shape), g.c_out, k, nb,
                              ohw, bias=bias, activation=activation,
                              residual=None if residual is None
                              else residual.offset(n0 * g.c_out * ohw, out_shape))
        return y

