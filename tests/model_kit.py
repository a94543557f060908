"""Helpers of the codec-model tests: weights moved off their initialisation, and
a model computing with given tensors as its parameters (for gradient checks)."""
import contextlib

import numpy as np


def randomize(module, rng):
    """Move parameters away from their initial values (and off GDN's bounds),
    so that checks do not pass by the symmetry of an initialisation."""
    state = {}
    for name, value in module.state_dict().items():
        if name.endswith(("matrices.0", "matrices.1", "matrices.2", "matrices.3", "matrices.4")):
            value = value + rng.normal(0, 0.5, value.shape)
        elif ".factors." in f".{name}":
            value = rng.normal(0, 1.0, value.shape)
        elif name.endswith("gamma"):
            value = np.sqrt(rng.uniform(0.01, 0.2, value.shape))     # stored form, above 2^-18
        elif name.endswith("beta"):
            value = np.sqrt(rng.uniform(0.5, 1.5, value.shape))
        state[name] = value
    module.load_state_dict(state)
    return module


@contextlib.contextmanager
def parameters_replaced(model, tensors):
    """Make ``model`` compute with ``tensors`` (in named_parameters order) as its parameters."""
    slots = [(module, name) for _, module in model.named_modules() for name in module._parameters]
    for (module, name), t in zip(slots, tensors):
        object.__setattr__(module, name, t)
    try:
        yield
    finally:
        for module, name in slots:
            object.__setattr__(module, name, module._parameters[name])
