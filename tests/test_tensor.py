"""Tensor creation, conversion and description."""
import re

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
    with pytest.raises(gf.DTypeError,
                       match="cuda backend supports float32, float16 and bfloat16, got float64"):
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


# ------------------------------------------------------------------ dtypes --
# The rule (Tensor's docstring, docs/ops.md): bool, integer and float data
# become float32; complex, object, string, bytes, void and datetime data are
# refused with a DTypeError naming the dtype.
NOT_REAL = {
    "complex": (np.array([1 + 2j, 3]), "complex128"),
    "python complex": (1 + 2j, "complex128"),
    "complex64 list": ([np.complex64(1j)], "complex64"),
    "object": (np.array([1, 2], dtype=object), "object"),
    "None": (None, "object"),
    "string": (["1.5", "2"], "<U3"),
    "bytes": (b"12", "|S2"),
    "structured": (np.zeros(2, dtype=[("a", "f4")]), "[('a', '<f4')]"),
    "datetime": (np.array(["2024-01-01"], dtype="datetime64[D]"), "datetime64"),
    "timedelta": (np.array([3], dtype="timedelta64[s]"), "timedelta64"),
}


@pytest.mark.parametrize("data, dtype_name", NOT_REAL.values(), ids=NOT_REAL.keys())
def test_non_real_data_is_refused_naming_its_dtype(data, dtype_name):
    with pytest.raises(gf.DTypeError, match=re.escape(f"(dtype {dtype_name}")):
        gf.tensor(data, device="numpy")
    with pytest.raises(TypeError):         # DTypeError is a TypeError for callers that catch that
        gf.Tensor(data, device="numpy", dtype=np.float64)


REAL = {
    "bool": (np.array([True, False]), [1.0, 0.0]),
    "python bool": (True, 1.0),
    "int8": (np.array([-128, 127], np.int8), [-128.0, 127.0]),
    "uint8": (np.array([0, 255], np.uint8), [0.0, 255.0]),
    "int64 past float32's mantissa": (np.array([2 ** 24 + 1], np.int64), [2.0 ** 24]),
    "uint64 max": (np.uint64(2 ** 64 - 1), 2.0 ** 64),
    "float16": (np.array([0.5], np.float16), [0.5]),
    "nested ints": ([[1, 2], [3, 4]], [[1.0, 2.0], [3.0, 4.0]]),
}


@pytest.mark.parametrize("data, expected", REAL.values(), ids=REAL.keys())
def test_bool_integer_and_float_data_become_float32(data, expected):
    t = gf.tensor(data, device="numpy")
    assert t.dtype == np.float32
    np.testing.assert_array_equal(t.numpy(), np.array(expected, np.float32))


def test_complex_operands_in_arithmetic_are_refused():
    t = gf.tensor([1.0, 2.0], device="numpy")
    z = np.array([1j, 2.0])
    for combine in (lambda: t + z, lambda: z + t, lambda: t * z, lambda: z - t, lambda: t / z,
                    lambda: t + (1 + 2j), lambda: (1 + 2j) * t, lambda: t + np.complex64(1j),
                    lambda: t + np.array(["a", "b"]), lambda: gf.full((2,), 1j, device="numpy")):
        with pytest.raises(gf.DTypeError, match="complex|<U1"):
            combine()
    before = t.numpy().copy()
    with pytest.raises(gf.DTypeError, match="complex128"):
        t += z
    np.testing.assert_array_equal(t.numpy(), before)
    with pytest.raises(gf.DTypeError, match="complex128"):
        z += t              # NumPy defers to the tensor, which refuses: z keeps its values
    np.testing.assert_array_equal(z, [1j, 2.0])


def test_integer_and_bool_operands_keep_working():
    t = gf.tensor([1.0, 2.0], device="numpy")
    np.testing.assert_array_equal((t + np.array([1, 2])).numpy(), [2.0, 4.0])
    np.testing.assert_array_equal((np.array([True, False]) * t).numpy(), [1.0, 0.0])
    np.testing.assert_array_equal((t * np.int64(3)).numpy(), [3.0, 6.0])
    with pytest.raises(TypeError, match="got bool"):     # a bare bool is no operand (as before)
        t + True
