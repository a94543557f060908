"""Winograd convolution F(m x m, 3 x 3) on the GPU: 3x3 kernels, stride 1, dilation 1, groups 1.

Kernels in ``cuda_src/winograd.cu``; the GEMM is cuBLAS's, through
:func:`gdnflow.backends.cuda.matmul`. With alpha = m + 2 and the matrices of
:data:`TRANSFORMS` (B^T alpha x alpha, G alpha x 3, A^T m x alpha), one m x m
output tile of image n, output channel o is::

    Y = A^T [ sum_c (G g[o, c] G^T) .* (B^T d[n, c] B) ] A

with d[n, c] the alpha x alpha input tile under it (zeros outside the
input). Four steps over the whole batch:

1. filter transform  U[xi] [C_out, C_in]  = (G g G^T)[xi] for each (o, c)
2. input transform   V[xi] [C_in, tiles]  = (B^T d B)[xi] for each (c, tile)
3. alpha^2 GEMMs     M[xi] [C_out, tiles] = U[xi] @ V[xi]   (one strided-batched cuBLAS call)
4. output transform  y tile = act(A^T M A + bias + residual), written as NCHW

(2-4 per chunk of tiles, within ``settings.conv_workspace_bytes`` for V and
M.) The backward-data pass is the same algorithm: gx is the convolution of gy
with the filter rotated by 180 degrees and its channel axes swapped, padded
by 2 - top on top and 2 - left on the left (a negative value crops). The
weight gradient stays with im2col + GEMM
(:class:`~gdnflow.ops.conv.algorithms.im2col.Im2colGemm`).

F(2x2) does 2.25x fewer multiply-adds than direct convolution, F(4x4) 4x
fewer; the price is the transforms' memory traffic, and F(4x4)'s float32
error is larger (still well inside gdnflow's 1e-4). U is recomputed on every
call, except inside :func:`gdnflow.backends.cuda.weight_cache.frozen_weights`
(inference), where each weight's U is computed once. Error measurements,
predictions and timings: docs/conv.md.
"""
import dataclasses
import functools

import numpy as np

from gdnflow.backends import cuda
from gdnflow.backends.cuda.weight_cache import weight_cache
from gdnflow.config import settings
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm
from gdnflow.ops.conv.geometry import FLOAT_BYTES

SOURCE = "winograd.cu"

#: The heuristic prefers F(4x4) when min(C_in, C_out) >= MIN_CHANNELS, C_in *
#: C_out >= MIN_CHANNEL_PRODUCT and N*OH*OW >= MIN_PIXELS (see
#: :meth:`WinogradF4.preferred`). The transforms move (C_in + C_out) floats per
#: pixel for 6.75 C_in C_out multiply-adds saved, so few channels gain little;
#: 64*64 (VGG16's second layer) gains too (docs/conv.md).
MIN_CHANNELS = 64
MIN_CHANNEL_PRODUCT = 64 * 64
#: Below this many output pixels the filter transform (a pass over U, which is
#: 4x the weight) is not paid back by the GEMM saved: batch-1 14x14 layers stay
#: on im2col.
MIN_PIXELS = 512
#: Narrower layers (min(C_in, C_out) >= NARROW_CHANNELS) on at least NARROW_PIXELS
#: output pixels prefer F(4x4) too: measured on the H200 (batch 32, autotune
#: against the heuristic's im2col choices), DenseNet-121's 128->32 layers took
#: 160 µs in F(4x4) against 579 µs at 56x56 (100,352 pixels) and 112 against
#: 160 at 28x28 (25,088), Inception v3's 32->32 at 149x149 350 against 1102;
#: at 14x14 (6,272 pixels) im2col kept the lead (61 against 101).
NARROW_CHANNELS = 32
NARROW_PIXELS = 24576

#: m -> (B^T, G, A^T) of F(m x m, 3 x 3), float64; cuda_src/winograd.cu writes
#: the same matrices out as code. Points 0, 1, -1 (and 2, -2 for m = 4) and
#: infinity (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
TRANSFORMS = {
    2: (np.array([[1, 0, -1, 0],
                  [0, 1, 1, 0],
                  [0, -1, 1, 0],
                  [0, 1, 0, -1]], np.float64),
        np.array([[1, 0, 0],
                  [1 / 2, 1 / 2, 1 / 2],
                  [1 / 2, -1 / 2, 1 / 2],
                  [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 0],
                  [0, 1, -1, -1]], np.float64)),
    4: (np.array([[4, 0, -5, 0, 1, 0],
                  [0, -4, -4, 1, 1, 0],
                  [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0],
                  [0, 4, 0, -5, 0, 1]], np.float64),
        np.array([[1 / 4, 0, 0],
                  [-1 / 6, -1 / 6, -1 / 6],
                  [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6],
                  [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 1, 1, 0],
                  [0, 1, -1, 2, -2, 0],
                  [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], np.float64)),
}


# ----------------------------------------------------------------- tiling --
@dataclasses.dataclass(frozen=True)
class WinogradTiling:
    """The index arithmetic of one Winograd pass (what winograd.cu's kernels are given).

    The pass computes ``y[n, o, p, q] = sum_{c,i,j} u[o, c, i, j] *
    x[n, c, p - pad_top + i, q - pad_left + j]`` for x [N, C_x, H_x, W_x] (zero
    outside) and y [N, C_y, H_y, W_y]. y is cut into ``tiles_h x tiles_w``
    tiles of m x m per image; tile t = (n * tiles_h + th) * tiles_w + tw reads
    x rows th*m - pad_top .. th*m - pad_top + m + 1 (and columns likewise).
    """

    m: int
    n: int
    c_x: int
    h_x: int
    w_x: int
    c_y: int
    h_y: int
    w_y: int
    pad_top: int
    pad_left: int

    @property
    def alpha(self):
        """Side of a transformed tile: m + 2."""
        return self.m + 2

    @property
    def tiles_h(self):
        """Tile rows per image: ceil(H_y / m) (the last may overhang)."""
        return -(-self.h_y // self.m)

    @property
    def tiles_w(self):
        """Tile columns per image: ceil(W_y / m)."""
        return -(-self.w_y // self.m)

    @property
    def tiles(self):
        """Tiles in the batch."""
        return self.n * self.tiles_h * self.tiles_w

    @functools.lru_cache(maxsize=1024)
    def chunks(self, workspace_bytes):
        """[(first tile, tile count)] covering every tile in near-equal chunks.

        A chunk of k tiles takes alpha^2 (C_x + C_y) k floats of V and M; at
        least one tile per chunk whatever the bound. Cached (a tuple): called
        on every pass.
        """
        if self.tiles == 0:
            return ()
        per_tile = FLOAT_BYTES * self.alpha ** 2 * (self.c_x + self.c_y)
        most = max(1, workspace_bytes // per_tile)
        count = -(-self.tiles // most)
        size = -(-self.tiles // count)
        return tuple((t0, min(size, self.tiles - t0)) for t0 in range(0, self.tiles, size))


@functools.lru_cache(maxsize=1024)
def tiling(g, m, stage):
    """The :class:`WinogradTiling` of ``stage`` ("forward" or "backward_data") of geometry g.

    forward:        x -> y, C_x = C_in, padding (top, left) as given.
    backward_data:  gy -> gx, C_x = C_out, H_x x W_x = OH x OW, H_y x W_y = H x W,
                    padding (2 - top, 2 - left): gx[h] = sum_i gy[h + top - i] w[i]
                    = sum_i' gy[h - (2 - top) + i'] w[2 - i'].
    """
    top, left = g.padding[0], g.padding[2]
    if stage == "forward":
        return WinogradTiling(m, g.n, g.c_in, g.h, g.w, g.c_out, g.oh, g.ow, top, left)
    if stage == "backward_data":
        return WinogradTiling(m, g.n, g.c_out, g.oh, g.ow, g.c_in, g.h, g.w, 2 - top, 2 - left)
    raise ValueError(f"winograd: no {stage!r} pass (forward or backward_data)")


def supports(g):
    """3x3 kernel, stride 1, dilation 1, groups 1 (any padding, any size)."""
    return (g.kh == g.kw == 3 and g.stride == (1, 1) and g.dilation == (1, 1)
            and g.groups == 1)


# ------------------------------------------------------ filter transforms --
def filter_transform(w, m, c_y, c_x, flip):
    """U [alpha^2, C_y, C_x] = G g G^T per channel pair, on the GPU.

    flip False: w [C_y, C_x, 3, 3], g = w[o, c] (forward). flip True: w
    [C_x, C_y, 3, 3], g = w[c, o] rotated by 180 degrees (backward-data).
    """
    def transform():
        u = cuda.empty(((m + 2) ** 2, c_y, c_x))
        cuda.kernel(SOURCE, f"winograd_filter_f{m}", "PPiii").launch(
            c_y * c_x, w.ptr, u.ptr, c_y, c_x, int(flip))
        return u
    return weight_cache.derived(("winograd", m, flip), w, transform)


# ------------------------------------------------------------------ passes --
@dataclasses.dataclass(frozen=True)
class PhaseView:
    """A pass's input or output seen as the phase split of a real tensor
    [N, ``channels``, ``h``, ``w``] (see winograd.cu): pass channel
    (rh * sw + rw) * channels + c, cell (i, j) is the real element
    (c, i * sh + rh, j * sw + rw). :mod:`~gdnflow.ops.conv.algorithms.subpixel` passes these."""

    channels: int
    sh: int
    sw: int
    h: int
    w: int


def _view_args(view, channels, h, w):
    """The (C0, SH, SW, HS, WS) kernel arguments of ``view``, or of no view."""
    if view is None:
        return channels, 1, 1, h, w
    return view.channels, view.sh, view.sw, view.h, view.w


def _winograd_pass(t, x, u, bias=None, residual=None, activation=0, input_phases=None,
                   output_phases=None):
    """y [N, C_y, H_y, W_y] for tiling t from x and the transformed filter u (see winograd.cu).

    With ``input_phases`` / ``output_phases`` (:class:`PhaseView`), x / y
    (and the residual) are the real tensors whose phase split the pass reads
    / writes; y then has the real shape and the bias is per real channel.
    """
    x_view = _view_args(input_phases, t.c_x, t.h_x, t.w_x)
    y_view = _view_args(output_phases, t.c_y, t.h_y, t.w_y)
    y = cuda.empty((t.n, y_view[0], y_view[3], y_view[4]))
    chunks = t.chunks(settings.conv_workspace_bytes)
    if not chunks:
        return y
    m, alpha2 = t.m, t.alpha ** 2
    size = max(count for _, count in chunks)
    cuda.check_index_range(alpha2 * max(t.c_x, t.c_y) * size, "winograd workspace")
    cuda.check_index_range(max(x.size, y.size), "winograd input/output")
    v = cuda.empty((alpha2 * t.c_x * size,))
    mm = cuda.empty((alpha2 * t.c_y * size,))
    # Whole rows of a tile in one vector store: every tile inside the width
    # and every row start aligned to m floats.
    vector = int(output_phases is None and t.w_y % m == 0 and y.ptr % (FLOAT_BYTES * m) == 0
                 and (residual is None or residual.ptr % (FLOAT_BYTES * m) == 0))
    forward_input = cuda.kernel(SOURCE, f"winograd_input_f{m}", "PP" + "i" * 12)
    forward_output = cuda.kernel(SOURCE, f"winograd_output_f{m}", "PPPP" + "i" * 12)
    for t0, count in chunks:
        forward_input.launch(t.c_x * count, x.ptr, v.ptr, t.c_x, *x_view, t.tiles_h,
                             t.tiles_w, t0, count, t.pad_top, t.pad_left)
        cuda.matmul(u.ptr, v.ptr, mm.ptr, t.c_y, count, t.c_x, batch=alpha2,
                    stride_a=t.c_y * t.c_x, stride_b=t.c_x * count, stride_c=t.c_y * count)
        forward_output.launch(t.c_y * count, mm.ptr, 0 if bias is None else bias.ptr,
                              0 if residual is None else residual.ptr, y.ptr, t.c_y, *y_view,
                              t.tiles_h, t.tiles_w, t0, count, activation, vector)
    return y


class _Winograd:
    """F(m x m, 3 x 3): forward and backward-data by Winograd, weight gradient by im2col."""

    m = None
    stages = ("forward", "backward_data")
    fuses_bias_activation = True
    fuses_residual = True
    #: Reads / writes phase views (:class:`PhaseView`) for the sub-pixel rewrite.
    reads_phases = True

    @staticmethod
    def supports(g):
        """3x3, stride 1, dilation 1, groups 1."""
        return supports(g)

    @classmethod
    def forward(cls, g, x, w, bias=None, activation=0, residual=None, output_phases=None):
        """y = act(conv(x, w) + bias + residual), the epilogue fused into the output
        transform; y written through ``output_phases`` (a :class:`PhaseView`) if given."""
        return _winograd_pass(tiling(g, cls.m, "forward"), x,
                              filter_transform(w, cls.m, g.c_out, g.c_in, flip=False),
                              bias, residual, activation, output_phases=output_phases)

    @classmethod
    def backward_data(cls, g, gy, w, input_phases=None, bias=None, activation=0):
        """gx = conv(gy, w rotated 180 degrees with its channel axes swapped), padding 2 - p;
        gy read through ``input_phases`` (a :class:`PhaseView`) if given. ``bias`` and
        ``activation``: an epilogue fused into the output transform (the sub-pixel
        rewrite's forward uses this pass as a forward)."""
        return _winograd_pass(tiling(g, cls.m, "backward_data"), gy,
                              filter_transform(w, cls.m, g.c_in, g.c_out, flip=True),
                              bias, None, activation, input_phases=input_phases)

    @staticmethod
    def backward_weight(g, x, gy):
        """im2col + GEMM (the planner does not ask Winograd for this stage)."""
        return Im2colGemm.backward_weight(g, x, gy)


class WinogradF4(_Winograd):
    """F(4x4, 3x3): 4x fewer multiplications than direct; the heuristic's choice for wide layers."""

    name = "winograd_4x4"
    m = 4

    @staticmethod
    def preferred(g):
        """Enough channels and pixels to pay for the transforms (see MIN_* and NARROW_*
        above)."""
        pixels = g.n * g.oh * g.ow
        wide = (min(g.c_in, g.c_out) >= MIN_CHANNELS
                and g.c_in * g.c_out >= MIN_CHANNEL_PRODUCT and pixels >= MIN_PIXELS)
        return wide or (min(g.c_in, g.c_out) >= NARROW_CHANNELS and pixels >= NARROW_PIXELS)


class WinogradF2(_Winograd):
    """F(2x2, 3x3): 2.25x fewer multiplications, more transform traffic; chosen by autotune only."""

    name = "winograd_2x2"
    m = 2

    @staticmethod
    def preferred(g):
        """Never by heuristic: F(4x4) moves fewer bytes and multiplies less."""
        return False

