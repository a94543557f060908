"""Convolution layers: parameters plus one call to the convolution operators
of :mod:`gdnflow.ops.conv` (conv2d and conv_transpose2d)."""
import math

import numpy as np

from gdnflow import ops
from gdnflow.errors import ShapeError
from gdnflow.nn.module import Module, Parameter


def _pair(value):
    return (value, value) if isinstance(value, int) else tuple(value)


def _uniform(rng, shape, fan_in):
    """PyTorch's default conv/linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape).astype(np.float32)


class Conv2d(Module):
    """2-D convolution layer: weight [out, in/groups, kh, kw], optional bias [out].

    Input [N, in, H, W] -> output [N, out, OH, OW] with
    ``OH = floor((H + pad_top + pad_bottom - dilation*(kh - 1) - 1) / stride) + 1``.
    ``padding`` is an int, (ph, pw) or (top, bottom, left, right);
    ``groups == in_channels == out_channels`` makes it depthwise.
    ``activation`` ("relu", "relu6" or None) is fused into the convolution's
    output pass.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, activation=None, device=None, rng=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"Conv2d: groups ({groups}) must divide in_channels ({in_channels}) "
                             f"and out_channels ({out_channels})")
        rng = rng or np.random.default_rng()
        kh, kw = _pair(kernel_size)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.padding = (kh, kw), stride, padding
        self.dilation, self.activation = dilation, activation
        fan_in = in_channels // groups * kh * kw
        self.weight = Parameter(_uniform(rng, (out_channels, in_channels // groups, kh, kw), fan_in),
                                device=device)
        self.bias = Parameter(_uniform(rng, (out_channels,), fan_in), device=device) if bias else None

    def forward(self, x, residual=None):
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ShapeError(f"Conv2d({self.in_channels}, {self.out_channels}): expected input "
                             f"[N, {self.in_channels}, H, W], got {x.shape}")
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                          self.groups, activation=self.activation, residual=residual)


class DepthwiseConv2d(Conv2d):
    """Depthwise convolution: one kh x kw filter per channel (groups = channels)."""

    def __init__(self, channels, kernel_size, stride=1, padding=0, dilation=1, bias=True,
                 activation=None, device=None, rng=None):
        super().__init__(channels, channels, kernel_size, stride, padding, dilation,
                         groups=channels, bias=bias, activation=activation, device=device, rng=rng)


class ConvTranspose2d(Module):
    """Transposed convolution layer: weight [in, out/groups, kh, kw], optional bias [out].

    Input [N, in, H, W] -> output [N, out, OH, OW] with
    ``OH = (H - 1)*stride - 2*padding + dilation*(kh - 1) + output_padding + 1``.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, dilation=1, groups=1, bias=True, device=None, rng=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"ConvTranspose2d: groups ({groups}) must divide in_channels "
                             f"({in_channels}) and out_channels ({out_channels})")
        rng = rng or np.random.default_rng()
        kh, kw = _pair(kernel_size)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation, self.groups = dilation, groups
        fan_in = out_channels // groups * kh * kw
        self.weight = Parameter(_uniform(rng, (in_channels, out_channels // groups, kh, kw), fan_in),
                                device=device)
        self.bias = Parameter(_uniform(rng, (out_channels,), fan_in), device=device) if bias else None

    def forward(self, x):
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ShapeError(f"ConvTranspose2d({self.in_channels}, {self.out_channels}): expected "
                             f"input [N, {self.in_channels}, H, W], got {x.shape}")
        return ops.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                    self.output_padding, self.dilation, self.groups)
