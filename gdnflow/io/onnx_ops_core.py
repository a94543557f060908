"""The ONNX operators at the core of the importer: convolution, Gemm and
MatMul, arithmetic, pooling, batch normalisation, and the shape arithmetic
exporters emit (Shape, Gather, Slice, Cast, Constant, ConstantOfShape,
Concat, Reshape, ...), which computes on host NumPy arrays.

Each handler takes ``(node, inputs, device)``: the node (its attributes via
``node.attr``, ``node.fail`` to refuse), its input values (device tensors or
host arrays, None for omitted ones) and the device; it returns the output or
a list of outputs. :data:`gdnflow.io.onnx.HANDLERS` gathers this module's
with the other families'.

Pooling with ``ceil_mode`` is the same pooling with more end padding (the
cells its last window reaches past the node's own); Pad's ``edge``,
``reflect`` and ``wrap`` modes are slices of the input concatenated to it.
Both therefore run on the existing pooling, slice and concat kernels.
"""
import numpy as np

from gdnflow import ops
from gdnflow.io.onnx_ops import unary
from gdnflow.io.onnx_ops_math import softmax_handler
from gdnflow.io.onnx_support import ONNX_TYPES
from gdnflow.io.onnx_values import as_tensor, host, ints, is_host, scalar


def _spatial_2d(node, x):
    if x.ndim != 4:
        node.fail(f"a {x.ndim - 2}-D {node.op_type} (only 2-D, NCHW)")


def _pads_2d(node, x_shape, kernel, strides, dilations=(1, 1)):
    """(top, bottom, left, right) from ONNX pads or auto_pad."""
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "VALID"):
        pads = node.attr("pads", [0, 0, 0, 0]) if auto_pad == "NOTSET" else [0, 0, 0, 0]
        return (pads[0], pads[2], pads[1], pads[3])
    out = []
    for size, k, s, d in zip(x_shape[2:], kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        out.append((small, large) if auto_pad == "SAME_UPPER" else (large, small))
    return (out[0][0], out[0][1], out[1][0], out[1][1])


def _binary(function, host_function):
    def handler(node, inputs, device):
        a, b = inputs
        if is_host(a) and is_host(b):
            return host_function(a, b)
        if is_host(b) and b.size == 1:
            return function(a, float(b.reshape(())))
        if is_host(a) and a.size == 1:
            return function(float(a.reshape(())), b)
        return function(as_tensor(a, device), as_tensor(b, device))
    return handler


# -------------------------------------------------------------- handlers --
def _conv(node, inputs, device):
    x, w, b = (inputs + [None])[:3]
    _spatial_2d(node, x)
    strides = node.attr("strides", [1, 1])
    dilations = node.attr("dilations", [1, 1])
    kernel = node.attr("kernel_shape", list(w.shape[2:]))
    padding = _pads_2d(node, x.shape, kernel, strides, dilations)
    return ops.conv2d(x, as_tensor(w, device), None if b is None else as_tensor(b, device),
                      stride=strides, padding=padding, dilation=dilations,
                      groups=node.attr("group", 1))


def _conv_transpose(node, inputs, device):
    x, w, b = (inputs + [None])[:3]
    _spatial_2d(node, x)
    pads = node.attr("pads", [0, 0, 0, 0])
    return ops.conv_transpose2d(x, as_tensor(w, device),
                                None if b is None else as_tensor(b, device),
                                stride=node.attr("strides", [1, 1]),
                                padding=(pads[0], pads[2], pads[1], pads[3]),
                                output_padding=node.attr("output_padding", [0, 0]),
                                dilation=node.attr("dilations", [1, 1]),
                                groups=node.attr("group", 1))


def _gemm(node, inputs, device):
    a, b, c = (inputs + [None])[:3]
    a, b = as_tensor(a, device), as_tensor(b, device)
    if node.attr("transA", 0):
        a = ops.transpose(a, (1, 0))
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    w = b if node.attr("transB", 0) else ops.transpose(b, (1, 0))   # linear takes [out, in]
    y = ops.linear(a, w)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        c = as_tensor(c, device)
        y = y + (c * beta if beta != 1.0 else c)
    return y


def _matmul(node, inputs, device):
    return ops.matmul(as_tensor(inputs[0], device), as_tensor(inputs[1], device))


def _clip(node, inputs, device):
    x = inputs[0]
    if node.opset < 11:
        low, high = node.attr("min", -np.inf), node.attr("max", np.inf)
    else:
        low = scalar(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else -np.inf
        high = scalar(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else np.inf
    if low > high:
        low = high      # ONNX: with min > max every output is max
    if low == 0 and high == 6:
        return ops.relu6(x)
    if low == 0 and high == np.inf:
        return ops.relu(x)
    return ops.clamp(x, max(low, -3.4e38), min(high, 3.4e38))


def _batch_norm(node, inputs, device):
    x, scale, bias, mean, var = inputs[:5]
    t = lambda v: as_tensor(v, device)  # noqa: E731
    if not node.attr("spatial", 1):
        # Opsets 7 and 8, spatial=0: statistics per activation, of shape [C, D1, ...].
        statistics = [t(v) for v in (scale, bias, mean, var)]
        if any(tuple(v.shape) != tuple(x.shape[1:]) for v in statistics):
            node.fail(f"spatial=0 statistics of shapes {[tuple(v.shape) for v in statistics]} "
                      f"for an input of shape {tuple(x.shape)} (each must be the input's "
                      "shape without the batch axis)")
        scale, bias, mean, var = statistics
        inverse_deviation = ops.pow(var + node.attr("epsilon", 1e-5), -0.5)
        return (x - mean) * (inverse_deviation * scale) + bias
    return ops.batch_norm(x, t(scale), t(bias), t(mean), t(var), training=False,
                          eps=node.attr("epsilon", 1e-5))


def _pool_geometry(node, x):
    """kernel, strides, the node's (top, bottom, left, right) padding, and the
    (bottom, right) cells that ``ceil_mode`` adds past it."""
    _spatial_2d(node, x)
    kernel = node.attr("kernel_shape")
    strides = node.attr("strides", [1, 1])
    padding = _pads_2d(node, x.shape, kernel, strides)
    ceil_extra = (0, 0)
    # SAME padding already gives ceil(size / stride) windows; ceil_mode changes nothing there.
    if node.attr("ceil_mode", 0) and node.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID"):
        ceil_extra = tuple(_ceil_mode_extra(size, k, s, before, after) for size, k, s, before, after
                           in zip(x.shape[2:], kernel, strides, padding[0::2], padding[1::2]))
    return kernel, strides, padding, ceil_extra


def _ceil_mode_extra(size, kernel, stride, before, after):
    """Cells past the end padding that ceil_mode's last window reaches.

    ceil_mode counts ceil((size + before + after - kernel) / stride) + 1
    windows, less the last one if it would start past the input and the
    front padding (onnxruntime's and PyTorch's rule: a window starts inside
    the data or the front padding). That last window starts at most at
    size + before - 1, so the cells added plus ``after`` stay below ``kernel``.
    """
    padded = size + before + after
    count = -(-(padded - kernel) // stride) + 1
    if (count - 1) * stride >= size + before:
        count -= 1
    return max((count - 1) * stride + kernel - padded, 0)


def _max_pool(node, inputs, device):
    kernel, strides, (top, bottom, left, right), (extra_h, extra_w) = _pool_geometry(node, inputs[0])
    # Max pooling reads padding as -inf: the cells ceil_mode adds are padding like the rest.
    return ops.max_pool2d(inputs[0], kernel, strides, (top, bottom + extra_h, left, right + extra_w))


def _average_pool(node, inputs, device):
    x = inputs[0]
    kernel, strides, (top, bottom, left, right), (extra_h, extra_w) = _pool_geometry(node, x)
    count_include_pad = bool(node.attr("count_include_pad", 0))
    if count_include_pad and (extra_h or extra_w):
        # The divisor counts the node's padding but never the cells ceil_mode
        # adds: pad with explicit zeros (counted as data), then let the pool
        # leave the added cells out of its count.
        x = ops.pad(x, [(0, 0), (0, 0), (top, bottom), (left, right)])
        top = bottom = left = right = 0
        count_include_pad = False
    return ops.avg_pool2d(x, kernel, strides, (top, bottom + extra_h, left, right + extra_w),
                          count_include_pad=count_include_pad)


def _flatten(node, inputs, device):
    x = inputs[0]
    axis = node.attr("axis", 1)
    axis += len(x.shape) if axis < 0 else 0     # from -rank to rank: the rank gives [n, 1]
    shape = (int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    return x.reshape(shape) if is_host(x) else ops.reshape(x, shape)


def _reshape(node, inputs, device):
    x, shape = inputs
    shape = ints(shape)
    if not node.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape) if is_host(x) else ops.reshape(x, shape)


def _transpose(node, inputs, device):
    x = inputs[0]
    perm = node.attr("perm", list(range(len(x.shape)))[::-1])
    return np.transpose(x, perm).copy() if is_host(x) else ops.transpose(x, perm)


def _axes(node, inputs, ndim):
    axes = node.attr("axes") if node.opset < 13 else (
        ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None)
    return None if axes is None else sorted(a % ndim for a in axes)


def _squeeze(node, inputs, device):
    x = inputs[0]
    axes = _axes(node, inputs, len(x.shape))
    if axes is None:
        axes = [i for i, s in enumerate(x.shape) if s == 1]
    if any(x.shape[a] != 1 for a in axes):
        node.fail(f"squeezing a dimension larger than 1 (shape {tuple(x.shape)}, axes {axes})")
    shape = [s for i, s in enumerate(x.shape) if i not in axes]
    return x.reshape(shape) if is_host(x) else ops.reshape(x, shape)


def _unsqueeze(node, inputs, device):
    x = inputs[0]
    raw = node.attr("axes") if node.opset < 13 else ints(inputs[1])
    ndim = len(x.shape) + len(raw)
    shape = list(x.shape)
    for axis in sorted(a % ndim for a in raw):
        shape.insert(axis, 1)
    return x.reshape(shape) if is_host(x) else ops.reshape(x, shape)


def _concat(node, inputs, device):
    axis = node.attr("axis")
    present = [v for v in inputs if v is not None and np.prod(v.shape) > 0] or inputs[:1]
    if all(is_host(v) for v in present):
        return np.concatenate(present, axis=axis)
    return ops.concat([as_tensor(v, device) for v in present], axis=axis)


def _pad(node, inputs, device):
    x = inputs[0]
    if node.opset < 11:
        pads, value = node.attr("pads"), node.attr("value", 0.0)
    else:
        pads = ints(inputs[1])
        value = scalar(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else 0.0
        if len(inputs) > 3 and inputs[3] is not None:     # opset 18: pads of these axes only
            pads = _pads_of_every_axis(node, pads, ints(inputs[3]), len(x.shape))
    half = len(pads) // 2
    pairs = list(zip(pads[:half], pads[half:]))
    if any(b < 0 or a < 0 for b, a in pairs):
        node.fail("negative pads (cropping)")
    mode = node.attr("mode", "constant")
    if mode == "constant":
        return ops.pad(x, pairs, value)
    if is_host(x):
        return np.pad(x, pairs, mode=mode)
    x = as_tensor(x, device)
    for axis, (before, after) in enumerate(pairs):
        if before or after:
            x = _pad_axis(node, x, axis, before, after, mode)
    return x


def _pad_axis(node, x, axis, before, after, mode):
    """x with ``before`` and ``after`` cells added along ``axis`` by copying its
    own cells: the edge cell repeated ("edge"), the cells mirrored about the
    edge one, which is not repeated ("reflect": [c b | a b c d | c b]), or
    those of the other end ("wrap": [c d | a b c d | a b])."""
    size = x.shape[axis]
    # Edge repeats one cell any number of times; the others copy at most the axis once.
    limit = {"edge": float("inf"), "reflect": size - 1}.get(mode, size)
    if max(before, after) > limit:
        node.fail(f"{mode} pads {before}, {after} on axis {axis} of size {size} (at most {limit})")

    def cells(start, stop, step=1):
        return ops.slice_(x, (slice(None),) * axis + (slice(start, stop, step),))

    def repeated(cell, count):
        shape = list(x.shape)
        shape[axis] = count
        return ops.broadcast_to(cell, tuple(shape))

    if mode == "edge":
        ahead, behind = (lambda: repeated(cells(0, 1), before),
                         lambda: repeated(cells(size - 1, size), after))
    elif mode == "reflect":
        # Cells before..1 ahead and size-2..size-1-after behind (a stop of -1 would
        # mean the last cell: None runs to the front).
        ahead, behind = (lambda: cells(before, 0, -1),
                         lambda: cells(size - 2, size - 2 - after if after < size - 1 else None,
                                       -1))
    else:
        ahead, behind = lambda: cells(size - before, size), lambda: cells(0, after)
    parts = ([ahead()] if before else []) + [x] + ([behind()] if after else [])
    return ops.concat(parts, axis=axis)


def _pads_of_every_axis(node, pads, axes, rank):
    """Pad's [begin..., end...] of the ``axes`` given, as pads of every axis of a
    ``rank``-D input (0 for the others)."""
    if len(pads) != 2 * len(axes):
        node.fail(f"{len(pads)} pads for {len(axes)} axes (two per axis)")
    every = [0] * (2 * rank)
    for index, axis in enumerate(axes):
        every[axis % rank] = pads[index]
        every[axis % rank + rank] = pads[index + len(axes)]
    return every


def _dropout(node, inputs, device):
    if len(inputs) > 2 and inputs[2] is not None and bool(host(inputs[2]).reshape(())):
        node.fail("Dropout in training mode")
    if len(node.outputs) > 1 and node.outputs[1]:
        # Inference keeps every element: the mask is all true (bool from opset 10,
        # of the data's type before).
        return [inputs[0], np.ones(inputs[0].shape, dtype=np.bool_ if node.opset >= 10
                                   else np.float32)]
    return inputs[0]


def _shape(node, inputs, device):
    shape = np.array(inputs[0].shape, dtype=np.int64)
    start, end = node.attr("start", 0), node.attr("end", None)
    return shape[start:end]


def _gather(node, inputs, device):
    data, indices = inputs
    axis = node.attr("axis", 0) % len(data.shape)
    indices = host(indices).astype(np.int64)
    if is_host(data):
        return np.take(data, indices, axis=axis)
    # On a device tensor: one slice per index, joined (Gather there is rare:
    # exporters use it on shapes; this path is for correctness, not speed).
    size = data.shape[axis]
    flat = [int(i) % size for i in indices.reshape(-1)]
    lead = [slice(None)] * axis
    pieces = [ops.slice_(data, tuple(lead + [slice(i, i + 1)])) for i in flat]
    joined = ops.concat(pieces, axis=axis) if len(pieces) != 1 else pieces[0]
    return ops.reshape(joined, data.shape[:axis] + indices.shape + data.shape[axis + 1:])


def _slice(node, inputs, device):
    x = inputs[0]
    if node.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes"), None
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        steps = ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else None
    ndim = len(x.shape)
    axes = list(range(len(starts))) if axes is None else [a % ndim for a in axes]
    steps = steps or [1] * len(starts)
    index = [slice(None)] * ndim
    for axis, start, end, step in zip(axes, starts, ends, steps):
        # ONNX clamps out-of-range ends (e.g. INT64_MAX), as Python slices do.
        index[axis] = slice(start, None if (step < 0 and end < -x.shape[axis]) else end, step)
    if is_host(x):
        return x[tuple(index)].copy()
    return ops.slice_(x, tuple(index))


def _cast(node, inputs, device):
    x = inputs[0]
    to = ONNX_TYPES[node.attr("to")]
    if is_host(x):
        return x.astype(to)
    if np.dtype(to) != np.float32:
        node.fail(f"casting a device tensor to {np.dtype(to)} (device tensors are float32)")
    return x


def _constant(node, inputs, device):
    from onnx import numpy_helper   # local import: onnx is optional, loaded on first use
    if "value" in node.attrs:
        return numpy_helper.to_array(node.attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64),
                       ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in node.attrs:
            return np.array(node.attrs[key], dtype=dtype)
    node.fail("this kind of Constant value")


def _constant_of_shape(node, inputs, device):
    from onnx import numpy_helper   # local import: onnx is optional, loaded on first use
    value = node.attrs.get("value")
    fill = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    return np.full(ints(inputs[0]), fill.reshape(-1)[0], dtype=fill.dtype)


HANDLERS = {
    "Conv": _conv, "ConvTranspose": _conv_transpose, "Gemm": _gemm, "MatMul": _matmul,
    "Add": _binary(ops.add, np.add), "Sub": _binary(ops.sub, np.subtract),
    "Mul": _binary(ops.mul, np.multiply),
    "Div": _binary(ops.div, lambda a, b: (np.trunc(np.true_divide(a, b))   # integers truncate
                                          if a.dtype.kind in "iu" and b.dtype.kind in "iu"
                                          else np.divide(a, b)).astype(np.result_type(a, b))),
    "Relu": unary(ops.relu), "Sigmoid": unary(ops.sigmoid), "Clip": _clip,
    "BatchNormalization": _batch_norm, "MaxPool": _max_pool, "AveragePool": _average_pool,
    "GlobalAveragePool": lambda node, inputs, device: ops.global_avg_pool2d(inputs[0]),
    "Flatten": _flatten, "Reshape": _reshape, "Transpose": _transpose, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Concat": _concat, "Pad": _pad,
    "Softmax": softmax_handler(lambda x, axis: ops.softmax(x, axis=axis)),
    "Dropout": _dropout, "Identity": lambda node, inputs, device: inputs[0],
    "Shape": _shape, "Gather": _gather, "Slice": _slice, "Cast": _cast, "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
}

#: Those of :data:`HANDLERS` that also compute on host arrays (shape arithmetic).
HOST_OPS = {"Shape", "Gather", "Slice", "Cast", "Constant", "ConstantOfShape", "Concat",
            "Unsqueeze", "Squeeze", "Reshape", "Identity", "Add", "Sub", "Mul", "Div",
            "Transpose", "Flatten"}
