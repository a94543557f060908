"""Numerical checks for training: finding where a NaN or an infinity came from,
and changing a model's precision (float64 copies for gradient checks).
"""
import math

import numpy as np

from gdnflow.autograd import no_grad
from gdnflow.nn.module import Parameter
from gdnflow.tensor import Tensor
from gdnflow.errors import GdnflowError


class NonFiniteError(GdnflowError, FloatingPointError):
    """Training met a NaN or an infinity. ``step`` is the step; ``where`` names the layer
    or parameter found first (None if none could be named); the message says both."""

    def __init__(self, message, step=None, where=None):
        super().__init__(message)
        self.step, self.where = step, where


def is_finite(tensor):
    """True if every element of ``tensor`` (a Tensor or an array) is finite (reads it back)."""
    values = tensor.numpy() if isinstance(tensor, Tensor) else np.asarray(tensor)
    return bool(np.isfinite(values).all())


def nonfinite_parameters(model):
    """Names of the model's parameters whose values are not all finite, in model order."""
    return [name for name, p in model.named_parameters() if not is_finite(p)]


def nonfinite_gradients(model):
    """Names of the model's parameters whose gradients are not all finite, in model order."""
    return [name for name, p in model.named_parameters()
            if p.grad is not None and not is_finite(p.grad)]


def first_nonfinite_output(model, x, **forward_args):
    """The name of the first layer in ``model.trace(x)`` whose output is not finite, or None.

    Runs the forward again without recording (the caller passes the same
    noise, so it repeats the failing computation).
    """
    if not is_finite(x):
        return "input"
    with no_grad():
        for name, output in model.trace(x, **forward_args):
            if not is_finite(output):
                return name
    return None


def locate_non_finite(model, x, record, **forward_args):
    """Where a training step's NaN or infinity came from: (name or None, a sentence).

    Looks, in order, at the parameters, at the layer outputs of the forward
    on ``x`` (``forward_args`` repeat the step's noise), at the gradients, and
    at the auxiliary loss in ``record`` (the step's values).
    """
    bad = nonfinite_parameters(model)
    if bad:
        return bad[0], f"parameter {bad[0]} holds non-finite values"
    where = first_nonfinite_output(model, x, **forward_args)
    if where is not None:
        layer = {name.rstrip("."): m for name, m in model.named_modules()}.get(where)
        kind = f" ({type(layer).__name__})" if layer is not None else ""
        return where, f"the first non-finite output is that of {where}{kind}"
    bad = nonfinite_gradients(model)
    if bad:
        more = f" (and {len(bad) - 1} more: {', '.join(bad[1:4])})" if len(bad) > 1 else ""
        return bad[0], f"the gradient of {bad[0]} is non-finite{more}"
    if not math.isfinite(record["aux"]):
        return "entropy_bottleneck.quantiles", "the auxiliary (quantile) loss is non-finite"
    return None, "nothing non-finite could be located (a transient value?)"


def cast_module(model, dtype):
    """Convert every parameter and buffer of ``model`` to ``dtype`` in place; returns the model.

    New Parameter objects replace the old (build optimisers afterwards).
    float64 exists on NumPy only: it is for gradient checks of whole models.
    """
    for _, module in model.named_modules():
        for name, p in list(module._parameters.items()):
            setattr(module, name, Parameter(p.numpy(), device=p.device, dtype=dtype,
                                            requires_grad=p.requires_grad))
        for name, b in list(module._buffers.items()):
            if b is not None:
                setattr(module, name, Tensor(b.numpy(), device=b.device, dtype=dtype))
    return model
