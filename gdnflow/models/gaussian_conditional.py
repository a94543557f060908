"""The Gaussian conditional entropy model of the scale hyperprior (Ballé et al. 2018).

Each element of a latent y has its own zero-mean Gaussian N(0, sigma), sigma
predicted by the hyper-synthesis transform; the likelihood of a (noisy or
rounded) value v is the Gaussian's mass over the unit bin around it::

    p(v) = Phi((1/2 - |v|) / s) - Phi((-1/2 - |v|) / s),   s = max(sigma, scale_bound)

(both CDFs in the left tail, where small masses keep their precision:
:func:`gdnflow.ops.gaussian.gaussian_likelihood`, one fused kernel each way),
bounded below by ``likelihood_bound`` as the entropy bottleneck bounds its
own. ``scale_bound`` = 0.11 is CompressAI's and the smallest scale of the
codec's table (:mod:`gdnflow.codec.gaussian_tables`). Training adds
U(-1/2, 1/2) noise; evaluation rounds to the nearest integer (half to even).
No parameters: CompressAI's ``gaussian_conditional`` buffers are coding
tables, which gdnflow builds in the codec.
"""
import numpy as np

from gdnflow.errors import ShapeError
from gdnflow.models.entropy_bottleneck import noise_key_or_draw
from gdnflow.nn.module import Module
from gdnflow.ops import entropy as entropy_ops
from gdnflow.ops.bound import lower_bound
from gdnflow.ops.gaussian import gaussian_likelihood

#: The smallest standard deviation the model uses (and the codec's smallest table scale).
SCALE_BOUND = 0.11


class GaussianConditional(Module):
    """Quantisation and likelihoods of a latent y under per-element Gaussians N(0, scales).

    ``forward(y, scales, training=None, noise_key=None, noise_stream=0)``
    returns ``(y_hat, likelihoods)``, both of y's shape: y + noise in
    training mode (from (``noise_key``, ``noise_stream``), see
    :func:`gdnflow.ops.entropy.uniform_noise`), round(y) in eval mode, and
    each y_hat element's likelihood (module docstring). ``scales`` has y's
    shape. ``rng`` draws a noise key when none is given.
    """

    def __init__(self, scale_bound=SCALE_BOUND, likelihood_bound=1e-9, rng=None):
        super().__init__()
        self.scale_bound = float(scale_bound)
        self.likelihood_bound = float(likelihood_bound)
        rng = np.random.default_rng() if rng is None else rng
        self.noise_rng = np.random.default_rng(rng.integers(2 ** 63))

    def __repr__(self):
        return f"GaussianConditional(scale_bound={self.scale_bound:g})"

    def quantize(self, y, training, noise_key=None, noise_stream=0):
        """y + U(-1/2, 1/2) noise (training) or y rounded half to even (evaluation)."""
        if training:
            return entropy_ops.uniform_noise(y, noise_key_or_draw(noise_key, self.noise_rng),
                                             noise_stream)
        return entropy_ops.round(y)

    def likelihood(self, y_hat, scales):
        """p(y_hat) under N(0, scales), bounded below by ``likelihood_bound``."""
        p = gaussian_likelihood(y_hat, scales, self.scale_bound)
        return lower_bound(p, self.likelihood_bound) if self.likelihood_bound > 0 else p

    def forward(self, y, scales, training=None, noise_key=None, noise_stream=0):
        """(y_hat, likelihoods) of y given its ``scales`` (see the class docstring)."""
        if y.shape != scales.shape:
            raise ShapeError(f"{self!r}: the latent {y.shape} and its scales {scales.shape} "
                             "must have one shape")
        if training is None:
            training = self.training
        y_hat = self.quantize(y, training, noise_key, noise_stream)
        return y_hat, self.likelihood(y_hat, scales)
