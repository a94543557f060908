"""gdnflow modules for the Keras layers that hold weights (recurrent ones aside).

Conv2D, DepthwiseConv2D, SeparableConv2D, Conv1D, Dense, BatchNormalization,
LayerNormalization and PReLU; their weights arrive converted to gdnflow's
layout (:mod:`gdnflow.io.keras.weights`) and keep Keras' results in the
layout of :mod:`gdnflow.io.keras.layout`:

- SeparableConv2D is a depthwise convolution (``depth_multiplier`` outputs per
  input channel, the strides, padding and dilation) then a 1x1 convolution
  with the bias and the activation: submodules ``depthwise`` and ``pointwise``.
- Conv1D runs on a sequence [batch, time, channels] as a convolution of the
  image [batch, channels, 1, time]; ``padding="causal"`` pads
  ``(k - 1) * dilation`` steps before the sequence.
- LayerNormalization: ``(x - m) / sqrt(v + epsilon) * gamma + beta``, m and v
  the mean and variance over Keras' ``axis`` (one or a list), gamma and beta
  kept in Keras' shape (the normalised axes' sizes) and broadcast per call.
- PReLU: ``relu(x) - alpha * relu(-x)``, alpha one per element of the input
  without the batch, 1 along ``shared_axes``; an image's alpha is kept as
  [C, H or 1, W or 1].
"""
import numpy as np

from gdnflow import nn, ops
from gdnflow.io.keras.activations import activate, activation_name, negative_part
from gdnflow.io.keras.layout import (image_as_sequence, keras_axis, pair, same_padding,
                                     sequence_as_image, single, to_nhwc, from_nhwc)
from gdnflow.nn.module import Module, Parameter
from gdnflow.tensor import Tensor


def parameter(params, key, device):
    """``params[key]`` (an array in gdnflow's layout) as a float32 Parameter on ``device``."""
    return Parameter(np.ascontiguousarray(params[key], dtype=np.float32), device=device)


class KerasConv2d(Module):
    """Keras' Conv2D or DepthwiseConv2D: weight [out, in/groups, kh, kw], bias [out] or None.

    ``padding`` is "valid" (none) or "same" (TensorFlow's, from each input's
    size); relu and relu6 activations are fused into the convolution.
    """

    def __init__(self, params, strides, dilation, groups, padding, activation, device):
        super().__init__()
        self.weight = parameter(params, "weight", device)
        self.bias = parameter(params, "bias", device) if "bias" in params else None
        self.kernel_size = tuple(self.weight.shape[2:])
        self.stride, self.dilation, self.groups = strides, dilation, groups
        self.same, self.activation = padding == "same", activation

    def forward(self, x):
        padding = same_padding(x, self.kernel_size, self.stride, self.dilation) if self.same else 0
        fused = self.activation if self.activation in ("relu", "relu6") else None
        y = ops.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                       self.groups, activation=fused)
        return y if fused else activate(y, self.activation)


class KerasConv1d(KerasConv2d):
    """Keras' Conv1D on [batch, time, channels]: weight [out, in/groups, 1, k], bias [out] or None.

    ``padding`` "valid", "same" (TensorFlow's) or "causal" (``(k - 1) *
    dilation`` zeros before the sequence, none after).
    """

    def __init__(self, params, stride, dilation, groups, padding, activation, device):
        super().__init__(params, (1, stride), (1, dilation), groups, padding, activation,
                         device)
        self.causal = padding == "causal"

    def forward(self, x):
        image = sequence_as_image(x)
        if self.causal:
            before = (self.kernel_size[1] - 1) * self.dilation[1]
            image = ops.pad(image, [(0, 0), (0, 0), (0, 0), (before, 0)])
        return image_as_sequence(super().forward(image))


class KerasSeparableConv2d(Module):
    """Keras' SeparableConv2D: ``pointwise(depthwise(x))`` (module docstring).

    ``depthwise.weight`` [in * depth_multiplier, 1, kh, kw];
    ``pointwise.weight`` [out, in * depth_multiplier, 1, 1], ``pointwise.bias``.
    """

    def __init__(self, params, multiplier, strides, dilation, padding, activation, device):
        super().__init__()
        depthwise = params["depthwise.weight"]
        self.depthwise = KerasConv2d({"weight": depthwise}, strides, dilation,
                                     depthwise.shape[0] // multiplier, padding, "linear", device)
        pointwise = {"weight": params["pointwise.weight"]}
        if "pointwise.bias" in params:
            pointwise["bias"] = params["pointwise.bias"]
        self.pointwise = KerasConv2d(pointwise, (1, 1), (1, 1), 1, "valid", activation, device)

    def forward(self, x):
        return self.pointwise(self.depthwise(x))


class KerasDense(Module):
    """Keras' Dense: weight [out, in] (the transposed Keras kernel), bias [out] or None.

    On a 4-D value it acts on the channels, as Keras' does on the last axis.
    """

    def __init__(self, params, activation, device):
        super().__init__()
        self.weight = parameter(params, "weight", device)
        self.bias = parameter(params, "bias", device) if "bias" in params else None
        self.activation = activation

    def forward(self, x):
        if x.ndim == 4:
            y = from_nhwc(ops.linear(to_nhwc(x), self.weight, self.bias))
        else:
            y = ops.linear(x, self.weight, self.bias)
        return activate(y, self.activation)


class KerasBatchNorm(nn.BatchNorm2d):
    """Keras' BatchNormalization over the channels of a 4-D value, or the last axis of a 2-D
    or 3-D one (features; a sequence's steps count as samples)."""

    def forward(self, x):
        if x.ndim in (2, 3):
            rows = ops.reshape(x, (-1, x.shape[-1], 1, 1))
            return ops.reshape(super().forward(rows), x.shape)
        return super().forward(x)


def _keras_broadcast(value, x, axes):
    """``value`` (Keras' shape: the sizes of ``axes``) shaped to broadcast against gdnflow's x."""
    keras_shape = to_nhwc_shape(x.shape)
    shape = tuple(keras_shape[d] if d in axes else 1 for d in range(x.ndim))
    return from_nhwc(ops.reshape(value, shape))


def to_nhwc_shape(shape):
    """The shape of a gdnflow value as Keras sees it (NHWC for 4-D)."""
    return (shape[0], shape[2], shape[3], shape[1]) if len(shape) == 4 else tuple(shape)


class KerasLayerNorm(Module):
    """Keras' LayerNormalization over Keras' ``axes``; weight (gamma) and bias (beta) or None.

    weight and bias have the sizes of the normalised axes, in Keras' order.
    """

    def __init__(self, params, axes, epsilon, device):
        super().__init__()
        self.axes, self.epsilon = tuple(int(a) for a in axes), float(epsilon)
        self.weight = parameter(params, "weight", device) if "weight" in params else None
        self.bias = parameter(params, "bias", device) if "bias" in params else None

    def forward(self, x):
        keras_axes = sorted({a % x.ndim for a in self.axes})
        axes = tuple(sorted(keras_axis(a, x.ndim) for a in keras_axes))
        centred = x - ops.mean(x, axes, True)
        y = centred * ops.pow(ops.mean(centred * centred, axes, True) + self.epsilon, -0.5)
        if self.weight is not None:
            y = y * _keras_broadcast(self.weight, x, keras_axes)
        if self.bias is not None:
            y = y + _keras_broadcast(self.bias, x, keras_axes)
        return y


class KerasPReLU(Module):
    """Keras' PReLU: ``relu(x) - alpha * relu(-x)``; alpha broadcasts against x (gdnflow layout)."""

    def __init__(self, params, device):
        super().__init__()
        self.alpha = parameter(params, "alpha", device)

    def forward(self, x):
        return ops.relu(x) - self.alpha * negative_part(x)


# --------------------------------------------------------------- builders --
def _padding(config):
    return str(config.get("padding", "valid")).lower()


def build_conv(depthwise):
    """The builder of Conv2D (``depthwise`` False) or DepthwiseConv2D."""
    def build(name, config, params, device):
        # Depthwise: one group per input channel, depth_multiplier outputs each.
        groups = (params["weight"].shape[0] // int(config.get("depth_multiplier", 1))
                  if depthwise else int(config.get("groups", 1)))
        return KerasConv2d(params, pair(config.get("strides", 1)),
                           pair(config.get("dilation_rate", 1)), groups, _padding(config),
                           activation_name_of(config), device)
    return build


def activation_name_of(config):
    """The name of a layer's ``activation`` ("linear" if it has none)."""
    return activation_name(config.get("activation"))


def _build_conv1d(name, config, params, device):
    return KerasConv1d(params, single(config.get("strides", 1)),
                       single(config.get("dilation_rate", 1)), int(config.get("groups", 1)),
                       _padding(config), activation_name_of(config), device)


def _build_separable(name, config, params, device):
    return KerasSeparableConv2d(params, int(config.get("depth_multiplier", 1)),
                                pair(config.get("strides", 1)),
                                pair(config.get("dilation_rate", 1)), _padding(config),
                                activation_name_of(config), device)


def _build_batch_norm(name, config, params, device):
    channels = params["running_mean"].shape[0]
    layer = KerasBatchNorm(channels, eps=float(config.get("epsilon", 1e-3)),
                           # Keras keeps `momentum` of the old value; PyTorch's rule the new one.
                           momentum=1.0 - float(config.get("momentum", 0.99)))
    layer.weight = parameter(params, "weight", device)
    layer.bias = parameter(params, "bias", device)
    layer.running_mean = Tensor(np.array(params["running_mean"], np.float32), device=device)
    layer.running_var = Tensor(np.array(params["running_var"], np.float32), device=device)
    return layer


def layer_norm_axes(config):
    """LayerNormalization's ``axis`` as a list of ints."""
    axis = config.get("axis", -1)
    return [int(a) for a in axis] if isinstance(axis, (list, tuple)) else [int(axis)]


def _build_layer_norm(name, config, params, device):
    return KerasLayerNorm(params, layer_norm_axes(config), config.get("epsilon", 1e-3), device)


#: Keras layer class -> builder(name, config, params in gdnflow layout, device) -> Module.
PARAMETRIC_LAYERS = {
    "Conv2D": build_conv(depthwise=False),
    "DepthwiseConv2D": build_conv(depthwise=True),
    "SeparableConv2D": _build_separable,
    "Conv1D": _build_conv1d,
    "Dense": lambda name, config, params, device: KerasDense(
        params, activation_name_of(config), device),
    "BatchNormalization": _build_batch_norm,
    "LayerNormalization": _build_layer_norm,
    "PReLU": lambda name, config, params, device: KerasPReLU(params, device),
}


def parametric_problems(class_name, config):
    """What gdnflow cannot run in a layer of :data:`PARAMETRIC_LAYERS` (empty: all fine)."""
    problems = []
    padding = _padding(config)
    if padding not in ("valid", "same") and not (class_name == "Conv1D" and padding == "causal"):
        problems.append(f"padding {config.get('padding')!r}")
    if class_name == "BatchNormalization":
        axis = config.get("axis", -1)
        axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
        if axis not in (-1, 3):
            problems.append(f"axis {config.get('axis')!r} (only the last, channel axis)")
    if class_name == "LayerNormalization":
        if config.get("rms_scaling"):
            problems.append("rms_scaling")
        if 0 in layer_norm_axes(config):
            problems.append(f"axis {config.get('axis')!r} (the batch axis)")
    return problems
