"""gdnflow: a small deep-learning framework whose operators are CUDA kernels
compiled at run time, with a NumPy reference backend behind the same API::

    import gdnflow as gf
    x = gf.tensor([[1.0, -2.0]], requires_grad=True)
    y = (x.relu() * 3).sum()
    y.backward()
    x.grad.numpy()      # [[3., 0.]]

``gf.compile(model.eval(), input_shape)`` makes an inference plan
(:func:`gdnflow.inference.compile`; the package loads on first use), and
``gf.compile_step(train_step, example_batch)`` a training step captured as a
CUDA graph (:func:`gdnflow.step.compile_step`). ``with gf.autocast("bf16"):``
runs matrix products on 16-bit tensors (:mod:`gdnflow.precision`).
"""
import importlib

from gdnflow.autograd import Operator, grad_enabled, no_grad
from gdnflow.backends import cuda_available, default_device, set_default_device
from gdnflow.config import set_matmul_precision
from gdnflow.precision import BFLOAT16 as bfloat16, FLOAT16 as float16, FLOAT32 as float32, autocast
from gdnflow.errors import (DeviceMismatchError, DTypeError, GdnflowError, GraphFreedError,
                            KernelCompileError, ShapeError)
from gdnflow.registry import register
from gdnflow.tensor import Tensor, full, ones, tensor, zeros
from gdnflow.version import __version__
from gdnflow import config, nn, ops, optim, precision, registry

#: The parts of gdnflow that ``import gdnflow`` leaves unloaded until used:
#: ``gdnflow.<name>`` imports them on first access.
OPTIONAL_PARTS = ("classify", "codec", "data", "distributed", "inference", "io", "models", "plugins",
                  "sparse", "step", "testing", "train")


#: Functions of optional parts that ``gdnflow.<name>`` reaches, importing the part
#: on first use: {name: the module defining it}.
LAZY_FUNCTIONS = {"compile": "gdnflow.inference", "compile_step": "gdnflow.step"}


def __getattr__(name):
    if name in OPTIONAL_PARTS:
        return importlib.import_module(f"gdnflow.{name}")
    if name in LAZY_FUNCTIONS:
        # gdnflow.compile(model, input_shape=None, **options): gdnflow.inference.compile;
        # gdnflow.compile_step(fn, example_batch, **options): gdnflow.step.compile_step
        return getattr(importlib.import_module(LAZY_FUNCTIONS[name]), name)
    raise AttributeError(f"module 'gdnflow' has no attribute {name!r}")


@registry.on_unknown_name
def _load_sparse():
    """An operator name nothing has registered: import gdnflow.sparse, which registers
    "sparse_conv2d" (an ONNX file, a saved graph or ``registry.get`` may name it)."""
    # import_module rather than an import statement: gdnflow.sparse is an optional part
    # (layer 9) that ``import gdnflow`` leaves unloaded; only this hook loads it, on demand.
    importlib.import_module("gdnflow.sparse")


@registry.on_unknown_name
def _load_plugins():
    """An operator name nothing has registered: load the installed plugins, then look again."""
    from gdnflow import plugins     # local import: plugins load on first use
    return plugins.load_for_unknown_name()
