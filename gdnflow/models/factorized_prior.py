"""The factorized-prior image-compression autoencoder (Ballé et al. ICLR 2017;
the "factorized prior" baseline of Ballé et al. ICLR 2018).

::

    x (N, 3, H, W) in [0, 1]
      g_a: conv5x5/2 (3 -> N), GDN, conv5x5/2, GDN, conv5x5/2, GDN, conv5x5/2 (N -> M)
    y (N, M, H/16, W/16)
      entropy bottleneck: y_hat = y + U(-1/2, 1/2) (training) or rounded (evaluation),
                          likelihoods p(y_hat) under a learned factorized density
      g_s: convT5x5/2 (M -> N), IGDN, convT5x5/2, IGDN, convT5x5/2, IGDN, convT5x5/2 (N -> 3)
    x_hat (N, 3, H, W)

Every convolution has padding 2 (the transposed ones output_padding 1, so
each doubles the size exactly): H and W must be multiples of 16.

Names follow CompressAI's ``FactorizedPrior`` (``g_a.0.weight``,
``g_a.1.beta``, ``g_s.6.bias``, ``entropy_bottleneck.matrices.0``,
``entropy_bottleneck.quantiles``...), and the stored GDN parameters use the
same reparameterisation, so :func:`load_compressai_state_dict` loads its
trained weights.
"""
import re

import numpy as np

from gdnflow.errors import ShapeError
from gdnflow.models.entropy_bottleneck import EntropyBottleneck
from gdnflow.nn.conv import Conv2d, ConvTranspose2d
from gdnflow.nn.gdn import GDN
from gdnflow.nn.layers import Sequential
from gdnflow.nn.module import Module

#: The factor by which g_a shrinks each side: inputs must be multiples of it.
DOWNSAMPLING = 16


class FactorizedPrior(Module):
    """Factorized-prior autoencoder with N channels inside and M in the latent.

    ``FactorizedPrior(N=128, M=192)`` is the model of CompressAI's qualities
    1-5 (6-8 use N=192, M=320). ``rng`` (a NumPy Generator) or ``seed``
    makes the initialisation reproducible; ``device`` is where the
    parameters go (default: the default device). Attributes: ``g_a``, ``g_s``
    (Sequential), ``entropy_bottleneck``, and ``config`` (the constructor's
    arguments, saved in checkpoints).

    ``forward(x, noise_key=None, noise_stream=0)`` returns a dict:
    ``x_hat`` (N, 3, H, W), ``y_hat`` (N, M, H/16, W/16) and
    ``likelihoods`` = {"y": (N, M, H/16, W/16)}. In training mode y_hat is
    y plus noise drawn from (noise_key, noise_stream) (see
    :meth:`EntropyBottleneck.quantize`); in eval mode it is rounded.
    """

    name = "factorized_prior"

    def __init__(self, N=128, M=192, rng=None, seed=None, device=None):
        super().__init__()
        N, M = int(N), int(M)
        if N < 1 or M < 1:
            raise ValueError(f"FactorizedPrior: N and M must be positive, got N={N}, M={M}")
        rng = np.random.default_rng(seed) if rng is None else rng
        self.N, self.M = N, M
        self.config = {"model": self.name, "N": N, "M": M}
        self.entropy_bottleneck = EntropyBottleneck(M, rng=rng)

        def conv(cin, cout):
            return Conv2d(cin, cout, 5, stride=2, padding=2, rng=rng)

        def deconv(cin, cout):
            return ConvTranspose2d(cin, cout, 5, stride=2, padding=2, output_padding=1, rng=rng)

        self.g_a = Sequential(conv(3, N), GDN(N), conv(N, N), GDN(N), conv(N, N), GDN(N),
                              conv(N, M))
        self.g_s = Sequential(deconv(M, N), GDN(N, inverse=True), deconv(N, N),
                              GDN(N, inverse=True), deconv(N, N), GDN(N, inverse=True),
                              deconv(N, 3))
        if device is not None:
            self.to(device)

    def __repr__(self):
        return f"FactorizedPrior(N={self.N}, M={self.M})"

    def check_input(self, x):
        """Raise ShapeError unless x is (N, 3, H, W) with H and W multiples of 16."""
        if x.ndim != 4 or x.shape[1] != 3 or x.shape[2] % DOWNSAMPLING or x.shape[3] % DOWNSAMPLING:
            raise ShapeError(f"{self!r}: expected images of shape (N, 3, H, W) with H and W "
                             f"multiples of {DOWNSAMPLING}, got {x.shape} (pad them first, "
                             "see gdnflow.data.pad_to_multiple)")

    def forward(self, x, noise_key=None, noise_stream=0):
        """Encode, quantise (or add noise) and decode ``x``; see the class docstring."""
        self.check_input(x)
        y = self.g_a(x)
        y_hat, likelihoods = self.entropy_bottleneck(y, noise_key=noise_key,
                                                     noise_stream=noise_stream)
        x_hat = self.g_s(y_hat)
        return {"x_hat": x_hat, "y_hat": y_hat, "likelihoods": {"y": likelihoods}}

    def trace(self, x, noise_key=None, noise_stream=0):
        """Yield (name, output) after each layer of :meth:`forward`, in order.

        Names are the layers' (``g_a.0`` ... ``entropy_bottleneck.y_hat``,
        ``entropy_bottleneck.likelihoods``, ``g_s.0`` ...): the trainer walks
        this to name the first layer whose output is not finite.
        """
        self.check_input(x)
        for i, layer in enumerate(self.g_a):
            x = layer(x)
            yield f"g_a.{i}", x
        y_hat, likelihoods = self.entropy_bottleneck(x, noise_key=noise_key,
                                                     noise_stream=noise_stream)
        yield "entropy_bottleneck.y_hat", y_hat
        yield "entropy_bottleneck.likelihoods", likelihoods
        x = y_hat
        for i, layer in enumerate(self.g_s):
            x = layer(x)
            yield f"g_s.{i}", x

    def aux_loss(self):
        """The entropy bottleneck's auxiliary (quantile) loss; see :meth:`EntropyBottleneck.loss`."""
        return self.entropy_bottleneck.loss()

    def aux_parameters(self):
        """The parameters the auxiliary loss trains: the quantiles (CompressAI's split)."""
        return [p for name, p in self.named_parameters() if name.endswith(".quantiles")]

    def main_parameters(self):
        """Every parameter but the quantiles: what the rate-distortion loss trains."""
        return [p for name, p in self.named_parameters() if not name.endswith(".quantiles")]


def factorized_prior(N=128, M=192, **kwargs):
    """A :class:`FactorizedPrior` (the constructor gdnflow.models registers)."""
    return FactorizedPrior(N, M, **kwargs)


def load_compressai_state_dict(model, state_dict):
    """Load a CompressAI ``FactorizedPrior`` state dict into ``model`` (a gdnflow one).

    ``state_dict`` maps names to arrays or torch tensors (converted with
    ``.detach().cpu().numpy()``). Entries gdnflow has no counterpart for are
    skipped: the GDN reparameterisations' constant buffers (``*.pedestal``,
    ``*.bound``) and the entropy coder's tables (``_offset``,
    ``_quantized_cdf``, ``_cdf_length``); every gdnflow parameter and buffer
    must be present. CompressAI before 1.2 named the entropy bottleneck's
    parameters ``_matrix0``, ``_bias0``, ``_factor0``: those are renamed.
    Returns the list of skipped names.
    """
    plural = {"matrix": "matrices", "bias": "biases", "factor": "factors"}
    own = set(model.state_dict())
    converted, skipped = {}, []
    for name, value in state_dict.items():
        renamed = re.sub(r"\._(matrix|bias|factor)(\d+)$",
                         lambda m: f".{plural[m.group(1)]}.{m.group(2)}", name)
        if renamed not in own:
            skipped.append(name)
            continue
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        converted[renamed] = np.asarray(value)
    model.load_state_dict(converted)
    return skipped
