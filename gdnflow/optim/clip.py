"""Gradient clipping by the global norm."""
import math

import numpy as np

from gdnflow.autograd import no_grad
from gdnflow.backends import cuda
from gdnflow.tensor import Tensor


def clip_grad_norm(params, max_norm, eps=1e-6, sync=True):
    """Scale the gradients in place so that their global L2 norm is at most ``max_norm``.

    The norm is ``sqrt(sum over parameters of sum(g^2))`` over the parameters
    (an iterable of tensors, or one tensor) that have a gradient, computed
    with gdnflow's reductions on each gradient's device. If it exceeds
    ``max_norm``, every gradient is multiplied by ``max_norm / (norm + eps)``
    (PyTorch's ``clip_grad_norm_``; the eps keeps the clipped norm just
    below ``max_norm``). A non-finite norm scales nothing.

    ``sync=True`` returns the norm before clipping as a float (read back
    from the GPU). ``sync=False`` reads nothing back: the factor is computed
    on the device and the norm comes back as a one-element tensor; the
    gradients must then all be on one device. Inside a compiled step
    function only ``sync=False`` works. Both give the same gradients.
    """
    params = [params] if isinstance(params, Tensor) else list(params)
    if not max_norm > 0:
        raise ValueError(f"clip_grad_norm: max_norm must be > 0, got {max_norm!r}")
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0 if sync else None
    if not sync and len({g.device for g in grads}) > 1:
        raise ValueError("clip_grad_norm(sync=False): the gradients are on "
                         f"{sorted({g.device for g in grads})}; the norm without a read back "
                         "needs them on one device")
    with no_grad():
        # One running sum per device (tensors of two devices cannot be
        # added), read back once per device.
        totals = {}
        for g in grads:
            square_sum = (g * g).sum()
            totals[g.device] = square_sum if g.device not in totals else totals[g.device] + square_sum
        if not sync:
            square_sum = next(iter(totals.values()))
            _scale_each_once(grads, lambda g: _scale_to_max_norm(g, square_sum, max_norm, eps))
            return _norm_tensor(square_sum)
        norm = math.sqrt(sum(t.item() for t in totals.values()))
    if norm > max_norm:
        scale = max_norm / (norm + eps)
        _scale_each_once(grads, lambda g: _scale_in_place(g, scale))
    return norm


def _scale_each_once(grads, scale):
    # Autograd hands the same gradient tensor to several leaves (a + b
    # gives both the incoming gradient): scale each array only once.
    seen = set()
    for g in grads:
        key = _address(g)
        if key not in seen:
            seen.add(key)
            scale(g)


def _address(t):
    """Where t's elements start: the identity of the memory, whatever Tensor wraps it."""
    if t.device == "numpy":
        return ("numpy", t.data.__array_interface__["data"][0])
    return ("cuda", t.data.ptr)


def _scale_in_place(t, scale):
    if t.device == "numpy":
        t.data *= t.data.dtype.type(scale)
    elif t.size:
        cuda.kernel("optim.cu", "scale_in_place", "Pif").launch(t.size, t.data.ptr, t.size, scale)


def _scale_to_max_norm(t, square_sum, max_norm, eps):
    """Clip ``t`` by the norm sqrt(``square_sum``) (a device scalar) without reading it."""
    if t.device == "numpy":
        norm = math.sqrt(float(square_sum.data.reshape(())))
        if norm > max_norm:
            t.data *= t.data.dtype.type(max_norm / (norm + eps))
    elif t.size:
        cuda.kernel("optim.cu", "scale_to_max_norm", "PiPdd").launch(
            t.size, t.data.ptr, t.size, square_sum.data.ptr, float(max_norm), float(eps))


def _norm_tensor(square_sum):
    """sqrt of the sum of squares, as a one-element tensor on its device."""
    if square_sum.device == "numpy":
        value = np.sqrt(square_sum.data.astype(np.float64)).astype(square_sum.dtype)
        return Tensor.wrap(value.reshape(1), "numpy")
    return square_sum.sqrt().reshape(1)
