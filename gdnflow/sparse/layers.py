"""SparseConv2d: a pruned Conv2d that runs the direct sparse convolution where it is faster.

A :class:`SparseConv2d` is a :class:`~gdnflow.nn.conv.Conv2d` (same
parameters ``weight`` [C_out, C_in, kh, kw] and ``bias``, same buffer
``weight_mask``, so checkpoints of either load into the other) whose
forward, when no gradient of the weight is wanted (inference, or a frozen
layer), asks :mod:`gdnflow.sparse.dispatch` whether this layer shape at this
density is faster dense or sparse, and runs that. When the weight is being
trained it runs the dense convolution: the dense weight gradient is what
the optimiser needs, and :func:`~gdnflow.sparse.prune.apply_masks` keeps
the pruned weights at zero between steps.

:func:`sparsify` turns the pruned Conv2d layers of a model into SparseConv2d
layers in place.
"""
import numpy as np

from gdnflow import ops
from gdnflow.autograd import grad_enabled, no_grad
from gdnflow.errors import ShapeError
from gdnflow.nn.conv import Conv2d
from gdnflow.nn.module import Module
from gdnflow.tensor import weights_changed, weights_version
from gdnflow.ops.conv import conv_geometry, conv_parameters
from gdnflow.sparse import dispatch
from gdnflow.sparse.conv import sparse_conv2d, values_tensor
from gdnflow.sparse.csr import to_csr
from gdnflow.sparse.geometry import padded_size
from gdnflow.sparse.prune import MASK, set_mask
from gdnflow.tensor import Tensor

_COPIED = ("in_channels", "out_channels", "groups", "kernel_size", "stride", "padding",
           "dilation", "activation")


class SparseConv2d(Conv2d):
    """A Conv2d (groups 1) with a pruning mask, run sparse or dense per the dispatcher.

    Arguments as :class:`~gdnflow.nn.conv.Conv2d` (``groups`` must be 1);
    the mask starts as the weight's non-zeros. Input [N, in, H, W] -> output
    [N, out, OH, OW], ``OH = floor((H + top + bottom - dilation*(kh-1) - 1)/stride) + 1``.
    ``last_choice`` says what the latest forward ran ("sparse" or "dense").
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 bias=True, activation=None, device=None, rng=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups=1, bias=bias, activation=activation, device=device, rng=rng)
        set_mask(self, self.weight.numpy() != 0)
        self._init_sparse_state()

    def _init_sparse_state(self):
        object.__setattr__(self, "_sparse_cache", {})
        object.__setattr__(self, "last_choice", None)

    @classmethod
    def from_conv(cls, conv):
        """A SparseConv2d sharing ``conv``'s parameters and mask (the mask: its
        weight's non-zeros if it has none)."""
        if not isinstance(conv, Conv2d) or conv.groups != 1:
            raise TypeError("SparseConv2d.from_conv: expected a Conv2d with groups == 1")
        layer = cls.__new__(cls)
        Module.__init__(layer)
        for name in _COPIED:
            object.__setattr__(layer, name, getattr(conv, name))
        layer.weight = conv.weight
        layer.bias = conv.bias
        mask = conv._buffers.get(MASK)
        if mask is not None:
            layer.register_buffer(MASK, mask)
        else:
            set_mask(layer, conv.weight.numpy() != 0)
        layer.training = conv.training
        layer._init_sparse_state()
        return layer

    @property
    def density(self):
        """Fraction of the weight the mask keeps (read from the device once per weights version)."""
        mask = self._buffers.get(MASK)
        if mask is None:
            return 1.0
        key = ("density", weights_version(), mask.data)
        cached = self._sparse_cache.get("density")
        if cached is None or cached[0] != key[1] or cached[1] is not key[2]:
            cached = (key[1], key[2], float(np.count_nonzero(mask.numpy())) / mask.size)
            self._sparse_cache["density"] = cached
        return cached[2]

    def _geometry(self, x):
        stride, padding, dilation, _ = conv_parameters("SparseConv2d", self.stride, self.padding,
                                                       self.dilation, 1)
        return conv_geometry("SparseConv2d", x.shape, self.weight.shape, stride, padding,
                             dilation, 1)

    def sparse_weight(self, g, device):
        """(CSRWeight, values tensor) of the masked weight, rebuilt when weights change."""
        version = weights_version()
        cached = self._sparse_cache.get(device)
        if cached is None or cached[0] != version or cached[1] is not self.weight.data:
            mask = self._buffers.get(MASK)
            csr = to_csr(self.weight.numpy(), padded_size(g), g.dilation,
                         mask=None if mask is None else mask.numpy())
            cached = (version, self.weight.data, csr, values_tensor(csr, device))
            self._sparse_cache[device] = cached
        return cached[2], cached[3]

    def forward(self, x, residual=None):
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ShapeError(f"SparseConv2d({self.in_channels}, {self.out_channels}): expected "
                             f"input [N, {self.in_channels}, H, W], got {x.shape}")
        training_weight = grad_enabled() and self.weight.requires_grad
        choice = "dense"
        if not training_weight and residual is None:
            g = self._geometry(x)
            choice = dispatch.dispatcher.choose(g, self.density, x.device)
        object.__setattr__(self, "last_choice", choice)
        if choice == "dense":
            return super().forward(x, residual)
        csr, values = self.sparse_weight(g, x.device)
        y = sparse_conv2d(x, csr, values, self.bias, g.stride, g.padding)
        if self.activation == "relu":
            y = ops.relu(y)
        elif self.activation == "relu6":
            y = ops.relu6(y)
        return y


def sparsify(model, min_sparsity=0.0):
    """Replace every masked Conv2d (groups 1) of ``model`` by a SparseConv2d, in place.

    Layers whose mask prunes less than ``min_sparsity`` stay dense Conv2d.
    Parameters, masks and names are kept (checkpoints still fit). Returns
    the names of the replaced layers.
    """
    replaced = []
    for prefix, parent in list(model.named_modules()):
        for name, child in list(parent._modules.items()):
            if (type(child) is Conv2d and child.groups == 1
                    and child._buffers.get(MASK) is not None):
                mask = child._buffers[MASK].numpy()
                if 1.0 - np.count_nonzero(mask) / mask.size >= min_sparsity:
                    _replace_child(parent, name, SparseConv2d.from_conv(child))
                    replaced.append(prefix + name)
    return replaced


def _replace_child(parent, name, module):
    """parent.<name> = module, keeping the child's place in the order (setattr would move
    it to the end, and a Sequential runs its children in that order)."""
    parent._modules[name] = module
    object.__setattr__(parent, name, module)
    weights_changed()


def describe_model(model, input_shape, device=None, seed=0):
    """Per sparse layer of ``model``: name, density and what the dispatcher runs, as text.

    Runs one forward (no gradient) of a random input of ``input_shape`` so
    that each SparseConv2d sees its real input size (on the GPU this is
    where the layers are timed), then adds the dispatcher's table.
    """
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal(input_shape), device=device)
    was_training = model.training
    model.eval()
    with no_grad():
        model(x)
    model.train(was_training)
    lines = []
    for name, m in model.named_modules():
        if isinstance(m, SparseConv2d):
            lines.append(f"{name.rstrip('.')}: density {m.density:.3f}, runs {m.last_choice}")
    return "\n".join(lines + [dispatch.describe()])
