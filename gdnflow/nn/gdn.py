"""The GDN layer: generalized divisive normalization with trained beta and gamma.

The operator, its math and its memory cost are in :mod:`gdnflow.ops.gdn`;
the reparameterisation of the parameters in :mod:`gdnflow.ops.gdn.parametrize`.
"""
import numpy as np

from gdnflow import ops
from gdnflow.errors import ShapeError
from gdnflow.nn.module import Module, Parameter
from gdnflow.ops.gdn.parametrize import NonNegativeReparametrization


class GDN(Module):
    """Generalized divisive normalization over the channels of NCHW inputs.

    ``y_i = x_i * (beta_i + sum_j gamma[i, j] s(x_j))^a`` at every pixel, with
    s(x) = x^2 and a = -1/2 (GDN, Ballé et al. 2016) or a = +1/2
    (``inverse=True``); ``simplified=True`` takes ``s(x) = |x|`` and a = -1 or +1
    (Johnston et al. 2019). Input and output: (N, channels, H, W).

    Parameters ``beta`` (channels,) and ``gamma`` (channels, channels), laid
    out [output channel, input channel], are stored reparameterised as in
    CompressAI's ``GDN`` (same names, same stored values: its trained ``beta``
    and ``gamma`` load here unchanged). :attr:`effective_beta` and
    :attr:`effective_gamma` are the values the normalisation uses:
    beta >= ``beta_min``, gamma >= 0; the forward computes them inside the
    GDN operator (``ops.gdn(..., parametrized=...)``), which also takes the
    gradients back to the stored values. At initialisation beta = 1 and
    gamma = ``gamma_init`` * I, so that GDN computes
    y = x / sqrt(1 + gamma_init x^2).
    """

    def __init__(self, channels, inverse=False, simplified=False, beta_min=1e-6, gamma_init=0.1):
        super().__init__()
        if int(channels) != channels or channels < 1:
            raise ValueError(f"GDN: channels must be a positive integer, got {channels!r}")
        self.channels = int(channels)
        self.inverse = bool(inverse)
        self.simplified = bool(simplified)
        self.beta_reparam = NonNegativeReparametrization(minimum=beta_min)
        self.gamma_reparam = NonNegativeReparametrization(minimum=0.0)
        self.beta = Parameter(self.beta_reparam.init(np.ones(self.channels)))
        self.gamma = Parameter(self.gamma_reparam.init(gamma_init * np.eye(self.channels)))

    @property
    def effective_beta(self):
        """beta as the normalisation uses it: a (channels,) Tensor, differentiable."""
        return self.beta_reparam(self.beta)

    @property
    def effective_gamma(self):
        """gamma as the normalisation uses it: a (channels, channels) Tensor, differentiable."""
        return self.gamma_reparam(self.gamma)

    def forward(self, x):
        """Normalise ``x`` of shape (N, channels, H, W); returns the same shape."""
        if x.ndim != 4 or x.shape[1] != self.channels:
            raise ShapeError(f"{self!r}: expected input of shape (N, {self.channels}, H, W), "
                             f"got {x.shape}")
        # The reparameterisation runs inside the operator: one autograd node
        # and one extra small launch, against three nodes and four launches
        # for ops.gdn(x, self.effective_beta, self.effective_gamma).
        parametrized = (self.beta_reparam.bound, self.gamma_reparam.bound,
                        self.beta_reparam.pedestal)
        return ops.gdn(x, self.beta, self.gamma, inverse=self.inverse,
                       simplified=self.simplified, parametrized=parametrized)

    def __repr__(self):
        flags = "".join(f", {name}=True" for name in ("inverse", "simplified")
                        if getattr(self, name))
        return f"GDN({self.channels}{flags})"
