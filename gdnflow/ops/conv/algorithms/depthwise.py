"""Depthwise convolution on the GPU: direct kernels in ``cuda_src/depthwise.cu``.

A depthwise convolution (groups == C_in == C_out, weight [C, 1, kh, kw])
filters each (image, channel) plane on its own::

    y[n, c, p, q] = b[c] + sum_{i,j} w[c, 0, i, j] * x[n, c, p*sh - top + i*dh, q*sw - left + j*dw]

It has kh*kw multiply-adds per output and nothing to share across channels,
so it is bound by memory traffic: the floor is one read of x and one write of
y. The NumPy reference and the operator are elsewhere in :mod:`gdnflow.ops.conv`;
this module is one of its algorithms.

Forward (and backward-data at stride 1, which is the forward of gy with the
filter rotated by 180 degrees and padding (k-1)*d - p). A block stages whole
input rows of a strip of output rows of one or more planes into shared
memory with cp.async, contiguous runs of 16-byte copies where the layout
allows, then each thread computes RPT rows x OUT_COLS columns of outputs from
them and stores 16 bytes at a time (:func:`forward_plan` picks the tiling;
the file's header says how the kernel works). Strided backward-data and the
weight gradient have kernels of their own. Why the kernel is built this way,
and what it measured: docs/conv.md.
"""
import dataclasses
import functools
import math

from gdnflow.backends import cuda
from gdnflow.ops.reduction import sum_cuda

SOURCE = "depthwise.cu"
SHARED_LIMIT = 48 * 1024        # bytes of shared memory a block may take without opting in
MAX_KERNEL = 7                  # taps per side compiled as unrolled registers
MAX_STRIDE = 2
MAX_DILATION = 2
BACKWARD_WEIGHT_BLOCK = 256     # -DDW_BWD_BLOCK
cuda.declare_variants(SOURCE)   # every module is built for a shape: none known ahead
#: Threads per forward block at most (DW_MAX_THREADS in depthwise.cu).
FORWARD_THREADS = 256
#: Shared memory one forward block stages (bytes). 32 KB lets 6-7 blocks share
#: an SM's 228 KB, each with its copies in flight: ~200 KB of loads per SM
#: against the ~25 KB that 4.1 TB/s at ~1 µs latency needs.
FORWARD_SHARED_BYTES = 32 * 1024


@dataclasses.dataclass(frozen=True)
class ForwardPlan:
    """The tiling of one depthwise_forward launch (the kernel's arguments and -D values).

    A block: ``planes_per_block`` planes x a strip of ``strip_rows`` output
    rows (``strips`` strips per plane), ``tile_floats`` staged floats per
    plane; ``row_groups`` x ``col_groups`` threads per plane, each RPT rows x
    ``out_cols`` columns of outputs. ``vec_copy``, ``vec_in``, ``vec_out``:
    floats per staging copy, per shared-memory read of a thread's own
    columns, per store.
    """

    rpt: int
    out_cols: int
    vec_copy: int
    vec_in: int
    vec_out: int
    planes_per_block: int
    strip_rows: int
    strips: int
    tile_floats: int
    row_groups: int
    col_groups: int
    threads: int
    blocks: int

    @property
    def shared_bytes(self):
        """Dynamic shared memory of a block."""
        return 4 * self.planes_per_block * self.tile_floats


def _vector(*lengths):
    """The widest of 4, 2, 1 floats that divides every length."""
    return next(v for v in (4, 2, 1) if all(n % v == 0 for n in lengths))


def alignment(array):
    """Floats (4, 2 or 1) the array's address is aligned to."""
    ptr = array.ptr      # arithmetic, not _vector: this runs on every launch
    return 4 if ptr % 16 == 0 else 2 if ptr % 8 == 0 else 1


def _input_rows(rows, k, s, d):
    """Input rows a run of ``rows`` output rows reads."""
    return (rows - 1) * s + (k - 1) * d + 1


@functools.lru_cache(maxsize=1024)
def forward_plan(planes, h, w, oh, ow, kh, sh, dh, pad_top, sw, x_align=1, y_align=1,
                 sm_count=132):
    """The :class:`ForwardPlan` of depthwise_forward for x [planes, h, w] -> y [planes, oh, ow].

    ``kh``, ``sh``, ``dh``, ``pad_top``: the kernel, stride, dilation and
    padding along the height; ``sw`` the stride along the width (a thread's
    own input columns are out_cols * sw); ``x_align``, ``y_align``: floats
    the arrays' addresses are aligned to. None if no tiling fits (a row
    wider than 4096 outputs, or rows too wide for even one thread's rows to
    fit in 48 KB: a 7x7 kernel at stride 2 on rows of 1920).

    Threads: OUT_COLS = 4 outputs across (2 for rows of 10-23, 1 below 10;
    8 past 1023, 16 past 2047), RPT = 4 rows down at stride 1, 2 at stride 2
    (half the staged rows per thread), the whole height when it is at most 8,
    fewer when the rows are so wide that RPT of them do not fit. A block
    takes whole planes when a plane's threads and staged rows fit (several
    planes when they are small: rows of consecutive planes are one contiguous
    run), else a strip of rows of one plane as tall as 256 threads and the
    shared-memory budget allow, strips evened out. Enough planes per block to
    reach 256 threads, fewer when the grid would not reach two blocks per SM.
    The budget is :data:`FORWARD_SHARED_BYTES`, or the 48 KB limit for rows
    too wide for it.
    """
    for budget in (FORWARD_SHARED_BYTES, SHARED_LIMIT):
        plan = _plan_within(budget, planes, h, w, oh, ow, kh, sh, dh, pad_top, sw, x_align,
                            y_align, sm_count)
        if plan is not None:
            return plan
    return None


def _plan_within(budget, planes, h, w, oh, ow, kh, sh, dh, pad_top, sw, x_align, y_align,
                 sm_count):
    """:func:`forward_plan` with at most ``budget`` bytes of shared memory per block."""
    out_cols = 16 if ow >= 2048 else 8 if ow >= 1024 else 4 if ow >= 24 else 2 if ow >= 10 else 1
    col_groups = -(-ow // out_cols)
    if col_groups > FORWARD_THREADS or planes == 0 or oh <= 0 or ow <= 0:
        return None
    rpt = oh if oh <= 8 else 4 if sh == 1 else 2

    def tile_floats(strip_rows):
        return min(h, _input_rows(strip_rows, kh, sh, dh)) * w

    while rpt > 1 and 4 * tile_floats(rpt) > budget:         # very wide rows
        rpt //= 2

    row_groups = -(-oh // rpt)
    if row_groups * col_groups > FORWARD_THREADS or 4 * tile_floats(oh) > budget:
        row_groups = min(row_groups, FORWARD_THREADS // col_groups)
        while row_groups and 4 * tile_floats(row_groups * rpt) > budget:
            row_groups -= 1
        if row_groups == 0:
            return None
        strips = -(-oh // (row_groups * rpt))
        rows_per_strip = -(-oh // strips)                   # even the strips out
        row_groups = -(-rows_per_strip // rpt)
    strip_rows = min(oh, row_groups * rpt)
    strips = -(-oh // strip_rows)
    tile = tile_floats(strip_rows)
    per_plane_threads = row_groups * col_groups
    planes_per_block = max(1, min(FORWARD_THREADS // per_plane_threads, budget // (4 * tile),
                                  planes, planes * strips // (2 * sm_count)))
    # Whole planes staged (one strip from row 0 to row h): the copy of a
    # block is one contiguous run, so only h*w must divide into vectors.
    first, last = -pad_top, (oh - 1) * sh - pad_top + (kh - 1) * dh
    whole = strips == 1 and first <= 0 and last >= h - 1
    vec_copy = _vector(h * w if whole else w, x_align)
    vec_in = _vector(out_cols * sw, w)
    vec_out = _vector(out_cols, ow, y_align)
    threads = -(-planes_per_block * per_plane_threads // 32) * 32
    blocks = -(-planes // planes_per_block) * strips
    return ForwardPlan(rpt, out_cols, vec_copy, vec_in, vec_out, planes_per_block, strip_rows,
                       strips, tile, row_groups, col_groups, threads, blocks)


def _forward_defines(plan, kh, kw, sh, sw, dh, dw, pad_left, flip):
    return (("KH", kh), ("KW", kw), ("SH", sh), ("SW", sw), ("DH", dh), ("DW", dw),
            ("RPT", plan.rpt), ("OUT_COLS", plan.out_cols), ("PAD_LEFT", pad_left),
            ("VEC_COPY", plan.vec_copy), ("VEC_IN", plan.vec_in), ("VEC_OUT", plan.vec_out),
            ("FLIP", int(flip)))


def _run_forward(x, w, bias, y, planes, c, h, wd, oh, ow, kh, kw, sh, sw, dh, dw, pad_top,
                 pad_left, activation, flip):
    """y <- depthwise_forward(x) for x [planes, h, wd] and y [planes, oh, ow] (see depthwise.cu)."""
    plan, defines = _forward_variant(planes, h, wd, oh, ow, kh, kw, sh, sw, dh, dw, pad_top,
                                     pad_left, flip, alignment(x), alignment(y), cuda.sm_count(),
                                     x.dtype)
    kernel = cuda.kernel(SOURCE, "depthwise_forward", "PPPP" + "i" * 14, defines)
    kernel((plan.blocks, 1, 1), (plan.threads, 1, 1), x.ptr, w.ptr,
           0 if bias is None else bias.ptr, y.ptr, planes, c, h, wd, oh, ow, pad_top,
           activation, plan.planes_per_block, plan.strip_rows, plan.strips, plan.tile_floats,
           plan.row_groups, plan.col_groups,
           shared_bytes=plan.shared_bytes * x.dtype.itemsize // 4)
    return y


@functools.lru_cache(maxsize=1024)
def _forward_variant(planes, h, wd, oh, ow, kh, kw, sh, sw, dh, dw, pad_top, pad_left, flip,
                     x_align, y_align, sm_count, dtype):
    """(plan, defines) of a depthwise_forward launch, cached per shape, alignment, SM count
    and dtype (planning and building the defines tuple cost host time on every call).

    The plan is the float32 one for 16-bit tensors too: the tile in shared memory
    then holds 16-bit values, in half the bytes (the launch asks for those), and
    16-bit addresses aligned to N floats' offsets are aligned for N 16-bit values."""
    plan = forward_plan(planes, h, wd, oh, ow, kh, sh, dh, pad_top, sw, x_align, y_align,
                        sm_count)
    return plan, (_forward_defines(plan, kh, kw, sh, sw, dh, dw, pad_left, flip)
                  + cuda.storage_defines(dtype))


def _backward_data_padding(g):
    """(top, left) padding of backward-data as a forward at stride 1: (k-1)*d - p (may be < 0)."""
    return ((g.kh - 1) * g.dilation[0] - g.padding[0], (g.kw - 1) * g.dilation[1] - g.padding[2])


@functools.lru_cache(maxsize=256)
def tiles(out_h, out_w):
    """Block shape (bx, by, bz) and outputs per thread (rpt) of the strided backward-data kernel.

    A block is 256 threads: bz planes, each a tile bx wide and by*rpt tall.
    The tile is the smallest of 8x8, 16x16, 32x32 that is not much narrower
    than the plane; small planes share a block.
    """
    if out_w > 16:
        bx, by, rpt = 32, 8, 4
    elif out_w > 8:
        bx, by, rpt = 16, 4, 4
    else:
        bx, by, rpt = 8, 4, 2
    return bx, by, 256 // (bx * by), rpt


def _gy_extent(tile, k, s, d):
    """gy entries along one axis a tile of ``tile`` gx entries reads; gy_extent in depthwise.cu."""
    return (tile - 1 + (k - 1) * d + s - 1) // s + 1


def _defines(g, rpt=None):
    return g.window_defines + ((("RPT", rpt),) if rpt is not None else ())


def _backward_shared_bytes(g, bx, by, bz, rpt):
    return 4 * bz * (_gy_extent(by * rpt, g.kh, g.stride[0], g.dilation[0])
                     * _gy_extent(bx, g.kw, g.stride[1], g.dilation[1]))


class Depthwise:
    """Direct depthwise kernels: forward (bias, activation fused), backward-data, backward-weight.

    Supports kernels up to 7x7, strides 1-2 and dilations 1-2 per axis (each
    combination is its own compiled variant); anything else goes to im2col +
    GEMM.
    """

    name = "depthwise"
    fuses_bias_activation = True
    #: The stages whose kernels also take 16-bit tensors (the module built for them).
    half_precision_stages = ("forward",)

    @staticmethod
    def supports(g):
        """Depthwise geometries within the compiled limits whose tiles fit in shared memory."""
        if not (g.is_depthwise and g.kh <= MAX_KERNEL and g.kw <= MAX_KERNEL
                and max(g.stride) <= MAX_STRIDE and max(g.dilation) <= MAX_DILATION):
            return False
        (sh, sw), (dh, _) = g.stride, g.dilation
        planes = g.n * g.c_in
        if forward_plan(planes, g.h, g.w, g.oh, g.ow, g.kh, sh, dh, g.padding[0], sw) is None:
            return False
        if g.stride == (1, 1):
            top, _ = _backward_data_padding(g)
            return forward_plan(planes, g.oh, g.ow, g.h, g.w, g.kh, 1, dh, top, 1) is not None
        return _backward_shared_bytes(g, *tiles(g.h, g.w)) <= SHARED_LIMIT

    @staticmethod
    def forward(g, x, w, bias=None, activation=0):
        """y = act(depthwise(x, w) + bias): one pass over x, one over y."""
        return _run_forward(x, w, bias, cuda.empty(g.y_shape, x.dtype), g.n * g.c_in, g.c_in, g.h, g.w,
                            g.oh, g.ow, g.kh, g.kw, *g.stride, *g.dilation, g.padding[0],
                            g.padding[2], activation, flip=False)

    @staticmethod
    def backward_data(g, gy, w):
        """gx = the adjoint of forward in x.

        At stride 1, the forward kernel on gy with the filter rotated by 180
        degrees and padding ``(k-1)*d - p``: ``gx[h] = sum_i w[i] gy[h + p - i*d]
        = sum_i' w[k-1-i'] gy[h - ((k-1)*d - p) + i'*d]``. Strided: gathered
        per gx element by depthwise_backward_data (tiled over gx).
        """
        gx = cuda.empty(g.x_shape)
        planes = g.n * g.c_in
        if g.stride == (1, 1):
            top, left = _backward_data_padding(g)
            return _run_forward(gy, w, None, gx, planes, g.c_in, g.oh, g.ow, g.h, g.w, g.kh, g.kw,
                                1, 1, *g.dilation, top, left, 0, flip=True)
        bx, by, bz, rpt = tiles(g.h, g.w)
        kernel = cuda.kernel(SOURCE, "depthwise_backward_data", "PPP" + "i" * 8,
                             _defines(g, rpt))
        grid = (math.ceil(planes / bz), math.ceil(g.w / bx), math.ceil(g.h / (by * rpt)))
        kernel(grid, (bx, by, bz), gy.ptr, w.ptr, gx.ptr, planes, g.c_in, g.h, g.w, g.oh, g.ow,
               g.padding[0], g.padding[2],
               shared_bytes=_backward_shared_bytes(g, bx, by, bz, rpt))
        return gx

    @staticmethod
    def backward_weight(g, x, gy):
        """gw[c, 0, i, j] = sum over n, p, q of gy * x under tap (i, j).

        Each (channel, split) block sums a contiguous range of output rows;
        enough splits that the grid fills the GPU even at batch 1, and the
        partials are added by a second reduction (deterministic, no atomics).
        """
        rows = g.n * g.oh
        taps = g.kh * g.kw
        if rows == 0:
            return cuda.zeros(g.w_shape)
        # Aim for 8 blocks per SM in all, each with at least ~8 outputs per thread.
        wanted = math.ceil(8 * cuda.sm_count() / g.c_in)
        most = max(1, rows * g.ow // (8 * BACKWARD_WEIGHT_BLOCK))
        rows_per_split = math.ceil(rows / max(1, min(wanted, most)))
        splits = math.ceil(rows / rows_per_split)
        partial = cuda.empty((splits, g.c_in * taps))
        kernel = cuda.kernel(SOURCE, "depthwise_backward_weight", "PPP" + "i" * 9,
                             _defines(g) + (("DW_BWD_BLOCK", BACKWARD_WEIGHT_BLOCK),))
        kernel((g.c_in, splits, 1), (BACKWARD_WEIGHT_BLOCK, 1, 1), x.ptr, gy.ptr, partial.ptr,
               g.n, g.c_in, g.h, g.w, g.oh, g.ow, g.padding[0], g.padding[2], rows_per_split)
        if splits == 1:
            return partial.reshape(g.w_shape)
        return sum_cuda(partial, (0,), 1.0).reshape(g.w_shape)
