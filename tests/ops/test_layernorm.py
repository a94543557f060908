"""Layer normalisation (gdnflow.ops.layernorm): forward against the float64 formula,
gradients against finite differences, CUDA against NumPy at odd sizes, shape errors."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.errors import ShapeError
from gdnflow.ops.layernorm import LayerNormOp
from gdnflow.testing import assert_backends_match, gradcheck, relative_error


def reference(x, scale, bias, axis, eps):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def inputs(rng, shape, axis):
    normalized = shape[axis % len(shape):]
    # An offset mean: the centred variance must not lose digits to it.
    return [rng.standard_normal(shape) * 3 + 5, rng.uniform(0.5, 1.5, normalized),
            rng.standard_normal(normalized)]


@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((2, 3, 5), 1), ((6,), 0),
                                        ((2, 5, 5, 96), 3)])
def test_forward_matches_the_float64_formula(rng, shape, axis):
    x, scale, bias = inputs(rng, shape, axis)
    got = ops.layer_norm(*(gf.tensor(a, dtype=np.float64) for a in (x, scale, bias)),
                         axis=axis, eps=1e-6).numpy()
    assert relative_error(got, reference(x, scale, bias, axis, 1e-6)) < 1e-12


@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((2, 3, 4), 1)])
def test_gradients_match_finite_differences(rng, shape, axis):
    gradcheck(lambda x, s, b: ops.layer_norm(x, s, b, axis=axis), inputs(rng, shape, axis),
              names=["x", "scale", "bias"])


def test_wrong_parameter_shapes_and_axis_are_refused(rng):
    x = gf.tensor(rng.standard_normal((2, 3, 4)))
    with pytest.raises(ShapeError, match=r"scale must have the normalised axes' shape \(4,\)"):
        ops.layer_norm(x, gf.ones((3,)), gf.zeros((4,)))
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        ops.layer_norm(x, gf.ones((4,)), gf.zeros((4,)), axis=3)
    with pytest.raises(ValueError, match="eps must be positive"):
        ops.layer_norm(x, gf.ones((4,)), gf.zeros((4,)), eps=0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis", [((5, 7), -1), ((3, 9, 11, 96), 3), ((37, 769), 1),
                                        ((2, 3, 33), 1), ((1, 1), -1)], ids=str)
def test_cuda_matches_numpy(rng, shape, axis):
    assert_backends_match(lambda x, s, b: ops.layer_norm(x, s, b, axis=axis),
                          inputs(rng, shape, axis), rtol=1e-4, names=["x", "scale", "bias"])


def test_channels_first_is_the_layer_norm_of_x_moved_last(rng):
    x, scale, bias = rng.standard_normal((2, 5, 3, 4)) + 2, rng.uniform(0.5, 1.5, 5), \
        rng.standard_normal(5)
    got = LayerNormOp(eps=1e-6, channels_first=True)(
        *(gf.tensor(a, dtype=np.float64) for a in (x, scale, bias))).numpy()
    assert got.shape == (2, 3, 4, 5)
    assert relative_error(got, reference(np.moveaxis(x, 1, -1), scale, bias, -1, 1e-6)) < 1e-12


def test_channels_first_gradients_match_finite_differences(rng):
    gradcheck(lambda x, s, b: LayerNormOp(channels_first=True)(x, s, b),
              [rng.standard_normal((2, 4, 3, 2)), rng.uniform(0.5, 1.5, 4),
               rng.standard_normal(4)], names=["x", "scale", "bias"])


def test_channels_out_first_is_layer_norm_2d(rng):
    # torchvision's LayerNorm2d: to channels last, the layer norm, back to channels first.
    x, scale, bias = rng.standard_normal((2, 5, 3, 4)) + 2, rng.uniform(0.5, 1.5, 5), \
        rng.standard_normal(5)
    got = LayerNormOp(eps=1e-6, channels_first=True, channels_out_first=True)(
        *(gf.tensor(a, dtype=np.float64) for a in (x, scale, bias))).numpy()
    expected = np.moveaxis(reference(np.moveaxis(x, 1, -1), scale, bias, -1, 1e-6), -1, 1)
    assert got.shape == (2, 5, 3, 4) and relative_error(got, expected) < 1e-12


def test_channels_out_first_gradients_match_finite_differences(rng):
    gradcheck(lambda x, s, b: LayerNormOp(channels_first=True, channels_out_first=True)(x, s, b),
              [rng.standard_normal((2, 4, 3, 2)), rng.uniform(0.5, 1.5, 4),
               rng.standard_normal(4)], names=["x", "scale", "bias"])


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["far_from_zero", "one_channel_far_out", "infinity"])
def test_channels_first_cuda_statistics_do_not_cancel(rng, case):
    # The kernel's one pass keeps running means and squared deviations (Welford): rows
    # far from zero, and rows with one channel 1000 deviations out (where a one-pass
    # E[(x - x_0)^2] - E[x - x_0]^2 lost a factor of C), must still match float64; an
    # infinite value makes its row NaN, as in NumPy.
    x = rng.standard_normal((2, 768, 5, 7))
    if case == "far_from_zero":
        x += 1000.0
    elif case == "one_channel_far_out":
        x[:, 5] += 1000.0
    else:
        x[1, 7, 2, 3] = np.inf
    x = x.astype(np.float32).astype(np.float64)     # the values the kernel reads
    scale, bias = rng.uniform(0.5, 1.5, 768), rng.standard_normal(768)
    with np.errstate(invalid="ignore"):
        expected = reference(np.moveaxis(x, 1, -1), scale, bias, -1, 1e-5)
    got = LayerNormOp(channels_first=True)(
        *(gf.tensor(a, device="cuda") for a in (x, scale, bias))).numpy()
    if case == "infinity":
        assert np.isnan(got[1, 2, 3]).all() and np.isnan(expected[1, 2, 3]).all()
        got, expected = got[0], expected[0]
    assert relative_error(got, expected) <= 1e-4


def test_channels_out_first_needs_channels_first():
    with pytest.raises(ValueError, match="needs channels_first=True"):
        LayerNormOp(channels_out_first=True)


def test_channels_first_refuses_parameters_of_another_width(rng):
    with pytest.raises(ShapeError, match="channels_first takes x"):
        LayerNormOp(channels_first=True)(gf.tensor(rng.standard_normal((2, 3, 4))),
                                         gf.ones((4,)), gf.zeros((4,)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (3, 96, 11, 13), (1, 40, 33), (2, 3, 1, 1)],
                         ids=str)
@pytest.mark.parametrize("out_first", [False, True], ids=["channels_last_out", "channels_first_out"])
def test_channels_first_cuda_matches_numpy(rng, shape, out_first):
    assert_backends_match(
        lambda x, s, b: LayerNormOp(channels_first=True, channels_out_first=out_first)(x, s, b),
        [rng.standard_normal(shape) * 3 + 5, rng.uniform(0.5, 1.5, shape[1]),
         rng.standard_normal(shape[1])], rtol=1e-4, names=["x", "scale", "bias"])
