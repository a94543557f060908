"""Train a tiny denoiser built on the softshrink plugin, by plain gradient descent.

The clean signal is sparse (most entries 0, a few large); the input is the
clean signal plus Gaussian noise, with a different noise level per channel.
The model scales a learned soft-thresholding per channel,

    y = gain_c * softshrink(x, theta_c),

and learns theta (how much noise to cut) and gain from the squared error.

    python train_denoiser.py [--steps 40] [--device numpy|cuda]
"""
import argparse

import numpy as np

import gdnflow as gf
from gdnflow.nn import Module, Parameter

from gdnflow_softshrink import SoftShrink

CHANNELS = 4


class Denoiser(Module):
    """y = gain_c * softshrink(x, theta_c) for x of shape (N, CHANNELS, H, W)."""

    def __init__(self, channels=CHANNELS, device=None):
        super().__init__()
        self.shrink = SoftShrink(channels, threshold=0.0, device=device)
        self.gain = Parameter(np.ones((1, channels, 1, 1)), device=device)

    def forward(self, x):
        return self.shrink(x) * self.gain


def make_data(rng, batch=16, size=8):
    """(noisy, clean) arrays of shape (batch, CHANNELS, size, size)."""
    shape = (batch, CHANNELS, size, size)
    clean = 3 * rng.standard_normal(shape) * (rng.random(shape) < 0.1)
    noise_level = np.linspace(0.1, 0.6, CHANNELS).reshape(1, CHANNELS, 1, 1)
    return clean + noise_level * rng.standard_normal(shape), clean


def train(steps=40, learning_rate=0.5, device="numpy", seed=0, log=print):
    """Train a Denoiser on fixed data; return the loss of every step."""
    rng = np.random.default_rng(seed)
    noisy, clean = make_data(rng)
    x, target = gf.tensor(noisy, device=device), gf.tensor(clean, device=device)
    model = Denoiser(device=device)
    losses = []
    for step in range(steps):
        loss = ((model(x) - target) ** 2).mean()
        model.zero_grad()
        loss.backward()
        with gf.no_grad():      # the update itself is not part of any graph
            for p in model.parameters():
                p.data = (p - learning_rate * p.grad).data
        losses.append(loss.item())
        if log and (step % 10 == 0 or step == steps - 1):
            log(f"step {step:3d}  loss {losses[-1]:.5f}")
    if log:
        log("learned thresholds: " + " ".join(f"{t:.3f}" for t in model.shrink.theta.numpy()))
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", choices=["numpy", "cuda"], default="numpy")
    args = parser.parse_args()
    losses = train(args.steps, device=args.device)
    print(f"loss {losses[0]:.5f} -> {losses[-1]:.5f}")


if __name__ == "__main__":
    main()
