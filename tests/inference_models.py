"""Models and helpers the inference-plan tests (tests/inference/) share."""
import gdnflow as gf
from gdnflow import models, nn, ops
from gdnflow.nn.module import Module


def randomize_batch_norms(model, rng):
    """Batch-norm statistics and affine parameters away from 0 and 1, via load_state_dict."""
    state = model.state_dict()
    for key, value in state.items():
        if key.endswith("running_mean"):
            state[key] = rng.uniform(-0.2, 0.2, value.shape)
        elif key.endswith("running_var"):
            state[key] = rng.uniform(0.5, 1.5, value.shape)
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            state[name + "weight"] = rng.uniform(0.5, 1.5, module.num_features)
            state[name + "bias"] = rng.uniform(-0.2, 0.2, module.num_features)
    model.load_state_dict(state)
    return model


def eager(model, x):
    with gf.no_grad():
        return model(x).numpy()


def tensor(rng, shape, device="numpy"):
    return gf.tensor(rng.standard_normal(shape), device=device)


class Residual(Module):
    """relu(x + bn(conv(x))): folds, fuses the residual, then the activation, into one conv."""

    def __init__(self, channels, rng):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False, rng=rng)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return ops.relu(x + self.bn(self.conv(x)))


def small_model(rng, device="numpy"):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False, rng=rng), nn.BatchNorm2d(4),
                          nn.ReLU6()).to(device)
    return randomize_batch_norms(model, rng).eval()


def changed_state(model, rng):
    state = model.state_dict()
    state = {k: v + rng.uniform(0.1, 0.2, v.shape).astype(v.dtype) for k, v in state.items()}
    return state


def gpu_model(name, rng):
    model = models.get(name)(device="cuda", rng=rng)
    return randomize_batch_norms(model, rng).eval()
