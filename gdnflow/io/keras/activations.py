"""Keras activations by name, as compositions of gdnflow operators: :data:`ACTIVATIONS`.

A layer's ``activation`` (and a recurrent layer's ``recurrent_activation``)
names one of these; :func:`activate` applies it. With ``n(x) = relu(-x)``
(the negative part, exact zeros where x >= 0)::

    linear        x                        elu          relu(x) + exp(-n(x)) - 1
    relu, relu6   relu(x), min(relu(x), 6) selu         s (relu(x) + a (exp(-n(x)) - 1))
    sigmoid       1 / (1 + e^-x)           leaky_relu   relu(x) - 0.2 n(x)
    tanh          tanh(x)                  gelu         x/2 (1 + erf(x / sqrt 2))
    softplus      log(1 + e^x)             swish, silu  x sigmoid(x)
    softsign      x / (1 + |x|)            hard_sigmoid clamp(x/6 + 1/2, 0, 1)
    exponential   e^x                      hard_swish,  x hard_sigmoid(x)
    mish          x tanh(softplus(x))        hard_silu
    softmax       over Keras' last axis (the channels of an image)

selu's a = 1.6732632, s = 1.0507010. Keras 2 defined ``hard_sigmoid`` as
``clamp(0.2 x + 1/2, 0, 1)`` (the recurrent activation of LSTM and GRU by
default up to Keras 2.2); files written by Keras 2 name it so, and
:class:`gdnflow.io.keras.graph.Graph` renames it ``hard_sigmoid_keras2``
there, which is its own entry here. Keras' gelu is the exact (erf) form
unless a layer asks for the tanh approximation, which no string names.
"""
import math

from gdnflow import ops

SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805


def negative_part(x):
    """relu(-x): -x where x < 0, exact zeros elsewhere."""
    return ops.relu(ops.neg(x))


def leaky_relu(x, slope):
    """x where x >= 0, ``slope`` x elsewhere."""
    return ops.relu(x) - slope * negative_part(x)


def elu(x, alpha=1.0):
    """x where x > 0, alpha (e^x - 1) elsewhere."""
    return ops.relu(x) + alpha * (ops.exp(ops.neg(negative_part(x))) - 1.0)


def hard_sigmoid(x):
    """Keras 3's hard sigmoid: clamp(x/6 + 1/2, 0, 1)."""
    return ops.clamp(ops.affine(x, 1 / 6, 0.5), 0.0, 1.0)


def _gelu(x):
    return (x * 0.5) * (ops.erf(x * math.sqrt(0.5)) + 1.0)


def _swish(x):
    return x * ops.sigmoid(x)


#: Keras activation name -> function of a tensor (softmax, which needs the axis, aside).
ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": ops.relu,
    "relu6": ops.relu6,
    "sigmoid": ops.sigmoid,
    "tanh": ops.tanh,
    "softplus": ops.softplus,
    "softsign": lambda x: x / (ops.abs(x) + 1.0),
    "exponential": ops.exp,
    "mish": lambda x: x * ops.tanh(ops.softplus(x)),
    "elu": elu,
    "selu": lambda x: SELU_SCALE * elu(x, SELU_ALPHA),
    "leaky_relu": lambda x: leaky_relu(x, 0.2),
    "gelu": _gelu,
    "swish": _swish,
    "silu": _swish,
    "hard_sigmoid": hard_sigmoid,
    "hard_sigmoid_keras2": lambda x: ops.clamp(ops.affine(x, 0.2, 0.5), 0.0, 1.0),
    "hard_swish": lambda x: x * hard_sigmoid(x),
    "hard_silu": lambda x: x * hard_sigmoid(x),
    "softmax": None,
}


def activation_name(value):
    """A Keras activation (a name, None, or a serialised activation object) as its name."""
    if isinstance(value, dict):     # a serialised activation object
        config = value.get("config")
        value = (config.get("name") if isinstance(config, dict) else config) or value.get(
            "class_name")
    return "linear" if value is None else str(value)


def activation_problem(config, key="activation"):
    """What is wrong with ``config[key]`` (None: gdnflow runs it, or there is none)."""
    if key not in config:
        return None
    name = activation_name(config[key])
    if name in ACTIVATIONS:
        return None
    supported = ", ".join(n for n in ACTIVATIONS if n != "hard_sigmoid_keras2")
    return f"{key} {name!r} (supported: {supported})"


def activate(x, name):
    """Apply the Keras activation ``name`` (softmax over Keras' last axis: channels for 4-D)."""
    if name == "softmax":
        return ops.softmax(x, axis=1 if x.ndim == 4 else -1)
    return ACTIVATIONS[name](x)
