"""Module and Parameter: the building blocks of layers and models.

A layer is its parameters plus one call to an operator. Assigning a
:class:`Parameter` or another :class:`Module` as an attribute registers it, so
``parameters()``, ``state_dict()`` and ``to(device)`` find it by its dotted
name (``encoder.0.weight``). State that is not trained but belongs to the
model (batch norm's running statistics) is a *buffer*: a plain tensor
registered with :meth:`Module.register_buffer`, saved in ``state_dict()`` and
moved by ``to(device)``, never returned by ``parameters()``.

Compiled inference plans (:mod:`gdnflow.inference`) copy and fold weights,
so they must know when weights change: every change a module makes marks the
tensor (:meth:`~gdnflow.tensor.Tensor.mark_changed`) or, for a change of
structure, :func:`gdnflow.tensor.weights_changed`.
"""
from collections import OrderedDict

import numpy as np

from gdnflow.backends import get_backend
from gdnflow.errors import ShapeError
from gdnflow.tensor import Tensor, weights_changed

class Parameter(Tensor):
    """A leaf tensor that a Module trains (``requires_grad`` is true by default)."""

    __slots__ = ()

    def __init__(self, data, device=None, dtype=None, requires_grad=True):
        super().__init__(data, device=device, dtype=dtype, requires_grad=requires_grad)


class Module:
    """Base class of layers and models.

    Subclasses create parameters and submodules in ``__init__`` (after calling
    ``super().__init__()``) and compute in ``forward``; calling the module
    calls ``forward``. ``training`` says which mode ``train()``/``eval()`` set.
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                 f"before assigning {name!r}")
        if (isinstance(value, (Tensor, Module)) or name in self._parameters
                or name in self._buffers or name in self._modules):
            weights_changed()
        if name in self._buffers:
            # Assigning to a buffer's name replaces the buffer (as in PyTorch);
            # anything but a tensor there would silently drop it from state_dict.
            if isinstance(value, Parameter) or not (value is None or isinstance(value, Tensor)):
                raise TypeError(f"{type(self).__name__}.{name} is a buffer: assign a Tensor or "
                                f"None, got {type(value).__name__}")
            self._buffers[name] = value
            object.__setattr__(self, name, value)
            return
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        """The computation; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_modules(self, prefix=""):
        """(dotted name, module) for this module and every submodule, depth first."""
        yield prefix, self
        for name, module in self._modules.items():
            yield from module.named_modules(f"{prefix}{name}.")

    def named_parameters(self):
        """(dotted name, parameter) for every parameter of this module and its submodules."""
        for prefix, module in self.named_modules():
            for name, p in module._parameters.items():
                yield prefix + name, p

    def parameters(self):
        """Every parameter, in registration order."""
        return [p for _, p in self.named_parameters()]

    def register_buffer(self, name, value):
        """Register ``value`` as the buffer ``name``: state that is saved and moved, not trained.

        ``value`` is a Tensor (kept as is, not copied), a NumPy array or
        nested lists (copied to a float32 Tensor on the default device), or
        None (a slot that state_dict skips until a tensor is assigned). The
        buffer is then the attribute ``name``; operators may update it in
        place (batch norm's running statistics are).
        """
        if "_buffers" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                 f"before registering the buffer {name!r}")
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"{type(self).__name__}.register_buffer: bad buffer name {name!r} "
                           "(a non-empty string without dots)")
        if name in self._parameters or name in self._modules:
            raise KeyError(f"{type(self).__name__}.register_buffer: {name!r} is already a "
                           "parameter or submodule")
        if isinstance(value, Parameter):
            raise TypeError(f"{type(self).__name__}.register_buffer: {name!r} is a Parameter; "
                            "assign it as an attribute to make it a parameter")
        if value is not None and not isinstance(value, Tensor):
            # A copy: buffers may be updated in place, and a float32 array
            # would otherwise be adopted as is and change under its owner.
            value = Tensor(np.array(value))
        weights_changed()
        self._buffers[name] = value
        object.__setattr__(self, name, value)

    def named_buffers(self):
        """(dotted name, tensor) for every buffer of this module and below (None slots skipped)."""
        for prefix, module in self.named_modules():
            for name, b in module._buffers.items():
                if b is not None:
                    yield prefix + name, b

    def buffers(self):
        """Every buffer tensor, in registration order."""
        return [b for _, b in self.named_buffers()]

    def train(self, mode=True):
        """Set training mode (dropout active, batch statistics) on this module and below."""
        if mode:
            weights_changed()   # training forwards update batch-norm statistics in place
        for _, module in self.named_modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        """Set inference mode on this module and below."""
        return self.train(False)

    def zero_grad(self):
        """Forget the gradients of every parameter."""
        for p in self.parameters():
            p.grad = None

    def to(self, device):
        """Move every parameter and buffer to ``device`` (in place); returns self.

        Parameters stay the same objects (their arrays move), so an optimiser
        built before the move still updates them.
        """
        for p in self.parameters():
            if p.device != device:
                _replace_array(p, p.numpy(), device)      # marks p changed
        for _, module in self.named_modules():
            for name, b in list(module._buffers.items()):
                if b is not None and b.device != device:
                    setattr(module, name, Tensor(b.numpy(), device=device, dtype=b.dtype))
        return self

    def _named_state(self):
        """(dotted name, tensor) of every parameter and buffer, module by module.

        Each module's parameters, then its buffers, then its submodules: the
        order of PyTorch's state_dict, so the two list the same names alike.
        """
        for prefix, module in self.named_modules():
            for name, p in module._parameters.items():
                yield prefix + name, p
            for name, b in module._buffers.items():
                if b is not None:
                    yield prefix + name, b

    def state_dict(self):
        """{dotted name: NumPy array} of every parameter and buffer (copies)."""
        return OrderedDict((name, np.array(t.numpy())) for name, t in self._named_state())

    def load_state_dict(self, state):
        """Load parameters and buffers by name; every name must match and every shape agree.

        Raises KeyError listing missing and unexpected names, or ShapeError
        listing each mis-shaped entry, before changing anything. Each tensor
        keeps its device and dtype.
        """
        own = dict(self._named_state())
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing {missing}, "
                           f"unexpected {unexpected}")
        wrong = [f"{n}: expected {own[n].shape}, got {np.shape(state[n])}"
                 for n in own if tuple(np.shape(state[n])) != own[n].shape]
        if wrong:
            raise ShapeError(f"{type(self).__name__}.load_state_dict: " + "; ".join(wrong))
        for prefix, module in self.named_modules():
            for name, p in list(module._parameters.items()):
                # In place, so that optimisers holding p keep working.
                _replace_array(p, state[prefix + name], p.device)
            for name, b in list(module._buffers.items()):
                if b is not None:
                    # Copied: operators update buffers in place, which must not
                    # reach into the caller's arrays.
                    setattr(module, name, Tensor(np.array(state[prefix + name]), device=b.device,
                                                 dtype=b.dtype))


def _replace_array(parameter, values, device):
    """Give ``parameter`` a copy of ``values`` on ``device``, keeping the object and its dtype.

    Its gradient is dropped (it belonged to the old array).
    """
    backend = get_backend(device)
    dtype = parameter.dtype if device == "numpy" else backend.check_dtype(parameter.dtype)
    parameter.data = backend.from_numpy(np.asarray(values, dtype=dtype))
    parameter.device = device
    parameter.grad = None
    parameter.mark_changed()
