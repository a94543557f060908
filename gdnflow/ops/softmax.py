"""Softmax and log-softmax along one axis. CUDA kernels: ``cuda_src/softmax.cu``.

Numerically stable: with m = max_j x_j along the axis,

    softmax(x)_j     = exp(x_j - m) / sum_k exp(x_k - m)
    log_softmax(x)_j = x_j - m - log sum_k exp(x_k - m)

Both save their output y for the backward:

    softmax:      gx_j = y_j (gy_j - sum_k gy_k y_k)
    log_softmax:  gx_j = gy_j - exp(y_j) sum_k gy_k

On the GPU the input is seen as [outer, r, inner] (r the axis): one warp
per row for the last axis and short rows, one block per row for long rows,
one thread per column for any other axis.
"""
import math

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.registry import register

SOURCE = "softmax.cu"
SOFTMAX_BLOCK = 256     # threads per block of the *_rows_block kernels (their -DSOFTMAX_BLOCK)
LONG_ROW = 512          # rows at least this long get a block each, shorter ones a warp
# (how it was chosen: docs/ops.md)
# Every kernel of the file is fetched with the same defines: one compiled module, not two.
DEFINES = (("SOFTMAX_BLOCK", SOFTMAX_BLOCK),)
cuda.declare_variants(SOURCE, DEFINES)


@register("softmax")
class SoftmaxOp(Operator):
    """y = exp(x - max) / sum exp(x - max) along ``axis``; see the module docstring."""

    log_mode = False

    def __init__(self, axis=-1):
        if not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{self.label}: axis must be an int, got {axis!r}")
        self.axis = int(axis)

    def check(self, x):
        if not -x.ndim <= self.axis < x.ndim:
            raise ShapeError(f"{self.label}: axis {self.axis} out of range for shape {x.shape}")
        axis = self.axis % x.ndim
        self.layout = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))

    def forward_numpy(self, x):
        shifted = x - np.max(x, axis=self.axis, keepdims=True)
        if self.log_mode:
            y = shifted - np.log(np.sum(np.exp(shifted), axis=self.axis, keepdims=True))
        else:
            e = np.exp(shifted)
            y = e / np.sum(e, axis=self.axis, keepdims=True)
        if self.recording:
            self.save(y=y)
        return y

    def forward_cuda(self, x):
        y = cuda.empty(x.shape, x.dtype)
        if y.size:
            self._launch("softmax", x, y)
        if self.recording:
            self.save(y=y)
        return y

    def _launch(self, prefix, *arrays):
        """Run ``<prefix>_rows_warp``, ``_rows_block`` or ``_columns`` on [outer, r, inner]."""
        outer, r, inner = self.layout
        pointers = [a.ptr for a in arrays]
        mode = int(self.log_mode)
        if inner > 1:
            cuda.kernel(SOURCE, f"{prefix}_columns", "P" * len(arrays) + "iiii", DEFINES).launch(
                outer * inner, *pointers, outer, r, inner, mode)
        elif r >= LONG_ROW:
            kernel = cuda.kernel(SOURCE, f"{prefix}_rows_block", "P" * len(arrays) + "iii", DEFINES)
            kernel.launch(outer * SOFTMAX_BLOCK, *pointers, outer, r, mode, block=SOFTMAX_BLOCK)
        else:
            cuda.kernel(SOURCE, f"{prefix}_rows_warp", "P" * len(arrays) + "iii", DEFINES).launch(
                outer * 32, *pointers, outer, r, mode)

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gy):
        y = self.saved.y
        if self.log_mode:
            return gy - np.exp(y) * np.sum(gy, axis=self.axis, keepdims=True)
        return y * (gy - np.sum(gy * y, axis=self.axis, keepdims=True))

    def backward_cuda(self, gy):
        y = self.saved.y
        gx = cuda.empty(gy.shape, gy.dtype)
        if gx.size:
            self._launch("softmax_backward", y, gy, gx)
        return gx


@register("log_softmax")
class LogSoftmaxOp(SoftmaxOp):
    """y = x - max - log sum exp(x - max) along ``axis``; see the module docstring."""

    log_mode = True


def softmax(x, axis=-1):
    """exp(x) / sum exp(x) along ``axis``, computed as exp(x - max) / sum exp(x - max).

    Any shape; y has x's shape and sums to 1 along ``axis``.
    Gradient: gx = y * (gy - sum(gy * y) along axis).
    """
    return SoftmaxOp(axis)(x)


def log_softmax(x, axis=-1):
    """log(softmax(x)) along ``axis``, computed as x - max - log sum exp(x - max).

    Gradient: gx = gy - exp(y) * sum(gy) along axis.
    """
    return LogSoftmaxOp(axis)(x)
