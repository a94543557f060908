"""max_pool2d, avg_pool2d, global_avg_pool2d: forward and the max-pool gradient
routing against explicit loops, gradients against finite differences, CUDA
against NumPy at odd sizes and at VGG16 / MobileNetV2 shapes."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import nn, ops
from gdnflow.errors import ShapeError
from gdnflow.inference import InferencePlan
from gdnflow.nn.module import Module
from gdnflow.ops.pool import MaxPool2dOp, MaxPoolOfConcat
from gdnflow.ops.shape import ConcatOp
from gdnflow.testing import assert_backends_match, gradcheck, relative_error


def t64(a, requires_grad=False):
    return gf.tensor(a, device="numpy", dtype=np.float64, requires_grad=requires_grad)


def as_pairs(kernel, stride, padding):
    k = (kernel, kernel) if isinstance(kernel, int) else kernel
    s = k if stride is None else ((stride, stride) if isinstance(stride, int) else stride)
    if isinstance(padding, int):
        padding = (padding,) * 4
    elif len(padding) == 2:
        padding = (padding[0], padding[0], padding[1], padding[1])
    return k, s, padding


def naive_pool(x, kernel, stride, padding, kind, count_include_pad=True):
    """Pool by looping over every output and every tap, testing bounds by hand.

    Returns (y, argmax) where argmax holds the (row, col) of each window's
    first maximum (for kind == "max").
    """
    (kh, kw), (sh, sw), (top, bottom, left, right) = as_pairs(kernel, stride, padding)
    n, c, h, w = x.shape
    oh = (h + top + bottom - kh) // sh + 1
    ow = (w + left + right - kw) // sw + 1
    y = np.zeros((n, c, oh, ow))
    argmax = {}
    for b, ch, p, q in np.ndindex(n, c, oh, ow):
        best, where, total, count = -np.inf, None, 0.0, 0
        for i in range(kh):
            for j in range(kw):
                r, col = p * sh - top + i, q * sw - left + j
                if 0 <= r < h and 0 <= col < w:
                    v = x[b, ch, r, col]
                    if where is None or v > best:
                        best, where = v, (r, col)
                    total += v
                    count += 1
        if kind == "max":
            y[b, ch, p, q] = best
            argmax[b, ch, p, q] = where
        else:
            y[b, ch, p, q] = total / (kh * kw if count_include_pad else count)
    return y, argmax


# (input shape, kernel, stride, padding): odd sizes, stride 2 over odd inputs,
# overlapping windows, non-square kernels, padding symmetric and not.
CASES = [
    ((2, 3, 7, 9), 2, 2, 0),
    ((1, 2, 8, 8), 2, None, 0),
    ((2, 3, 7, 9), 3, 2, 1),
    ((1, 2, 5, 5), 3, 1, 1),
    ((2, 1, 9, 6), (3, 2), (2, 1), (1, 0)),
    ((1, 3, 6, 7), 2, 2, (0, 1, 0, 1)),
    ((2, 2, 4, 5), 1, 2, 0),
    ((1, 1, 3, 3), 3, 1, 0),
    ((1, 2, 5, 6), 3, 1, 2),            # padding up to kernel - 1, as ONNX allows
    ((2, 1, 4, 7), (2, 3), 2, (1, 0, 2, 1)),
]


@pytest.mark.parametrize("shape, kernel, stride, padding", CASES, ids=str)
def test_max_pool_forward_matches_loops(shape, kernel, stride, padding, rng):
    x = rng.standard_normal(shape)
    y = ops.max_pool2d(t64(x), kernel, stride, padding)
    np.testing.assert_array_equal(y.numpy(), naive_pool(x, kernel, stride, padding, "max")[0])


@pytest.mark.parametrize("shape, kernel, stride, padding", CASES, ids=str)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool_forward_matches_loops(shape, kernel, stride, padding, count_include_pad, rng):
    x = rng.standard_normal(shape)
    y = ops.avg_pool2d(t64(x), kernel, stride, padding, count_include_pad)
    want = naive_pool(x, kernel, stride, padding, "avg", count_include_pad)[0]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("shape, kernel, stride, padding", CASES, ids=str)
def test_max_pool_gradient_goes_to_each_windows_maximum(shape, kernel, stride, padding, rng):
    x = rng.standard_normal(shape)
    y, argmax = naive_pool(x, kernel, stride, padding, "max")
    gy = rng.standard_normal(y.shape)
    want = np.zeros(shape)
    for (b, ch, p, q), (r, col) in argmax.items():
        want[b, ch, r, col] += gy[b, ch, p, q]
    t = t64(x, requires_grad=True)
    ops.max_pool2d(t, kernel, stride, padding).backward(t64(gy))
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-12)


def test_max_pool_ties_go_to_the_first_maximum():
    x = np.array([[[[1.0, 3.0], [3.0, 0.0]]]])
    t = t64(x, requires_grad=True)
    ops.max_pool2d(t, 2).backward(t64(np.ones((1, 1, 1, 1))))
    np.testing.assert_array_equal(t.grad.numpy(), [[[[0.0, 1.0], [0.0, 0.0]]]])


@pytest.mark.parametrize("shape, kernel, stride, padding", CASES, ids=str)
def test_pool_gradients(shape, kernel, stride, padding, rng):
    x = rng.standard_normal(shape)
    gradcheck(lambda t: ops.max_pool2d(t, kernel, stride, padding), [x])
    gradcheck(lambda t: ops.avg_pool2d(t, kernel, stride, padding), [x])
    gradcheck(lambda t: ops.avg_pool2d(t, kernel, stride, padding, count_include_pad=False), [x])


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 1, 1), (3, 1, 2, 9)], ids=str)
def test_global_avg_pool_forward_and_gradient(shape, rng):
    x = rng.standard_normal(shape)
    want = np.zeros(shape[:2] + (1, 1))
    for b, ch in np.ndindex(shape[:2]):
        want[b, ch, 0, 0] = sum(x[b, ch, i, j] for i in range(shape[2])
                                for j in range(shape[3])) / (shape[2] * shape[3])
    np.testing.assert_allclose(ops.global_avg_pool2d(t64(x)).numpy(), want, rtol=1e-12)
    gradcheck(ops.global_avg_pool2d, [x])


def test_no_argmax_is_kept_without_a_graph(rng):
    from gdnflow.ops.pool import MaxPool2dOp
    op = MaxPool2dOp(2)
    op(gf.tensor(rng.standard_normal((1, 1, 4, 4)), device="numpy"))
    assert op.saved == ()


def test_an_input_without_pixels_is_refused():
    # Windows of padding only: no input element to pool (the kernels assume one).
    with pytest.raises(gf.ShapeError, match=r"max_pool2d: input has no pixels to pool: "
                                            r"shape \(1, 1, 0, 4\)"):
        ops.max_pool2d(gf.zeros((1, 1, 0, 4), device="numpy"), 3, 1, 2)
    with pytest.raises(gf.ShapeError, match="avg_pool2d: input has no pixels"):
        ops.avg_pool2d(gf.zeros((2, 3, 5, 0), device="numpy"), 2, 1, 1)


@pytest.mark.parametrize("call, error, message", [
    (lambda x: ops.max_pool2d(x, 3, 1, 3), ValueError,
     r"max_pool2d: padding \(3, 3, 3, 3\) must be smaller than the kernel \(3, 3\)"),
    (lambda x: ops.avg_pool2d(x, (3, 2), 1, (0, 0, 1, 2)), ValueError,
     r"avg_pool2d: padding \(0, 0, 1, 2\) must be smaller than the kernel \(3, 2\)"),
    (lambda x: ops.avg_pool2d(x.reshape(1, 5, 7), 2), gf.ShapeError,
     r"avg_pool2d: input must be 4-D \[N, C, H, W\], got shape \(1, 5, 7\)"),
    (lambda x: ops.max_pool2d(x, 6), gf.ShapeError,
     r"max_pool2d: kernel 6x6 is larger than the padded input 5x7"),
    (lambda x: ops.max_pool2d(x, 2, 0), ValueError, r"max_pool2d: stride must be at least 1"),
    (lambda x: ops.global_avg_pool2d(x.reshape(5, 7)), gf.ShapeError,
     r"global_avg_pool2d: input must be 4-D"),
])
def test_errors_name_operator_and_values(call, error, message):
    with pytest.raises(error, match=message):
        call(gf.zeros((1, 1, 5, 7), device="numpy"))


# -------------------------------------------------------------------- GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("shape, kernel, stride, padding", CASES + [((3, 5, 33, 17), 3, 2, 1)],
                         ids=str)
def test_pools_cuda_match_numpy(shape, kernel, stride, padding, rng):
    x = rng.standard_normal(shape)
    assert_backends_match(lambda t: ops.max_pool2d(t, kernel, stride, padding), [x], rtol=1e-5)
    assert_backends_match(lambda t: ops.avg_pool2d(t, kernel, stride, padding), [x], rtol=1e-5)
    assert_backends_match(lambda t: ops.avg_pool2d(t, kernel, stride, padding, False), [x],
                          rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 64, 224, 224), (1, 512, 14, 14), (2, 128, 113, 111)],
                         ids=str)
def test_max_pool_cuda_at_vgg16_shapes(shape, rng):
    assert_backends_match(lambda t: ops.max_pool2d(t, 2, 2), [rng.standard_normal(shape)],
                          rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1280, 7, 7), (3, 5, 1, 1), (2, 7, 33, 65), (1, 3, 61, 67)],
                         ids=str)
def test_global_avg_pool_cuda_matches_numpy(shape, rng):
    assert_backends_match(ops.global_avg_pool2d, [rng.standard_normal(shape)], rtol=1e-5)


# The fixed-window forward (pool_forward_fixed): both pools without a graph, every window
# of CASES plus the networks' (Inception's and GoogLeNet's 3x3 stride-1 branch pools,
# SqueezeNet's 3x3 stride-2, DenseNet's 2x2 transitions), rows of 1 to 4 outputs past the
# last whole group of four.
FIXED_CASES = CASES + [((3, 5, 33, 17), 3, 2, 1), ((2, 7, 35, 35), 3, 1, 1),
                       ((2, 9, 17, 17), 3, 1, 1), ((1, 6, 55, 55), 3, 2, 0),
                       ((2, 4, 28, 28), 2, 2, 0), ((1, 3, 9, 10), (5, 4), (3, 2), (2, 1))]


@pytest.mark.gpu
@pytest.mark.parametrize("shape, kernel, stride, padding", FIXED_CASES, ids=str)
def test_fixed_window_pools_cuda_match_numpy(shape, kernel, stride, padding, rng):
    x = rng.standard_normal(shape)
    for fn in (lambda t: ops.max_pool2d(t, kernel, stride, padding),
               lambda t: ops.avg_pool2d(t, kernel, stride, padding),
               lambda t: ops.avg_pool2d(t, kernel, stride, padding, False)):
        assert_backends_match(fn, [x], rtol=1e-5, grad=False)


@pytest.mark.gpu
def test_fixed_window_max_pool_keeps_nan_and_infinities(rng):
    # As the NumPy reference (and the argmax kernel): a NaN in a window wins, -inf
    # loses to any number, padding never wins.
    x = rng.standard_normal((2, 3, 11, 13)).astype(np.float32)
    x[0, 0, 4, 5] = np.nan
    x[1, 2, :3, :] = -np.inf
    x[0, 1, :, :2] = np.inf
    with gf.no_grad():
        want = ops.max_pool2d(gf.tensor(x, device="numpy"), 3, 1, 1).numpy()
        got = ops.max_pool2d(gf.tensor(x, device="cuda"), 3, 1, 1).numpy()
    assert np.isnan(want).sum() == 9
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------- a pooled concatenation --
class FirePool(Module):
    """Branches of one input concatenated along the channels, then a 3x3/2 max pool (with
    padding 1 here): SqueezeNet's fire modules before each pool (``parts`` branches)."""

    def __init__(self, rng, channels, parts=2):
        super().__init__()
        self.parts = parts
        for k in range(parts):
            setattr(self, f"conv{k}", nn.Conv2d(channels, 3 + 2 * k, 1, rng=rng))

    def forward(self, x):
        branches = [ops.relu(getattr(self, f"conv{k}")(x)) for k in range(self.parts)]
        return ops.max_pool2d(ops.concat(branches, axis=1), 3, 2, 1)


@pytest.mark.parametrize("device", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("parts", [2, 4])
def test_plan_pools_a_concatenation_from_its_parts(rng, device, parts):
    model = FirePool(rng, 5, parts).to(device).eval()
    x = gf.tensor(rng.standard_normal((3, 5, 13, 17)), device=device)
    plan = InferencePlan(model, x.shape, device=device)
    names = [(s.name, s.fused) for s in plan.program.steps]
    assert ("max_pool2d", ("concat", "max_pool2d")) in names
    assert "concat" not in [s.name for s in plan.program.steps]
    with gf.no_grad():
        expected = model(x).numpy()
    assert relative_error(plan(x).numpy(), expected) == 0      # a maximum moves values only


def test_a_concatenation_read_twice_or_of_many_parts_is_made(rng):
    class Both(FirePool):
        def forward(self, x):
            joined = ops.concat([getattr(self, f"conv{k}")(x) for k in range(self.parts)], 1)
            return ops.max_pool2d(joined, 2), joined
    for model in (Both(rng, 4), FirePool(rng, 4, parts=5)):
        plan = InferencePlan(model.eval(), (2, 4, 8, 8))
        assert "concat" in [s.name for s in plan.program.steps]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("widths, shape", [((3, 5), (2, 9, 9)), ((1, 64, 7, 2), (3, 27, 31)),
                                          ((16,), (1, 12, 12))], ids=str)
def test_max_pool_of_parts_cuda_matches_the_concatenation(rng, widths, shape, dtype):
    n, h, w = shape
    parts = [gf.tensor(rng.standard_normal((n, c, h, w)), device="cuda") for c in widths]
    if dtype == "bf16":
        parts = [p.astype("bf16") for p in parts]
    pool = MaxPool2dOp(3, 2, 1)
    got = MaxPoolOfConcat(pool, ConcatOp(1))(*parts)
    joined = np.concatenate([p.astype("float32").numpy() for p in parts], axis=1)
    expected = ops.max_pool2d(gf.tensor(joined), 3, 2, 1).numpy()
    # float32, as the concatenation it replaces computes (16-bit parts widened).
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got.numpy(), expected)


@pytest.mark.gpu
def test_max_pool_of_parts_refuses_parts_of_other_sizes(rng):
    parts = [gf.tensor(rng.standard_normal(s), device="cuda") for s in ((2, 3, 9, 9), (2, 4, 9, 8))]
    with pytest.raises(ShapeError, match="input 1 has shape .* outside axis 1"):
        MaxPoolOfConcat(MaxPool2dOp(3, 2, 1), ConcatOp(1))(*parts)
