"""16-bit dtypes, the cast operator, autocast's rules and the NumPy emulation (no GPU)."""
import ml_dtypes
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops, precision
from gdnflow.errors import DTypeError
from gdnflow.testing import round_to_bfloat16

BF16, FP16 = precision.BFLOAT16, precision.FLOAT16


def tensor(array, dtype=np.float32, grad=False):
    return gf.tensor(array, device="numpy", dtype=dtype, requires_grad=grad)


@pytest.mark.parametrize("name, expected", [("bf16", BF16), ("bfloat16", BF16), ("fp16", FP16),
                                            ("half", FP16), ("float32", np.float32),
                                            ("fp32", np.float32), (np.float16, FP16)])
def test_dtype_names(name, expected):
    assert precision.as_dtype(name) == np.dtype(expected)


def test_an_unknown_dtype_name_is_refused_listing_the_names():
    with pytest.raises(DTypeError, match="unknown dtype 'bf8'.*bf16"):
        precision.as_dtype("bf8")


def test_casting_to_bfloat16_rounds_to_nearest_even_as_the_bit_oracle(rng):
    x = (rng.standard_normal(20001) * 10.0 ** rng.integers(-30, 30, 20001)).astype(np.float32)
    # Exact ties: 1 + 2^-8 lies halfway between bfloat16's 1 and 1 + 2^-7.
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 3.4e38, np.inf, -np.inf],
                    np.float32)
    x = np.concatenate([x, ties])
    y = tensor(x).astype("bf16")
    assert y.dtype == BF16
    np.testing.assert_array_equal(y.numpy().astype(np.float32), round_to_bfloat16(x))
    assert y.numpy().astype(np.float32)[-6:-2].tolist() == [1.0, 1 + 2.0 ** -6, -1.0, np.inf]


def test_casting_to_float16_rounds_ties_to_even_and_overflows_to_infinity():
    x = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 65504.0, 65520.0, 1e-8], np.float32)
    y = tensor(x).astype("fp16").numpy().astype(np.float64)
    # 65520 is halfway between float16's largest (65504) and the next step: rounds away to inf.
    assert y.tolist() == [1.0, 1 + 2.0 ** -9, 65504.0, np.inf, 0.0]


def test_cast_gradient_comes_back_in_the_input_dtype(rng):
    x = tensor(rng.standard_normal((3, 5)), grad=True)
    y = ops.cast(x, "bf16")
    g = rng.standard_normal((3, 5)).astype(BF16)
    y.backward(tensor(g, dtype=BF16))
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.numpy(), g.astype(np.float32))


def test_cast_to_its_own_dtype_is_the_tensor_itself(rng):
    x = tensor(rng.standard_normal(4))
    assert ops.cast(x, "float32") is x


def test_unary_and_binary_ops_round_once_from_float32(rng):
    a = rng.standard_normal((4, 7)).astype(BF16)
    b = rng.standard_normal((7,)).astype(BF16)
    wide_a, wide_b = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_array_equal(tensor(a, BF16).sigmoid().numpy().astype(np.float32),
                                  round_to_bfloat16(1 / (1 + np.exp(-wide_a))))
    np.testing.assert_array_equal((tensor(a, BF16) * tensor(b, BF16)).numpy().astype(np.float32),
                                  round_to_bfloat16(wide_a * wide_b))


def test_linear_in_16_bits_rounds_the_float32_product_once(rng):
    x, w, b = (rng.standard_normal(s).astype(BF16) for s in ((6, 33), (5, 33), (5,)))
    y = ops.linear(tensor(x, BF16), tensor(w, BF16), tensor(b, BF16))
    wide = [a.astype(np.float32) for a in (x, w, b)]
    expected = round_to_bfloat16(wide[0] @ wide[1].T + wide[2])
    np.testing.assert_allclose(y.numpy().astype(np.float32), expected, rtol=2.0 ** -7, atol=1e-6)


def test_broadcast_gradients_of_16_bit_arithmetic_sum_in_float32(rng):
    a = tensor(rng.standard_normal((64, 3)), BF16, grad=True)
    b = tensor(rng.standard_normal((3,)), BF16, grad=True)
    (a + b).backward(tensor(np.full((64, 3), 1.0 + 2.0 ** -7), BF16))
    assert b.grad.dtype == BF16
    # 64 x (1 + 2^-7) = 64.5, exact in float32; a bfloat16 running sum would lose the 0.5.
    np.testing.assert_array_equal(b.grad.numpy().astype(np.float32), [64.5] * 3)


def test_operators_without_16_bit_kernels_refuse_16_bit_inputs_by_name(rng):
    x = tensor(rng.standard_normal((2, 3)), BF16)
    with pytest.raises(DTypeError, match="softmax has no bfloat16 kernels.*autocast"):
        ops.softmax(x, axis=1)


def test_mixing_dtypes_outside_autocast_names_both(rng):
    with pytest.raises(DTypeError, match="input 0 is float32 but input 1 is bfloat16"):
        tensor(rng.standard_normal(3)) + tensor(rng.standard_normal(3), BF16)


def test_autocast_lowers_products_and_widens_the_rest(rng):
    x = tensor(rng.standard_normal((4, 8)))
    w = tensor(rng.standard_normal((3, 8)))
    with gf.autocast("bf16"):
        y = ops.linear(x, w)
        z = ops.matmul(y, tensor(rng.standard_normal((3, 2))))
        r = y.relu()
        s = ops.softmax(y, axis=1)
        mixed = y + tensor(rng.standard_normal((4, 3)))
    assert (y.dtype, z.dtype, r.dtype, s.dtype, mixed.dtype) == (BF16, BF16, BF16, np.float32,
                                                                  np.float32)


def test_autocast_leaves_float64_alone_and_fp16_is_its_other_dtype(rng):
    x64 = gf.tensor(rng.standard_normal((2, 3)), device="numpy", dtype=np.float64)
    w64 = gf.tensor(rng.standard_normal((4, 3)), device="numpy", dtype=np.float64)
    with gf.autocast("fp16"):
        assert ops.linear(x64, w64).dtype == np.float64
        assert ops.linear(x64.astype("float32"), w64.astype("float32")).dtype == FP16


def test_autocast_blocks_nest_restore_and_refuse_non_16_bit_dtypes(rng):
    x, w = tensor(rng.standard_normal((2, 3))), tensor(rng.standard_normal((4, 3)))
    with gf.autocast("bf16"):
        with gf.autocast("fp16"):
            assert ops.linear(x, w).dtype == FP16
        with gf.autocast(enabled=False):
            assert ops.linear(x, w).dtype == np.float32
        assert ops.linear(x, w).dtype == BF16
    with pytest.raises(RuntimeError):
        with gf.autocast("bf16"):
            raise RuntimeError("inside")
    assert precision.autocast_dtype() is None
    with pytest.raises(DTypeError, match="bf16 or fp16"):
        with gf.autocast("float32"):
            pass


def test_float32_parameters_get_float32_gradients_close_to_float32_training(rng):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    w1, w2 = rng.standard_normal((24, 16)) * 0.25, rng.standard_normal((4, 24)) * 0.2
    b1 = rng.standard_normal(24) * 0.1

    def gradients(cast_dtype):
        params = [tensor(p, grad=True) for p in (w1, b1, w2)]
        with gf.autocast(cast_dtype or "bf16", enabled=cast_dtype is not None):
            h = ops.linear(tensor(x), params[0], params[1]).relu()
            loss = (ops.linear(h, params[2]) * 0.5).sum()
        assert loss.dtype == np.float32
        loss.backward()
        return loss.item(), [p.grad for p in params]

    loss32, grads32 = gradients(None)
    loss16, grads16 = gradients("bf16")
    assert all(g.dtype == np.float32 for g in grads16)
    assert abs(loss16 - loss32) <= 2e-2 * abs(loss32) + 1e-2
    for g16, g32 in zip(grads16, grads32):     # bfloat16 keeps 8 bits: about 0.4% per rounding
        error = np.linalg.norm(g16.numpy() - g32.numpy()) / np.linalg.norm(g32.numpy())
        assert 0 < error <= 2e-2


def test_bfloat16_tensors_are_made_and_read_on_numpy():
    t = gf.tensor([1.0, 2.5, 3.0078125], device="numpy", dtype="bf16")
    assert t.dtype == np.dtype(ml_dtypes.bfloat16)
    assert t.numpy().astype(np.float32).tolist() == [1.0, 2.5, 3.0]    # 3 + 2^-7 rounds to 3


def test_a_gradient_of_another_dtype_is_refused(rng):
    y = tensor(rng.standard_normal(4), BF16, grad=True).relu()
    with pytest.raises(DTypeError, match="grad is float32, the tensor bfloat16"):
        y.backward(tensor(np.ones(4)))


def test_optimisers_and_clipping_take_float32_parameters_only(rng):
    p16 = tensor(rng.standard_normal(3), BF16, grad=True)
    with pytest.raises(DTypeError, match="SGD: parameter 0 of group 0 is bfloat16.*autocast"):
        gf.optim.SGD([p16], lr=0.1)
    p = tensor(rng.standard_normal(3), grad=True)
    p.grad = tensor(rng.standard_normal(3), FP16)
    with pytest.raises(DTypeError, match="clip_grad_norm: 1 gradient.*float16"):
        gf.optim.clip_grad_norm([p], 1.0)
