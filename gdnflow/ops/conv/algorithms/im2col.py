"""Convolutions as matrix products on the GPU: im2col + SGEMM, and one GEMM per image for 1x1.

Kernels: ``cuda_src/conv2d.cu`` (im2col, col2im, the NCHW -> CNHW transpose);
the GEMMs are cuBLAS's, through :func:`gdnflow.backends.cuda.matmul`. The
column matrices are made a chunk of images at a time, within
``settings.conv_workspace_bytes`` (:mod:`gdnflow.config`).

Both algorithms also run on 16-bit tensors (``half_precision_stages``): the lowering
kernels built for 16-bit storage and GemmEx products with float32
accumulation; the weight gradient accumulates over chunks in float32 and is
rounded once at the end.
"""
from gdnflow.backends import cuda
from gdnflow.config import settings
from gdnflow.ops.cast import CastOp
from gdnflow.ops.conv.geometry import FLOAT_BYTES
from gdnflow.precision import FLOAT32

SOURCE = "conv2d.cu"
# The epilogue's module, and im2col's for the common square kernels: 3x3
# (MobileNet's and VGG's stride-2 or grouped layers) and 5x5 (the codecs').
cuda.declare_variants(SOURCE, (), (("KH", 3), ("KW", 3)), (("KH", 5), ("KW", 5)))


def chunk_images(n, floats_per_image):
    """How many images to lower at once within ``settings.conv_workspace_bytes`` (at least one)."""
    most = settings.conv_workspace_bytes // (FLOAT_BYTES * max(floats_per_image, 1))
    chunk = max(1, min(n, most))
    cuda.check_index_range(chunk * floats_per_image, "conv2d workspace")
    return chunk


def _defines(g, dtype):
    """The conv2d.cu module for ``g``'s kernel size and tensors of ``dtype``."""
    return (("KH", g.kh), ("KW", g.kw)) + cuda.storage_defines(dtype)


def im2col(g, x, cols, nb, row_stride, image_stride):
    """cols <- the column matrices of the ``nb`` images that ``x`` starts with (see conv2d.cu)."""
    kernel = cuda.kernel(SOURCE, "im2col", "PP" + "i" * 14, _defines(g, x.dtype))
    kernel.launch(nb * g.c_in * g.oh * g.ow, x.ptr, cols.ptr, nb, g.c_in, g.h, g.w, g.oh, g.ow,
                  *g.stride, *g.dilation, g.padding[0], g.padding[2], row_stride, image_stride)


def col2im(g, cols, x, nb, row_stride, image_stride):
    """The ``nb`` images of gx that ``x`` starts with <- the adjoint of im2col applied to cols."""
    kernel = cuda.kernel(SOURCE, "col2im", "PP" + "i" * 14, _defines(g, x.dtype))
    kernel.launch(nb * g.c_in * g.h * g.w, cols.ptr, x.ptr, nb, g.c_in, g.h, g.w, g.oh, g.ow,
                  *g.stride, *g.dilation, g.padding[0], g.padding[2], row_stride, image_stride)


def nchw_to_cnhw(src, dst, nb, channels, pixels):
    """dst [C, nb, P] <- src [nb, C, P]."""
    cuda.kernel(SOURCE, "nchw_to_cnhw", "PPiii", cuda.storage_defines(src.dtype)).launch(
        nb * channels * pixels, src.ptr, dst.ptr, nb, channels, pixels)


def gemm_backward_weight(g, x, gy, lower):
    """gw[grp] = sum_n gy[n, grp] @ cols[n, grp]^T as one GEMM per chunk of images.

    ``lower(x_chunk, cols, nb)`` writes the column matrix of the ``nb`` images
    ``x_chunk`` starts with, the images side by side ([C_in*kh*kw, nb*OH*OW]);
    the chunk's gy is brought to the same layout ([C_out, nb*OH*OW], a
    transpose unless nb == 1), so the GEMM's inner dimension runs over all
    pixels of all images of the chunk and accumulates (beta = 1) over chunks.
    Groups are the GEMM's batch.
    """
    dtype = x.dtype
    if g.n == 0:
        return cuda.zeros(g.w_shape, dtype)
    gw = cuda.empty(g.w_shape)          # float32: the sums over chunks are not rounded
    ohw, k_rows = g.oh * g.ow, g.c_in * g.kh * g.kw
    chunk = chunk_images(g.n, (k_rows + g.c_out) * ohw)
    cols = cuda.empty((chunk * k_rows * ohw,), dtype)
    gyt = cuda.empty((chunk * g.c_out * ohw,), dtype) if chunk > 1 else None
    og, kg = g.c_out // g.groups, k_rows // g.groups
    for n0 in range(0, g.n, chunk):
        nb = min(chunk, g.n - n0)
        width = nb * ohw
        lower(x.offset(n0 * g.c_in * g.h * g.w, (nb, g.c_in, g.h, g.w)), cols, nb)
        gy_chunk = gy.offset(n0 * g.c_out * ohw, (nb, g.c_out, g.oh, g.ow))
        if nb > 1:
            nchw_to_cnhw(gy_chunk, gyt, nb, g.c_out, ohw)
            gy_chunk = gyt
        cuda.matmul(gy_chunk.ptr, cols.ptr, gw.ptr, og, kg, width, trans_b=True,
                    beta=0.0 if n0 == 0 else 1.0, batch=g.groups,
                    stride_a=og * width, stride_b=kg * width, stride_c=og * kg, dtype=dtype,
                    out_dtype=FLOAT32)
    return gw if dtype == FLOAT32 else CastOp(dtype).forward_cuda(gw)


def grouped_matmul(a, b, c, m, n, k, groups, images, a_group, b_group, b_image, c_group,
                   c_image, **options):
    """C[i, grp] = op(A[grp]) @ B[i, grp] for ``images`` images and ``groups`` groups.

    Strided-batched GEMMs (``cuda.matmul``, ``options`` passed on) over whichever of
    the two is longer, one call per element of the other: a grouped layer at batch 1
    is one call, not one per group. Strides in elements: ``a_group`` (A has no image
    stride), ``b_group``, ``b_image``, ``c_group``, ``c_image``.
    """
    size = a.dtype.itemsize     # one dtype for the three (the product's)
    if groups <= images:
        for grp in range(groups):
            cuda.matmul(a.ptr + grp * a_group * size, b.ptr + grp * b_group * size,
                        c.ptr + grp * c_group * size, m, n, k, batch=images, stride_a=0,
                        stride_b=b_image, stride_c=c_image, **options)
    else:
        for image in range(images):
            cuda.matmul(a.ptr, b.ptr + image * b_image * size, c.ptr + image * c_image * size,
                        m, n, k, batch=groups, stride_a=a_group, stride_b=b_group,
                        stride_c=c_group, **options)


def _lowering(g):
    """(OH*OW, floats of one image's column matrix, images per workspace chunk, output
    and column rows per group) of ``g``'s im2col lowering."""
    ohw, k_rows = g.oh * g.ow, g.c_in * g.kh * g.kw
    per_image = k_rows * ohw
    return ohw, per_image, chunk_images(g.n, per_image), g.c_out // g.groups, k_rows // g.groups


class Im2colGemm:
    """Any convolution: lower the input to column matrices, multiply with cuBLAS SGEMM.

    ================  ========================================================
    forward:          y[n, grp] = W[grp] @ cols[n, grp], strided-batched over
                      the images of a chunk (the weight's batch stride is 0),
                      one call per group, or over the groups, one call per
                      image, where there are more groups (:func:`grouped_matmul`);
    backward_data:    gcols[n, grp] = W[grp]^T @ gy[n, grp], then col2im;
    backward_weight:  :func:`gemm_backward_weight` with im2col as the lowering.
    ================  ========================================================
    """

    name = "im2col_gemm"
    fuses_bias_activation = False
    #: The stages whose maps also take 16-bit tensors (GemmEx, conv2d.cu's 16-bit build).
    half_precision_stages = ("forward", "backward_data", "backward_weight")

    @staticmethod
    def supports(g):
        """Every geometry."""
        return True

    @staticmethod
    def forward(g, x, w, bias=None, activation=0):
        """y [N, C_out, OH, OW] from x and w (bias and activation: the caller's epilogue)."""
        y = cuda.empty(g.y_shape, x.dtype)
        ohw, per_image, chunk, og, kg = _lowering(g)
        cols = cuda.empty((chunk * per_image,), x.dtype)
        for n0 in range(0, g.n, chunk):
            nb = min(chunk, g.n - n0)
            im2col(g, x.offset(n0 * g.c_in * g.h * g.w, (nb, g.c_in, g.h, g.w)), cols, nb, ohw,
                   per_image)
            grouped_matmul(w, cols, y.offset(n0 * g.c_out * ohw, (nb * g.c_out * ohw,)), og, ohw,
                           kg, g.groups, nb, og * kg, kg * ohw, per_image, og * ohw,
                           g.c_out * ohw, dtype=x.dtype)
        return y

    @staticmethod
    def backward_data(g, gy, w):
        """gx [N, C_in, H, W] from gy [N, C_out, OH, OW] and w."""
        gx = cuda.empty(g.x_shape, gy.dtype)
        ohw, per_image, chunk, og, kg = _lowering(g)
        gcols = cuda.empty((chunk * per_image,), gy.dtype)
        for n0 in range(0, g.n, chunk):
            nb = min(chunk, g.n - n0)
            grouped_matmul(w, gy.offset(n0 * g.c_out * ohw, (nb * g.c_out * ohw,)), gcols, kg,
                           ohw, og, g.groups, nb, og * kg, og * ohw, g.c_out * ohw, kg * ohw,
                           per_image, trans_a=True, dtype=gy.dtype)
            col2im(g, gcols, gx.offset(n0 * g.c_in * g.h * g.w, (nb, g.c_in, g.h, g.w)), nb, ohw,
                   per_image)
        return gx

    @staticmethod
    def backward_weight(g, x, gy):
        """gw [C_out, C_in/groups, kh, kw] from x and gy."""
        ohw = g.oh * g.ow
        return gemm_backward_weight(
            g, x, gy, lambda x_chunk, cols, nb: im2col(g, x_chunk, cols, nb, nb * ohw, ohw))


class Pointwise:
    """1x1 convolution, stride 1, no padding: no lowering at all.

    Each image's input already is the column matrix X_n [C_in, H*W], so
    y_n = W [C_out, C_in] @ X_n is one strided-batched GEMM over the images
    (weight stride 0), per group (or over the groups, per image: :func:`grouped_matmul`); gx_n = W^T @ gy_n likewise; the weight
    gradient transposes x and gy to [C, N*H*W] and makes one GEMM of it.
    """

    name = "pointwise"
    fuses_bias_activation = False
    #: The stages whose maps also take 16-bit tensors (GemmEx, conv2d.cu's 16-bit build).
    half_precision_stages = ("forward", "backward_data", "backward_weight")

    @staticmethod
    def supports(g):
        """1x1 kernels at stride 1 without padding (any groups)."""
        return g.is_pointwise

    @staticmethod
    def forward(g, x, w, bias=None, activation=0):
        """y_n[grp] = W[grp] @ x_n[grp] (bias and activation: the caller's epilogue)."""
        y = cuda.empty(g.y_shape, x.dtype)
        hw, og, cg = g.h * g.w, g.c_out // g.groups, g.c_in // g.groups
        grouped_matmul(w, x, y, og, hw, cg, g.groups, g.n, og * cg, cg * hw, g.c_in * hw,
                       og * hw, g.c_out * hw, dtype=x.dtype)
        return y

    @staticmethod
    def backward_data(g, gy, w):
        """gx_n[grp] = W[grp]^T @ gy_n[grp]."""
        gx = cuda.empty(g.x_shape, gy.dtype)
        hw, og, cg = g.h * g.w, g.c_out // g.groups, g.c_in // g.groups
        grouped_matmul(w, gy, gx, cg, hw, og, g.groups, g.n, og * cg, og * hw, g.c_out * hw,
                       cg * hw, g.c_in * hw, trans_a=True, dtype=gy.dtype)
        return gx

    @staticmethod
    def backward_weight(g, x, gy):
        """gw[grp] = sum_n gy_n[grp] @ x_n[grp]^T, x transposed to [C_in, N*H*W] as the columns."""
        hw = g.h * g.w

        def lower(x_chunk, cols, nb):
            nchw_to_cnhw(x_chunk, cols, nb, g.c_in, hw)
        return gemm_backward_weight(g, x, gy, lower)
