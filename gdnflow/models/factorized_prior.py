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
same reparameterisation, so
:func:`~gdnflow.models.compression.load_compressai_state_dict` loads its
trained weights.
"""
from gdnflow.models.compression import (CompressionModel, analysis_transform,
                                        load_compressai_state_dict, synthesis_transform,
                                        trace_layers)
from gdnflow.models.entropy_bottleneck import EntropyBottleneck

#: The factor by which g_a shrinks each side: inputs must be multiples of it.
DOWNSAMPLING = 16


class FactorizedPrior(CompressionModel):
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
    downsampling = DOWNSAMPLING

    def __init__(self, N=128, M=192, rng=None, seed=None, device=None):
        super().__init__(N, M, rng, seed)
        N, M, rng = self.N, self.M, self.init_rng
        self.entropy_bottleneck = EntropyBottleneck(M, rng=rng)
        self.g_a = analysis_transform(N, M, rng)
        self.g_s = synthesis_transform(N, M, rng)
        if device is not None:
            self.to(device)

    def __repr__(self):
        return f"FactorizedPrior(N={self.N}, M={self.M})"

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
        y = yield from trace_layers("g_a", self.g_a, x)
        y_hat, likelihoods = self.entropy_bottleneck(y, noise_key=noise_key,
                                                     noise_stream=noise_stream)
        yield "entropy_bottleneck.y_hat", y_hat
        yield "entropy_bottleneck.likelihoods", likelihoods
        yield from trace_layers("g_s", self.g_s, y_hat)


def factorized_prior(N=128, M=192, **kwargs):
    """A :class:`FactorizedPrior` (the constructor gdnflow.models registers)."""
    return FactorizedPrior(N, M, **kwargs)


# load_compressai_state_dict lived here before the scale hyperprior shared it.
__all__ = ["FactorizedPrior", "factorized_prior", "DOWNSAMPLING", "load_compressai_state_dict"]
