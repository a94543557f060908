"""Tensor creation, conversion and description."""
import numpy as np
import pytest

import gdnflow as gf


def test_default_dtype_is_float32():
    t = gf.tensor([[1, 2], [3, 4]], device="numpy")
    assert t.dtype == np.float32 and t.shape == (2, 2) and t.ndim == 2 and t.size == 4


def test_float64_on_numpy_for_gradient_checks():
    assert gf.tensor([1.0], device="numpy", dtype=np.float64).dtype == np.float64


def test_unsupported_dtype_is_refused():
    with pytest.raises(gf.DTypeError, match="int32"):
        gf.tensor([1], device="numpy", dtype=np.int32)


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match=r"unknown device 'tpu'"):
        gf.tensor([1.0], device="tpu")


def test_zero_dimensional_tensor_keeps_its_shape():
    t = gf.tensor(3.5, device="numpy")
    assert t.shape == () and t.item() == 3.5


def test_item_needs_one_element():
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        gf.tensor([1.0, 2.0], device="numpy").item()


def test_full_zeros_ones():
    np.testing.assert_array_equal(gf.full((2, 3), 7.0, device="numpy").numpy(), np.full((2, 3), 7.0))
    assert gf.zeros((4,), device="numpy").numpy().sum() == 0
    assert gf.ones((4,), device="numpy", requires_grad=True).requires_grad


def test_to_same_device_is_identity_and_detach_cuts_graph():
    t = gf.tensor([1.0], device="numpy", requires_grad=True)
    assert t.to("numpy") is t
    d = (t * 2).detach()
    assert d.creator is None and not d.requires_grad


def test_astype_copies():
    t = gf.tensor([1.5], device="numpy")
    assert t.astype(np.float64).dtype == np.float64


def test_repr_names_shape_dtype_device():
    assert repr(gf.zeros((2, 3), device="numpy")) == "Tensor(shape=(2, 3), dtype=float32, device='numpy')"


@pytest.mark.gpu
def test_round_trip_to_cuda_and_back(rng):
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    t = gf.tensor(x, device="cuda")
    assert t.device == "cuda" and t.shape == (3, 5, 7)
    np.testing.assert_array_equal(t.numpy(), x)
    np.testing.assert_array_equal(t.to("numpy").numpy(), x)
    assert gf.tensor(2.5, device="cuda").item() == 2.5


@pytest.mark.gpu
def test_cuda_refuses_float64():
    with pytest.raises(gf.DTypeError, match="float32 only"):
        gf.tensor([1.0], device="cuda", dtype=np.float64)


@pytest.mark.gpu
def test_full_on_cuda(rng):
    np.testing.assert_array_equal(gf.full((3, 1001), -2.5, device="cuda").numpy(),
                                  np.full((3, 1001), -2.5, np.float32))


def test_tensor_copies_the_callers_array():
    host = np.ones(3, np.float32)
    t = gf.tensor(host, device="numpy")
    t.data += 1             # what an optimiser's in-place step does
    np.testing.assert_array_equal(host, np.ones(3))
