"""gdnflow modules for Keras layers, built from a layer's config and its weights: :data:`LAYERS`.

**Layout.** Keras computes in NHWC; gdnflow in NCHW. Every 4-D value stays
NCHW between layers. Where the order of elements matters (Flatten,
Reshape, Dense on a 4-D value), the value is transposed to NHWC first, so
Flatten gives exactly Keras' order whatever layer follows it. Axes of
Softmax, Concatenate and BatchNormalization are mapped from NHWC to NCHW.

**Padding.** "same" is TensorFlow's, computed from each input's size at run
time: ``total = max((ceil(H/s) - 1)*s + (k - 1)*d + 1 - H, 0)``, ``total // 2``
before and the rest (one more for odd totals) after (:func:`tf_same`).
Average pooling with "same" padding divides by the number of real inputs in
the window (as TensorFlow does); max pooling ignores the padding.

:func:`layer_problems` says what of a supported layer's config gdnflow
cannot run (``channels_first``, other activations, ``padding="causal"``...).
"""
import numpy as np

from gdnflow import nn, ops
from gdnflow.nn.module import Module, Parameter
from gdnflow.tensor import Tensor

#: The Keras activations gdnflow runs.
ACTIVATIONS = ("linear", "relu", "relu6", "sigmoid", "softmax")


def activation_name(value):
    """A Keras activation (a name, None, or a serialised activation object) as its name."""
    if isinstance(value, dict):     # a serialised activation object
        value = value.get("config", {}).get("name") or value.get("class_name")
    return "linear" if value is None else str(value)


def _channels_last(config):
    return config.get("data_format") in (None, "channels_last")


def pair(value):
    """An int or a pair (Keras' kernel sizes, strides...) as a tuple of two ints."""
    return (int(value), int(value)) if isinstance(value, (int, float)) else tuple(
        int(v) for v in value)


def layer_problems(class_name, config):
    """What gdnflow cannot do in one layer of a supported class (empty: all fine)."""
    problems = []
    if not _channels_last(config):
        problems.append(f"data_format {config.get('data_format')!r} (only channels_last)")
    if "activation" in config and activation_name(config["activation"]) not in ACTIVATIONS:
        problems.append(f"activation {activation_name(config['activation'])!r} (supported: "
                        f"{', '.join(ACTIVATIONS)})")
    if str(config.get("padding", "valid")).lower() not in ("valid", "same") and \
            class_name != "ZeroPadding2D":
        problems.append(f"padding {config.get('padding')!r}")
    if class_name == "ReLU":
        if float(config.get("negative_slope") or 0) != 0:
            problems.append("negative_slope (leaky ReLU)")
        if float(config.get("threshold") or 0) != 0:
            problems.append("threshold")
    if class_name == "BatchNormalization":
        axis = config.get("axis", -1)
        axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
        if axis not in (-1, 3):
            problems.append(f"axis {config.get('axis')!r} (only the last, channel axis)")
    if class_name == "Rescaling" and not all(
            isinstance(config.get(k, 0), (int, float)) for k in ("scale", "offset")):
        problems.append("per-channel scale or offset")
    return problems


def tf_same(size, kernel, stride, dilation=1):
    """TensorFlow's "same" padding (before, after) of one dimension."""
    effective = (kernel - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def same_padding(x, kernel, stride, dilation=(1, 1)):
    """TensorFlow's "same" padding (top, bottom, left, right) of an NCHW value ``x``."""
    top, bottom = tf_same(x.shape[2], kernel[0], stride[0], dilation[0])
    left, right = tf_same(x.shape[3], kernel[1], stride[1], dilation[1])
    return (top, bottom, left, right)


def _activate(x, name):
    """Apply a Keras activation by name (softmax over Keras' last axis: channels for 4-D)."""
    if name == "relu":
        return ops.relu(x)
    if name == "relu6":
        return ops.relu6(x)
    if name == "sigmoid":
        return ops.sigmoid(x)
    if name == "softmax":
        return ops.softmax(x, axis=1 if x.ndim == 4 else -1)
    return x


def _to_nhwc(x):
    """A 4-D value in Keras' element order (NHWC); free when H = W = 1."""
    if x.ndim != 4:
        return x
    if x.shape[2] == x.shape[3] == 1:
        return ops.reshape(x, (x.shape[0], 1, 1, x.shape[1]))
    return ops.transpose(x, (0, 2, 3, 1))


def _from_nhwc(x):
    """An NHWC 4-D value back in gdnflow's NCHW."""
    if x.ndim != 4:
        return x
    if x.shape[1] == x.shape[2] == 1:
        return ops.reshape(x, (x.shape[0], x.shape[3], 1, 1))
    return ops.transpose(x, (0, 3, 1, 2))


def _axis(axis, ndim):
    """A Keras axis (NHWC for 4-D values) as gdnflow's axis (NCHW)."""
    axis = int(axis) % ndim
    return (0, 2, 3, 1)[axis] if ndim == 4 else axis


def _parameter(params, key, device):
    return Parameter(np.ascontiguousarray(params[key], dtype=np.float32), device=device)


class KerasConv2d(Module):
    """Keras' Conv2D or DepthwiseConv2D: weight [out, in/groups, kh, kw], bias [out] or None.

    ``padding`` is "valid" (none) or "same" (TensorFlow's, from each input's
    size); relu and relu6 activations are fused into the convolution.
    """

    def __init__(self, params, strides, dilation, groups, padding, activation, device):
        super().__init__()
        self.weight = _parameter(params, "weight", device)
        self.bias = _parameter(params, "bias", device) if "bias" in params else None
        self.kernel_size = tuple(self.weight.shape[2:])
        self.stride, self.dilation, self.groups = strides, dilation, groups
        self.same, self.activation = padding == "same", activation

    def forward(self, x):
        padding = same_padding(x, self.kernel_size, self.stride, self.dilation) if self.same else 0
        fused = self.activation if self.activation in ("relu", "relu6") else None
        y = ops.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                       self.groups, activation=fused)
        return y if fused else _activate(y, self.activation)


class KerasDense(Module):
    """Keras' Dense: weight [out, in] (the transposed Keras kernel), bias [out] or None.

    On a 4-D value it acts on the channels, as Keras' does on the last axis.
    """

    def __init__(self, params, activation, device):
        super().__init__()
        self.weight = _parameter(params, "weight", device)
        self.bias = _parameter(params, "bias", device) if "bias" in params else None
        self.activation = activation

    def forward(self, x):
        if x.ndim == 4:
            y = _from_nhwc(ops.linear(_to_nhwc(x), self.weight, self.bias))
        else:
            y = ops.linear(x, self.weight, self.bias)
        return _activate(y, self.activation)


class KerasBatchNorm(nn.BatchNorm2d):
    """Keras' BatchNormalization over the channels of a 4-D value, or the features of a 2-D one."""

    def forward(self, x):
        if x.ndim == 2:
            return ops.reshape(super().forward(ops.reshape(x, x.shape + (1, 1))), x.shape)
        return super().forward(x)


class KerasFunction(Module):
    """A parameterless Keras layer: ``function(*inputs)``; ``name`` says which."""

    def __init__(self, name, function):
        super().__init__()
        self.name, self.function = name, function

    def forward(self, *inputs):
        return self.function(*inputs)

    def __repr__(self):
        return f"KerasFunction({self.name})"


def _conv(depthwise):
    def build(name, config, params, device):
        # Depthwise: one group per input channel, depth_multiplier outputs each.
        groups = (params["weight"].shape[0] // int(config.get("depth_multiplier", 1))
                  if depthwise else int(config.get("groups", 1)))
        return KerasConv2d(params, pair(config.get("strides", 1)),
                           pair(config.get("dilation_rate", 1)), groups,
                           str(config.get("padding", "valid")).lower(),
                           activation_name(config.get("activation")), device)
    return build


def _build_batch_norm(name, config, params, device):
    channels = params["running_mean"].shape[0]
    layer = KerasBatchNorm(channels, eps=float(config.get("epsilon", 1e-3)),
                           # Keras keeps `momentum` of the old value; PyTorch's rule the new one.
                           momentum=1.0 - float(config.get("momentum", 0.99)))
    layer.weight = _parameter(params, "weight", device)
    layer.bias = _parameter(params, "bias", device)
    layer.running_mean = Tensor(np.array(params["running_mean"], np.float32), device=device)
    layer.running_var = Tensor(np.array(params["running_var"], np.float32), device=device)
    return layer


def _relu(name, config, params, device):
    top = config.get("max_value")
    if top is None:
        return KerasFunction(name, ops.relu)
    if float(top) == 6:
        return KerasFunction(name, ops.relu6)
    return KerasFunction(name, lambda x: ops.clamp(x, 0.0, float(top)))


def _add(*inputs):
    total = inputs[0]
    for x in inputs[1:]:
        total = total + x
    return total


def _zero_padding(name, config, params, device):
    padding = config.get("padding", 1)
    if isinstance(padding, (int, float)):
        rows = cols = (int(padding), int(padding))
    else:
        rows, cols = padding
        rows = pair(rows) if not isinstance(rows, (int, float)) else (int(rows), int(rows))
        cols = pair(cols) if not isinstance(cols, (int, float)) else (int(cols), int(cols))
    return KerasFunction(name, lambda x: ops.pad(x, [(0, 0), (0, 0), rows, cols]))


def _pool(kind):
    def build(name, config, params, device):
        kernel = pair(config.get("pool_size", 2))
        stride = pair(config.get("strides") or kernel)
        same = str(config.get("padding", "valid")).lower() == "same"

        def pool(x):
            padding = same_padding(x, kernel, stride) if same else 0
            if kind == "max":
                return ops.max_pool2d(x, kernel, stride, padding)
            # TensorFlow averages over the real inputs of a "same"-padded window.
            return ops.avg_pool2d(x, kernel, stride, padding, count_include_pad=False)
        return KerasFunction(name, pool)
    return build


def _global_pool(kind):
    def build(name, config, params, device):
        keepdims = bool(config.get("keepdims", False))

        def pool(x):
            y = (ops.global_avg_pool2d(x) if kind == "avg"
                 else ops.max_pool2d(x, tuple(x.shape[2:])))
            return y if keepdims else ops.reshape(y, y.shape[:2])
        return KerasFunction(name, pool)
    return build


def _flatten(x):
    return ops.reshape(_to_nhwc(x), (x.shape[0], -1)) if x.ndim > 2 else x


def _reshape(name, config, params, device):
    target = tuple(int(s) for s in config["target_shape"])
    return KerasFunction(name, lambda x: _from_nhwc(ops.reshape(_to_nhwc(x),
                                                                (x.shape[0],) + target)))


def _softmax(name, config, params, device):
    axis = config.get("axis", -1)
    axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
    return KerasFunction(name, lambda x: ops.softmax(x, axis=_axis(axis, x.ndim)))


def _concatenate(name, config, params, device):
    axis = int(config.get("axis", -1))
    return KerasFunction(name, lambda *xs: ops.concat(list(xs), axis=_axis(axis, xs[0].ndim)))


def _rescaling(name, config, params, device):
    scale, offset = float(config.get("scale", 1.0)), float(config.get("offset", 0.0))
    return KerasFunction(name, lambda x: ops.affine(x, scale, offset))


def _simple(function):
    return lambda name, config, params, device: KerasFunction(name, function)


#: Keras layer class -> builder(name, config, params in gdnflow layout, device) -> Module.
LAYERS = {
    "Conv2D": _conv(depthwise=False),
    "DepthwiseConv2D": _conv(depthwise=True),
    "BatchNormalization": _build_batch_norm,
    "Dense": lambda name, config, params, device: KerasDense(
        params, activation_name(config.get("activation")), device),
    "ReLU": _relu,
    "Activation": lambda name, config, params, device: KerasFunction(
        name, lambda x, a=activation_name(config.get("activation")): _activate(x, a)),
    "Add": _simple(_add),
    "Concatenate": _concatenate,
    "ZeroPadding2D": _zero_padding,
    "MaxPooling2D": _pool("max"),
    "AveragePooling2D": _pool("avg"),
    "GlobalAveragePooling2D": _global_pool("avg"),
    "GlobalMaxPooling2D": _global_pool("max"),
    "Flatten": _simple(_flatten),
    "Dropout": lambda name, config, params, device: nn.Dropout(float(config.get("rate", 0.5))),
    "Reshape": _reshape,
    "Softmax": _softmax,
    "Rescaling": _rescaling,
    "InputLayer": None,
}
# Older Keras names for the same layers.
LAYERS["MaxPool2D"], LAYERS["AvgPool2D"] = LAYERS["MaxPooling2D"], LAYERS["AveragePooling2D"]
LAYERS["GlobalAvgPool2D"] = LAYERS["GlobalAveragePooling2D"]

