"""The scale hyperprior (Ballé, Minnen, Singh, Hwang, Johnston, "Variational image
compression with a scale hyperprior", ICLR 2018; CompressAI's ``ScaleHyperprior``).

::

    x (B, 3, H, W) in [0, 1]
      g_a (as the factorized prior's)                       y (B, M, H/16, W/16)
      h_a: |y| -> conv3x3/1 (M -> N), ReLU, conv5x5/2, ReLU, conv5x5/2
                                                            z (B, N, H/64, W/64)
      entropy bottleneck: z_hat (noise or rounding around the medians), p(z_hat)
      h_s: convT5x5/2, ReLU, convT5x5/2, ReLU, conv3x3/1 (N -> M), ReLU
                                                            scales (B, M, H/16, W/16)
      Gaussian conditional: y_hat (noise or rounding), p(y_hat | scales)
      g_s (as the factorized prior's)                       x_hat (B, 3, H, W)

The rate is that of y and of the side information z together; z costs a few
percent of it and buys a scale per element of y, where the factorized prior
has one density per channel. H and W must be multiples of 64.

Names follow CompressAI's (``h_a.0.weight``, ``h_s.4.bias``,
``entropy_bottleneck.quantiles``...), so its trained weights load with
:func:`~gdnflow.models.compression.load_compressai_state_dict`.
"""
from gdnflow.models.compression import (CompressionModel, analysis_transform, conv, deconv,
                                        synthesis_transform, trace_layers)
from gdnflow.models.entropy_bottleneck import EntropyBottleneck, noise_key_or_draw
from gdnflow.models.gaussian_conditional import GaussianConditional
from gdnflow.nn.layers import ReLU, Sequential
from gdnflow.ops import entropy as entropy_ops

#: The factor by which g_a and h_a together shrink each side.
DOWNSAMPLING = 64
# Added to the noise key for z's noise, so that y's and z's noise differ (the golden ratio's
# 64-bit fraction: any odd constant would do).
_Z_KEY_OFFSET = 0x9E3779B97F4A7C15


def hyper_analysis_transform(N, M, rng):
    """h_a: conv3x3/1 (M -> N), ReLU, conv5x5/2, ReLU, conv5x5/2 (applied to |y|)."""
    return Sequential(conv(M, N, rng, kernel=3, stride=1), ReLU(), conv(N, N, rng), ReLU(),
                      conv(N, N, rng))


def hyper_synthesis_transform(N, M, rng):
    """h_s: convT5x5/2, ReLU, convT5x5/2, ReLU, conv3x3/1 (N -> M), ReLU: the scales."""
    return Sequential(deconv(N, N, rng), ReLU(), deconv(N, N, rng), ReLU(),
                      conv(N, M, rng, kernel=3, stride=1), ReLU())


class ScaleHyperprior(CompressionModel):
    """Scale-hyperprior autoencoder with N channels inside and M in the latent y.

    ``ScaleHyperprior(N=128, M=192)`` is CompressAI's ``bmshj2018-hyperprior``
    at qualities 1-5 (6-8: N=192, M=320). ``rng`` or ``seed`` makes the
    initialisation reproducible; ``device`` places the parameters.
    Attributes: ``g_a``, ``g_s``, ``h_a``, ``h_s`` (Sequential),
    ``entropy_bottleneck`` (over z's N channels), ``gaussian_conditional``,
    ``config``.

    ``forward(x, noise_key=None, noise_stream=0)`` returns a dict: ``x_hat``,
    ``y_hat``, ``z_hat``, ``scales`` and ``likelihoods`` = {"y": ..., "z": ...}.
    Training noise for y and z comes from (noise_key, noise_stream) with two
    different derived keys.
    """

    name = "hyperprior"
    downsampling = DOWNSAMPLING

    def __init__(self, N=128, M=192, rng=None, seed=None, device=None):
        super().__init__(N, M, rng, seed)
        N, M, rng = self.N, self.M, self.init_rng
        self.entropy_bottleneck = EntropyBottleneck(N, rng=rng)
        self.gaussian_conditional = GaussianConditional(rng=rng)
        self.g_a = analysis_transform(N, M, rng)
        self.g_s = synthesis_transform(N, M, rng)
        self.h_a = hyper_analysis_transform(N, M, rng)
        self.h_s = hyper_synthesis_transform(N, M, rng)
        if device is not None:
            self.to(device)

    def __repr__(self):
        return f"ScaleHyperprior(N={self.N}, M={self.M})"

    def forward(self, x, noise_key=None, noise_stream=0):
        """Encode, quantise (or add noise) and decode ``x``; see the class docstring."""
        out = dict(self.trace(x, noise_key, noise_stream))
        return {"x_hat": out["g_s.6"], "y_hat": out["gaussian_conditional.y_hat"],
                "z_hat": out["entropy_bottleneck.z_hat"], "scales": out["h_s.5"],
                "likelihoods": {"y": out["gaussian_conditional.likelihoods"],
                                "z": out["entropy_bottleneck.likelihoods"]}}

    def trace(self, x, noise_key=None, noise_stream=0):
        """Yield (name, output) after each layer of :meth:`forward`, in order.

        Names are the layers' (``g_a.0`` ... ``h_a.4``,
        ``entropy_bottleneck.z_hat``, ``entropy_bottleneck.likelihoods``,
        ``h_s.0`` ... ``gaussian_conditional.y_hat``,
        ``gaussian_conditional.likelihoods``, ``g_s.0`` ... ``g_s.6``).
        """
        self.check_input(x)
        if self.training:
            noise_key = noise_key_or_draw(noise_key, self.gaussian_conditional.noise_rng)
        z_key = None if noise_key is None else (noise_key + _Z_KEY_OFFSET) % 2 ** 64
        y = yield from trace_layers("g_a", self.g_a, x)
        z = yield from trace_layers("h_a", self.h_a, entropy_ops.abs(y))
        z_hat, z_likelihoods = self.entropy_bottleneck(z, noise_key=z_key,
                                                       noise_stream=noise_stream)
        yield "entropy_bottleneck.z_hat", z_hat
        yield "entropy_bottleneck.likelihoods", z_likelihoods
        scales = yield from trace_layers("h_s", self.h_s, z_hat)
        y_hat, y_likelihoods = self.gaussian_conditional(y, scales, noise_key=noise_key,
                                                         noise_stream=noise_stream)
        yield "gaussian_conditional.y_hat", y_hat
        yield "gaussian_conditional.likelihoods", y_likelihoods
        yield from trace_layers("g_s", self.g_s, y_hat)


def scale_hyperprior(N=128, M=192, **kwargs):
    """A :class:`ScaleHyperprior` (the constructor gdnflow.models registers)."""
    return ScaleHyperprior(N, M, **kwargs)
