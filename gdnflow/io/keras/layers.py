"""gdnflow modules for Keras layers, built from a layer's config and its weights: :data:`LAYERS`.

The layers with weights are :mod:`gdnflow.io.keras.layers_parametric`'s and
:mod:`gdnflow.io.keras.layers_recurrent`'s; the parameterless ones are here,
each a :class:`KerasFunction`. Values keep the layout of
:mod:`gdnflow.io.keras.layout` (4-D NCHW; sequences [batch, time,
features] as Keras has them). Where a layer's meaning is not plain:

- Pooling with "same" padding is TensorFlow's; average pooling divides by
  the number of real inputs in the window (as TensorFlow does), max pooling
  ignores the padding. The 1-D poolings run on [batch, time, channels] as
  2-D poolings of [batch, channels, 1, time].
- UpSampling2D repeats each pixel ``size`` times ("nearest") or interpolates
  as ``tf.image.resize`` does ("bilinear": half-pixel centres, output pixel o
  of an s-times upsampling reads input ``(o + 1/2) / s - 1/2`` between its
  two neighbours, those beyond the edge clamped to it), as one matrix
  product per axis.
- Merges (Add, Subtract, Multiply, Average, Maximum, Minimum) combine inputs
  of one shape; Maximum is ``a + relu(b - a)``, Minimum ``a - relu(a - b)``.
- ReLU takes ``max_value`` and ``negative_slope`` (``threshold`` is refused);
  LeakyReLU's slope is ``negative_slope`` (Keras 3) or ``alpha`` (Keras 2).
- Permute's ``dims`` are Keras' (1-based, NHWC), applied to the NHWC value.

:func:`layer_problems` says what of a supported layer's config gdnflow
cannot run (``channels_first``, other activations, ``padding="causal"`` on
a 2-D layer, ``return_state``...).
"""

from gdnflow import nn, ops
from gdnflow.io.keras.activations import (activate, activation_name, activation_problem, elu,
                                          leaky_relu, negative_part)
from gdnflow.io.keras.layers_parametric import PARAMETRIC_LAYERS, parametric_problems
from gdnflow.io.keras.layers_recurrent import RECURRENT_LAYERS, recurrent_problems
from gdnflow.io.keras.layout import (from_nhwc, image_as_sequence, keras_axis, pair,
                                     same_padding, sequence_as_image, single, to_nhwc)
from gdnflow.io.onnx_resize import resample
from gdnflow.nn.module import Module

#: The interpolations of UpSampling2D that gdnflow runs.
UPSAMPLING_INTERPOLATIONS = ("nearest", "bilinear")


class KerasFunction(Module):
    """A parameterless Keras layer: ``function(*inputs)``; ``name`` says which."""

    def __init__(self, name, function):
        super().__init__()
        self.name, self.function = name, function

    def forward(self, *inputs):
        return self.function(*inputs)

    def __repr__(self):
        return f"KerasFunction({self.name})"


def _function(make):
    """A builder of a KerasFunction: ``make(config)`` gives the function."""
    return lambda name, config, params, device: KerasFunction(name, make(config))


# ------------------------------------------------------------ activations --
def _relu(config):
    top, slope = config.get("max_value"), float(config.get("negative_slope") or 0)
    if top is None:
        positive = ops.relu
    elif float(top) == 6:
        positive = ops.relu6
    else:
        positive = lambda x: ops.clamp(x, 0.0, float(top))  # noqa: E731
    if slope == 0:
        return positive
    return lambda x: positive(x) - slope * negative_part(x)


def _leaky_relu(config):
    slope = config.get("negative_slope", config.get("alpha", 0.3))
    return lambda x: leaky_relu(x, float(slope))


def _activation(config):
    return lambda x, name=activation_name(config.get("activation")): activate(x, name)


# ----------------------------------------------------------------- merges --
def _add(*inputs):
    total = inputs[0]
    for x in inputs[1:]:
        total = total + x
    return total


def _multiply(*inputs):
    product = inputs[0]
    for x in inputs[1:]:
        product = product * x
    return product


def _maximum(*inputs):
    top = inputs[0]
    for x in inputs[1:]:
        top = top + ops.relu(x - top)
    return top


def _minimum(*inputs):
    bottom = inputs[0]
    for x in inputs[1:]:
        bottom = bottom - ops.relu(bottom - x)
    return bottom


def _concatenate(config):
    axis = int(config.get("axis", -1))
    return lambda *xs: ops.concat(list(xs), axis=keras_axis(axis, xs[0].ndim))


# --------------------------------------------------------- spatial layers --
def _two_sided(value):
    """Keras' padding or cropping of two axes (an int, a pair, or pairs) as (rows, cols)."""
    if isinstance(value, (int, float)):
        return (int(value), int(value)), (int(value), int(value))
    return tuple(pair(v) if not isinstance(v, (int, float)) else (int(v), int(v))
                 for v in value)


def _zero_padding(config):
    rows, cols = _two_sided(config.get("padding", 1))
    return lambda x: ops.pad(x, [(0, 0), (0, 0), rows, cols])


def _cropping(config):
    (top, bottom), (left, right) = _two_sided(config.get("cropping", 0))
    return lambda x: ops.slice_(x, (slice(None), slice(None), slice(top, x.shape[2] - bottom),
                                    slice(left, x.shape[3] - right)))


def _pool(kind, one_d=False):
    def make(config):
        size = config.get("pool_size", 2)
        kernel = (1, single(size)) if one_d else pair(size)
        strides = config.get("strides") or size
        stride = (1, single(strides)) if one_d else pair(strides)
        same = str(config.get("padding", "valid")).lower() == "same"

        def pool(x):
            image = sequence_as_image(x) if one_d else x
            padding = same_padding(image, kernel, stride) if same else 0
            if kind == "max":
                y = ops.max_pool2d(image, kernel, stride, padding)
            else:
                # TensorFlow averages over the real inputs of a "same"-padded window.
                y = ops.avg_pool2d(image, kernel, stride, padding, count_include_pad=False)
            return image_as_sequence(y) if one_d else y
        return pool
    return make


def _global_pool(kind):
    def make(config):
        keepdims = bool(config.get("keepdims", False))

        def pool(x):
            y = (ops.global_avg_pool2d(x) if kind == "avg"
                 else ops.max_pool2d(x, tuple(x.shape[2:])))
            return y if keepdims else ops.reshape(y, y.shape[:2])
        return pool
    return make


def _global_pool_1d(kind):
    def make(config):
        keepdims = bool(config.get("keepdims", False))

        def pool(x):
            if kind == "avg":
                return ops.mean(x, 1, keepdims)
            y = ops.max_pool2d(sequence_as_image(x), (1, x.shape[1]))     # [B, C, 1, 1]
            return ops.reshape(y, (x.shape[0], 1, x.shape[2]) if keepdims else y.shape[:2])
        return pool
    return make


def _upsampling(config):
    rows, cols = pair(config.get("size", 2))
    bilinear = str(config.get("interpolation", "nearest")) == "bilinear"

    def upsample(x):
        n, c, h, w = x.shape
        if not bilinear:
            # Each pixel repeated: x as [n, c, h, 1, w, 1] broadcast to [n, c, h, rows, w, cols].
            spread = ops.broadcast_to(ops.reshape(x, (n, c, h, 1, w, 1)), (n, c, h, rows, w, cols))
            return ops.reshape(spread, (n, c, h * rows, w * cols))
        # tf.image.resize's bilinear is ONNX Resize's linear mode with half-pixel centres.
        return resample(None, x, "linear", "half_pixel", (n, c, h * rows, w * cols),
                        (1, 1, rows, cols))
    return upsample


# ------------------------------------------------------------------ shape --
def _flatten(config):
    return lambda x: ops.reshape(to_nhwc(x), (x.shape[0], -1)) if x.ndim > 2 else x


def _reshape(config):
    target = tuple(int(s) for s in config["target_shape"])
    return lambda x: from_nhwc(ops.reshape(to_nhwc(x), (x.shape[0],) + target))


def _permute(config):
    order = (0,) + tuple(int(d) for d in config["dims"])
    return lambda x: from_nhwc(ops.transpose(to_nhwc(x), order))


def _softmax(config):
    axis = config.get("axis", -1)
    axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
    return lambda x: ops.softmax(x, axis=keras_axis(axis, x.ndim))


def _rescaling(config):
    scale, offset = float(config.get("scale", 1.0)), float(config.get("offset", 0.0))
    return lambda x: ops.affine(x, scale, offset)


def _fixed(function):
    return _function(lambda config: function)


#: Keras layer class -> builder(name, config, params in gdnflow layout, device) -> Module.
LAYERS = {
    **PARAMETRIC_LAYERS,
    **RECURRENT_LAYERS,
    "ReLU": _function(_relu),
    "LeakyReLU": _function(_leaky_relu),
    "ELU": _function(lambda config: lambda x: elu(x, float(config.get("alpha", 1.0)))),
    "Activation": _function(_activation),
    "Softmax": _function(_softmax),
    "Add": _fixed(_add),
    "Subtract": _fixed(lambda a, b: a - b),
    "Multiply": _fixed(_multiply),
    "Average": _fixed(lambda *xs: _add(*xs) * (1.0 / len(xs))),
    "Maximum": _fixed(_maximum),
    "Minimum": _fixed(_minimum),
    "Concatenate": _function(_concatenate),
    "ZeroPadding2D": _function(_zero_padding),
    "Cropping2D": _function(_cropping),
    "UpSampling2D": _function(_upsampling),
    "MaxPooling2D": _function(_pool("max")),
    "AveragePooling2D": _function(_pool("avg")),
    "MaxPooling1D": _function(_pool("max", one_d=True)),
    "AveragePooling1D": _function(_pool("avg", one_d=True)),
    "GlobalAveragePooling2D": _function(_global_pool("avg")),
    "GlobalMaxPooling2D": _function(_global_pool("max")),
    "GlobalAveragePooling1D": _function(_global_pool_1d("avg")),
    "GlobalMaxPooling1D": _function(_global_pool_1d("max")),
    "Flatten": _function(_flatten),
    "Reshape": _function(_reshape),
    "Permute": _function(_permute),
    "Dropout": lambda name, config, params, device: nn.Dropout(float(config.get("rate", 0.5))),
    "Rescaling": _function(_rescaling),
    "InputLayer": None,
}
# Older Keras names for the same layers.
for _alias, _name in (("MaxPool2D", "MaxPooling2D"), ("AvgPool2D", "AveragePooling2D"),
                      ("MaxPool1D", "MaxPooling1D"), ("AvgPool1D", "AveragePooling1D"),
                      ("GlobalAvgPool2D", "GlobalAveragePooling2D"),
                      ("GlobalMaxPool2D", "GlobalMaxPooling2D"),
                      ("GlobalAvgPool1D", "GlobalAveragePooling1D"),
                      ("GlobalMaxPool1D", "GlobalMaxPooling1D")):
    LAYERS[_alias] = LAYERS[_name]


def _channels_last(config):
    return config.get("data_format") in (None, "channels_last")


def layer_problems(class_name, config):
    """What gdnflow cannot do in one layer of a supported class (empty: all fine)."""
    problems = []
    if not _channels_last(config):
        problems.append(f"data_format {config.get('data_format')!r} (only channels_last)")
    if class_name in RECURRENT_LAYERS:
        return problems + recurrent_problems(class_name, config)
    problem = activation_problem(config)
    if problem:
        problems.append(problem)
    if class_name in PARAMETRIC_LAYERS:
        problems += parametric_problems(class_name, config)
    elif class_name not in ("ZeroPadding2D",) and str(config.get("padding", "valid")).lower() \
            not in ("valid", "same"):
        problems.append(f"padding {config.get('padding')!r}")
    if class_name == "ReLU" and float(config.get("threshold") or 0) != 0:
        problems.append("threshold")
    if class_name == "UpSampling2D" and str(config.get("interpolation", "nearest")) not in \
            UPSAMPLING_INTERPOLATIONS:
        problems.append(f"interpolation {config.get('interpolation')!r} (supported: "
                        f"{', '.join(UPSAMPLING_INTERPOLATIONS)})")
    if class_name == "Rescaling" and not all(
            isinstance(config.get(k, 0), (int, float)) for k in ("scale", "offset")):
        problems.append("per-channel scale or offset")
    return problems
