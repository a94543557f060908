"""Depthwise convolution on the GPU: direct kernels in ``cuda_src/depthwise.cu``.

A depthwise convolution (groups == C_in == C_out, weight [C, 1, kh, kw])
filters each (image, channel) plane on its own::

    y[n, c, p, q] = b[c] + sum_{i,j} w[c, 0, i, j] * x[n, c, p*sh - top + i*dh, q*sw - left + j*dw]

It has kh*kw multiply-adds per output and nothing to share across channels,
so it is bound by memory traffic: the floor is one read of x and one write of
y. The NumPy reference and the operator itself are in :mod:`gdnflow.ops.conv`;
this module is one of its algorithms.

Forward (and backward-data at stride 1, which is the forward of gy with the
filter rotated by 180 degrees and padding (k-1)*d - p). A block stages whole
input rows of a strip of output rows of one or more planes into shared
memory with cp.async, contiguous runs of 16-byte copies where the layout
allows, then each thread computes RPT rows x OUT_COLS columns of outputs from
them and stores 16 bytes at a time (:func:`forward_plan` picks the tiling;
the file's header says how the kernel works).

Why the previous kernel (32x32 output tiles of 8x32 threads) was slow,
especially at stride 2 (H200, batch 64, forward: 96x112² -> 56² took 274 µs
against a 94 µs floor, 1.4 TB/s; 32x112² stride 1 157 µs against 50):
one-float loads with an integer division per element into a 65x65 tile
(1 row of halo per 32-wide tile at stride 1, 33 extra columns of every 65
at stride 2), the loads of a thread issued one after another and never in
flight together; tiles fixed at 32x32 outputs, so a 56x56 plane ran 4 tiles
of which 44% of the threads had nothing to write; stride-2 shared-memory
reads 2-way bank conflicted; one-float stores. Planes of 7x7 and 14x14
shared a block 16 or 4 to a block in tiles mostly idle.

Prediction (written before any GPU run of this version): every MobileNetV2
depthwise layer at batch 64 at 70-85% of 4.1 TB/s in kernel time, i.e.
96x112² s2 ~115 µs (was 274), 32x112² s1 ~65 (157), 144x56² s1 ~70 (175),
144x56² s2 ~45 (111), 192x28² s1 ~25 (67), 192x28² s2 ~15 (53), 384x14²
~12 (46), 576x14² s1 ~18 (59), 576x14² s2 ~11 (49), 960x7² ~8 (43), the old
times as benchmarks/results/conv.md measured them. bench_conv's per-layer
column includes ~15-20 µs of Python dispatch before the kernel starts (the
events are recorded around the Python call), so the small layers show
25-35 µs there; its "gpu ms" column (launches queued behind a busy kernel)
shows kernel time. Backward-data at stride 1 through the same kernel:
similar times instead of the old tiled kernel's (not measured before).
"""
import dataclasses
import functools
import math

from gdnflow.backends import cuda

SOURCE = "depthwise.cu"
SHARED_LIMIT = 48 * 1024        # bytes of shared memory a block may take without opting in
MAX_KERNEL = 7                  # taps per side compiled as unrolled registers
MAX_STRIDE = 2
MAX_DILATION = 2
BACKWARD_WEIGHT_BLOCK = 256     # -DDW_BWD_BLOCK
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
    return _vector(array.ptr // 4) if array.ptr % 4 == 0 else 1


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
    wider than 2048 outputs, or too tall a kernel for shared memory).

    Threads: OUT_COLS = 4 outputs across (2 for rows of 10-23, 1 below 10;
    8 past 1023), RPT = 4 rows down at stride 1, 2 at stride 2 (half the
    staged rows per thread), the whole height when it is at most 8. A block
    takes whole planes when a plane's threads and staged rows fit (several
    planes when they are small: rows of consecutive planes are one contiguous
    run), else a strip of rows of one plane as tall as 256 threads and the
    shared-memory budget allow, strips evened out. Enough planes per block to
    reach 256 threads, fewer when the grid would not reach two blocks per SM.
    """
    out_cols = 8 if ow >= 1024 else 4 if ow >= 24 else 2 if ow >= 10 else 1
    col_groups = -(-ow // out_cols)
    if col_groups > FORWARD_THREADS or planes == 0 or oh <= 0 or ow <= 0:
        return None
    rpt = oh if oh <= 8 else 4 if sh == 1 else 2

    def tile_floats(strip_rows):
        return min(h, _input_rows(strip_rows, kh, sh, dh)) * w

    row_groups = -(-oh // rpt)
    if (row_groups * col_groups > FORWARD_THREADS
            or 4 * tile_floats(oh) > FORWARD_SHARED_BYTES):
        row_groups = min(row_groups, FORWARD_THREADS // col_groups)
        while row_groups and 4 * tile_floats(row_groups * rpt) > FORWARD_SHARED_BYTES:
            row_groups -= 1
        if row_groups == 0:
            return None
        strips = -(-oh // (row_groups * rpt))
        row_groups = -(-(-(-oh // strips)) // rpt)          # even the strips out
    strip_rows = min(oh, row_groups * rpt)
    strips = -(-oh // strip_rows)
    tile = tile_floats(strip_rows)
    per_plane_threads = row_groups * col_groups
    planes_per_block = max(1, min(FORWARD_THREADS // per_plane_threads,
                                  FORWARD_SHARED_BYTES // (4 * tile), planes,
                                  planes * strips // (2 * sm_count)))
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
    from gdnflow.backends.cuda.runtime import get_runtime
    plan = forward_plan(planes, h, wd, oh, ow, kh, sh, dh, pad_top, sw, alignment(x),
                        alignment(y), get_runtime().sm_count)
    kernel = cuda.kernel(SOURCE, "depthwise_forward", "PPPP" + "i" * 14,
                         _forward_defines(plan, kh, kw, sh, sw, dh, dw, pad_left, flip))
    kernel((plan.blocks, 1, 1), (plan.threads, 1, 1), x.ptr, w.ptr,
           0 if bias is None else bias.ptr, y.ptr, planes, c, h, wd, oh, ow, pad_top,
           activation, plan.planes_per_block, plan.strip_rows, plan.strips, plan.tile_floats,
           plan.row_groups, plan.col_groups, shared_bytes=plan.shared_bytes)
    return y


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
    defines = (("KH", g.kh), ("KW", g.kw), ("SH", g.stride[0]), ("SW", g.stride[1]),
               ("DH", g.dilation[0]), ("DW", g.dilation[1]))
    return defines + ((("RPT", rpt),) if rpt is not None else ())


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
        return _run_forward(x, w, bias, cuda.empty(g.y_shape), g.n * g.c_in, g.c_in, g.h, g.w,
                            g.oh, g.ow, g.kh, g.kw, *g.stride, *g.dilation, g.padding[0],
                            g.padding[2], activation, flip=False)

    @staticmethod
    def backward_data(g, gy, w):
        """gx = the adjoint of forward in x.

        At stride 1, the forward kernel on gy with the filter rotated by 180
        degrees and padding (k-1)*d - p: gx[h] = sum_i w[i] gy[h + p - i*d]
        = sum_i' w[k-1-i'] gy[h - ((k-1)*d - p) + i'*d]. Strided: gathered
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
        from gdnflow.backends.cuda.runtime import get_runtime
        from gdnflow.ops.reduction import sum_cuda
        rows = g.n * g.oh
        taps = g.kh * g.kw
        if rows == 0:
            return get_runtime().full(g.w_shape, 0.0)
        # Aim for 8 blocks per SM in all, each with at least ~8 outputs per thread.
        wanted = math.ceil(8 * get_runtime().sm_count / g.c_in)
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
