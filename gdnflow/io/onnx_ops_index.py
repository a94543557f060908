"""ONNX indexing, rearrangement and generator operators, composed from gdnflow
operators (indices are host arrays; data may be a device tensor).

========================  ===================================================
GatherElements(axis)      x as [..., 1, n, ...] times the constant one-hot of
                          the indices [..., k, n, ...], summed over n: a
                          differentiable gather (memory k n per position)
TopK(axis, largest,       the indices by a stable sort on the host; the
sorted)                   values gathered as GatherElements does
ArgMax, ArgMin            NumPy on the host (integer indices, no gradient)
ScatterElements,          NumPy on the host (no gradient: refused where an
Scatter, ScatterND,       input requires one)
GatherND
DepthToSpace,             reshape, transpose, reshape
SpaceToDepth
Einsum                    NumPy's einsum on host arrays; on tensors, the
                          operands' subscripts sorted into batch,
                          contracted and free ones by transposes and
                          reshapes, then one matmul (a lone operand: a
                          sum and a transpose); repeated subscripts within
                          one operand (diagonals) are refused
Trilu(upper)              x times the constant triangular 0/1 mask
Range, EyeLike, OneHot,   NumPy on the host
NonZero, Size
========================  ===================================================
"""
import string

import numpy as np

from gdnflow import ops
from gdnflow.io.onnx_ops_math import on_host
from gdnflow.io.onnx_values import as_tensor, host, ints, is_host, scalar


def gather_elements(x, indices, axis):
    """x's elements at ``indices`` (a host array of x's rank) along ``axis``."""
    if is_host(x):
        return np.take_along_axis(x, indices, axis)
    size = x.shape[axis]
    indices = np.where(indices < 0, indices + size, indices)
    # Other axes of the indices may be shorter than x's: the leading block of x.
    x = ops.slice_(x, tuple(slice(0, k) if i != axis else slice(None)
                            for i, k in enumerate(indices.shape)))
    one_hot = (np.expand_dims(indices, axis + 1) == np.arange(size).reshape(
        (size,) + (1,) * (x.ndim - axis - 1))).astype(np.float32)
    return ops.sum(ops.reshape(x, x.shape[:axis] + (1,) + x.shape[axis:]) * one_hot, (axis + 1,))


def _gather_elements(node, inputs, device):
    x, indices = inputs
    axis = node.attr("axis", 0) % x.ndim
    return gather_elements(x, host(indices).astype(np.int64), axis)


def _top_k(node, inputs, device):
    x = inputs[0]
    k = node.attr("k") if node.opset < 10 else ints(inputs[1])[0]   # an input from opset 10
    axis = node.attr("axis", -1) % x.ndim
    values = host(x)
    if node.attr("largest", 1):     # descending: negated (unsigned integers: from their maximum)
        values = np.iinfo(values.dtype).max - values if values.dtype.kind == "u" else -values
    # A stable sort keeps equal values in index order, as ONNX asks.
    order = np.argsort(values, axis=axis, kind="stable")
    indices = np.take(order, range(k), axis=axis).astype(np.int64)
    return [gather_elements(x, indices, axis), indices]


def _arg_extremum(function):
    def arg(node, x):
        axis = node.attr("axis", 0) % x.ndim
        if node.attr("select_last_index", 0):
            index = x.shape[axis] - 1 - function(np.flip(x, axis), axis=axis)
        else:
            index = function(x, axis=axis)
        index = index.astype(np.int64)
        return np.expand_dims(index, axis) if node.attr("keepdims", 1) else index
    return on_host(arg)


def _scatter_elements(node, x, indices, updates):
    axis = node.attr("axis", 0) % x.ndim
    indices = np.where(indices < 0, indices + x.shape[axis], indices)
    out = x.copy()
    reduction = node.attr("reduction", "none")
    combine = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}.get(
        reduction)
    # One update at a time, in order: later duplicates win (reduction none) or combine.
    for position in np.ndindex(*indices.shape):
        target = list(position)
        target[axis] = indices[position]
        target = tuple(target)
        out[target] = updates[position] if combine is None else combine(out[target],
                                                                        updates[position])
    return out


def _scatter_nd(node, x, indices, updates):
    # indices [..., k] address x's first k axes; updates [..., x.shape[k:]].
    out = x.copy()
    reduction = node.attr("reduction", "none")
    combine = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}.get(
        reduction)
    depth = indices.shape[-1]
    targets = indices.reshape(-1, depth)
    targets = np.where(targets < 0, targets + np.array(x.shape[:depth]), targets)
    values = updates.reshape((-1,) + x.shape[depth:])
    # One update at a time, in order: later duplicates win (reduction none) or combine.
    for target, value in zip(map(tuple, targets), values):
        out[target] = value if combine is None else combine(out[target], value)
    return out


def _gather_nd(node, x, indices):
    batch = node.attr("batch_dims", 0)
    lead = x.shape[:batch]
    flat_x = x.reshape((-1,) + x.shape[batch:])
    flat_i = indices.reshape((-1,) + indices.shape[batch:])
    picked = [xb[tuple(np.moveaxis(ib, -1, 0))] for xb, ib in zip(flat_x, flat_i)]
    return np.stack(picked).reshape(lead + picked[0].shape)


def _depth_to_space(node, inputs, device):
    x = inputs[0]
    b = node.attr("blocksize")
    n, c, h, w = x.shape
    if node.attr("mode", "DCR") == "DCR":
        y = ops.transpose(ops.reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = ops.transpose(ops.reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return ops.reshape(y, (n, c // (b * b), h * b, w * b))


def _space_to_depth(node, inputs, device):
    x = inputs[0]
    b = node.attr("blocksize")
    n, c, h, w = x.shape
    order = (0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    y = ops.transpose(ops.reshape(x, (n, c, h // b, b, w // b, b)), order)
    return ops.reshape(y, (n, c * b * b, h // b, w // b))


def _trilu(node, inputs, device):
    x = inputs[0]
    k = ints(inputs[1])[0] if len(inputs) > 1 and inputs[1] is not None else 0
    rows, cols = np.indices(x.shape[-2:])
    mask = (cols - rows >= k) if node.attr("upper", 1) else (cols - rows <= k)
    if is_host(x):
        return np.where(mask, x, np.zeros_like(x))
    return x * mask.astype(np.float32)


# ---------------------------------------------------------------- einsum --
def _einsum(node, inputs, device):
    equation = node.attr("equation").replace(" ", "")
    if all(is_host(v) for v in inputs):
        if any(v.dtype.kind not in "biuf" for v in inputs):
            node.fail(f"{inputs[0].dtype} data (NumPy's einsum computes host arrays of "
                      "bool, integer and float types)")
        return np.einsum(equation, *inputs)
    operands = [as_tensor(v, device) for v in inputs]
    terms, _, output = equation.partition("->")
    terms = terms.split(",")
    unused = [c for c in string.ascii_letters if c not in equation]
    ellipsis_rank = max((v.ndim - len(t.replace("...", "")) for t, v in zip(terms, operands)
                         if "..." in t), default=0)
    dots = "".join(unused[:ellipsis_rank])
    terms = [t.replace("...", dots[len(dots) - (v.ndim - len(t.replace("...", ""))):])
             for t, v in zip(terms, operands)]
    if not _:       # implicit output: the subscripts that occur once, sorted, after the ellipsis
        counts = "".join(terms)
        output = dots + "".join(sorted(c for c in set(counts) if counts.count(c) == 1
                                       and c not in dots))
    output = output.replace("...", dots)
    if any(len(set(t)) != len(t) for t in terms) or len(terms) > 2:
        node.fail(f"equation {equation!r} (only one or two operands, no repeated subscript "
                  "within one)")
    if len(terms) == 1:
        return _reorder(operands[0], terms[0], output)
    return _contract(operands, terms, output)


def _reorder(x, term, output):
    """x summed over the subscripts of ``term`` not in ``output``, then transposed to it."""
    summed = tuple(i for i, c in enumerate(term) if c not in output)
    if summed:
        x = ops.sum(x, summed)
        term = "".join(c for c in term if c in output)
    perm = [term.index(c) for c in output]
    return x if perm == sorted(perm) else ops.transpose(x, perm)


def _contract(operands, terms, output):
    (a, b), (ta, tb) = operands, terms
    # A subscript in one operand only and not in the output is summed out first.
    kept_a = "".join(c for c in ta if c in tb or c in output)
    kept_b = "".join(c for c in tb if c in ta or c in output)
    a, b, ta, tb = _reorder(a, ta, kept_a), _reorder(b, tb, kept_b), kept_a, kept_b
    batch = [c for c in ta if c in tb and c in output]
    contracted = [c for c in ta if c in tb and c not in output]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]
    sizes = {c: max(a.shape[ta.index(c)] if c in ta else 1, b.shape[tb.index(c)] if c in tb
                    else 1) for c in ta + tb}

    def as_matrices(x, term, rows, cols):
        order = batch + rows + cols
        x = _reorder(x, term, "".join(order))
        full = tuple(sizes[c] for c in order)
        if x.shape != full:         # a batch subscript of size 1 broadcasts
            x = ops.broadcast_to(x, full)
        count = int(np.prod([sizes[c] for c in batch], dtype=np.int64))
        return ops.reshape(x, (count, int(np.prod([sizes[c] for c in rows], dtype=np.int64)),
                               int(np.prod([sizes[c] for c in cols], dtype=np.int64))))

    product = ops.matmul(as_matrices(a, ta, free_a, contracted),
                         as_matrices(b, tb, contracted, free_b))
    result = ops.reshape(product, tuple(sizes[c] for c in batch + free_a + free_b))
    return _reorder(result, "".join(batch + free_a + free_b), output)


# ------------------------------------------------------------ generators --
def _range(node, start, limit, delta):
    return np.arange(start.reshape(()), limit.reshape(()), delta.reshape(()), dtype=start.dtype)


def _eye_like(node, x):
    from onnx.helper import tensor_dtype_to_np_dtype   # local import: onnx is optional
    dtype = tensor_dtype_to_np_dtype(node.attr("dtype")) if "dtype" in node.attrs else x.dtype
    return np.eye(*x.shape, k=node.attr("k", 0), dtype=dtype)


def _one_hot(node, indices, depth, values):
    depth = int(scalar(depth))
    axis = node.attr("axis", -1)
    indices = np.where(indices < 0, indices + depth, indices).astype(np.int64)
    hot = np.expand_dims(indices, -1) == np.arange(depth)
    out = np.where(hot, values[1], values[0])
    return np.moveaxis(out, -1, axis % out.ndim)


HANDLERS = {
    "GatherElements": _gather_elements, "TopK": _top_k,
    "ArgMax": _arg_extremum(np.argmax), "ArgMin": _arg_extremum(np.argmin),
    "ScatterElements": on_host(_scatter_elements, has_gradient=True),
    "Scatter": on_host(_scatter_elements, has_gradient=True),
    "ScatterND": on_host(_scatter_nd, has_gradient=True),
    "GatherND": on_host(_gather_nd, has_gradient=True),
    "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth, "Trilu": _trilu,
    "Einsum": _einsum, "Range": on_host(_range), "EyeLike": on_host(_eye_like),
    "OneHot": on_host(_one_hot), "NonZero": on_host(lambda node, x: np.array(np.nonzero(x))),
    "Size": on_host(lambda node, x: np.array(x.size, np.int64)),
}

#: Those of :data:`HANDLERS` that also compute on host arrays.
HOST_OPS = {"GatherElements", "TopK", "Einsum", "ArgMax", "ArgMin", "ScatterElements", "Scatter",
            "ScatterND", "GatherND", "Trilu", "Range", "EyeLike", "OneHot", "NonZero", "Size"}
