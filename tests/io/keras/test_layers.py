"""The layout of a Keras import (gdnflow.io.keras.layout): TensorFlow's "same" padding."""
from gdnflow.io.keras.layout import tf_same


def test_same_padding_is_tensorflows():
    same = tf_same
    assert same(13, 3, 2) == (1, 1)             # odd size, stride 2: symmetric
    assert same(224, 3, 2) == (0, 1)            # even size: the extra row after
    assert same(7, 4, 2) == (1, 2)              # even kernel
    assert same(6, 4, 2) == (1, 1)
    assert same(5, 3, 1, dilation=2) == (2, 2)
    assert same(4, 1, 2) == (0, 0)              # never negative
