"""gdnflow.testing must catch wrong gradients and wrong values."""
import numpy as np
import pytest

from gdnflow.autograd import Operator
from gdnflow.testing import gradcheck, relative_error


class SquareWithWrongGradient(Operator):
    """y = x^2 with backward 2x + 0.01: subtly wrong."""

    def forward_numpy(self, x):
        self.save(x=x)
        return x * x

    def backward(self, gy):
        x = self.saved.x
        return (gy * self.wrap(2 * x + 0.01),)


class SquareWithOneWrongElement(SquareWithWrongGradient):
    """Right everywhere but in one element: only the element-wise check sees it."""

    def backward(self, gy):
        x = self.saved.x
        g = 2 * x
        g.flat[3] += 1e-3
        return (gy * self.wrap(g),)


def test_gradcheck_rejects_a_wrong_backward(rng):
    with pytest.raises(AssertionError, match="gradient of input 0"):
        gradcheck(lambda t: SquareWithWrongGradient()(t), [rng.standard_normal((3, 4))])


def test_gradcheck_finds_a_single_wrong_element(rng):
    with pytest.raises(AssertionError, match=r"at element \(0, 3\)|random direction"):
        gradcheck(lambda t: SquareWithOneWrongElement()(t), [rng.standard_normal((2, 5))])


def test_gradcheck_accepts_a_right_backward(rng):
    gradcheck(lambda t: t * t, [rng.standard_normal((3, 4))])


def test_relative_error_flags_nan_and_shape():
    assert relative_error(np.array([np.nan, 1.0]), np.array([1.0, 1.0])) == float("inf")
    assert relative_error(np.ones(3), np.ones(4)) == float("inf")
    assert relative_error(np.array([1.0, 2.001]), np.array([1.0, 2.0])) == pytest.approx(5e-4)
