"""The 16-bit kernels on the GPU against the NumPy emulation, at odd sizes, on random inputs.

Tolerances, per dtype: casts bit for bit; elementwise kernels within one unit
in the last place of the 16-bit result (the GPU's float32 math functions and
NumPy's may round a value to either side of a 16-bit boundary); products
within two units of the dtype's epsilon relative to the largest reference
magnitude (the float32 sums run in another order on the tensor cores).
"""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops, precision
from gdnflow.testing import assert_half_backends_match, relative_error

pytestmark = pytest.mark.gpu
HALF = ["bf16", "fp16"]
EPS = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -10}
UNARY = {"neg": lambda x: -x, "exp": lambda x: (x * 0.5).exp(), "log": lambda x: x.log(),
         "sqrt": lambda x: x.sqrt(), "pow": lambda x: x ** 1.5, "relu": lambda x: x.relu(),
         "relu6": ops.relu6, "sigmoid": lambda x: x.sigmoid(),
         "clamp": lambda x: x.clamp(0.5, 1.5), "affine": lambda x: x * 0.75 + 0.25,
         "erf": ops.erf, "sin": ops.sin, "atan": ops.atan, "sinh": ops.sinh}
POSITIVE = {"log", "sqrt", "pow"}


@pytest.mark.parametrize("dtype", HALF)
def test_casts_equal_numpy_bit_for_bit(dtype, rng):
    x = (rng.standard_normal(100_003) * 10.0 ** rng.integers(-9, 9, 100_003)).astype(np.float32)
    x[:6] = [np.inf, -np.inf, np.nan, 1 + 2.0 ** -8, 65520.0, -0.0]
    wide = gf.tensor(x, device="cuda")
    gpu = wide.astype(dtype).numpy()
    cpu = gf.tensor(x, device="numpy").astype(dtype).numpy()
    assert gpu.dtype == cpu.dtype == precision.as_dtype(dtype)
    # NaN stays NaN; its payload is the converter's own (the GPU's canonical 0x7FFF).
    nan = np.isnan(x)
    assert np.isnan(gpu.astype(np.float32)[nan]).all()
    np.testing.assert_array_equal(gpu.view(np.uint16)[~nan], cpu.view(np.uint16)[~nan])
    other = "fp16" if dtype == "bf16" else "bf16"
    np.testing.assert_array_equal(
        gf.tensor(cpu, device="cuda", dtype=dtype).astype(other).numpy().astype(np.float32),
        gf.tensor(cpu, device="numpy", dtype=dtype).astype(other).numpy().astype(np.float32))
    back = gf.tensor(cpu, device="cuda", dtype=dtype).astype("float32").numpy()
    np.testing.assert_array_equal(back, cpu.astype(np.float32))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", UNARY)
def test_unary_kernels_match_the_emulation(name, dtype, rng):
    x = rng.standard_normal((37, 41)) * 1.5
    if name in POSITIVE:
        x = np.abs(x) + 0.1
    assert_half_backends_match(UNARY[name], [x], dtype, ulps=1)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shapes", [((33, 17), (33, 17)), ((5, 7, 9), (7, 1)), ((3, 1, 11), (4, 1))])
def test_binary_kernels_match_the_emulation(shapes, dtype, rng):
    a, b = (rng.standard_normal(s) for s in shapes)
    b = np.abs(b) + 0.5         # a divisor away from 0
    for fn in (lambda p, q: p + q, lambda p, q: p - q, lambda p, q: p * q, lambda p, q: p / q):
        # Broadcast gradients are sums: as the products, within the reduction tolerance.
        tolerance = {"ulps": 1} if shapes[0] == shapes[1] else {"rtol": 2 * EPS[dtype]}
        assert_half_backends_match(fn, [a, b], dtype, **tolerance)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows, inp, out", [(1, 1, 1), (37, 129, 65), (256, 512, 384)])
def test_linear_matches_the_emulation(rows, inp, out, dtype, rng):
    x, w, b = rng.standard_normal((rows, inp)), rng.standard_normal((out, inp)), rng.standard_normal(out)
    assert_half_backends_match(ops.linear, [x, w / np.sqrt(inp), b], dtype, rtol=2 * EPS[dtype])


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("a_shape, b_shape", [((17, 33), (33, 9)), ((3, 17, 33), (33, 9)),
                                              ((17, 33), (3, 33, 9)), ((3, 5, 7), (3, 7, 11))])
def test_matmul_matches_the_emulation(a_shape, b_shape, dtype, rng):
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    assert_half_backends_match(ops.matmul, [a, b / np.sqrt(b_shape[-2])], dtype,
                               rtol=2 * EPS[dtype])


@pytest.mark.parametrize("dtype", HALF)
def test_an_autocast_training_step_matches_numpy(dtype, rng):
    x = rng.standard_normal((64, 96)).astype(np.float32)
    weights = [rng.standard_normal((128, 96)) / 10, rng.standard_normal(128) / 10,
               rng.standard_normal((10, 128)) / 11]
    results = {}
    for device in ("numpy", "cuda"):
        params = [gf.tensor(p, device=device, requires_grad=True) for p in weights]
        with gf.autocast(dtype):
            # sigmoid, not relu: a 16-bit rounding on either side of 0 would flip relu's
            # mask for that element, a difference of the inputs, not of the kernels.
            h = ops.linear(gf.tensor(x, device=device), params[0], params[1]).sigmoid()
            loss = ops.log_softmax(ops.linear(h, params[2]), axis=1).mean() * -1.0
        loss.backward()
        assert all(p.grad.dtype == np.float32 for p in params)
        results[device] = [loss.numpy()] + [p.grad.numpy() for p in params]
    for gpu, cpu in zip(results["cuda"], results["numpy"]):
        assert relative_error(gpu, cpu) <= 4 * EPS[dtype]


@pytest.mark.parametrize("dtype", HALF + ["float32"])
def test_views_off_the_16_byte_grid_take_the_element_path(dtype, rng):
    # A view one element into an array is not 16-byte aligned: the kernels must not
    # load it in vectors. Checked against the aligned result of the same values.
    host = rng.standard_normal(1 + 1001).astype(np.float32)
    whole = gf.tensor(host, device="cuda").astype(dtype)
    view = gf.Tensor.wrap(whole.data.offset(1, (1001,)), "cuda")
    aligned = gf.tensor(host[1:], device="cuda").astype(dtype)
    for fn in (lambda t: t.sigmoid(), lambda t: t * t, lambda t: (t + aligned).relu()):
        np.testing.assert_array_equal(fn(view).numpy().astype(np.float32),
                                      fn(aligned).numpy().astype(np.float32))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("pool", [lambda x: ops.max_pool2d(x, 3, 2, 1),
                                  lambda x: ops.max_pool2d(x, 2),
                                  lambda x: ops.avg_pool2d(x, 3, 2, 1),
                                  lambda x: ops.avg_pool2d(x, 3, 1, 1, count_include_pad=False)],
                         ids=["max 3/2 pad 1", "max 2", "avg 3/2 pad 1", "avg 3/1 excluding pad"])
def test_pools_match_the_emulation(pool, dtype, rng):
    # The window sums (averages, overlapping gradients) run in float: one rounding each.
    assert_half_backends_match(pool, [rng.standard_normal((2, 5, 13, 11))], dtype, ulps=1)


def test_moving_a_16_bit_tensor_keeps_its_dtype(rng):
    x = gf.tensor(rng.standard_normal(5), device="numpy", dtype="bf16")
    assert x.to("cuda").dtype == precision.BFLOAT16
    assert x.to("cuda").to("numpy").dtype == precision.BFLOAT16
    same = gf.tensor(rng.standard_normal(5), device="cuda", dtype="fp16")
    assert same.astype("fp16").data.ptr != same.data.ptr     # a copy, as on NumPy
