"""Keras' layout (NHWC) against gdnflow's (NCHW), and TensorFlow's "same" padding.

**Layout.** Keras computes in NHWC; gdnflow in NCHW. Every 4-D value stays
NCHW between layers; values of other ranks (sequences [batch, time,
features], vectors) keep Keras' order. Where the order of elements matters
(Flatten, Reshape, Permute, Dense on a 4-D value), the value is transposed
to NHWC first (:func:`to_nhwc`), so that it holds exactly Keras' elements
whatever layer follows. Axes that layers name (Softmax, Concatenate,
normalisations) are mapped with :func:`keras_axis`.

**Padding.** "same" is TensorFlow's, computed from each input's size at run
time: ``total = max((ceil(H/s) - 1)*s + (k - 1)*d + 1 - H, 0)``, ``total // 2``
before and the rest (one more for odd totals) after (:func:`tf_same`).
"""
from gdnflow import ops


def pair(value):
    """An int or a pair (Keras' kernel sizes, strides...) as a tuple of two ints."""
    return (int(value), int(value)) if isinstance(value, (int, float)) else tuple(
        int(v) for v in value)


def single(value):
    """An int or a one-element list (a 1-D layer's kernel size, stride...) as an int."""
    if isinstance(value, (int, float)):
        return int(value)
    (value,) = value
    return int(value)


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


def to_nhwc(x):
    """A 4-D value in Keras' element order (NHWC); free when H = W = 1."""
    if x.ndim != 4:
        return x
    if x.shape[2] == x.shape[3] == 1:
        return ops.reshape(x, (x.shape[0], 1, 1, x.shape[1]))
    return ops.transpose(x, (0, 2, 3, 1))


def from_nhwc(x):
    """An NHWC 4-D value back in gdnflow's NCHW."""
    if x.ndim != 4:
        return x
    if x.shape[1] == x.shape[2] == 1:
        return ops.reshape(x, (x.shape[0], x.shape[3], 1, 1))
    return ops.transpose(x, (0, 3, 1, 2))


def keras_axis(axis, ndim):
    """A Keras axis (NHWC for 4-D values) as gdnflow's axis (NCHW)."""
    axis = int(axis) % ndim
    return (0, 2, 3, 1)[axis] if ndim == 4 else axis


def sequence_as_image(x):
    """A sequence [batch, time, channels] as the NCHW image [batch, channels, 1, time]."""
    batch, steps, channels = x.shape
    return ops.reshape(ops.transpose(x, (0, 2, 1)), (batch, channels, 1, steps))


def image_as_sequence(x):
    """An NCHW image [batch, channels, 1, time] as the sequence [batch, time, channels]."""
    batch, channels, _, steps = x.shape
    return ops.transpose(ops.reshape(x, (batch, channels, steps)), (0, 2, 1))
