"""The model of the distributed tests (tests/distributed/worker.py's ranks, in-process tests)."""
import numpy as np

import gdnflow as gf

SEED = 1234


def autoencoder(channels=8, device=None):
    """3 -> channels (stride 2) -> GDN -> 3 (transposed, stride 2); the same weights for a seed."""
    rng = np.random.default_rng(SEED)
    model = gf.nn.Sequential(
        gf.nn.Conv2d(3, channels, 5, stride=2, padding=2, rng=rng),
        gf.nn.GDN(channels),
        gf.nn.ConvTranspose2d(channels, 3, 5, stride=2, padding=2, output_padding=1, rng=rng))
    return model.to(device) if device else model
