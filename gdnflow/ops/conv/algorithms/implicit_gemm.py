"""16-bit convolutions on the tensor cores as one implicit GEMM, epilogue fused.

Kernels in ``cuda_src/implicit_gemm.cu``: ``conv_weight_matrix`` rearranges a
weight [C_out, C_in, kh, kw] once into the GEMM's A [M_pad, K_pad] (k = (tap,
channel), each tap's channels padded to a multiple of the K step);
``nchw_to_nhwc`` copies x channels last; ``conv_implicit_gemm`` multiplies A by
im2col(x) without writing im2col out: each block copies its piece of the
columns straight from the channels-last x (16-byte cp.async, several steps in
flight), multiplies on the tensor cores (mma.sync; on compute capability 9.0
Hopper's wgmma, an sm_90a build: :func:`uses_wgmma`; float32 sums) and writes
act(y + bias + residual) in the dtype, NCHW. The im2col + GemmEx path it
replaces writes and reads the columns (kh*kw times the input) and then makes a
second pass for the epilogue.

Forward only, groups 1, float16 and bfloat16, on GPUs of compute capability
8.0 and up (cp.async, bf16 mma). :func:`~gdnflow.ops.conv.planning.half_conv_algorithm`
offers it where :meth:`ImplicitGemm.preferred` says, unless
``settings.half_conv_tensor_cores`` is off. Inside an inference plan
(:func:`gdnflow.backends.cuda.weight_cache.weight_cache` frozen) A is made once
per weight; elsewhere on every call, as the optimizers change weights in place.
Measurements and the design: docs/conv.md, "Tensor-core implicit GEMM".
"""
import functools

from gdnflow.backends import cuda
from gdnflow.backends.cuda.kernel_cache import ARCH_SPECIFIC_DEFINE
from gdnflow.backends.cuda.limits import MAX_GRID_YZ
from gdnflow.backends.cuda.weight_cache import weight_cache
from gdnflow.config import settings
from gdnflow.errors import DTypeError
from gdnflow.precision import is_half

SOURCE = "implicit_gemm.cu"
cuda.declare_variants(SOURCE)   # every module is built for a window and dtype: none known ahead
#: Channels per K step (the kernel's BK): each tap's channels are padded to a multiple.
K_STEP = 64
#: Output pixels (GEMM columns) per block (the kernel's BN).
COLUMN_TILE = 128
#: Columns per warp: a block has 2 x COLUMN_TILE / WARP_N warps.
WARP_N = 32
#: Shared-memory stages of the K loop (cp.async in flight: STAGES - 1 steps).
STAGES = 3
#: The row tiles (output channels per block) offered, largest first (the kernel's BM =
#: 2 warps of BM / 2 rows).
ROW_TILES = (128, 64)
#: Fewer input channels than this waste most of each K step on zero padding
#: (an RGB first layer: 3 of 64): such layers stay with im2col + GEMM.
MIN_CHANNELS = 16
#: Fewer blocks than this many per SM leave SMs idle for much of the layer
#: (batch-1 layers on small planes): such layers stay with the GEMMs.
MIN_BLOCKS_PER_SM = 2
#: 1x1 layers on odd planes need this many column tiles (of :data:`COLUMN_TILE` pixels):
#: with fewer, each block's long K loop costs more than the GEMM path's two kernels
#: (MobileNetV2's 7x7 layers, fp16 on the H200: the GEMM path won all five shapes up to
#: batch 4, two of five at batch 8 (4 tiles), none from batch 16;
#: benchmarks/results/precision/pointwise_odd_planes_fp16.md).
MIN_POINTWISE_COLUMN_TILES = 4
#: Compute capability of cp.async and of bfloat16 mma.sync.
MIN_CAPABILITY = (8, 0)
#: Compute capability of Hopper's warpgroup MMA (wgmma, sm_90a only): there both row
#: tiles multiply by wgmma (``settings.half_conv_wgmma``). The build needs an nvcc that
#: knows sm_90a (CUDA 12.0 on; gdnflow's toolchain is 13.0).
WGMMA_CAPABILITY = (9, 0)
#: Bytes wgmma's swizzled tiles may need to skip to start on a 1024-byte boundary.
WGMMA_ALIGNMENT = 1024


def shared_bytes(bm, wgmma=False):
    """Dynamic shared memory of a block of ``bm`` rows: STAGES stages of the A and X tiles,
    rows of K_STEP + 8 16-bit values (mma.sync), or of K_STEP values and
    :data:`WGMMA_ALIGNMENT` more bytes (wgmma)."""
    if wgmma:
        return STAGES * (bm + COLUMN_TILE) * K_STEP * 2 + WGMMA_ALIGNMENT
    return STAGES * (bm + COLUMN_TILE) * (K_STEP + 8) * 2


def uses_wgmma():
    """Whether the kernel multiplies by wgmma on this GPU: on compute capability
    :data:`WGMMA_CAPABILITY`, unless ``settings.half_conv_wgmma`` is off. Either row tile:
    two warpgroups of 64 rows x 128 columns each (128-row tile), or of 64 rows x 64."""
    return settings.half_conv_wgmma and cuda.compute_capability() == WGMMA_CAPABILITY


def row_tile(c_out, shared_limit=None):
    """Output channels per block among :data:`ROW_TILES`: the one padding C_out least (the
    larger on a tie), of those whose shared memory fits ``shared_limit`` bytes (None: no
    limit); None if none fits."""
    tiles = [t for t in ROW_TILES if shared_limit is None or shared_bytes(t) <= shared_limit]
    return min(tiles, key=lambda t: (-(-c_out // t) * t, -t)) if tiles else None


def threads():
    """Threads of a block: 2 x COLUMN_TILE / WARP_N warps (the kernel's layout)."""
    return 64 * COLUMN_TILE // WARP_N


def channel_steps(c_in):
    """K steps per tap: C_in padded up to a multiple of :data:`K_STEP`, in steps."""
    return -(-c_in // K_STEP)


def grid(g, bm):
    """(row tiles, column tiles) of the kernel's grid for ``g`` with row tile ``bm``."""
    return -(-g.c_out // bm), -(-(g.n * g.oh * g.ow) // COLUMN_TILE)


def _defines(g, dtype, bm, wgmma):
    """The module of ``g``'s window and ``dtype`` with row tile ``bm``, multiplying by wgmma
    or mma.sync (every constant the kernels share with this file passed, so the two cannot
    disagree; wgmma's build is for the arch-specific target)."""
    return cuda.storage_defines(dtype) + (
        ("KH", g.kh), ("KW", g.kw), ("SH", g.stride[0]), ("SW", g.stride[1]),
        ("DH", g.dilation[0]), ("DW", g.dilation[1]), ("WARP_M", bm // 2), ("WARP_N", WARP_N),
        ("BN", COLUMN_TILE), ("STAGES", STAGES), ("BK", K_STEP)) + (
        (("WGMMA", 1), (ARCH_SPECIFIC_DEFINE, 1)) if wgmma else ())


@functools.lru_cache(maxsize=None)
def _conv_kernel(defines, shared):
    """conv_implicit_gemm of the module ``defines``, allowed ``shared`` bytes of dynamic
    shared memory (opted in once per kernel, not per launch)."""
    kernel = cuda.kernel(SOURCE, "conv_implicit_gemm", "PPPPP" + "i" * 12, defines)
    kernel.allow_shared_bytes(shared)
    return kernel


def weight_matrix(g, w, bm, defines):
    """A [ceil(C_out / bm) * bm, kh*kw*C_pad] of w, zero-padded (cached inside a frozen block)."""
    steps = channel_steps(g.c_in)
    rows = -(-g.c_out // bm) * bm

    def make():
        a = cuda.empty((rows, g.kh * g.kw * steps * K_STEP), w.dtype)
        cuda.kernel(SOURCE, "conv_weight_matrix", "PPiiii", defines).launch(
            a.size, w.ptr, a.ptr, g.c_out, g.c_in, steps, rows)
        return a
    return weight_cache.derived(("implicit_gemm", rows, steps * K_STEP), w, make)


#: The channels-last copy's (channel, pixel) tile and threads per block (nchw_to_nhwc's
#: NHWC_TILE and NHWC_THREADS, fixed by its layout there: a test checks the two agree).
NHWC_TILE = 64
NHWC_THREADS = 256


def channels_last(x, c8, defines):
    """x [N, C, H, W] copied to [N, H, W, c8], the channels past C zero."""
    n, c, h, w = x.shape
    xt = cuda.empty((n, h, w, c8), x.dtype)
    # 16-byte reads need whole 16-byte pieces of every plane (8 values), aligned.
    vector_reads = (h * w) % 8 == 0 and x.ptr % 16 == 0
    cuda.kernel(SOURCE, "nchw_to_nhwc", "PPiiiii", defines)(
        (-(-(h * w) // NHWC_TILE), -(-c8 // NHWC_TILE), min(n, MAX_GRID_YZ)),
        (NHWC_THREADS, 1, 1), x.ptr, xt.ptr, n, c, c8, h * w, int(vector_reads))
    return xt


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
        """Stride-1 layers of at least :data:`MIN_CHANNELS` input channels on a GPU of
        compute capability :data:`MIN_CAPABILITY` whose shared memory holds a row tile:
        those wider than 1x1 with at least :data:`MIN_BLOCKS_PER_SM` blocks per SM, and
        1x1 layers on planes of an odd number of pixels with at least
        :data:`MIN_POINTWISE_COLUMN_TILES` column tiles (the shapes measured against
        im2col + GEMM and the plain GEMM: docs/conv.md). Strided layers keep the GEMMs,
        and other 1x1 layers the plain GEMM (no im2col to save; measured slower here).
        An odd plane leaves each image's columns misaligned for the plain GEMM's batched
        cuBLAS call, whose 2-byte-aligned kernels were the slower: MobileNetV2's 7x7
        layers from batch 16; at batch 1 the GEMM path was faster on every one."""
        if not (g.stride == (1, 1) and g.c_in >= MIN_CHANNELS):
            return False
        pointwise = g.kh * g.kw == 1
        if pointwise and (g.oh * g.ow) % 2 == 0:
            return False
        if cuda.compute_capability() < MIN_CAPABILITY:
            return False
        bm = row_tile(g.c_out, cuda.max_shared_bytes())
        if bm is None:
            return False
        rows, columns = grid(g, bm)
        if pointwise:
            return columns >= MIN_POINTWISE_COLUMN_TILES
        return rows * columns >= MIN_BLOCKS_PER_SM * cuda.sm_count()

    @staticmethod
    def forward(g, x, w, bias=None, activation=0, residual=None):
        """y = act(conv(x, w) + bias + residual), one kernel after the copy of x."""
        if not is_half(x.dtype):
            raise DTypeError(f"implicit_gemm: 16-bit tensors only (bfloat16, float16), "
                             f"got {x.dtype}")
        y = cuda.empty(g.y_shape, x.dtype)
        if y.size == 0:
            return y
        c8 = -(-g.c_in // 8) * 8
        cuda.check_index_range(max(g.n * g.h * g.w * c8, y.size), "implicit_gemm input/output")
        bm = row_tile(g.c_out, cuda.max_shared_bytes())
        if bm is None:
            raise ValueError(f"implicit_gemm: no row tile fits this GPU's "
                             f"{cuda.max_shared_bytes()} bytes of shared memory a block")
        m_tiles, column_tiles = grid(g, bm)
        cuda.check_index_range(m_tiles * column_tiles, "implicit_gemm blocks")
        wgmma = uses_wgmma()
        defines = _defines(g, x.dtype, bm, wgmma)
        a = weight_matrix(g, w, bm, defines)
        xt = channels_last(x, c8, defines)
        shared = shared_bytes(bm, wgmma)
        _conv_kernel(defines, shared)(
            (m_tiles * column_tiles, 1, 1), (threads(), 1, 1), xt.ptr, a.ptr,
            0 if bias is None else bias.ptr, 0 if residual is None else residual.ptr, y.ptr,
            g.n, c8, g.h, g.w, g.c_out, g.oh, g.ow, g.padding[0], g.padding[2],
            channel_steps(g.c_in), m_tiles, activation, shared_bytes=shared)
        return y
