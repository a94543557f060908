"""Gradient clipping by the global norm."""
import math

import numpy as np

from gdnflow import step_state
from gdnflow.autograd import no_grad
from gdnflow.backends import cuda, get_backend
from gdnflow.errors import DTypeError
from gdnflow.optim.optimizer import BLOCK, SOURCE, block_map
from gdnflow.precision import is_half
from gdnflow.tensor import Tensor

#: Pointer tables of eager clipping kept for reuse (see :func:`_multi_tensor`).
EAGER_TABLES = 8
_eager_tables = {}      # pointers -> device table


def clip_grad_norm(params, max_norm, eps=1e-6, sync=True):
    """Scale the gradients in place so that their global L2 norm is at most ``max_norm``.

    The norm is ``sqrt(sum over parameters of sum(g^2))`` over the parameters
    (an iterable of tensors, or one tensor) that have a gradient. If it
    exceeds ``max_norm``, every gradient is multiplied by ``max_norm / (norm
    + eps)`` (PyTorch's ``clip_grad_norm_``; the eps keeps the clipped norm
    just below ``max_norm``). A NaN norm scales nothing; an infinite one
    makes the factor 0, as in PyTorch. On the GPU this is three launches
    whatever the number of gradients (optim.cu).

    ``sync=True`` returns the norm before clipping as a float (read back
    from the GPU). ``sync=False`` reads nothing back: the factor is computed
    on the device and the norm comes back as a one-element tensor (of 0 when
    no parameter has a gradient). Inside a compiled step function only
    ``sync=False`` works. Both give the same gradients. The gradients must
    be on one device.
    """
    if sync and step_state.active() is not None:
        step_state.refuse_host_read("clip_grad_norm(sync=True), which returns the norm as a "
                                    "float,")
    params = [params] if isinstance(params, Tensor) else list(params)
    if not max_norm > 0:
        raise ValueError(f"clip_grad_norm: max_norm must be > 0, got {max_norm!r}")
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        if sync:
            return 0.0
        device = params[0].device if params else "numpy"
        return Tensor.wrap(get_backend(device).full((1,), 0.0, np.float32), device)
    half = [g.dtype for g in grads if is_half(g.dtype)]
    if half:
        raise DTypeError(f"clip_grad_norm: {len(half)} gradient(s) are {half[0]}; it clips "
                         "float32 gradients (of float32 parameters, as gdnflow.autocast keeps them)")
    devices = sorted({g.device for g in grads})
    if len(devices) > 1:
        raise ValueError(f"clip_grad_norm: the gradients are on {devices}; move them to one "
                         "device")
    # Autograd hands the same gradient tensor to several leaves (a + b gives
    # both the incoming gradient): each counts in the norm, but is scaled once.
    distinct = list({_address(g): g for g in grads}.values())
    with no_grad():
        if devices[0] == "numpy":
            square_sum = _square_sum_numpy(grads)
            norm = math.sqrt(float(square_sum))
            if norm > max_norm:
                for g in distinct:
                    g.data *= g.data.dtype.type(max_norm / (norm + eps))
            if sync:
                return norm
            norm_tensor = Tensor.wrap(np.array([norm], dtype=grads[0].dtype), "numpy")
        else:
            tables = _multi_tensor(grads)
            total = _square_sum_cuda(tables)
            if len(distinct) != len(grads):
                tables = _multi_tensor(distinct)
            if tables is not None:
                table, blocks, n_blocks = tables
                cuda.kernel(SOURCE, "scale_to_max_norm", "PPPdd")(
                    (n_blocks, 1, 1), (BLOCK, 1, 1), table.ptr, blocks.ptr, total.ptr,
                    float(max_norm), float(eps))
            if sync:
                return math.sqrt(Tensor.wrap(total, "cuda").item())
            norm_tensor = Tensor.wrap(total, "cuda").sqrt().reshape(1)
    return norm_tensor


def _square_sum_numpy(grads):
    """sum of g^2 over every gradient: a sum per gradient, added in the gradients' dtype."""
    total = grads[0].data.dtype.type(0)
    for g in grads:
        total = total + np.square(g.data).sum()
    return total


def _square_sum_cuda(tables):
    """A one-element device array: sum of g^2 over the tensors of ``tables`` (see
    :func:`_multi_tensor`; two launches)."""
    total = cuda.empty((1,))
    table, blocks, n_blocks = tables if tables is not None else (None, None, 0)
    # With no element at all, sum_partials sums nothing and writes 0.
    partials = cuda.empty((max(n_blocks, 1),))
    if n_blocks:
        cuda.kernel(SOURCE, "square_sum_partials", "PPP")(
            (n_blocks, 1, 1), (BLOCK, 1, 1), table.ptr, blocks.ptr, partials.ptr)
    cuda.kernel(SOURCE, "sum_partials", "PiP")((1, 1, 1), (BLOCK, 1, 1), partials.ptr,
                                               n_blocks, total.ptr)
    return total


def _multi_tensor(tensors):
    """(pointer table, block map, block count) of ``tensors`` for optim.cu, or None if empty.

    Inside a compiled step the table is one of the step's constants.
    """
    blocks, n_blocks = block_map(tuple(t.size for t in tensors))
    if not n_blocks:
        return None
    pointers = tuple(t.data.ptr for t in tensors)
    step = step_state.active()
    if step is not None:
        return step.upload_constant(np.array(pointers, dtype=np.uint64)), blocks, n_blocks
    # Eager steps: the pool tends to hand the gradients the same blocks every
    # step, so the table of the last few pointer lists is kept (the same values).
    table = _eager_tables.get(pointers)
    if table is None:
        if len(_eager_tables) >= EAGER_TABLES:
            _eager_tables.clear()
        table = _eager_tables[pointers] = cuda.get_runtime().from_numpy(
            np.array(pointers, dtype=np.uint64))
    return table, blocks, n_blocks


def _address(t):
    """Where t's elements start: the identity of the memory, whatever Tensor wraps it."""
    if t.device == "numpy":
        return ("numpy", t.data.__array_interface__["data"][0])
    return ("cuda", t.data.ptr)
