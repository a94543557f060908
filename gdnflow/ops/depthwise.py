"""Depthwise convolution on the GPU: direct kernels in ``cuda_src/depthwise.cu``.

A depthwise convolution (groups == C_in == C_out, weight [C, 1, kh, kw])
filters each (image, channel) plane on its own::

    y[n, c, p, q] = b[c] + sum_{i,j} w[c, 0, i, j] * x[n, c, p*sh - top + i*dh, q*sw - left + j*dw]

It has kh*kw multiply-adds per output and nothing to share across channels,
so it is bound by memory traffic, not arithmetic: the kernels stage each
input tile once in shared memory, keep the plane's weights in registers and
compute several outputs per thread. The NumPy reference and the operator
itself are in :mod:`gdnflow.ops.conv`; this module is one of its algorithms.
"""
import functools
import math

from gdnflow.backends import cuda

SOURCE = "depthwise.cu"
SHARED_LIMIT = 48 * 1024        # bytes of shared memory a block may take without opting in
MAX_KERNEL = 7                  # taps per side compiled as unrolled registers
MAX_STRIDE = 2
MAX_DILATION = 2
BACKWARD_WEIGHT_BLOCK = 256     # -DDW_BWD_BLOCK


@functools.lru_cache(maxsize=256)
def tiles(out_h, out_w):
    """Block shape (bx, by, bz) and outputs per thread (rpt) for an out_h x out_w plane.

    A block is 256 threads: bz planes, each a tile bx wide and by*rpt tall.
    The tile is the smallest of 8x8, 16x16, 32x32 that is not much narrower
    than the plane, so the 7x7 and 14x14 planes of MobileNetV2's last stages
    do not leave most of a 32-wide tile idle; small planes share a block.
    """
    if out_w > 16:
        bx, by, rpt = 32, 8, 4
    elif out_w > 8:
        bx, by, rpt = 16, 4, 4
    else:
        bx, by, rpt = 8, 4, 2
    return bx, by, 256 // (bx * by), rpt


def _extent(tile, k, s, d):
    """Inputs along one axis that a tile of ``tile`` outputs reads (forward)."""
    return (tile - 1) * s + (k - 1) * d + 1


def _gy_extent(tile, k, s, d):
    """gy entries along one axis a tile of ``tile`` gx entries reads; gy_extent in depthwise.cu."""
    return (tile - 1 + (k - 1) * d + s - 1) // s + 1


def _defines(g, rpt=None):
    defines = (("KH", g.kh), ("KW", g.kw), ("SH", g.stride[0]), ("SW", g.stride[1]),
               ("DH", g.dilation[0]), ("DW", g.dilation[1]))
    return defines + ((("RPT", rpt),) if rpt is not None else ())


def _forward_shared_bytes(g, bx, by, bz, rpt):
    return 4 * bz * (_extent(by * rpt, g.kh, g.stride[0], g.dilation[0])
                     * _extent(bx, g.kw, g.stride[1], g.dilation[1]))


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
        forward_tiles, backward_tiles = tiles(g.oh, g.ow), tiles(g.h, g.w)
        return (_forward_shared_bytes(g, *forward_tiles) <= SHARED_LIMIT
                and _backward_shared_bytes(g, *backward_tiles) <= SHARED_LIMIT)

    @staticmethod
    def forward(g, x, w, bias=None, activation=0):
        """y = act(depthwise(x, w) + bias): one pass over x, one over y."""
        bx, by, bz, rpt = tiles(g.oh, g.ow)
        y = cuda.empty(g.y_shape)
        planes = g.n * g.c_in
        kernel = cuda.kernel(SOURCE, "depthwise_forward", "PPPP" + "i" * 9, _defines(g, rpt))
        grid = (math.ceil(planes / bz), math.ceil(g.ow / bx), math.ceil(g.oh / (by * rpt)))
        kernel(grid, (bx, by, bz), x.ptr, w.ptr, 0 if bias is None else bias.ptr, y.ptr,
               planes, g.c_in, g.h, g.w, g.oh, g.ow, g.padding[0], g.padding[2], activation,
               shared_bytes=_forward_shared_bytes(g, bx, by, bz, rpt))
        return y

    @staticmethod
    def backward_data(g, gy, w):
        """gx = the adjoint of forward in x, gathered per gx element (tiled over gx)."""
        bx, by, bz, rpt = tiles(g.h, g.w)
        gx = cuda.empty(g.x_shape)
        planes = g.n * g.c_in
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
