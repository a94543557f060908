"""Inverted dropout.

In training each element is kept with probability 1 - p and scaled by
1 / (1 - p), so the expected output equals the input and inference needs no
rescaling; in inference dropout is the identity::

    y = x * mask,   mask_i = 1/(1 - p) with probability 1 - p, else 0
    gx = gy * mask

The mask is drawn on the host with a NumPy ``Generator`` and uploaded, then
applied by the ``mul`` operator (which also gives the backward), so it is the
same on both backends for the same generator state (the cost of the upload:
docs/ops.md).
"""
import numpy as np

from gdnflow.tensor import Tensor


def dropout_mask(shape, p, rng, dtype=np.float32):
    """The mask of :func:`dropout`: 1/(1-p) with probability 1-p, else 0 (all 0 when p = 1)."""
    if p >= 1:
        return np.zeros(shape, dtype)
    keep = rng.random(shape) >= p
    return keep.astype(dtype) * dtype(1.0 / (1.0 - p))


def dropout(x, p=0.5, training=True, rng=None):
    """Inverted dropout of x (any shape): y = x * mask in training, x itself otherwise.

    mask_i = 1/(1 - p) with probability 1 - p, else 0, drawn from ``rng`` (a
    ``numpy.random.Generator``; a freshly seeded one if None). ``p`` in [0, 1].
    """
    if not 0 <= p <= 1:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0:
        return x
    rng = np.random.default_rng() if rng is None else rng
    mask = dropout_mask(x.shape, p, rng, np.dtype(x.dtype).type)
    return x * Tensor(mask, device=x.device, dtype=x.dtype)
