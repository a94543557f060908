"""2-D pooling of NCHW tensors. CUDA kernels: ``cuda_src/pool.cu``.

For x [N, C, H, W], kernel (kh, kw), stride (sh, sw) and padding (top,
bottom, left, right), output (p, q) of each plane pools the window of rows
``p*sh - top + [0, kh)`` and columns ``q*sw - left + [0, kw)``::

    max_pool2d:  y[n, c, p, q] = max over the window (padding counts as -inf)
    avg_pool2d:  y[n, c, p, q] = (sum over the window) / d, with d = kh*kw
                 (``count_include_pad``, padding counts as 0) or the number
                 of input elements in the window
    OH = floor((H + top + bottom - kh) / sh) + 1     (ceil_mode off; OW likewise)

    global_avg_pool2d:  y[n, c, 0, 0] = mean over h, w of x[n, c, h, w]

On the GPU the forward of windows up to 5x5 at strides up to 3 (the max
pool's only where no argmax is kept: inference) runs a kernel built for the
window (``pool_forward_fixed``: each thread four outputs of a row, each input
read once per row); other windows, and the max pool under a graph, run the
general kernels.

Gradients: the max routes gy[p, q] to the argmax of its window, which the
forward saves as int32 indices (h*W + w within the plane; the first maximum
on ties); the average spreads gy[p, q] / d over its window. Padding must be
smaller than the kernel (PyTorch asks for at most half; ONNX allows up to
kernel - 1), so that every window holds an input element and every argmax
is a real one.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.ops.reduction import sum_cuda
from gdnflow.ops.cast import cast_array
from gdnflow.precision import FLOAT32, emulate
from gdnflow.registry import register
from gdnflow.tensor import Tensor

SOURCE = "pool.cu"
#: Windows pool_forward_fixed is built for: taps and stride per side at most these.
FIXED_MAX_KERNEL = 5
FIXED_MAX_STRIDE = 3
#: Outputs of a row each thread of pool_forward_fixed computes (POOL_Q in pool.cu), and the
#: parts of a concatenation it reads x from (POOL_PARTS).
FIXED_OUTPUTS_PER_THREAD = 4
FIXED_MAX_PARTS = 4
#: pool_forward_fixed's PoolParts argument: the part pointers, then their first channels
#: and the channel count (NumPy's ``align=True`` lays it out by C's rules: 56 bytes).
POOL_PARTS_LAYOUT = np.dtype([("x", np.uint64, (FIXED_MAX_PARTS,)),
                              ("start", np.int32, (FIXED_MAX_PARTS + 1,))], align=True)
_FIXED_ARGUMENTS = "P" + "i" * 10 + f"{POOL_PARTS_LAYOUT.itemsize}s"


def _pair(op, name, value, minimum):
    """An int or a pair of ints as a pair (h, w), each at least ``minimum``."""
    values = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(values) != 2 or not all(isinstance(v, (int, np.integer)) for v in values):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    if any(v < minimum for v in values):
        raise ValueError(f"{op}: {name} must be at least {minimum}, got {value!r}")
    return tuple(int(v) for v in values)


def _padding(op, padding):
    """Padding as (top, bottom, left, right) from an int, a pair (ph, pw) or four values.

    Four values are what ONNX pads and Keras "same" pooling need for even
    kernels (more after than before).
    """
    if isinstance(padding, (int, np.integer)):
        padding = (padding,) * 4
    padding = tuple(padding)
    if len(padding) == 2:
        padding = (padding[0], padding[0], padding[1], padding[1])
    if len(padding) != 4 or not all(isinstance(v, (int, np.integer)) and v >= 0
                                    for v in padding):
        raise ValueError(f"{op}: padding must be a non-negative int, a pair (ph, pw) or four "
                         f"values (top, bottom, left, right), got {padding!r}")
    return tuple(int(v) for v in padding)


class Pool2dOp(Operator):
    """Shared geometry of the windowed pools: checks and output size."""

    def __init__(self, kernel, stride=None, padding=0):
        self.kernel = _pair(self.label, "kernel", kernel, 1)
        self.stride = self.kernel if stride is None else _pair(self.label, "stride", stride, 1)
        self.padding = _padding(self.label, padding)
        kh, kw = self.kernel
        top, bottom, left, right = self.padding
        if max(top, bottom) >= kh or max(left, right) >= kw:
            raise ValueError(f"{self.label}: padding {self.padding} must be smaller than the "
                             f"kernel {self.kernel} (so that every window holds an input element)")

    def check(self, x):
        self.check_shape(tuple(x.shape))

    def check_shape(self, shape):
        """Refuse an input of ``shape`` this pooling cannot take; else note the output's."""
        if len(shape) != 4:
            raise ShapeError(f"{self.label}: input must be 4-D [N, C, H, W], got shape {shape}")
        n, c, h, w = shape
        (kh, kw), (sh, sw) = self.kernel, self.stride
        top, bottom, left, right = self.padding
        if h == 0 or w == 0:
            raise ShapeError(f"{self.label}: input has no pixels to pool: shape {shape}")
        if h + top + bottom < kh or w + left + right < kw:
            raise ShapeError(f"{self.label}: kernel {kh}x{kw} is larger than the padded input "
                             f"{h + top + bottom}x{w + left + right} (input {shape}, padding "
                             f"{self.padding})")
        self.out_hw = ((h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1)
        self.out_shape = (n, c) + self.out_hw
        self.x_shape = shape

    def _kernel_args(self):
        """The geometry arguments every pool.cu kernel takes after its pointers."""
        n, c, h, w = self.x_shape
        return (n * c, h, w, *self.out_hw, *self.kernel, *self.stride,
                self.padding[0], self.padding[2])

    def fixed_window(self):
        """Whether pool_forward_fixed is built for this window (at most
        :data:`FIXED_MAX_KERNEL` taps and :data:`FIXED_MAX_STRIDE` a side)."""
        return max(self.kernel) <= FIXED_MAX_KERNEL and max(self.stride) <= FIXED_MAX_STRIDE

    def _forward_fixed(self, parts, maximum, include_pad=False):
        """y by pool.cu's pool_forward_fixed (the window compiled in, no argmax) from x
        given as ``parts``, the arrays x is the concatenation of along the channels (one
        for a plain x; at most :data:`FIXED_MAX_PARTS`), or None where
        :meth:`fixed_window` says no."""
        if not self.fixed_window():
            return None
        (kh, kw), (sh, sw) = self.kernel, self.stride
        dtype = parts[0].dtype
        y = cuda.empty(self.out_shape, dtype)
        planes, h, w, oh, ow = self._kernel_args()[:5]
        q_groups = -(-ow // FIXED_OUTPUTS_PER_THREAD)
        table = np.zeros((), POOL_PARTS_LAYOUT)
        table["x"][:len(parts)] = [a.ptr for a in parts]
        starts = np.cumsum([0] + [a.shape[1] for a in parts])
        table["start"][:] = starts[-1]          # past the last part: every channel is in one
        table["start"][:len(starts)] = starts
        defines = (("POOL_KH", kh), ("POOL_KW", kw), ("POOL_SH", sh), ("POOL_SW", sw)) + (
            (("POOL_MAX", 1),) if maximum else ()) + cuda.storage_defines(dtype)
        cuda.kernel(SOURCE, "pool_forward_fixed", _FIXED_ARGUMENTS, defines).launch(
            planes * oh * q_groups, y.ptr, planes, h, w, oh, ow, self.padding[0],
            self.padding[2], int(include_pad), q_groups, self.x_shape[1], table.tobytes())
        return y

    def _windows(self, x, fill):
        """x padded with ``fill`` and viewed as [N, C, OH, OW, kh, kw] windows (no copy)."""
        top, bottom, left, right = self.padding
        padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=fill)
        sh, sw = self.stride
        return sliding_window_view(padded, self.kernel, axis=(2, 3))[:, :, ::sh, ::sw]


@register("max_pool2d")
class MaxPool2dOp(Pool2dOp):
    """y = the maximum of each window; see the module docstring."""

    autocast = "same"       # pool.cu is built for 16-bit storage too

    def forward_numpy(self, x):
        return emulate(self._max_pool_numpy, x)

    def _max_pool_numpy(self, x):
        n, c, h, w = x.shape
        oh, ow = self.out_hw
        (kh, kw), (sh, sw) = self.kernel, self.stride
        windows = self._windows(x, -np.inf).reshape(n, c, oh, ow, kh * kw)
        k = np.argmax(windows, axis=-1)             # first maximum, like the kernel
        y = np.take_along_axis(windows, k[..., None], axis=-1)[..., 0]
        if self.recording:
            # The window's tap k is input row p*sh - top + k // kw, column
            # q*sw - left + k % kw. The clip only matters when x is -inf across
            # a whole window and argmax picked a padding tap: then the tap it
            # moves to holds -inf too.
            rows = np.clip(np.arange(oh)[:, None] * sh - self.padding[0] + k // kw, 0, h - 1)
            cols = np.clip(np.arange(ow) * sw - self.padding[2] + k % kw, 0, w - 1)
            self.save(argmax=(rows * w + cols).astype(np.int32))
        return np.ascontiguousarray(y)

    def forward_cuda(self, x):
        if not self.recording:          # no argmax to keep: the faster kernel where it applies
            y = self._forward_fixed([x], maximum=True)
            if y is not None:
                return y
        y = cuda.empty(self.out_shape, x.dtype)
        argmax = cuda.empty(self.out_shape, np.int32) if self.recording else None
        cuda.kernel(SOURCE, "max_pool_forward", "PPP" + "i" * 11,
                    cuda.storage_defines(x.dtype)).launch(
            y.size, x.ptr, y.ptr, 0 if argmax is None else argmax.ptr, *self._kernel_args())
        if self.recording:
            self.save(argmax=argmax)
        return y

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gy):
        return emulate(self._max_pool_backward_numpy, gy)

    def _max_pool_backward_numpy(self, gy):
        argmax = self.saved.argmax
        n, c, h, w = self.input_shapes[0]
        # Scatter-add into the flat gx: plane offset + index within the plane.
        planes = np.arange(n * c).reshape(n, c, 1, 1) * (h * w)
        gx = np.bincount((argmax + planes).ravel(), weights=gy.ravel(), minlength=n * c * h * w)
        return gx.astype(gy.dtype).reshape(n, c, h, w)

    def backward_cuda(self, gy):
        argmax = self.saved.argmax
        gx = cuda.empty(self.input_shapes[0], gy.dtype)
        cuda.kernel(SOURCE, "max_pool_backward", "PPP" + "i" * 11,
                    cuda.storage_defines(gy.dtype)).launch(
            gx.size, gy.ptr, argmax.ptr, gx.ptr, *self._kernel_args())
        return gx


@register("avg_pool2d")
class AvgPool2dOp(Pool2dOp):
    """y = the mean of each window; see the module docstring for the divisor."""

    autocast = "same"       # pool.cu is built for 16-bit storage too

    def __init__(self, kernel, stride=None, padding=0, count_include_pad=True):
        super().__init__(kernel, stride, padding)
        self.count_include_pad = bool(count_include_pad)

    def divisors(self, dtype):
        """d for every output position, [OH, OW] (or a scalar with count_include_pad)."""
        kh, kw = self.kernel
        if self.count_include_pad:
            return dtype.type(kh * kw)
        # The number of input elements under each window: pool a plane of ones.
        h, w = self.input_shapes[0][2:]
        ones = np.ones((1, 1, h, w), dtype)
        return self._windows(ones, 0).sum(axis=(-2, -1))[0, 0]

    def forward_numpy(self, x):
        return emulate(lambda x: np.ascontiguousarray(self._windows(x, 0).sum(axis=(-2, -1))
                                                      / self.divisors(x.dtype)), x)

    def forward_cuda(self, x):
        y = self._forward_fixed([x], maximum=False, include_pad=self.count_include_pad)
        if y is not None:
            return y
        y = cuda.empty(self.out_shape, x.dtype)
        cuda.kernel(SOURCE, "avg_pool_forward", "PP" + "i" * 12,
                    cuda.storage_defines(x.dtype)).launch(
            y.size, x.ptr, y.ptr, *self._kernel_args(), int(self.count_include_pad))
        return y

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gy):
        return emulate(self._avg_pool_backward_numpy, gy)

    def _avg_pool_backward_numpy(self, gy):
        n, c, h, w = self.input_shapes[0]
        (kh, kw), (sh, sw) = self.kernel, self.stride
        top, bottom, left, right = self.padding
        oh, ow = self.out_hw
        share = gy / self.divisors(gy.dtype)
        # Tap (i, j) of every window reads the padded input at rows i + p*sh,
        # columns j + q*sw: add each window's share there, one tap at a time.
        gx = np.zeros((n, c, h + top + bottom, w + left + right), gy.dtype)
        for i in range(kh):
            for j in range(kw):
                gx[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw] += share
        return np.ascontiguousarray(gx[:, :, top:top + h, left:left + w])

    def backward_cuda(self, gy):
        gx = cuda.empty(self.input_shapes[0], gy.dtype)
        cuda.kernel(SOURCE, "avg_pool_backward", "PP" + "i" * 12,
                    cuda.storage_defines(gy.dtype)).launch(
            gx.size, gy.ptr, gx.ptr, *self._kernel_args(), int(self.count_include_pad))
        return gx


@register("global_avg_pool2d")
class GlobalAvgPool2dOp(Operator):
    """y[n, c, 0, 0] = mean of x[n, c] over H and W: [N, C, H, W] -> [N, C, 1, 1].

    The forward is the row sum of :mod:`gdnflow.ops.reduction` (one warp or
    block per plane); the backward spreads gy / (H*W) over the plane in one
    kernel.
    """

    def check(self, x):
        if x.ndim != 4:
            raise ShapeError(f"{self.label}: input must be 4-D [N, C, H, W], got shape {x.shape}")
        if x.shape[2] * x.shape[3] == 0:
            raise ShapeError(f"{self.label}: input has no pixels to average: shape {x.shape}")
        self.out_shape = x.shape[:2] + (1, 1)

    def forward_numpy(self, x):
        return x.mean(axis=(2, 3), keepdims=True)

    def forward_cuda(self, x):
        h, w = x.shape[2:]
        return sum_cuda(x, (2, 3), 1.0 / (h * w)).reshape(self.out_shape)

    def backward(self, grad_output):
        return (self.wrap(self.dispatch("backward", grad_output.data)),)

    def backward_numpy(self, gy):
        h, w = self.input_shapes[0][2:]
        return np.ascontiguousarray(np.broadcast_to(gy / gy.dtype.type(h * w),
                                                    self.input_shapes[0]))

    def backward_cuda(self, gy):
        h, w = self.input_shapes[0][2:]
        gx = cuda.empty(self.input_shapes[0], gy.dtype)
        cuda.kernel(SOURCE, "global_avg_pool_backward", "PPiif").launch(
            gx.size, gy.ptr, gx.ptr, gx.size, h * w, 1.0 / (h * w))
        return gx


def max_pool2d(x, kernel, stride=None, padding=0):
    """Max pooling of x [N, C, H, W] -> [N, C, OH, OW], OH = floor((H + top + bottom - kh)/sh) + 1.

    ``kernel``, ``stride`` (default: the kernel): an int or (h, w);
    ``padding``: an int, (ph, pw) or (top, bottom, left, right), smaller than
    the kernel, counting as -inf. The gradient goes to the first maximum of
    each window.
    """
    return MaxPool2dOp(kernel, stride, padding)(x)


def avg_pool2d(x, kernel, stride=None, padding=0, count_include_pad=True):
    """Average pooling of x [N, C, H, W] -> [N, C, OH, OW] (output size as max_pool2d).

    Padding counts as zeros; the divisor is kh*kw with ``count_include_pad``,
    else the number of input elements in the window.
    """
    return AvgPool2dOp(kernel, stride, padding, count_include_pad)(x)


def global_avg_pool2d(x):
    """Mean over H and W: x [N, C, H, W] -> [N, C, 1, 1]."""
    return GlobalAvgPool2dOp()(x)


class MaxPoolOfConcat:
    """``max_pool2d(concat(parts, axis=1))`` reading the parts: an inference rewrite
    (:func:`gdnflow.inference.passes.fuse_pooled_concatenations`).

    ``pool`` and ``concat`` are the traced operators. On the GPU, for a window
    ``pool_forward_fixed`` is built for and at most :data:`FIXED_MAX_PARTS` parts,
    one launch pools each channel from the part it is in, so the concatenation is
    never written; elsewhere it runs the two operators (the reference). It
    computes no gradients (inference plans record none).
    """

    def __init__(self, pool, concat):
        self.pool, self.concat = pool, concat

    def __repr__(self):
        return f"MaxPoolOfConcat({self.pool.kernel} window, stride {self.pool.stride})"

    def __call__(self, *parts):
        arrays = [t.data for t in parts]
        if (parts[0].device == "cuda" and len(parts) <= FIXED_MAX_PARTS
                and self.pool.fixed_window() and len({a.dtype for a in arrays}) == 1):
            self.concat.check(*parts)           # the parts agree outside the channels
            self.pool.check_shape(self.concat.out_shape)
            y = self.pool._forward_fixed(arrays, maximum=True)
            # float32 out, as the concatenation it replaces computes (16-bit parts are
            # widened under autocast); a maximum of 16-bit values widens exactly.
            return Tensor.wrap(cast_array(y, FLOAT32), "cuda")
        joined = self.concat(*parts)
        self.concat.release()
        y = self.pool(joined)
        self.pool.release()
        return y
