"""Stochastic gradient descent with momentum, Nesterov momentum and weight decay."""
from gdnflow.optim.optimizer import Optimizer


class SGD(Optimizer):
    """Stochastic gradient descent, with PyTorch's update rule (dampening 0).

    For each parameter p with gradient g, at every step::

        d = g + weight_decay * p
        if momentum != 0:
            b = momentum * b + d            (b = d on the first step)
            d = d + momentum * b  if nesterov  else  b
        p = p - lr * d

    ``b`` is the ``momentum_buffer`` state. It starts at zero, which gives
    exactly b = d on the first step (momentum * 0 + d), so the NumPy code and
    the CUDA kernel need no first-step branch.

    ``params``: parameters or parameter groups (see :class:`Optimizer`); the
    other arguments are the defaults of every group.
    """

    state_arrays = ("momentum_buffer",)
    kernel = "sgd_step"

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      nesterov=nesterov))

    def check_group(self, group):
        for key in ("lr", "momentum", "weight_decay"):
            value = group[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"SGD: {key} must be a number >= 0, got {value!r}")
            group[key] = float(value)
        group["nesterov"] = bool(group["nesterov"])
        if group["nesterov"] and group["momentum"] == 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")

    def prepare_state(self, p, state, group):
        # Created on the first step that uses momentum (also when momentum
        # is switched on later), as PyTorch does.
        if group["momentum"] != 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = self.zeros_like(p)

    def update_scalars(self, state, group):
        # The order optim.cu's sgd_step reads them in (nesterov as 0 or 1).
        return (group["lr"], group["momentum"], group["weight_decay"], int(group["nesterov"]))

    def update_numpy(self, param, grad, state, scalars):
        lr, momentum, weight_decay, nesterov = scalars
        d = grad + weight_decay * param if weight_decay != 0 else grad
        if momentum != 0:
            buffer = state["momentum_buffer"]
            buffer *= momentum
            buffer += d
            d = d + momentum * buffer if nesterov else buffer
        param -= lr * d
