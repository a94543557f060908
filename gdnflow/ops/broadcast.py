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


def kernel_layout(out_shape, *in_shapes):
    """Describe broadcasting for the CUDA kernels.

    Returns ``(dims, strides)``: ``dims`` = (d1, ..., d5), the five inner
    dimensions of ``out_shape`` seen as six, and one 6-tuple of element
    strides per input, 0 along a broadcast dimension. Adjacent dimensions are
    merged wherever every input is contiguous across them, so per-channel
    vectors against NCHW tensors take three dimensions: (N, C, H*W).
    """
    ndim = len(out_shape)
    per_input = []
    for shape in in_shapes:
        shape = (1,) * (ndim - len(shape)) + tuple(shape)
        strides, step = [], 1
        for size, out_size in zip(reversed(shape), reversed(out_shape)):
            strides.append(step if size == out_size else 0)
            step *= size
        per_input.append(strides[::-1])
    dims, strides = [], [[] for _ in in_shapes]
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
            f"broadcasting {in_shapes} to {tuple(out_shape)} needs {len(dims)} index dimensions; "
            f"the CUDA kernels handle {KERNEL_DIMS}")
    pad = KERNEL_DIMS - len(dims)
    dims = [1] * pad + dims
    strides = [tuple([0] * pad + st) for st in strides]
    return tuple(dims[1:]), strides


def reduced_axes(shape, target):
    """Axes of ``shape`` to sum so that the result reshapes to ``target`` (broadcast's inverse)."""
    lead = len(shape) - len(target)
    return tuple(i for i, size in enumerate(shape)
                 if i < lead or (target[i - lead] == 1 and size != 1))
