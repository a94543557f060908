"""Shape operators. reshape and flatten need no kernel (a reshape of a
contiguous array is a view on both backends); transpose, slice, concat and
pad move data with the kernels of ``cuda_src/shape.cu``."""
import itertools
import math

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.registry import register


@register("reshape")
class ReshapeOp(Operator):
    """The same elements in ``shape`` (one entry may be -1: inferred)."""

    autocast = "same"       # a view: any dtype

    def __init__(self, shape):
        self.shape = tuple(int(s) for s in shape)

    def check(self, x):
        shape, unknown = list(self.shape), [i for i, s in enumerate(self.shape) if s == -1]
        known = math.prod(s for s in shape if s != -1)
        if len(unknown) > 1 or any(s < -1 for s in shape):
            raise ShapeError(f"reshape: bad target shape {self.shape} (at most one -1, no other negatives)")
        if unknown and known and x.size % known == 0:
            shape[unknown[0]] = x.size // known
        if math.prod(shape) != x.size or (unknown and not known):
            raise ShapeError(f"reshape: cannot reshape {x.shape} ({x.size} elements) "
                             f"to {self.shape}")
        self.shape = tuple(shape)

    def forward_numpy(self, x):
        return x.reshape(self.shape)

    forward_cuda = forward_numpy

    def backward(self, gy):
        return (ReshapeOp(self.input_shapes[0])(gy),)


def flatten(x, start_dim=1):
    """Merge dimensions ``start_dim`` and after into one: (N, C, H, W) -> (N, C*H*W).

    The same as ``x.flatten(start_dim)`` (:meth:`gdnflow.tensor.Tensor.flatten`):
    a reshape; ShapeError if ``start_dim`` is out of range.
    """
    return x.flatten(start_dim)


# ------------------------------------------------- data-moving shape ops --
# transpose, slice, concat and pad move elements; on the GPU each is one or
# more launches of strided_gather / strided_scatter (cuda_src/shape.cu),
# which pair a dense array with a strided view of another.
SOURCE = "shape.cu"
#: Inputs one concat_inputs launch takes, and the values a block copies at a time
#: (``CONCAT_INPUTS``, ``CONCAT_PIECE`` in shape.cu).
CONCAT_INPUTS, CONCAT_PIECE = 32, 4096
# out, outer, total, inner, count, then the ConcatInputs table: 32 pointers, 33 starts, 33
# piece numbers (520 bytes); a constant, so that tests/test_cuda_sources.py checks it
# against the compiled kernel.
_CONCAT_ARGUMENTS = "Piiii520s"
_CONCAT_TABLE_WORDS = 65        # the table in 8-byte words
VIEW_DIMS = 6


def contiguous_strides(shape):
    """Element strides of a C-order array of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def view_arguments(shape, strides):
    """(d1..d5, s0..s5) for the kernels: size-1 dimensions dropped, adjacent
    ones merged where the view steps across them as one, padded to six."""
    dims, merged = [], []
    for size, stride in zip(shape, strides):
        if size == 1:
            continue
        if dims and merged[-1] == stride * size:
            dims[-1] *= size
            merged[-1] = stride
        else:
            dims.append(size)
            merged.append(stride)
    if len(dims) > VIEW_DIMS:
        raise NotImplementedError(f"a strided view of shape {tuple(shape)} needs {len(dims)} "
                                  f"index dimensions; the CUDA kernels handle {VIEW_DIMS}")
    pad = VIEW_DIMS - len(dims)
    return ([1] * pad + dims)[1:], [0] * pad + merged


def _launch_view_kernel(name, source, destination, base, dense_shape, view_strides):
    dims, strides = view_arguments(dense_shape, view_strides)
    n = math.prod(dense_shape)
    if n:
        cuda.kernel(SOURCE, name, "PPii" + "i" * 11).launch(
            n, source.ptr, destination.ptr, n, base, *dims, *strides)


def cuda_gather(x, shape, base, strides):
    """A dense array of ``shape`` read from ``x`` through the view (base, strides)."""
    out = cuda.empty(tuple(shape), x.dtype)
    _launch_view_kernel("strided_gather", x, out, base, shape, strides)
    return out


def cuda_transpose(x, perm):
    """The dense device array ``numpy.transpose(x, perm)`` (float32)."""
    strides = contiguous_strides(x.shape)
    return cuda_gather(x, [x.shape[p] for p in perm], 0, [strides[p] for p in perm])


def cuda_scatter(x, out, base, strides):
    """Write the dense ``x`` into ``out`` through the view (base, strides)."""
    _launch_view_kernel("strided_scatter", x, out, base, x.shape, strides)


@register("transpose")
class TransposeOp(Operator):
    """Permute dimensions: out.shape[k] = x.shape[perm[k]] (like numpy.transpose)."""

    def __init__(self, perm):
        self.perm = tuple(int(p) for p in perm)

    def check(self, x):
        if sorted(self.perm) != list(range(x.ndim)):
            raise ShapeError(f"transpose: perm {self.perm} is not a permutation of the "
                             f"{x.ndim} dimensions of shape {x.shape}")

    def forward_numpy(self, x):
        return np.ascontiguousarray(np.transpose(x, self.perm))

    def forward_cuda(self, x):
        return cuda_transpose(x, self.perm)

    def backward(self, gy):
        return (TransposeOp(np.argsort(self.perm))(gy),)


@register("slice")
class SliceOp(Operator):
    """Basic slicing: ``slices`` is one Python ``slice`` per leading dimension
    (steps may be negative); the result is a copy."""

    def __init__(self, slices):
        self.slices = tuple(slices)

    def check(self, x):
        if len(self.slices) > x.ndim:
            raise ShapeError(f"slice: {len(self.slices)} slices for a tensor of shape {x.shape}")
        self.ranges = [range(*s.indices(size)) for s, size in zip(self.slices, x.shape)]
        self.ranges += [range(size) for size in x.shape[len(self.ranges):]]
        strides = contiguous_strides(x.shape)
        self.out_shape = tuple(len(r) for r in self.ranges)
        self.base = sum(r.start * s for r, s in zip(self.ranges, strides) if len(r))
        self.view_strides = [r.step * s for r, s in zip(self.ranges, strides)]

    def _index(self):
        return tuple(slice(r.start, r.stop if r.stop >= 0 else None, r.step) for r in self.ranges)

    def forward_numpy(self, x):
        return np.array(x[self._index()])

    def forward_cuda(self, x):
        return cuda_gather(x, self.out_shape, self.base, self.view_strides)

    def backward(self, gy):
        return (self.wrap(self.dispatch("backward", gy.data)),)

    def backward_numpy(self, gy):
        gx = np.zeros(self.input_shapes[0], gy.dtype)
        gx[self._index()] = gy
        return gx

    def backward_cuda(self, gy):
        gx = cuda.zeros(self.input_shapes[0], gy.dtype)
        cuda_scatter(gy, gx, self.base, self.view_strides)
        return gx


@register("concat")
class ConcatOp(Operator):
    """Join tensors along ``axis``; all other dimensions must agree."""

    def __init__(self, axis):
        self.axis = axis

    def check(self, *xs):
        ndim = xs[0].ndim
        if not -ndim <= self.axis < ndim:
            raise ShapeError(f"concat: axis {self.axis} out of range for {ndim}-D inputs")
        self.axis %= ndim
        for i, x in enumerate(xs):
            rest = x.shape[:self.axis] + x.shape[self.axis + 1:]
            first = xs[0].shape[:self.axis] + xs[0].shape[self.axis + 1:]
            if x.ndim != ndim or rest != first:
                raise ShapeError(f"concat: input {i} has shape {x.shape}, which differs from "
                                 f"input 0's {xs[0].shape} outside axis {self.axis}")
        self.out_shape = list(xs[0].shape)
        self.out_shape[self.axis] = sum(x.shape[self.axis] for x in xs)
        self.out_shape = tuple(self.out_shape)

    def forward_numpy(self, *xs):
        return np.concatenate(xs, axis=self.axis)

    def forward_cuda(self, *xs):
        out = cuda.empty(self.out_shape, xs[0].dtype)
        outer = math.prod(self.out_shape[:self.axis])
        inner = math.prod(self.out_shape[self.axis + 1:])
        starts = [0] + list(itertools.accumulate(x.shape[self.axis] for x in xs))
        kernel = cuda.kernel(SOURCE, "concat_inputs", _CONCAT_ARGUMENTS)
        for first in range(0, len(xs), CONCAT_INPUTS):
            group = [x for x in xs[first:first + CONCAT_INPUTS] if x.size]
            if not group:
                continue
            table = np.zeros(_CONCAT_TABLE_WORDS, np.uint64)
            table[:len(group)] = [x.ptr for x in group]
            rows = list(itertools.accumulate((x.shape[self.axis] for x in group),
                                             initial=starts[first]))
            pieces = list(itertools.accumulate(
                (-(-x.shape[self.axis] * inner // CONCAT_PIECE) for x in group), initial=0))
            words = table[CONCAT_INPUTS:].view(np.int32)
            words[:len(rows)] = rows
            words[CONCAT_INPUTS + 1:CONCAT_INPUTS + 1 + len(pieces)] = pieces
            tasks = outer * pieces[-1]      # a block per piece of a segment (shape.cu)
            longest = max(x.shape[self.axis] for x in group) * inner
            block = 256 if longest >= 1024 else 64
            kernel((max(1, min(tasks, 64 * cuda.sm_count())), 1, 1), (block, 1, 1), out.ptr,
                   outer, self.out_shape[self.axis], inner, len(group), table.tobytes())
        return out

    def backward(self, gy):
        grads, offset = [], 0
        for shape, needed in zip(self.input_shapes, self.needs_grad):
            size = shape[self.axis]
            index = [slice(None)] * self.axis + [slice(offset, offset + size)]
            grads.append(SliceOp(index)(gy) if needed else None)
            offset += size
        return tuple(grads)


@register("pad")
class PadOp(Operator):
    """Constant padding: ``pads`` is one (before, after) pair per leading dimension."""

    def __init__(self, pads, value=0.0):
        self.pads = tuple((int(b), int(a)) for b, a in pads)
        self.value = float(value)

    def check(self, x):
        if len(self.pads) > x.ndim or any(b < 0 or a < 0 for b, a in self.pads):
            raise ShapeError(f"pad: pads {self.pads} do not fit shape {x.shape} "
                             "(one non-negative (before, after) pair per leading dimension)")
        pads = list(self.pads) + [(0, 0)] * (x.ndim - len(self.pads))
        self.full_pads = pads
        self.out_shape = tuple(s + b + a for s, (b, a) in zip(x.shape, pads))
        self.inner = [slice(b, b + s) for s, (b, _) in zip(x.shape, pads)]

    def forward_numpy(self, x):
        return np.pad(x, self.full_pads, constant_values=self.value)

    def forward_cuda(self, x):
        out = cuda.get_runtime().full(self.out_shape, self.value, x.dtype)
        strides = contiguous_strides(self.out_shape)
        cuda_scatter(x, out, sum(b * s for (b, _), s in zip(self.full_pads, strides)), strides)
        return out

    def backward(self, gy):
        return (SliceOp(self.inner)(gy),)


def reshape(x, shape):
    """The same elements in another shape (one -1 allowed)."""
    return ReshapeOp(shape)(x)



def transpose(x, perm):
    """Permute dimensions like numpy.transpose (a copy)."""
    return TransposeOp(perm)(x)



def slice_(x, index):
    """x[index] for basic slicing: a tuple of Python slices, one per leading dimension."""
    return SliceOp(index if isinstance(index, (tuple, list)) else (index,))(x)



def concat(tensors, axis=0):
    """Join tensors along ``axis``."""
    return ConcatOp(axis)(*tensors)



def pad(x, pads, value=0.0):
    """Constant padding: one (before, after) pair per leading dimension."""
    return PadOp(pads, value)(x)
