"""The entropy bottleneck: a learned, non-parametric, factorized density over
the channels of a latent, and the noisy quantisation that trains it.

Ballé, Minnen, Singh, Hwang, Johnston, "Variational image compression with a
scale hyperprior", ICLR 2018, appendix 6.1. Per channel c, a cumulative
density is a chain of K + 1 small layers applied to a scalar x::

    f_0 = x                                              (1 value)
    g_k = softplus(H_k) @ f_k + b_k                      (r_k values, r = filters)
    f_{k+1} = g_k + tanh(a_k) * tanh(g_k)   for k < K    (elementwise)
    c(x) = g_K                                           (1 value: a CDF logit)

softplus keeps every matrix positive and |tanh(a_k)| < 1 keeps each
f -> f + tanh(a) tanh(f) increasing, so c is increasing and sigmoid(c) a
CDF. The likelihood of a (noisy or rounded) latent value v is the mass of
the unit bin around it::

    p(v) = |sigmoid(s c(v + 1/2)) - sigmoid(s c(v - 1/2))|,  s = -sign(c(v-1/2) + c(v+1/2))

(the sign trick: the difference is taken in the tail where sigmoid is small,
so masses near 1e-9 keep float32 precision; see
:func:`gdnflow.ops.entropy.sigmoid_difference`), bounded below by
``likelihood_bound`` with :class:`~gdnflow.ops.bound.LowerBoundOp`'s
gradient (it still passes where it would raise a likelihood that sits on the
bound, as CompressAI's ``LowerBound`` does).

Training adds U(-1/2, 1/2) noise to the latent (a differentiable stand-in for
rounding); evaluation rounds around each channel's median. ``quantiles``
holds per channel the values where c = -t, 0, +t with t = log(2/tail_mass - 1)
(so that each tail carries tail_mass/2); the auxiliary loss :meth:`loss`
learns them, with the density itself held fixed. The codec
(:mod:`gdnflow.codec`) uses them to bound the range of symbols.

Parameter names follow CompressAI's ``EntropyBottleneck`` (``matrices.0``,
``biases.0``, ``factors.0``, ``quantiles``; buffer ``target``) so that its
weights convert name for name (see
:func:`gdnflow.models.compression.load_compressai_state_dict`).
"""
import math

import numpy as np

from gdnflow import ops
from gdnflow.errors import ShapeError
from gdnflow.nn.module import Module, Parameter
from gdnflow.ops import entropy as entropy_ops
from gdnflow.ops.bound import lower_bound


def noise_key_or_draw(noise_key, rng):
    """``noise_key``, or a new one drawn from ``rng`` (a NumPy Generator) when it is None."""
    return int(rng.integers(2 ** 63)) if noise_key is None else noise_key


class ParameterList(Module):
    """Parameters named "0", "1", ... in order: the names of PyTorch's ``nn.ParameterList``."""

    def __init__(self, values=()):
        super().__init__()
        for value in values:
            self.append(value)

    def append(self, value):
        """Add a parameter (a Parameter, or an array copied into a new one) at the end."""
        if not isinstance(value, Parameter):
            value = Parameter(value)
        setattr(self, str(len(self._parameters)), value)
        return self

    def __getitem__(self, index):
        return getattr(self, str(range(len(self))[index]))

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter([self[i] for i in range(len(self))])


class EntropyBottleneck(Module):
    """Factorized density and noisy quantisation of a latent y of shape (N, channels, H, W).

    ``forward(y)`` returns ``(y_hat, likelihoods)``, both of y's shape:
    y + noise in training mode, round(y - median) + median in eval mode, and
    the likelihood of each y_hat element under its channel's density (see
    the module docstring).

    Arguments: ``channels``; ``filters`` (the widths r_k of the hidden
    layers, (3, 3, 3, 3) as in the paper); ``init_scale`` (the initial
    density is roughly uniform over [-init_scale, init_scale]);
    ``tail_mass`` (the mass outside the outer quantiles); ``likelihood_bound``
    (the lower bound of likelihoods, 0 for none); ``rng`` (a NumPy Generator
    for the biases' initialisation and for noise when no key is given);
    ``device`` (default: the default device).

    Parameters, per channel C = ``channels``: ``matrices.k`` (C, r_{k+1}, r_k)
    (stored before softplus), ``biases.k`` (C, r_{k+1}, 1), ``factors.k``
    (C, r_{k+1}, 1) (before tanh), ``quantiles`` (C, 1, 3). Initialisation as
    tensorflow-compression and CompressAI: softplus(H_k) = 1 / (scale r_{k+1})
    with scale = init_scale^(1/(K+1)), biases U(-1/2, 1/2), factors 0,
    quantiles (-init_scale, 0, init_scale).
    """

    def __init__(self, channels, filters=(3, 3, 3, 3), init_scale=10.0, tail_mass=1e-9,
                 likelihood_bound=1e-9, rng=None, device=None):
        super().__init__()
        if int(channels) != channels or channels < 1:
            raise ValueError(f"EntropyBottleneck: channels must be a positive integer, "
                             f"got {channels!r}")
        rng = np.random.default_rng() if rng is None else rng
        self.channels = int(channels)
        self.filters = tuple(int(f) for f in filters)
        self.init_scale = float(init_scale)
        self.tail_mass = float(tail_mass)
        self.likelihood_bound = float(likelihood_bound)
        # Noise keys for calls that pass none; the trainer always passes one.
        self.noise_rng = np.random.default_rng(rng.integers(2 ** 63))

        widths = (1,) + self.filters + (1,)
        scale = self.init_scale ** (1 / (len(self.filters) + 1))
        matrices, biases, factors = [], [], []
        for k in range(len(self.filters) + 1):
            # softplus^-1 of 1/(scale r): the chain starts close to x / init_scale.
            init = math.log(math.expm1(1 / scale / widths[k + 1]))
            matrices.append(np.full((self.channels, widths[k + 1], widths[k]), init))
            biases.append(rng.uniform(-0.5, 0.5, (self.channels, widths[k + 1], 1)))
            if k < len(self.filters):
                factors.append(np.zeros((self.channels, widths[k + 1], 1)))
        self.quantiles = Parameter(np.tile([[[-self.init_scale, 0.0, self.init_scale]]],
                                           (self.channels, 1, 1)))
        target = math.log(2 / self.tail_mass - 1)
        self.register_buffer("target", np.array([-target, 0.0, target]))
        self.matrices = ParameterList(matrices)
        self.biases = ParameterList(biases)
        self.factors = ParameterList(factors)
        if device is not None:
            self.to(device)

    def __repr__(self):
        return f"EntropyBottleneck({self.channels}, filters={self.filters})"

    # ---------------------------------------------------------- density --
    def logits_cumulative(self, inputs, stop_gradient=False):
        """c(x) for inputs of shape (channels, 1, K): the CDF logits, same shape.

        With ``stop_gradient`` the density's parameters are held fixed (the
        gradient reaches only ``inputs``), as the auxiliary loss needs.
        """
        logits = inputs
        for k in range(len(self.filters) + 1):
            matrix, bias = self.matrices[k], self.biases[k]
            if stop_gradient:
                matrix, bias = matrix.detach(), bias.detach()
            # One batched GEMM over the channels: (C, r', r) @ (C, r, K).
            logits = ops.matmul(entropy_ops.softplus(matrix), logits) + bias
            if k < len(self.filters):
                factor = self.factors[k].detach() if stop_gradient else self.factors[k]
                logits = logits + entropy_ops.tanh(factor) * entropy_ops.tanh(logits)
        return logits

    def likelihood(self, values, stop_gradient=False):
        """p(v) for values of shape (channels, 1, K), unbounded (see the module docstring)."""
        k = values.shape[-1]
        # Both bin edges go through the chain as one (C, 1, 2K) batch: half
        # the launches of two passes.
        edges = ops.concat([values - 0.5, values + 0.5], axis=2)
        logits = self.logits_cumulative(edges, stop_gradient)
        every = slice(None)
        lower = ops.slice_(logits, (every, every, slice(0, k)))
        upper = ops.slice_(logits, (every, every, slice(k, 2 * k)))
        return entropy_ops.sigmoid_difference(lower, upper)

    def medians(self):
        """Each channel's median, the middle quantile: a (channels, 1, 1) Tensor."""
        every = slice(None)
        return ops.slice_(self.quantiles, (every, every, slice(1, 2)))

    # ---------------------------------------------------------- forward --
    def quantize(self, y, training, noise_key=None, noise_stream=0):
        """y + U(-1/2, 1/2) noise (training) or round(y - median) + median (evaluation).

        The noise is a function of (``noise_key``, ``noise_stream``) only
        (:func:`gdnflow.ops.entropy.uniform_noise`); without a key one is
        drawn from ``noise_rng``. Rounding passes the gradient straight
        through; the medians are held fixed.
        """
        if training:
            return entropy_ops.uniform_noise(y, noise_key_or_draw(noise_key, self.noise_rng),
                                             noise_stream)
        medians = self.medians().detach().reshape(1, self.channels, 1, 1)
        return entropy_ops.round(y - medians) + medians

    def forward(self, y, training=None, noise_key=None, noise_stream=0):
        """(y_hat, likelihoods) for a latent y of shape (N, channels, H, W).

        ``training`` defaults to the module's mode; ``noise_key`` and
        ``noise_stream`` choose the training noise (see :meth:`quantize`).
        """
        if y.ndim != 4 or y.shape[1] != self.channels:
            raise ShapeError(f"{self!r}: expected a latent of shape (N, {self.channels}, H, W), "
                             f"got {y.shape}")
        if training is None:
            training = self.training
        n, c, h, w = y.shape
        y_hat = self.quantize(y, training, noise_key, noise_stream)
        # One density per channel: lay each channel's values out as a row.
        values = ops.transpose(y_hat, (1, 0, 2, 3)).reshape(c, 1, n * h * w)
        likelihoods = self.likelihood(values)
        if self.likelihood_bound > 0:
            likelihoods = lower_bound(likelihoods, self.likelihood_bound)
        likelihoods = ops.transpose(likelihoods.reshape(c, n, h, w), (1, 0, 2, 3))
        return y_hat, likelihoods

    def loss(self):
        """The auxiliary loss ``sum |c(quantiles) - target|``: it moves only ``quantiles``.

        Minimised, it places each channel's quantiles where the CDF logits are
        -t, 0 and t (``target``), the density itself held fixed.
        """
        logits = self.logits_cumulative(self.quantiles, stop_gradient=True)
        return entropy_ops.abs(logits - self.target).sum()
