"""Strided convolutions as stride-1 convolutions on a sub-pixel grid (CUDA).

Kernels: ``cuda_src/subpixel.cu``. A conv2d C with stride s (groups 1,
dilation 1), x [N, C_x, H, W] -> y [N, C_y, OH, OW], w [C_y, C_x, kh, kw],
is rewritten around a stride-1 convolution C' whose input is y's space and
whose output is x split into its s_h * s_w phases::

    x'[n, (rh*sw + rw)*C_x + c, qh, qw] = x[n, c, qh*sh + rh, qw*sw + rw]

(zero past the edge), a tensor [N, sh*sw*C_x, ceil(H/sh), ceil(W/sw)]. Then

    C.backward_data(gy, w) = interleave(C'.forward(gy, w'))         (conv_transpose2d's forward)
    C.forward(x, w)        = C'.backward_data(split(x), w')         (its adjoint)

so both run as stride-1 convolutions, and C' takes the stride-1 3x3 paths
(Winograd F(4x4, 3x3)) where C (5x5 / 2, the GDN autoencoders' layers) had
only im2col + GEMM, whose column matrix is 25 floats per pixel and channel.
Winograd's transforms read x' and write x through a phase view of x
(:class:`~gdnflow.ops.conv.algorithms.winograd.PhaseView`), so split and
interleave then cost no pass of their own; the kernels of this module do
them for any other inner algorithm. C's algorithm is chosen by the planner
the :class:`Subpixel` instance is bound to.

Index arithmetic, one axis (stride s, C's padding p before, kernel k). C's
backward-data sends y[o] * w[kk] to x[o*s - p + kk]. Write x's index as
s*q + r (phase r, cell q) and r + p = s*a + b (0 <= b < s): then
kk = s*m + b and o = q + a - m, so phase r of x gets the taps
kk = b, b + s, ... < k (M_r of them, m = 0 .. M_r - 1) from y[q + a - m]. As
a stride-1 correlation over y with padding P before, tap t reads y[q - P + t],
so t = a + P - m. With P = max_r (M_r - 1 - a_r) (at least 0) every t is
>= 0, and ``taps`` = max_r a_r + P + 1 covers them all; w'[r, t] =
w[s*(a_r + P - t) + b_r], zero where that m is out of [0, M_r). C' produces
ceil(H/s) cells per phase, which fixes its padding after. For 5x5 / 2 with
padding 2, P = 1 and taps = 3: w' is [4 C_x, C_y, 3, 3], 36 taps of which 25
are w's. C' is supported when that padding after is not negative.

The heuristic prefers this path where C' would run F(4x4)
(:meth:`Subpixel.preferred`; its cost against im2col + GEMM: docs/conv.md);
autotune times it against the others. The weight gradient stays with
im2col + GEMM.
"""
import dataclasses
import functools

from gdnflow.backends import cuda
from gdnflow.backends.cuda.weight_cache import weight_cache
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm
from gdnflow.ops.conv.algorithms.winograd import PhaseView, WinogradF4
from gdnflow.ops.conv.epilogue import epilogue_cuda
from gdnflow.ops.conv.geometry import ConvGeometry

SOURCE = "subpixel.cu"


@dataclasses.dataclass(frozen=True)
class AxisSplit:
    """One axis of the rewrite: C's ``stride``, ``pad`` (before) and ``kernel``;
    C' has ``taps`` taps, padding ``inner_pad`` before and ``inner_pad_after``
    after, and ``cells`` = ceil(size / stride) outputs per phase."""

    stride: int
    pad: int
    kernel: int
    taps: int
    inner_pad: int
    inner_pad_after: int
    cells: int


def split_axis(size, out_size, kernel, stride, pad):
    """The :class:`AxisSplit` of an axis of ``size`` input and ``out_size``
    output pixels (see the module docstring), or None if C' would need a
    negative padding after."""
    phases = []                                 # (a_r, M_r) for the phases that get taps
    for r in range(stride):
        a, b = divmod(r + pad, stride)
        count = -(-(kernel - b) // stride)
        if count > 0:
            phases.append((a, count))
    inner_pad = max(0, max(count - 1 - a for a, count in phases))
    taps = max(a for a, _ in phases) + inner_pad + 1
    cells = -(-size // stride)
    after = cells + taps - 1 - out_size - inner_pad
    if after < 0:
        return None
    return AxisSplit(stride, pad, kernel, taps, inner_pad, after, cells)


@dataclasses.dataclass(frozen=True)
class SubpixelPlan:
    """The rewrite of one strided convolution: its two axes and C' (``inner``)."""

    rows: AxisSplit
    cols: AxisSplit
    inner: object               # the ConvGeometry of C'


@functools.lru_cache(maxsize=256)
def subpixel_plan(g):
    """The :class:`SubpixelPlan` of ConvGeometry ``g``, or None where the
    rewrite does not apply (stride 1, dilation, groups, negative padding after)."""
    if g.stride == (1, 1) or g.dilation != (1, 1) or g.groups != 1:
        return None
    top, _, left, _ = g.padding
    rows = split_axis(g.h, g.oh, g.kh, g.stride[0], top)
    cols = split_axis(g.w, g.ow, g.kw, g.stride[1], left)
    if rows is None or cols is None:
        return None
    inner = ConvGeometry(g.n, g.c_out, g.oh, g.ow, rows.stride * cols.stride * g.c_in,
                         rows.taps, cols.taps, (1, 1),
                         (rows.inner_pad, rows.inner_pad_after, cols.inner_pad,
                          cols.inner_pad_after), (1, 1), 1)
    return SubpixelPlan(rows, cols, inner)


def subpixel_weight(plan, g, w):
    """w' [sh*sw*C_x, C_y, taps_h, taps_w] from C's weight w (once per weight
    inside :func:`gdnflow.backends.cuda.weight_cache.frozen_weights`)."""
    rows, cols = plan.rows, plan.cols

    def rearrange():
        w_sub = cuda.empty(plan.inner.w_shape, w.dtype)
        cuda.kernel(SOURCE, "subpixel_weight", "PP" + "i" * 12,
                    cuda.storage_defines(w.dtype)).launch(
            w_sub.size, w.ptr, w_sub.ptr, g.c_out, g.c_in, g.kh, g.kw, rows.stride,
            cols.stride, rows.pad, cols.pad, rows.inner_pad, cols.inner_pad, rows.taps,
            cols.taps)
        return w_sub
    return weight_cache.derived(("subpixel", g), w, rearrange)


def _phase_args(plan, g):
    return (g.n, g.c_in, g.h, g.w, plan.rows.cells, plan.cols.cells, plan.rows.stride,
            plan.cols.stride)


def split(plan, g, x):
    """x' (C's input split into its phases) from x [N, C_x, H, W]."""
    rows, cols = plan.rows, plan.cols
    x_sub = cuda.empty((g.n, rows.stride * cols.stride * g.c_in, rows.cells, cols.cells),
                       x.dtype)
    cuda.kernel(SOURCE, "subpixel_split", "PP" + "i" * 8, cuda.storage_defines(x.dtype)).launch(
        x_sub.size, x.ptr, x_sub.ptr, *_phase_args(plan, g))
    return x_sub


def interleave(plan, g, x_sub):
    """x [N, C_x, H, W] from its phases x'."""
    x = cuda.empty(g.x_shape, x_sub.dtype)
    cuda.kernel(SOURCE, "subpixel_interleave", "PP" + "i" * 8,
                cuda.storage_defines(x_sub.dtype)).launch(
        x.size, x_sub.ptr, x.ptr, *_phase_args(plan, g))
    return x


def _reads_phases(algorithm):
    """Whether ``algorithm`` reads and writes phase splits itself (its forward takes
    ``output_phases`` and its backward_data ``input_phases``: Winograd's do)."""
    return getattr(algorithm, "reads_phases", False)


def _epilogue(y, bias, activation):
    """y <- act(y + bias) in one pass where there is anything to do; returns y."""
    if bias is None and not activation:
        return y
    return epilogue_cuda(y, bias, None, activation)


def _phases(plan, g):
    """C's input x as the phase split C' produces or reads (a Winograd PhaseView)."""
    return PhaseView(g.c_in, plan.rows.stride, plan.cols.stride, g.h, g.w)


class Subpixel:
    """Strided conv2d (groups 1, no dilation) through a stride-1 convolution on
    the sub-pixel grid: forward and backward-data (so conv_transpose2d's
    forward and backward-data too); see the module docstring.

    The planner offers the class; its maps run on an instance bound to a
    planner (``Subpixel(planner)``, :func:`~gdnflow.ops.conv.planning.bound`
    does it), which chooses the algorithm of the stride-1 convolution C'.
    """

    name = "subpixel"
    stages = ("forward", "backward_data")
    #: On 16-bit tensors (split, interleave and the weight rearrangement move values of
    #: any dtype): backward_data, so that a strided layer's data gradient and
    #: conv_transpose2d's forward run C''s im2col (9 taps per pixel for 5x5 / 2) instead
    #: of im2col + GEMM's col2im over 25.
    half_precision_stages = ("backward_data",)
    fuses_bias_activation = True
    #: backward_data takes a bias too (conv_transpose2d's forward passes its own).
    backward_data_fuses_bias = True
    #: Its maps run other algorithms: they need an instance bound to a planner.
    binds_planner = True

    def __init__(self, planner):
        """The rewrite, asking ``planner`` (an object with ``choose(g, stage)``) for C''s
        algorithm."""
        self.planner = planner

    @staticmethod
    def supports(g):
        """Stride above 1, dilation 1, groups 1, and the rewrite's padding not negative."""
        return subpixel_plan(g) is not None

    @staticmethod
    def half_preferred(g):
        """Where a 16-bit data gradient should take the rewrite: kernels wider than their
        stride, whose taps overlap (col2im then sums kh*kw columns per pixel; 1x1 / 2 would
        only multiply the work of a scatter)."""
        return g.kh > g.stride[0] or g.kw > g.stride[1]

    @staticmethod
    def preferred(g):
        """Where C' would run Winograd F(4x4, 3x3) by the heuristic."""
        inner = subpixel_plan(g).inner
        return WinogradF4.supports(inner) and WinogradF4.preferred(inner)

    def forward(self, g, x, w, bias=None, activation=0):
        """y = act(C'.backward_data(split(x), w') + bias), the epilogue in Winograd's
        output transform (or one pass after another inner algorithm)."""
        plan = subpixel_plan(g)
        algorithm = self.planner.choose(plan.inner, "backward_data")
        w_sub = subpixel_weight(plan, g, w)
        if _reads_phases(algorithm):
            return algorithm.backward_data(plan.inner, x, w_sub, input_phases=_phases(plan, g),
                                           bias=bias, activation=activation)
        y = algorithm.backward_data(plan.inner, split(plan, g, x), w_sub)
        return _epilogue(y, bias, activation)

    def backward_data(self, g, gy, w, bias=None):
        """gx = interleave(C'.forward(gy, w')) + bias (conv_transpose2d's bias, per
        channel of gx; in Winograd's output transform where it runs)."""
        plan = subpixel_plan(g)
        algorithm = self.planner.choose(plan.inner, "forward")
        w_sub = subpixel_weight(plan, g, w)
        if _reads_phases(algorithm):
            return algorithm.forward(plan.inner, gy, w_sub, bias, output_phases=_phases(plan, g))
        return _epilogue(interleave(plan, g, algorithm.forward(plan.inner, gy, w_sub)), bias, 0)

    @staticmethod
    def backward_weight(g, x, gy):
        """im2col + GEMM (the planner does not ask this class for this stage)."""
        return Im2colGemm.backward_weight(g, x, gy)
