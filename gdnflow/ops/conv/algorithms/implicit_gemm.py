"""16-bit convolutions on the tensor cores as one implicit GEMM, epilogue fused.

Kernels in ``cuda_src/implicit_gemm.cu``: ``conv_weight_matrix`` rearranges a
weight [C_out, C_in, kh, kw] once into the GEMM's A [M_pad, K_pad] (k = (tap,
channel), each tap's channels padded to a multiple of the K step);
``nchw_to_nhwc`` copies x channels last; ``conv_implicit_gemm`` multiplies A by
im2col(x) without writing im2col out: each block copies its piece of the
columns straight from the channels-last x (16-byte cp.async, several steps in
flight), multiplies on the tensor cores (mma.sync, float32 sums) and writes
act(y + bias + residual) in the dtype, NCHW. The im2col + GemmEx path it
replaces writes and reads the columns (kh*kw times the input) and then makes a
second pass for the epilogue.

Forward only, groups 1, float16 and bfloat16 (:func:`gdnflow.ops.conv.planning.
half_conv_algorithm` offers it where :meth:`ImplicitGemm.preferred` says, unless
``settings.half_conv_tensor_cores`` is off). Inside an inference plan
(:func:`gdnflow.backends.cuda.weight_cache.weight_cache` frozen) A is made once
per weight; elsewhere on every call, as the optimizers change weights in place.
"""
from gdnflow.backends import cuda
from gdnflow.backends.cuda.weight_cache import weight_cache
from gdnflow.precision import is_half

SOURCE = "implicit_gemm.cu"
cuda.declare_variants(SOURCE)   # every module is built for a window and dtype: none known ahead
#: The K step (cuda_src/implicit_gemm.cu's BK: channels per step) and the column tile (IG_BN).
K_STEP = 64
COLUMN_TILE = 128
#: Columns per warp: the block has 2 x COLUMN_TILE / WARP_N warps.
WARP_N = 32
#: Shared-memory stages of the K loop (cp.async in flight: STAGES - 1 steps).
STAGES = 3
#: Fewer input channels than this waste most of each K step on zero padding
#: (an RGB first layer: 3 of 64): such layers stay with im2col + GEMM.
MIN_CHANNELS = 16
#: Fewer blocks than this leave most of the GPU's 132 SMs idle (batch-1 layers on
#: small planes): such layers stay with the GEMMs.
MIN_BLOCKS = 264


def row_tile(c_out):
    """Output channels per block, 64 or 128: the one padding C_out least (128 on a tie)."""
    return 128 if -(-c_out // 128) * 128 <= -(-c_out // 64) * 64 else 64


def channel_steps(c_in):
    """K steps per tap: C_in padded up to a multiple of :data:`K_STEP`, in steps."""
    return -(-c_in // K_STEP)


def blocks(g):
    """(row tiles, column tiles) of the kernel's grid for ``g``."""
    return -(-g.c_out // row_tile(g.c_out)), -(-(g.n * g.oh * g.ow) // COLUMN_TILE)


def shared_bytes(bm):
    """Dynamic shared memory of a block: STAGES stages of the A and X tiles, rows of
    K_STEP + 8 16-bit values."""
    return STAGES * (bm + COLUMN_TILE) * (K_STEP + 8) * 2


def _defines(g, dtype, bm):
    return cuda.storage_defines(dtype) + (
        ("KH", g.kh), ("KW", g.kw), ("SH", g.stride[0]), ("SW", g.stride[1]),
        ("DH", g.dilation[0]), ("DW", g.dilation[1]), ("WARP_M", bm // 2), ("WARP_N", WARP_N),
        ("STAGES", STAGES), ("BK", K_STEP))


def channels_last(x, c8):
    """x [N, C, H, W] copied to [N, H, W, c8], the channels past C zero."""
    n, c, h, w = x.shape
    xt = cuda.empty((n, h, w, c8), x.dtype)
    cuda.kernel(SOURCE, "nchw_to_nhwc", "PPiii", cuda.storage_defines(x.dtype))(
        (-(-(h * w) // 32), -(-c8 // 32), n), (32, 8, 1), x.ptr, xt.ptr, c, c8, h * w)
    return xt


def weight_matrix(g, w, bm):
    """A [ceil(C_out / bm) * bm, kh*kw*C_pad] of w, zero-padded (cached inside a frozen block)."""
    steps = channel_steps(g.c_in)
    rows = -(-g.c_out // bm) * bm

    def make():
        a = cuda.empty((rows, g.kh * g.kw * steps * K_STEP), w.dtype)
        cuda.kernel(SOURCE, "conv_weight_matrix", "PPiiii", _defines(g, w.dtype, bm)).launch(
            a.size, w.ptr, a.ptr, g.c_out, g.c_in, steps, rows)
        return a
    return weight_cache.derived(("implicit_gemm", bm, steps), w, make)


class ImplicitGemm:
    """Forward of a 16-bit, one-group convolution: tensor-core implicit GEMM, epilogue fused."""

    name = "implicit_gemm"
    fuses_bias_activation = True
    fuses_residual = True
    #: Only the forward: gradients keep the GEMM algorithms.
    half_precision_stages = ("forward",)

    @staticmethod
    def supports(g):
        """One group (the product has a single weight matrix)."""
        return g.groups == 1

    @staticmethod
    def preferred(g):
        """Stride-1 layers wider than 1x1, of at least :data:`MIN_CHANNELS` input channels
        and :data:`MIN_BLOCKS` blocks (the shapes measured against im2col + GEMM:
        docs/conv.md). Strided layers keep the GEMMs, and 1x1 layers the plain GEMM
        (no im2col to save; measured slower here)."""
        rows, columns = blocks(g)
        return (g.stride == (1, 1) and g.kh * g.kw > 1 and g.c_in >= MIN_CHANNELS
                and rows * columns >= MIN_BLOCKS)

    @staticmethod
    def forward(g, x, w, bias=None, activation=0, residual=None):
        """y = act(conv(x, w) + bias + residual), one kernel."""
        if not is_half(x.dtype):
            raise TypeError(f"implicit_gemm: 16-bit tensors only, got {x.dtype}")
        y = cuda.empty(g.y_shape, x.dtype)
        if y.size == 0:
            return y
        c8 = -(-g.c_in // 8) * 8
        cuda.check_index_range(max(g.n * g.h * g.w * c8, y.size), "implicit_gemm input/output")
        bm = row_tile(g.c_out)
        a = weight_matrix(g, w, bm)
        m_tiles, column_tiles = blocks(g)
        cuda.check_index_range(m_tiles * column_tiles, "implicit_gemm blocks")
        xt = channels_last(x, c8)
        kernel = cuda.kernel(SOURCE, "conv_implicit_gemm", "PPPPP" + "i" * 12,
                             _defines(g, x.dtype, bm))
        kernel.allow_shared_bytes(shared_bytes(bm))
        threads = 64 * COLUMN_TILE // WARP_N
        kernel((m_tiles * column_tiles, 1, 1), (threads, 1, 1), xt.ptr, a.ptr,
               0 if bias is None else bias.ptr, 0 if residual is None else residual.ptr, y.ptr,
               g.n, c8, g.h, g.w, g.c_out, g.oh, g.ow, g.padding[0], g.padding[2],
               channel_steps(g.c_in), m_tiles, activation, shared_bytes=shared_bytes(bm))
        return y
