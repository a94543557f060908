"""The graph: accumulation, ordering, freeing, no_grad, and their errors."""
import gc
import weakref

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.autograd import Operator


def leaf(x, **kw):
    return gf.tensor(x, device="numpy", dtype=np.float64, requires_grad=True, **kw)


def test_diamond_graph_accumulates_both_paths(rng):
    x0 = rng.standard_normal(5)
    x = leaf(x0)
    a = x.exp()
    y = (a * a + a).sum()       # d/dx = 2 e^{2x} + e^x
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(2 * x0) + np.exp(x0), rtol=1e-12)


def test_gradients_accumulate_across_backward_calls(rng):
    x = leaf(rng.standard_normal(3))
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 5.0))


def test_deep_chain_has_no_recursion_limit():
    x = leaf(np.ones(2))
    y = x
    for _ in range(5000):
        y = y + 1
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones(2))


def test_no_grad_records_nothing(rng):
    x = leaf(rng.standard_normal(3))
    with gf.no_grad():
        y = (x * 2).sum()
        assert not gf.grad_enabled()
    assert gf.grad_enabled()
    assert not y.requires_grad and y.creator is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward()


def test_second_backward_through_freed_graph_is_refused(rng):
    x = leaf(rng.standard_normal(3))
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(gf.GraphFreedError, match="retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_pass(rng):
    x0 = rng.standard_normal(3)
    x = leaf(x0)
    y = (x.exp()).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(x0), rtol=1e-12)


def test_saved_arrays_are_freed_after_backward(rng):
    x = leaf(rng.standard_normal(3))
    y = x.exp()
    saved = weakref.ref(y.creator.saved.y)      # exp keeps its output
    z = (y * 2).sum()
    del y
    z.backward()
    gc.collect()
    assert saved() is None


def test_intermediate_inputs_are_not_held_by_the_graph(rng):
    x = leaf(rng.standard_normal(1000))
    h = x * 2                   # add keeps nothing of its inputs
    ref = weakref.ref(h.data)
    y = (h + 1).sum()
    del h
    gc.collect()
    assert ref() is None
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(1000, 2.0))


def test_only_requested_gradients_are_computed(rng):
    a = leaf(rng.standard_normal(3))
    b = gf.tensor(rng.standard_normal(3), device="numpy", dtype=np.float64)
    (a * b).sum().backward()
    assert a.grad is not None and b.grad is None


def test_backward_needs_grad_for_non_scalar(rng):
    y = leaf(rng.standard_normal((2, 2))) * 2
    with pytest.raises(ValueError, match="one-element"):
        y.backward()
    with pytest.raises(ValueError, match=r"expected shape \(2, 2\)"):
        y.backward(np.ones(3))


def test_wrong_gradient_shape_from_an_operator_is_reported():
    class BadOp(Operator):
        def forward_numpy(self, x):
            self.saved = ()
            return x * 2

        def backward(self, gy):
            return (self.wrap(np.zeros(7)),)

    x = leaf(np.ones(3))
    with pytest.raises(gf.ShapeError, match=r"BadOp.backward returned a gradient of shape \(7,\)"):
        BadOp()(x).sum().backward()


def test_mismatched_devices_are_refused():
    a = gf.tensor([1.0, 2.0], device="numpy")
    fake_cuda = gf.Tensor.wrap(np.ones(2, np.float32), "cuda")   # device checked before any kernel
    with pytest.raises(gf.DeviceMismatchError, match=r"add: input 0 is on 'numpy' but input 1 is on 'cuda'"):
        a + fake_cuda


def test_mismatched_dtypes_are_refused():
    a = gf.tensor([1.0], device="numpy", dtype=np.float32)
    b = gf.tensor([1.0], device="numpy", dtype=np.float64)
    with pytest.raises(gf.DTypeError, match="input 0 is float32 but input 1 is float64"):
        a * b


def test_non_tensor_input_is_refused():
    with pytest.raises(TypeError, match="expected a Tensor, a number or a NumPy array, got str"):
        ops.add(gf.tensor([1.0], device="numpy"), "one")
