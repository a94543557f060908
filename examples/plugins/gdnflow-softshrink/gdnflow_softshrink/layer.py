"""``SoftShrink``: a layer of learned, per-channel soft thresholds."""
import numpy as np

from gdnflow.nn import Module, Parameter

from gdnflow_softshrink.operator import soft_shrink


class SoftShrink(Module):
    """y = sign(x) * max(|x| - theta_c, 0) with a learned threshold theta per channel.

    ``SoftShrink(channels, threshold=0.1)``: input (N, channels, ...), output
    the same shape; ``theta`` is a Parameter of shape (channels,), every entry
    starting at ``threshold``.
    """

    def __init__(self, channels, threshold=0.1, device=None):
        super().__init__()
        if channels < 1:
            raise ValueError(f"SoftShrink: channels must be positive, got {channels}")
        self.theta = Parameter(np.full(channels, threshold), device=device)

    def forward(self, x):
        return soft_shrink(x, self.theta)
