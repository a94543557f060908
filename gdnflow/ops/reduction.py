"""Sum and mean over all elements or given axes, and their adjoint ``broadcast_to``.

CUDA kernels: ``cuda_src/reduction.cu`` (sums) and ``broadcast_copy`` of
``cuda_src/elementwise.cu``. Each is the other's gradient: the gradient of a
sum is its output gradient broadcast back to the input's shape, the gradient
of a broadcast is its output gradient summed over the broadcast dimensions
(:func:`sum_to`).

On the GPU the reduced axes are merged into blocks of adjacent dimensions and
summed one block at a time, innermost first, each pass seeing its input as
[outer, r, inner]: the two-pass whole-tensor kernel when outer = inner = 1,
one warp or block per row when inner = 1, one thread per output otherwise.
"""
import builtins
import math

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.backends.numpy_backend import contiguous
from gdnflow.errors import DTypeError, ShapeError
from gdnflow.precision import FLOAT32, is_half
from gdnflow.ops.broadcast import broadcast_shape, kernel_layout, reduced_axes
from gdnflow.ops.cast import cast
from gdnflow.ops.elementwise import AffineOp
from gdnflow.ops.shape import ReshapeOp
from gdnflow.registry import register

SOURCE = "reduction.cu"
BROADCAST_SOURCE = "elementwise.cu"     # broadcast_copy sits beside the binary kernels
SUM_BLOCK = 256          # threads per block of sum_partial (its -DSUM_BLOCK)
SUM_BLOCKS_PER_SM = 8    # one full wave of 256-thread blocks: 2048 threads per SM
SUM_DEFINES = (("SUM_BLOCK", SUM_BLOCK),)   # the whole-tensor sum's module; the others: none
cuda.declare_variants(SOURCE, (), SUM_DEFINES)
# (how these were chosen: docs/ops.md)
LONG_ROW = 2048          # rows at least this long get a block each, shorter ones a warp


@register("sum")
class SumOp(Operator):
    """Sum over ``axis`` (None: all; an int or a tuple of ints), optionally keeping dims."""

    def __init__(self, axis=None, keepdims=False):
        self.axis = axis
        self.keepdims = bool(keepdims)

    def check(self, x):
        ndim = x.ndim
        axes = range(ndim) if self.axis is None else (
            (self.axis,) if isinstance(self.axis, int) else tuple(self.axis))
        try:
            self.axes = tuple(sorted({a + ndim if a < 0 else a for a in axes}))
        except TypeError:
            raise TypeError(f"{self.label}: axis must be None, an int or a tuple of ints, "
                            f"got {self.axis!r}") from None
        if any(not 0 <= a < ndim for a in self.axes):
            raise ShapeError(f"{self.label}: axis {self.axis} out of range for shape {x.shape}")
        self.kept_shape = tuple(1 if i in self.axes else s for i, s in enumerate(x.shape))
        self.out_shape = self.kept_shape if self.keepdims else tuple(
            s for i, s in enumerate(x.shape) if i not in self.axes)
        self.scale = self.scale_for(math.prod(x.shape[a] for a in self.axes))

    def scale_for(self, count):
        """The factor the sum is multiplied by: 1 for a sum, 1/count for a mean."""
        return 1.0

    def forward_numpy(self, x):
        y = np.sum(x, axis=self.axes, keepdims=True) * x.dtype.type(self.scale)
        return np.asarray(y, dtype=x.dtype).reshape(self.out_shape)

    def forward_cuda(self, x):
        return sum_cuda(x, self.axes, self.scale).reshape(self.out_shape)

    def backward(self, gy):
        g = ReshapeOp(self.kept_shape)(gy)
        if self.scale != 1.0:
            g = AffineOp(self.scale, 0.0)(g)
        return (BroadcastToOp(self.input_shapes[0])(g),)


@register("mean")
class MeanOp(SumOp):
    """Mean over ``axis`` (None: all; an int or a tuple of ints), optionally keeping dims."""

    def scale_for(self, count):
        return 1.0 / count if count else float("nan")


def sum_cuda(x, axes, scale):
    """scale * (x summed over ``axes``), as a flat CudaArray of the kept elements.

    float32 only (reduction.cu): callers widen 16-bit arrays first.
    """
    if x.dtype != FLOAT32:
        raise DTypeError(f"sum_cuda: reduction.cu sums float32, got {x.dtype}")
    # Merge adjacent dimensions that are both reduced or both kept.
    blocks = []
    for i, size in enumerate(x.shape):
        if size == 1:
            continue
        reduced = i in axes
        if blocks and blocks[-1][1] == reduced:
            blocks[-1][0] *= size
        else:
            blocks.append([size, reduced])
    if not any(reduced for _, reduced in blocks):
        return AffineOp(scale, 0.0).forward_cuda(x)      # nothing to add up: a scaled copy
    current = x
    while any(reduced for _, reduced in blocks):
        k = max(i for i, (_, reduced) in enumerate(blocks) if reduced)
        outer = math.prod(size for size, _ in blocks[:k])
        inner = math.prod(size for size, _ in blocks[k + 1:])
        last = builtins.sum(reduced for _, reduced in blocks) == 1   # sum() here is the operator
        current = _sum_pass(current, outer, blocks[k][0], inner, scale if last else 1.0)
        del blocks[k]
        if 0 < k < len(blocks) and not blocks[k - 1][1] and not blocks[k][1]:
            blocks[k - 1][0] *= blocks.pop(k)[0]
    return current


def _sum_pass(x, outer, r, inner, scale):
    """out[o, i] = scale * sum_j x[o, j, i] for x seen as [outer, r, inner]."""
    out = cuda.empty((outer * inner,), x.dtype)
    defines = SUM_DEFINES
    if outer == 1 and inner == 1:
        grid = cuda.launch_grid(max(r // 4, 1), SUM_BLOCK, SUM_BLOCKS_PER_SM)
        partial = cuda.empty((grid[0],), x.dtype)
        cuda.kernel(SOURCE, "sum_partial", "PPi", defines)(
            grid, (SUM_BLOCK, 1, 1), x.ptr, partial.ptr, r)
        cuda.kernel(SOURCE, "sum_final", "PPif", defines)(
            (1, 1, 1), (1024, 1, 1), partial.ptr, out.ptr, grid[0], scale)
    elif inner == 1 and r >= LONG_ROW:
        cuda.kernel(SOURCE, "sum_rows_block", "PPiif").launch(
            outer * 256, x.ptr, out.ptr, outer, r, scale)
    elif inner == 1:
        cuda.kernel(SOURCE, "sum_rows_warp", "PPiif").launch(
            outer * 32, x.ptr, out.ptr, outer, r, scale)
    else:
        cuda.kernel(SOURCE, "sum_middle", "PPiiif").launch(
            outer * inner, x.ptr, out.ptr, outer, r, inner, scale)
    return out


@register("broadcast_to")
class BroadcastToOp(Operator):
    """Repeat x along its size-1 (or missing leading) dimensions to ``shape``."""

    autocast = "same"       # broadcast_copy is built for 16-bit storage too

    def __init__(self, shape):
        self.shape = tuple(shape)

    def check(self, x):
        if broadcast_shape(self.label, x.shape, self.shape) != self.shape:
            raise ShapeError(f"broadcast_to: cannot broadcast shape {x.shape} to {self.shape}")

    def forward_numpy(self, x):
        return contiguous(np.broadcast_to(x, self.shape))

    def forward_cuda(self, x):
        out = cuda.empty(self.shape, x.dtype)
        dims, (strides,) = kernel_layout(self.shape, x.shape)
        cuda.kernel(BROADCAST_SOURCE, "broadcast_copy", "PPi" + "i" * 11,
                    cuda.storage_defines(x.dtype)).launch(
            out.size, x.ptr, out.ptr, out.size, *dims, *strides)
        return out

    def backward(self, gy):
        return (sum_to(gy, self.input_shapes[0]),)


def sum_to(t, shape):
    """Sum ``t`` over the dimensions along which ``shape`` was broadcast to t's shape.

    A 16-bit ``t`` (a gradient of 16-bit arithmetic) is summed in float32 and
    the sum rounded back to its dtype.
    """
    if t.shape == tuple(shape):
        return t
    if is_half(t.dtype):
        return cast(sum_to(cast(t, FLOAT32), shape), t.dtype)
    return ReshapeOp(shape)(SumOp(reduced_axes(t.shape, shape), keepdims=True)(t))


def sum(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.sum)
    """Sum over all elements or over ``axis``."""
    return SumOp(axis, keepdims)(x)



def mean(x, axis=None, keepdims=False):
    """Mean over all elements or over ``axis``."""
    return MeanOp(axis, keepdims)(x)



def broadcast_to(x, shape):
    """x repeated along broadcast dimensions to ``shape``."""
    return BroadcastToOp(shape)(x)
