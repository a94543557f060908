"""Broadcasting rules shared by the elementwise operators and their gradients."""
from gdnflow.errors import ShapeError

#: Dimensions the CUDA broadcast kernels index (after merging adjacent ones).
KERNEL_DIMS = 6


def broadcast_shape(op_name, *shapes):
    """The NumPy broadcast of ``shapes``, or a ShapeError naming the operator."""
    if all(s == shapes[0] for s in shapes):
        return tuple(shapes[0])
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ShapeError(f"{op_name}: shapes {' and '.join(str(tuple(s)) for s in shapes)} "
                             "cannot be broadcast together (each dimension must match or be 1)")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_strides(out_shape, shape, strides=None):
    """Element strides of an array of ``shape`` (C-contiguous, or with element ``strides``)
    read at each index of ``out_shape`` that it broadcasts to: 0 along a broadcast
    dimension."""
    if strides is None:
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= size
        strides = strides[::-1]
    lead = len(out_shape) - len(shape)
    return [0] * lead + [stride if size == out_size else 0 for size, stride, out_size
                         in zip(shape, strides, out_shape[lead:])]


def kernel_layout(out_shape, *in_shapes):
    """Describe broadcasting for the CUDA kernels.

    Returns ``(dims, strides)``: ``dims`` = (d1, ..., d5), the five inner
    dimensions of ``out_shape`` seen as six, and one 6-tuple of element
    strides per input, 0 along a broadcast dimension. Adjacent dimensions are
    merged wherever every input is contiguous across them, so per-channel
    vectors against NCHW tensors take three dimensions: (N, C, H*W).
    """
    dims, strides = merged_layout(out_shape, [broadcast_strides(out_shape, shape)
                                              for shape in in_shapes])
    return tuple(dims[1:]), strides


def merged_layout(out_shape, per_input):
    """``(dims, strides)`` of ``out_shape`` read through ``per_input`` (one list of element
    strides over out's dimensions per input), merged and padded to :data:`KERNEL_DIMS`.

    ``dims`` are the :data:`KERNEL_DIMS` sizes, outermost first (leading 1s
    pad), and ``strides`` one tuple per input. Adjacent dimensions are merged
    wherever every input steps across the two as one; NotImplementedError if
    more than :data:`KERNEL_DIMS` remain.
    """
    dims, strides = [], [[] for _ in per_input]
    for k, d in enumerate(out_shape):
        if d == 1:
            continue        # a size-1 dimension adds nothing to an index
        # A block of merged dimensions is stored as (size, stride of its
        # innermost dimension); dimension k joins it when every input steps
        # across the two as one: block stride == stride[k] * d.
        if dims and all(st[-1] == s[k] * d for st, s in zip(strides, per_input)):
            dims[-1] *= d
            for st, s in zip(strides, per_input):
                st[-1] = s[k]
        else:
            dims.append(d)
            for st, s in zip(strides, per_input):
                st.append(s[k])
    if len(dims) > KERNEL_DIMS:
        raise NotImplementedError(
            f"reading {len(per_input)} inputs at shape {tuple(out_shape)} needs {len(dims)} "
            f"index dimensions; the CUDA kernels handle {KERNEL_DIMS}")
    pad = KERNEL_DIMS - len(dims)
    return [1] * pad + dims, [tuple([0] * pad + st) for st in strides]


def reduced_axes(shape, target):
    """Axes of ``shape`` to sum so that the result reshapes to ``target`` (broadcast's inverse)."""
    lead = len(shape) - len(target)
    return tuple(i for i, size in enumerate(shape)
                 if i < lead or (target[i - lead] == 1 and size != 1))
