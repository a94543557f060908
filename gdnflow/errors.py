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


class KernelArgumentError(GdnflowError, ValueError):
    """Argument types declared for a kernel disagree with its compiled parameter list.

    The message names the Python line of the declaration, the ``.cu`` file,
    and the parameters there against the types declared.
    """


class DeviceLimitError(GdnflowError):
    """The device cannot hold or index an array an operator asked for.

    Raised where memory is allocated or a kernel launched, so the message first
    says what was asked; the operator call that was running adds its name and
    input shapes in front (:meth:`add_operator`), once, for the innermost one.
    """

    operator = None

    def add_operator(self, label, input_shapes):
        """Name the operator call ``label`` on inputs of ``input_shapes`` in the message."""
        if self.operator is None:
            self.operator = label
            shapes = ", ".join(str(tuple(s)) for s in input_shapes)
            self.args = (f"{label} on inputs of shape {shapes}: {self.args[0]}",) + self.args[1:]


class TensorTooLargeError(DeviceLimitError, ValueError):
    """An array past the element count the CUDA kernels can index (2^31 - 2^24)."""


class DeviceMemoryError(DeviceLimitError, MemoryError):
    """The GPU ran out of memory; the message names the bytes asked for."""
