"""Grouped convolutions with few channels per group: a direct kernel (``cuda_src/grouped.cu``).

For x [N, C_in, H, W] and w [C_out, CG, kh, kw] with CG = C_in / groups
(not depthwise: that is :mod:`.depthwise`'s)::

    y[n, o, p, q] = act(b[o] + residual[n, o, p, q]
                        + sum_{c < CG, i, j} w[o, c, i, j] x[n, g(o)*CG + c, p*sh - top + i*dh, q*sw - left + j*dw])

with g(o) = o // (C_out / groups). RegNet's 3x3 layers (8 channels per group)
and ResNeXt's (4 to 32) have products too small per group for a GEMM: the
im2col path runs hundreds of tiny cuBLAS calls per network. A network's first
layer, on image channels (groups 1, C_in at most :data:`MAX_STEM_CHANNELS`), is
one such group: for a small layer (:data:`MAX_STEM_MULTIPLY_ADDS`, a batch of
one at 224x224), or one of at most 3x3 whose output plane is not a multiple
of 4 pixels (:data:`MAX_ODD_PLANE_STEM_MULTIPLY_ADDS`), the kernel beats
writing a column matrix and multiplying it.
Forward only; the gradients stay with im2col + GEMM (training such layers is
not what this kernel is for).
"""
import functools

from gdnflow.backends import cuda
from gdnflow.ops.conv.algorithms.pointwise import VECTOR_COLUMNS

SOURCE = "grouped.cu"
cuda.declare_variants(SOURCE)   # every module is built for a shape: none known ahead
#: Threads per block at most (GROUPED_MAX_THREADS in grouped.cu).
MAX_THREADS = 256
#: Shared memory a block may take without opting in (the chunk's weights).
SHARED_LIMIT = 48 * 1024
MAX_KERNEL = 7                  # taps per side unrolled in the kernel
MAX_STRIDE = 2
MAX_DILATION = 2
#: Output channels per thread at most: the accumulators a thread keeps in registers.
MAX_OUTPUTS_PER_THREAD = 8
#: The heuristic prefers the kernel for groups of at most this many input
#: channels; wider groups are products a GEMM fills the GPU with.
PREFERRED_GROUP_CHANNELS = 16
#: Ungrouped layers (groups 1) run here with at most this many input channels (the
#: image channels of a first layer: gray, RGB, RGBA) ...
MAX_STEM_CHANNELS = 4
#: ... and at most this many multiply-adds (N*C_out*OH*OW*C_in*kh*kw). Measured on an
#: H200 (``ConvPlanner`` autotune, docs/conv.md): RGB first layers at batch 1 (at most
#: 118 million) took 18-26 us on the kernel against 30-49 for im2col + the direct
#: product and 38-74 for im2col + GEMM; at batch 32 it won below about 300 million
#: (MobileNetV3's 3x3 to 16 channels, 173 million: 34 against 45 us), tied at 347
#: million and lost from 681 million (SqueezeNet's 3x3 to 64: 117 against 103 us;
#: the 7x7 layers, 3.8 billion: 432 against 284), as on the codec's 5x5 layer at
#: 768x512 (943 million: 207 against 70 us).
MAX_STEM_MULTIPLY_ADDS = 1 << 28
#: ... or, with a window of at most 3x3 and an output plane that is not a multiple of 4
#: pixels, at most this many. The im2col + direct product copies such planes one value
#: at a time (pointwise.cu's VEC_X 1, :data:`.pointwise.VECTOR_COLUMNS`). With the
#: layer's bias and ReLU, on the H200
#: (``benchmarks/bench_stem_epilogue.py``, benchmarks/results/stem_epilogue.md):
#: SqueezeNet's 3x3/2 to 64 (111x111 out) at batch 8 to 64 took 34-269 us on the
#: kernel against 58-383 for im2col + the direct product and 81-339 for im2col + GEMM
#: (Inception v3's 3x3/2 to 32, 149x149 out, batch 32: 126 against 191 and 197);
#: where the plane is a multiple of 4 (112x112, 224x224) the direct product won
#: (MobileNetV2's 3x3/2 to 32 at batch 32: 69 against 78 us on the kernel; VGG's 3x3 to
#: 64 at batch 8: 90 against 100). Larger layers were not measured.
MAX_ODD_PLANE_STEM_MULTIPLY_ADDS = 1 << 31
MAX_ODD_PLANE_STEM_WINDOW = 3
#: On 16-bit tensors, first layers of at most this many multiply-adds. Measured in fp16
#: with bias and ReLU on the H200 against im2col + GemmEx + the epilogue pass:
#: MobileNetV2's 3x3/2 to 32 took 18 against 69 us at batch 1 and 154 against 203 at
#: batch 64 (693 million); VGG16's 3x3 to 64 30 against 68 us at batch 1 and 110 against
#: 120 at batch 8 (694 million), but 770 against 711 at batch 64 (5.5 billion); ResNet's
#: 7x7/2 to 64 at batch 64 (7.6 billion) 861 against 434. Between 0.7 and 5.5 billion
#: nothing was measured: the bound is a guess in that gap.
MAX_HALF_STEM_MULTIPLY_ADDS = 1 << 30


def stem_multiply_adds(g):
    """The multiply-adds of an ungrouped layer ``g`` (N*C_out*OH*OW*C_in*kh*kw): what the
    first-layer bounds above are in."""
    return g.n * g.c_out * g.oh * g.ow * g.c_in * g.kh * g.kw


def outputs_per_thread(g):
    """OPT: the most of 8, 4, 2, 1 output channels per thread that divides C_out / groups
    and whose weights (CG*kh*kw*OPT floats) fit a block's shared memory; None if none does."""
    og, cg = g.c_out // g.groups, g.c_in // g.groups
    for opt in (8, 4, 2, 1):
        if opt <= MAX_OUTPUTS_PER_THREAD and og % opt == 0 \
                and 4 * cg * g.kh * g.kw * opt <= SHARED_LIMIT:
            return opt
    return None


@functools.lru_cache(maxsize=256)
def pixel_tiling(pixels):
    """(threads per block, blocks per output plane) for an output plane of ``pixels``:
    as few tiles of at most :data:`MAX_THREADS` pixels as cover the plane, evened out,
    the threads rounded up to whole warps (a 7x7 plane: one block of 64 threads)."""
    tiles = max(1, -(-pixels // MAX_THREADS))
    threads = -(-pixels // tiles)
    return -(-threads // 32) * 32, tiles


class GroupedDirect:
    """Direct grouped convolution, forward only, bias, residual and activation fused."""

    name = "grouped_direct"
    stages = ("forward",)
    #: Also on 16-bit tensors: float32 products and epilogue, one rounding per output.
    half_precision_stages = ("forward",)
    fuses_bias_activation = True
    fuses_residual = True

    @staticmethod
    def supports(g):
        """Grouped and not depthwise, or ungrouped on at most :data:`MAX_STEM_CHANNELS`
        input channels; kernels up to 7x7, strides and dilations up to 2, and a chunk of
        output channels whose weights fit in shared memory."""
        narrow = g.groups > 1 or g.c_in <= MAX_STEM_CHANNELS
        return (narrow and not g.is_depthwise and g.kh <= MAX_KERNEL
                and g.kw <= MAX_KERNEL and max(g.stride) <= MAX_STRIDE
                and max(g.dilation) <= MAX_DILATION and outputs_per_thread(g) is not None)

    @staticmethod
    def preferred(g):
        """Groups of at most :data:`PREFERRED_GROUP_CHANNELS` input channels; an ungrouped
        layer (supported on image channels only) of at most :data:`MAX_STEM_MULTIPLY_ADDS`
        multiply-adds, or of at most :data:`MAX_ODD_PLANE_STEM_MULTIPLY_ADDS` with a window
        of at most :data:`MAX_ODD_PLANE_STEM_WINDOW` taps a side and an output plane that is
        not a multiple of 4 pixels."""
        if g.groups == 1:
            multiply_adds = stem_multiply_adds(g)
            odd_plane = ((g.oh * g.ow) % VECTOR_COLUMNS != 0
                         and max(g.kh, g.kw) <= MAX_ODD_PLANE_STEM_WINDOW)
            return multiply_adds <= (MAX_ODD_PLANE_STEM_MULTIPLY_ADDS if odd_plane
                                     else MAX_STEM_MULTIPLY_ADDS)
        return g.c_in // g.groups <= PREFERRED_GROUP_CHANNELS

    @staticmethod
    def half_preferred(g):
        """On 16-bit tensors: layers on image channels (groups 1) of at most
        :data:`MAX_HALF_STEM_MULTIPLY_ADDS` multiply-adds, and the groups :meth:`preferred`
        takes. The 16-bit alternative writes a column matrix, multiplies it (GemmEx) and
        runs the epilogue as a pass of its own; past
        :data:`~gdnflow.ops.conv.planning.MAX_HALF_GROUPS` groups it computes in float32
        and rounds."""
        if g.groups == 1:
            return stem_multiply_adds(g) <= MAX_HALF_STEM_MULTIPLY_ADDS
        return GroupedDirect.preferred(g)

    @staticmethod
    def forward(g, x, w, bias=None, activation=0, residual=None):
        """y = act(grouped_conv(x, w) + bias + residual): one launch."""
        y = cuda.empty(g.y_shape, x.dtype)
        blocks, threads, tiles, defines = _launch(g, x.dtype)
        if blocks == 0:
            return y
        kernel = cuda.kernel(SOURCE, "grouped_conv_forward", "PPPPP" + "i" * 11, defines)
        kernel((blocks, 1, 1), (threads, 1, 1), x.ptr, w.ptr,
               0 if bias is None else bias.ptr, 0 if residual is None else residual.ptr, y.ptr,
               g.c_in, g.h, g.w, g.c_out, g.oh, g.ow, g.padding[0], g.padding[2],
               g.c_out // g.groups, tiles, activation)
        return y


@functools.lru_cache(maxsize=256)
def _launch(g, dtype):
    """(blocks, threads per block, blocks per output plane, -D defines) of ``g``'s launch on
    ``dtype`` tensors, worked out once per geometry and dtype (not on every call)."""
    opt = outputs_per_thread(g)
    threads, tiles = pixel_tiling(g.oh * g.ow)
    blocks = g.n * (g.c_out // opt) * tiles if g.oh * g.ow else 0
    cuda.check_index_range(blocks, "grouped_conv_forward blocks")
    defines = (g.window_defines + (("CG", g.c_in // g.groups), ("OPT", opt))
               + cuda.storage_defines(dtype))
    return blocks, threads, tiles, defines
