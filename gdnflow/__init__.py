"""gdnflow: a small deep-learning framework whose operators are CUDA kernels
compiled at run time, with a NumPy reference backend behind the same API.

    import gdnflow as gf
    x = gf.tensor([[1.0, -2.0]], requires_grad=True)
    y = (x.relu() * 3).sum()
    y.backward()
    x.grad.numpy()      # [[3., 0.]]
"""
from gdnflow.autograd import Operator, grad_enabled, no_grad
from gdnflow.backends import cuda_available, default_device, set_default_device
from gdnflow.errors import (DeviceMismatchError, DTypeError, GdnflowError, GraphFreedError,
                            KernelCompileError, ShapeError)
from gdnflow.registry import register
from gdnflow.tensor import Tensor, full, ones, tensor, zeros
from gdnflow import config, nn, ops, optim
# The plugin layer installs its hooks (load installed plugins for an unknown
# operator name; name the plugin owning a CUDA source that fails to compile).
from gdnflow import plugins  # noqa: F401

from gdnflow.version import __version__  # noqa: F401
