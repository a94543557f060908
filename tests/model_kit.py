"""Helpers of the codec-model tests: weights moved off their initialisation, and
a model computing with given tensors as its parameters (for gradient checks)."""
import contextlib

import numpy as np

import gdnflow as gf
from gdnflow.testing import relative_error
from gdnflow.train.losses import RateDistortionLoss
from gdnflow.train.numerics import cast_module


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


def assert_cuda_training_step_matches_numpy(model_class, source, rng, side):
    """Loss and every gradient of a training step (same batch, same noise) of a copy of
    ``source`` (a codec model on NumPy) on CUDA (float32) against NumPy (float64),
    within 1e-4 relative; the batch is 2 random side x side images."""
    x_host = rng.random((2, 3, side, side)).astype(np.float32)
    results = {}
    for device, dtype in (("numpy", np.float64), ("cuda", np.float32)):
        model = model_class(source.N, source.M, seed=0, device=device)
        model.load_state_dict(source.state_dict())
        cast_module(model, dtype)
        x = gf.tensor(x_host, device=device, dtype=dtype)
        terms = RateDistortionLoss(0.0130)(model(x, noise_key=99, noise_stream=3), x)
        terms["loss"].backward()
        model.aux_loss().backward()
        results[device] = ({k: v.item() for k, v in terms.items()},
                           {name: p.grad.numpy() for name, p in model.named_parameters()})
    (ref_terms, ref_grads), (gpu_terms, gpu_grads) = results["numpy"], results["cuda"]
    for key in ref_terms:
        assert abs(gpu_terms[key] - ref_terms[key]) <= 1e-4 * abs(ref_terms[key]), key
    for name in ref_grads:
        err = relative_error(gpu_grads[name], ref_grads[name])
        assert err <= 1e-4, f"{name}: relative error {err:.2e}"
