"""Tensor: a backend array, its gradient, and the operation that made it."""
import numbers

import numpy as np

from gdnflow import registry, step_state
from gdnflow.precision import BFLOAT16
from gdnflow.backends import check_device, default_device, get_backend
from gdnflow.errors import DTypeError, ShapeError

#: NumPy dtype kinds a tensor is made from: bool, signed and unsigned integers,
#: floats. Everything else (complex, object, str, bytes, void, datetime,
#: timedelta) would lose information or mean nothing as a float.
REAL_KINDS = "biuf"
_KIND_NAMES = {"c": "complex", "O": "object", "U": "string", "S": "bytes", "V": "void (raw or structured)",
               "M": "datetime", "m": "timedelta"}


class Tensor:
    """An n-dimensional array on a device, recording operations for autograd.

    ``Tensor(data, device=None, dtype=None, requires_grad=False)`` copies
    ``data`` (a NumPy array, nested lists, a number, or another Tensor) to
    ``device`` (``"numpy"`` or ``"cuda"``; the default device if None) as
    ``dtype`` (float32 unless given; float64 exists on NumPy, for gradient checks).

    The data must hold real numbers: bool, integer and float data are converted
    to ``dtype`` (True is 1.0; large integers round to the nearest float32);
    complex, object, string, bytes, void and datetime data raise
    :class:`~gdnflow.errors.DTypeError` naming the dtype, rather than losing
    an imaginary part or guessing at a conversion. The same rule holds for a
    NumPy array combined with a tensor in arithmetic (``t + array``).

    Attributes: ``data`` (the backend array), ``device``, ``requires_grad``,
    ``grad`` (a Tensor after :meth:`backward`, else None), ``creator`` (the
    :class:`~gdnflow.autograd.Operator` node that produced it, None for leaves
    and for results computed without gradient) and ``version`` (how many times
    :meth:`mark_changed` recorded an in-place change of its values).
    """

    __slots__ = ("data", "device", "requires_grad", "grad", "creator", "version", "__weakref__")
    __array_priority__ = 1000   # make ndarray * Tensor call Tensor.__rmul__

    def __init__(self, data, device=None, dtype=None, requires_grad=False):
        if step_state.active() is not None:
            step_state.refuse_host_data(f"making a tensor from host data of shape "
                                        f"{np.shape(data)}")
        device = check_device(device) if device is not None else default_device()
        if isinstance(data, Tensor):
            data = data.numpy()
        host = np.asarray(data)
        if host.dtype.kind not in REAL_KINDS and host.dtype != BFLOAT16:    # ml_dtypes' kind "V"
            raise DTypeError(_not_real_message(host.dtype))
        if dtype is None:
            dtype = np.float32
        backend = get_backend(device)
        dtype = backend.check_dtype(dtype)
        self.data = backend.from_numpy(host.astype(dtype, copy=False))
        self.device = device
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self.creator = None
        self.version = 0

    @classmethod
    def wrap(cls, array, device, requires_grad=False):
        """A tensor around an existing backend array (no copy, no checks)."""
        t = object.__new__(cls)
        t.data = array
        t.device = device
        t.requires_grad = requires_grad
        t.grad = None
        t.creator = None
        t.version = 0
        return t

    def mark_changed(self):
        """Record that this tensor's values were changed in place (an optimiser step, a load).

        Increases :attr:`version` and the process-wide :func:`weights_version`,
        which compiled inference plans compare to know they are stale.
        """
        self.version += 1
        weights_changed()

    # ------------------------------------------------------------ describe --
    @property
    def shape(self):
        """The shape, a tuple of ints."""
        return self.data.shape

    @property
    def dtype(self):
        """The element type, a ``numpy.dtype``."""
        return self.data.dtype

    @property
    def ndim(self):
        """Number of dimensions."""
        return len(self.data.shape)

    @property
    def size(self):
        """Number of elements."""
        return self.data.size

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"Tensor(shape={self.shape}, dtype={self.dtype}, device={self.device!r}{grad})")

    # ------------------------------------------------------------- convert --
    def numpy(self):
        """The values as a NumPy array (on NumPy: the tensor's own array, not a copy).

        Refused inside a compiled step function (:class:`~gdnflow.step_state.StepSyncError`).
        """
        if step_state.active() is not None:
            step_state.refuse_host_read(f"Tensor.numpy() of a tensor of shape {self.shape}")
        return get_backend(self.device).to_numpy(self.data)

    def item(self):
        """The value of a one-element tensor as a Python float."""
        if self.size != 1:
            raise ValueError(f"item() needs a tensor of one element, got shape {self.shape}")
        return float(self.numpy().reshape(()))

    def to(self, device):
        """This tensor on ``device`` (itself if already there); not differentiable."""
        device = check_device(device)
        if device == self.device:
            return self
        return Tensor(self.numpy(), device=device, dtype=self.dtype,
                      requires_grad=self.requires_grad)

    def astype(self, dtype):
        """A copy with another dtype (``"float32"``, ``"bf16"``, ``"fp16"``...), cut from the graph.

        Converted on the tensor's device (``gdnflow.ops.cast``, rounding to
        nearest, ties to even); ``gdnflow.ops.cast`` itself is the
        differentiable form.
        """
        return _apply("cast", self, dtype=dtype).detach()

    def detach(self):
        """The same array, cut from the graph (no copy)."""
        return Tensor.wrap(self.data, self.device)

    # ------------------------------------------------------------ autograd --
    def backward(self, grad=None, retain_graph=False):
        """Add d(self)/d(leaf) to the ``grad`` of every leaf tensor that requires it.

        ``grad`` (the gradient flowing into this tensor) may be omitted for a
        one-element tensor. The graph's saved arrays are freed on the way
        unless ``retain_graph`` is true.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad: no input "
                               "of the computation had requires_grad=True (or it ran under no_grad)")
        if grad is None:
            if self.size != 1:
                raise ValueError(f"backward() without a gradient needs a one-element tensor, "
                                 f"got shape {self.shape}; pass grad=")
            grad = full(self.shape, 1.0, self.device, self.dtype)
        elif not isinstance(grad, Tensor):
            grad = Tensor(grad, device=self.device, dtype=self.dtype)
        if grad.shape != self.shape or grad.device != self.device:
            raise ValueError(f"backward(): grad has shape {grad.shape} on {grad.device!r}, "
                             f"expected shape {self.shape} on {self.device!r}")
        if grad.dtype != self.dtype:
            raise DTypeError(f"backward(): grad is {grad.dtype}, the tensor {self.dtype}; "
                             f"convert it with grad.astype({self.dtype.name!r})")
        if self.creator is None:        # a leaf: its gradient is grad itself
            self.grad = grad if self.grad is None else self.grad + grad
            return
        self.creator.backpropagate(self, grad, retain_graph=retain_graph)

    # ---------------------------------------------------------- operations --
    # Each applies the operator registered under its name (gdnflow.ops
    # registers them); a number operand becomes the constant of an "affine"
    # operator, a NumPy array a constant tensor on this tensor's device.
    def __add__(self, other):
        if _is_number(other):
            return _apply("affine", self, scale=1.0, shift=other)
        return _apply("add", self, _operand(other, self))

    def __radd__(self, other):
        if _is_number(other):
            return _apply("affine", self, scale=1.0, shift=other)
        return _apply("add", _operand(other, self), self)

    def __sub__(self, other):
        if _is_number(other):
            return _apply("affine", self, scale=1.0, shift=-other)
        return _apply("sub", self, _operand(other, self))

    def __rsub__(self, other):
        if _is_number(other):
            return _apply("affine", self, scale=-1.0, shift=other)
        return _apply("sub", _operand(other, self), self)

    def __mul__(self, other):
        if _is_number(other):
            return _apply("affine", self, scale=other, shift=0.0)
        return _apply("mul", self, _operand(other, self))

    def __rmul__(self, other):
        if _is_number(other):
            return _apply("affine", self, scale=other, shift=0.0)
        return _apply("mul", _operand(other, self), self)

    def __truediv__(self, other):
        if _is_number(other):
            return _apply("affine", self, scale=1.0 / other, shift=0.0)
        return _apply("div", self, _operand(other, self))

    def __rtruediv__(self, other):
        if _is_number(other):
            return _apply("affine", _apply("pow", self, exponent=-1.0), scale=other, shift=0.0)
        return _apply("div", _operand(other, self), self)

    def __neg__(self): return _apply("neg", self)

    def __pow__(self, exponent):
        if not isinstance(exponent, numbers.Real):
            raise TypeError(f"pow: the exponent must be a number, got {type(exponent).__name__}")
        return _apply("pow", self, exponent=exponent)

    def exp(self): return _apply("exp", self)
    def log(self): return _apply("log", self)
    def sqrt(self): return _apply("sqrt", self)
    def relu(self): return _apply("relu", self)
    def sigmoid(self): return _apply("sigmoid", self)
    def clamp(self, low, high): return _apply("clamp", self, low=low, high=high)
    def sum(self, axis=None, keepdims=False): return _apply("sum", self, axis=axis, keepdims=keepdims)
    def mean(self, axis=None, keepdims=False): return _apply("mean", self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape):
        """Same values in another shape; accepts ``reshape(2, 3)`` or ``reshape((2, 3))``."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return _apply("reshape", self, shape=shape)

    def flatten(self, start_dim=1):
        """Merge dimensions ``start_dim`` and after into one: (N, C, H, W) -> (N, C*H*W)."""
        if not -self.ndim <= start_dim < max(self.ndim, 1):
            raise ShapeError(f"flatten: start_dim {start_dim} out of range for shape {self.shape}")
        start_dim %= max(self.ndim, 1)
        return self.reshape(self.shape[:start_dim] + (-1,))


def _apply(name, *inputs, **arguments):
    """Build the operator registered as ``name`` with ``arguments`` and apply it to ``inputs``."""
    return registry.get(name)(**arguments)(*inputs)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _operand(value, like):
    """``value`` as a tensor operand beside the tensor ``like``."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray):
        return Tensor(value, device=like.device, dtype=like.dtype)
    if isinstance(value, complex) or (isinstance(value, np.generic)
                                      and value.dtype.kind not in REAL_KINDS):
        raise DTypeError(_not_real_message(np.asarray(value).dtype))
    raise TypeError(f"expected a Tensor, a number or a NumPy array, got {type(value).__name__}")


def _not_real_message(dtype):
    kind = _KIND_NAMES.get(dtype.kind, "non-numeric")
    return (f"cannot make a tensor of {kind} data (dtype {dtype}): tensors hold real numbers "
            "(bool, integer or float data); convert it first, e.g. take .real or abs() of "
            "complex values, or parse strings into numbers")


_weights_version = 0


def weights_version():
    """A counter that grows whenever weights may have changed through gdnflow's API.

    Increased by :meth:`Tensor.mark_changed` (``Optimizer.step`` marks each
    parameter it updates; loading a checkpoint, ``load_state_dict`` and
    ``Module.to`` mark what they replace) and by :func:`weights_changed`
    (assigning a tensor or module to a Module attribute, ``train()``: batch
    norm updates its running statistics in training mode). Code that writes
    into a tensor's array by other means must call ``mark_changed``.
    """
    return _weights_version


def weights_changed():
    """Record that weights may have changed, none in particular (a model's structure changed)."""
    global _weights_version
    _weights_version += 1


def tensor(data, device=None, dtype=None, requires_grad=False):
    """Make a :class:`Tensor` from data; see the class for the arguments."""
    return Tensor(data, device=device, dtype=dtype, requires_grad=requires_grad)


def full(shape, value, device=None, dtype=np.float32, requires_grad=False):
    """A tensor of ``shape`` filled with ``value`` (a real number)."""
    if not isinstance(value, numbers.Real) and np.asarray(value).dtype.kind not in REAL_KINDS:
        raise DTypeError(_not_real_message(np.asarray(value).dtype))
    device = check_device(device) if device is not None else default_device()
    backend = get_backend(device)
    t = Tensor.wrap(backend.full(tuple(shape), value, backend.check_dtype(dtype)), device)
    t.requires_grad = requires_grad
    return t


def zeros(shape, device=None, dtype=np.float32, requires_grad=False):
    """A tensor of zeros."""
    return full(shape, 0.0, device, dtype, requires_grad)


def ones(shape, device=None, dtype=np.float32, requires_grad=False):
    """A tensor of ones."""
    return full(shape, 1.0, device, dtype, requires_grad)

