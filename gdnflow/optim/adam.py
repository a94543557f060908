"""Adam (Kingma & Ba, 2015) with L2 weight decay, as PyTorch's ``torch.optim.Adam``."""
import math

import numpy as np

from gdnflow.optim.optimizer import Optimizer


class Adam(Optimizer):
    """Adam, with PyTorch's update rule (``amsgrad=False``, weight decay added to g).

    For each parameter p with gradient g, at its step t = 1, 2, ...::

        g = g + weight_decay * p
        m = beta1 * m + (1 - beta1) * g                 (exp_avg, starts at 0)
        v = beta2 * v + (1 - beta2) * g^2               (exp_avg_sq, starts at 0)
        step_size = lr / (1 - beta1^t)
        denom = sqrt(v) / sqrt(1 - beta2^t) + eps
        p = p - step_size * m / denom

    t counts the updates of that parameter (``state["step"]``): a parameter
    without a gradient on some step is skipped and its t does not advance.

    ``params``: parameters or parameter groups (see :class:`Optimizer`); the
    other arguments are the defaults of every group.
    """

    state_arrays = ("exp_avg", "exp_avg_sq")
    required_state = ("step", "exp_avg", "exp_avg_sq")
    kernel = "adam_step"
    # update_scalars: beta1, 1 - beta1, beta2, 1 - beta2, eps, weight_decay,
    # step_size, sqrt(1 - beta2^t): the host computes the step-dependent
    # factors in double precision, as PyTorch does; the kernel reads them as
    # floats, per tensor (step counts may differ within a group).

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def check_group(self, group):
        for key in ("lr", "eps", "weight_decay"):
            value = group[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"Adam: {key} must be a number >= 0, got {value!r}")
            group[key] = float(value)
        try:
            beta1, beta2 = (float(b) for b in group["betas"])
        except (TypeError, ValueError):
            raise ValueError(f"Adam: betas must be two numbers, got {group['betas']!r}") from None
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"Adam: betas must lie in [0, 1), got {group['betas']!r}")
        group["betas"] = (beta1, beta2)     # a tuple again after a JSON round trip

    def prepare_state(self, p, state, group):
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = self.zeros_like(p)
            state["exp_avg_sq"] = self.zeros_like(p)

    def update_scalars(self, state, group):
        state["step"] += 1
        t = state["step"]
        beta1, beta2 = group["betas"]
        return (beta1, 1 - beta1, beta2, 1 - beta2, group["eps"], group["weight_decay"],
                group["lr"] / (1 - beta1 ** t), math.sqrt(1 - beta2 ** t))

    def update_numpy(self, param, grad, state, scalars):
        beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, step_size, \
            bias_correction2_sqrt = scalars
        g = grad + weight_decay * param if weight_decay != 0 else grad
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= beta1
        m += one_minus_beta1 * g
        v *= beta2
        v += one_minus_beta2 * (g * g)
        denom = np.sqrt(v) / bias_correction2_sqrt + eps
        param -= step_size * (m / denom)
