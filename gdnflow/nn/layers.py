"""The layers of classification networks (MobileNetV2, VGG16): each is its
parameters (or buffers) plus one operator call, and checks its input's shape
where a wrong one would otherwise surface as an operator error far from the
model code.

Names of parameters and buffers follow PyTorch's (``weight``, ``bias``,
``running_mean``, ``running_var``), so state dicts map one to one.
"""
import math

import numpy as np

from gdnflow import ops
from gdnflow.errors import ShapeError
from gdnflow.nn.module import Module, Parameter
from gdnflow.ops.pool import AvgPool2dOp as AvgPool2dOperator
from gdnflow.ops.pool import MaxPool2dOp as MaxPool2dOperator


def _check_nchw(layer, x, channels=None):
    """Raise ShapeError naming ``layer`` unless x is [N, C, H, W] (with C == channels if given)."""
    if x.ndim != 4 or (channels is not None and x.shape[1] != channels):
        expected = f"(N, {channels if channels is not None else 'C'}, H, W)"
        raise ShapeError(f"{layer!r}: expected input of shape {expected}, got {x.shape}")


class Linear(Module):
    """Fully connected layer: y = x @ weight^T + bias.

    x [..., in_features] -> y [..., out_features]; ``weight`` [out_features,
    in_features] (PyTorch's layout), ``bias`` [out_features] (absent with
    ``bias=False``). Both start uniform in +-1/sqrt(in_features), as in
    PyTorch; ``rng`` (a numpy Generator) makes that reproducible.
    """

    def __init__(self, in_features, out_features, bias=True, rng=None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        rng = np.random.default_rng() if rng is None else rng
        bound = 1 / math.sqrt(self.in_features) if self.in_features else 0.0
        self.weight = Parameter(rng.uniform(-bound, bound, (self.out_features, self.in_features)))
        self.bias = Parameter(rng.uniform(-bound, bound, self.out_features)) if bias else None

    def forward(self, x):
        """x [..., in_features] -> [..., out_features]."""
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ShapeError(f"{self!r}: expected input of shape (..., {self.in_features}), "
                             f"got {x.shape}")
        return ops.linear(x, self.weight, self.bias)

    def __repr__(self):
        return (f"Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None})")


class BatchNorm2d(Module):
    """Batch normalisation of [N, C, H, W] inputs per channel.

    ``y = weight * (x - mean) / sqrt(var + eps) + bias``. In training mode
    mean and var are the batch's (over N, H, W; biased var), and the buffers
    ``running_mean`` (starts at 0) and ``running_var`` (starts at 1) follow
    ``running = (1 - momentum) * running + momentum * batch`` (unbiased var),
    as in PyTorch; in eval mode the running statistics normalise. ``weight``
    starts at 1, ``bias`` at 0. PyTorch's ``num_batches_tracked`` counter is
    not kept (it only matters for momentum=None, which this layer does not offer).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.num_features = int(num_features)
        if self.num_features < 1:
            raise ValueError(f"BatchNorm2d: num_features must be positive, got {num_features!r}")
        self.eps, self.momentum = float(eps), float(momentum)
        self.weight = Parameter(np.ones(self.num_features))
        self.bias = Parameter(np.zeros(self.num_features))
        self.register_buffer("running_mean", np.zeros(self.num_features))
        self.register_buffer("running_var", np.ones(self.num_features))

    def forward(self, x):
        """x [N, num_features, H, W] -> the same shape."""
        _check_nchw(self, x, self.num_features)
        return ops.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                              self.training, self.momentum, self.eps)

    def __repr__(self):
        return f"BatchNorm2d({self.num_features}, eps={self.eps:g}, momentum={self.momentum:g})"


class ReLU(Module):
    """y = max(x, 0), elementwise (any shape)."""

    def forward(self, x):
        return ops.relu(x)

    def __repr__(self):
        return "ReLU()"


class ReLU6(Module):
    """y = min(max(x, 0), 6), elementwise (any shape): MobileNetV2's activation."""

    def forward(self, x):
        return ops.relu6(x)

    def __repr__(self):
        return "ReLU6()"


class MaxPool2d(Module):
    """Max pooling: [N, C, H, W] -> [N, C, OH, OW], OH = floor((H + 2 padding - kernel)/stride) + 1.

    ``kernel_size``, ``stride`` (default: the kernel size), ``padding``: as
    :func:`gdnflow.ops.max_pool2d` (padding counts as -inf, smaller than the kernel).
    """

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        MaxPool2dOperator(self.kernel_size, self.stride, self.padding)  # fail here, not in forward

    def forward(self, x):
        _check_nchw(self, x)
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def __repr__(self):
        return (f"MaxPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding})")


class AvgPool2d(Module):
    """Average pooling: [N, C, H, W] -> [N, C, OH, OW] (output size as :class:`MaxPool2d`).

    Padding counts as zeros; the divisor is the kernel area with
    ``count_include_pad`` (PyTorch's default), else the number of input
    elements in the window.
    """

    def __init__(self, kernel_size, stride=None, padding=0, count_include_pad=True):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.count_include_pad = bool(count_include_pad)
        AvgPool2dOperator(kernel_size, self.stride, padding)  # fail here, not in forward

    def forward(self, x):
        _check_nchw(self, x)
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding,
                              self.count_include_pad)

    def __repr__(self):
        return (f"AvgPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, count_include_pad={self.count_include_pad})")


class GlobalAvgPool2d(Module):
    """Mean over H and W: [N, C, H, W] -> [N, C, 1, 1] (MobileNetV2's head)."""

    def forward(self, x):
        _check_nchw(self, x)
        return ops.global_avg_pool2d(x)

    def __repr__(self):
        return "GlobalAvgPool2d()"


class Flatten(Module):
    """Merge dimensions ``start_dim`` and after: [N, C, H, W] -> [N, C*H*W] by default."""

    def __init__(self, start_dim=1):
        super().__init__()
        self.start_dim = int(start_dim)

    def forward(self, x):
        return ops.flatten(x, self.start_dim)

    def __repr__(self):
        return f"Flatten(start_dim={self.start_dim})"


class Dropout(Module):
    """Inverted dropout in training mode (zero with probability p, scale the rest by 1/(1-p));
    the identity in eval mode. Any shape.

    Masks come from this layer's own numpy Generator (``seed`` seeds it), so a
    seeded model draws the same masks on NumPy and CUDA (see :mod:`gdnflow.ops.dropout`).
    """

    def __init__(self, p=0.5, seed=None):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = float(p)
        self.rng = np.random.default_rng(seed)

    def forward(self, x):
        return ops.dropout(x, self.p, self.training, self.rng)

    def __repr__(self):
        return f"Dropout(p={self.p:g})"


class Softmax(Module):
    """y = exp(x) / sum exp(x) along ``axis`` (stable; any shape with that axis)."""

    function = staticmethod(ops.softmax)

    def __init__(self, axis=-1):
        super().__init__()
        self.axis = int(axis)

    def forward(self, x):
        if not -x.ndim <= self.axis < x.ndim:
            raise ShapeError(f"{self!r}: expected an input with an axis {self.axis}, got shape "
                             f"{x.shape}")
        return self.function(x, self.axis)

    def __repr__(self):
        return f"{type(self).__name__}(axis={self.axis})"


class LogSoftmax(Softmax):
    """y = log softmax(x) along ``axis`` (stable; any shape with that axis)."""

    function = staticmethod(ops.log_softmax)


class Identity(Module):
    """y = x (the same tensor): a placeholder, e.g. for a removed layer."""

    def forward(self, x):
        return x

    def __repr__(self):
        return "Identity()"


class Sequential(Module):
    """Modules applied in order: ``Sequential(a, b, c)(x) = c(b(a(x)))``.

    The submodules are named "0", "1", ... (so parameters are ``0.weight``,
    as in PyTorch's state dicts). Indexing gives a submodule (negative
    indices count from the end), a slice a new Sequential sharing them;
    ``len`` and iteration work as on a list.
    """

    def __init__(self, *modules):
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module):
        """Add ``module`` at the end (named by its position); returns self."""
        if not isinstance(module, Module):
            raise TypeError(f"Sequential: expected a Module, got {type(module).__name__}")
        setattr(self, str(len(self._modules)), module)
        return self

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*modules[index])
        try:
            return modules[index]
        except IndexError:
            raise IndexError(f"Sequential: index {index} out of range for {len(modules)} "
                             "modules") from None

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x

    def __repr__(self):
        lines = [f"  ({name}): " + repr(module).replace("\n", "\n  ")
                 for name, module in self._modules.items()]
        return "Sequential(\n" + "\n".join(lines) + "\n)" if lines else "Sequential()"
