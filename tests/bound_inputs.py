"""Inputs for tests of functions with a bound (max(x, bound) and its relatives)."""
import numpy as np


def values_around(rng, bound, shape):
    """Values on both sides of ``bound``, none within 1e-4 of it (where float32
    and float64 could disagree about which side they are on)."""
    values = rng.uniform(0.0, 3 * bound, shape)
    values[np.abs(values - bound) < 1e-4] += 2e-4
    return values
