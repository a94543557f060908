"""Exceptions that gdnflow raises on bad input.

Each subclasses the built-in exception a Python user would expect
(``ValueError`` for shapes, ``TypeError`` for dtypes), so ``except ValueError``
keeps working, while the message names the operator, what it expected and what
it got.
"""


class ShapeError(ValueError):
    """An operator got inputs whose shapes it cannot combine."""


class DTypeError(TypeError):
    """An operator or backend got an array of a dtype it does not support."""


class DeviceMismatchError(ValueError):
    """An operator got tensors that live on different devices."""


class GraphFreedError(RuntimeError):
    """backward() walked through a graph whose saved arrays were already freed."""


class BackendUnavailableError(RuntimeError):
    """A backend was asked for that cannot run on this machine."""


class KernelCompileError(RuntimeError):
    """nvcc rejected a CUDA source file; the message names the file and the error."""
