"""Exceptions that gdnflow raises on bad input.

Every gdnflow error is a :class:`GdnflowError`, so ``except gf.GdnflowError``
catches all of them. Each also subclasses the built-in exception a Python user
would expect (``ValueError`` for shapes, ``TypeError`` for dtypes), so
``except ValueError`` keeps working, while the message names the operator, what
it expected and what it got. Errors of one part of gdnflow (a file format, the
codec, plugins) are defined beside that part, under this base.
"""


class GdnflowError(Exception):
    """Base class of every error gdnflow raises on purpose."""


class ShapeError(GdnflowError, ValueError):
    """An operator got inputs whose shapes it cannot combine."""


class DTypeError(GdnflowError, TypeError):
    """An operator or backend got an array of a dtype it does not support."""


class DeviceMismatchError(GdnflowError, ValueError):
    """An operator got tensors that live on different devices."""


class GraphFreedError(GdnflowError, RuntimeError):
    """backward() walked through a graph whose saved arrays were already freed."""


class BackendUnavailableError(GdnflowError, RuntimeError):
    """A backend was asked for that cannot run on this machine."""


class KernelCompileError(GdnflowError, RuntimeError):
    """nvcc rejected a CUDA source file; the message names the file and the error."""
