"""What the learned image codecs share: the GDN transforms of Ballé et al. and
the split of their parameters between the rate-distortion and auxiliary losses.

``analysis_transform(N, M)`` (g_a) and ``synthesis_transform(N, M)`` (g_s)
are the four 5x5 stride-2 layers of the factorized prior and of the scale
hyperprior (padding 2; the transposed ones output_padding 1, so each
doubles the size exactly), with GDN (IGDN) between them. Names follow
CompressAI (``g_a.0.weight``, ``g_a.1.beta``, ``g_s.6.bias``).
"""
import re

import numpy as np

from gdnflow.errors import ShapeError
from gdnflow.nn.conv import Conv2d, ConvTranspose2d
from gdnflow.nn.gdn import GDN
from gdnflow.nn.layers import Sequential
from gdnflow.nn.module import Module


def conv(cin, cout, rng, kernel=5, stride=2):
    """A convolution with "same" padding (kernel // 2): the output is the input / stride."""
    return Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, rng=rng)


def deconv(cin, cout, rng, kernel=5, stride=2):
    """A transposed convolution whose output is exactly ``stride`` times its input."""
    return ConvTranspose2d(cin, cout, kernel, stride=stride, padding=kernel // 2,
                           output_padding=stride - 1, rng=rng)


def trace_layers(prefix, layers, x):
    """Yield (``prefix.i``, output) after each of ``layers`` applied in turn to x; return the
    last output (``x = yield from trace_layers("g_a", self.g_a, x)`` in a model's trace)."""
    for i, layer in enumerate(layers):
        x = layer(x)
        yield f"{prefix}.{i}", x
    return x


def analysis_transform(N, M, rng):
    """g_a: conv5x5/2 (3 -> N), GDN, conv5x5/2, GDN, conv5x5/2, GDN, conv5x5/2 (N -> M)."""
    return Sequential(conv(3, N, rng), GDN(N), conv(N, N, rng), GDN(N), conv(N, N, rng), GDN(N),
                      conv(N, M, rng))


def synthesis_transform(N, M, rng):
    """g_s: convT5x5/2 (M -> N), IGDN, convT5x5/2, IGDN, convT5x5/2, IGDN, convT5x5/2 (N -> 3)."""
    return Sequential(deconv(M, N, rng), GDN(N, inverse=True), deconv(N, N, rng),
                      GDN(N, inverse=True), deconv(N, N, rng), GDN(N, inverse=True),
                      deconv(N, 3, rng))


class CompressionModel(Module):
    """Base of the codec models: input checks and the parameter split of the two losses.

    Subclasses set ``name`` and ``downsampling`` (how much the encoder
    shrinks each side: image sides must be multiples of it), call
    ``super().__init__(N, M, rng, seed)`` (which checks and stores N and M,
    the ``config`` saved in checkpoints, and ``init_rng``), and own an
    ``entropy_bottleneck``.
    """

    downsampling = 16

    def __init__(self, N, M, rng=None, seed=None):
        super().__init__()
        N, M = int(N), int(M)
        if N < 1 or M < 1:
            raise ValueError(f"{type(self).__name__}: N and M must be positive, got N={N}, M={M}")
        self.N, self.M = N, M
        self.config = {"model": self.name, "N": N, "M": M}
        #: The generator the subclass initialises its layers from (``rng``, else from ``seed``).
        self.init_rng = np.random.default_rng(seed) if rng is None else rng

    def check_input(self, x):
        """Raise ShapeError unless x is (N, 3, H, W) with H and W multiples of ``downsampling``."""
        d = self.downsampling
        if x.ndim != 4 or x.shape[1] != 3 or x.shape[2] % d or x.shape[3] % d:
            raise ShapeError(f"{self!r}: expected images of shape (N, 3, H, W) with H and W "
                             f"multiples of {d}, got {x.shape} (pad them first, "
                             "see gdnflow.data.pad_to_multiple)")

    def aux_loss(self):
        """The entropy bottleneck's auxiliary (quantile) loss; see :meth:`EntropyBottleneck.loss`."""
        return self.entropy_bottleneck.loss()

    def aux_parameters(self):
        """The parameters the auxiliary loss trains: the quantiles (CompressAI's split)."""
        return [p for name, p in self.named_parameters() if name.endswith(".quantiles")]

    def main_parameters(self):
        """Every parameter but the quantiles: what the rate-distortion loss trains."""
        return [p for name, p in self.named_parameters() if not name.endswith(".quantiles")]


def load_compressai_state_dict(model, state_dict):
    """Load a CompressAI ``FactorizedPrior`` or ``ScaleHyperprior`` state dict into ``model``.

    ``model`` is the gdnflow model of the same kind and size. The one place
    where CompressAI's names meet gdnflow's.

    ``state_dict`` maps names to arrays or torch tensors (converted with
    ``.detach().cpu().numpy()``). Entries gdnflow has no counterpart for are
    skipped: the GDN reparameterisations' constant buffers (``*.pedestal``,
    ``*.bound``) and the entropy coder's tables (``_offset``,
    ``_quantized_cdf``, ``_cdf_length``, the Gaussian conditional's ``scale_table``
    and ``scale_bound``, whose values gdnflow fixes); every gdnflow parameter and buffer
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
