"""Module and Parameter: the building blocks of layers and models.

A layer is its parameters plus one call to an operator. Assigning a
:class:`Parameter` or another :class:`Module` as an attribute registers it, so
``parameters()``, ``state_dict()`` and ``to(device)`` find it by its dotted
name (``encoder.0.weight``).
"""
from collections import OrderedDict

import numpy as np

from gdnflow.errors import ShapeError
from gdnflow.tensor import Tensor


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
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                 f"before assigning {name!r}")
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

    def train(self, mode=True):
        """Set training mode (dropout active, batch statistics) on this module and below."""
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
        """Move every parameter to ``device`` (in place); returns self."""
        for _, module in self.named_modules():
            for name, p in list(module._parameters.items()):
                if p.device != device:
                    setattr(module, name, Parameter(p.numpy(), device=device, dtype=p.dtype,
                                                    requires_grad=p.requires_grad))
        return self

    def state_dict(self):
        """{dotted name: NumPy array} of every parameter (copies)."""
        return OrderedDict((name, np.array(p.numpy())) for name, p in self.named_parameters())

    def load_state_dict(self, state):
        """Load arrays by name; every name must match and every shape agree.

        Raises KeyError listing missing and unexpected names, or ShapeError
        listing each mis-shaped entry, before changing anything.
        """
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        if missing or unexpected:
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing {missing}, "
                           f"unexpected {unexpected}")
        wrong = [f"{n}: expected {params[n].shape}, got {np.shape(state[n])}"
                 for n in params if tuple(np.shape(state[n])) != params[n].shape]
        if wrong:
            raise ShapeError(f"{type(self).__name__}.load_state_dict: " + "; ".join(wrong))
        for prefix, module in self.named_modules():
            for name, p in list(module._parameters.items()):
                setattr(module, name, Parameter(state[prefix + name], device=p.device,
                                                dtype=p.dtype, requires_grad=p.requires_grad))
