"""Strided convolutions on the sub-pixel grid (gdnflow/ops/conv/algorithms/subpixel.py,
cuda_src/subpixel.cu).

On the CPU: a NumPy model of the rewrite, driven by the module's plan (the
inner geometry and each axis's taps and paddings) and the kernels' tap
formula, equals the reference strided convolution's forward and
backward-data at odd sizes, asymmetric padding and several kernel/stride
pairs; the heuristic's choices. On the GPU: conv2d and conv_transpose2d
through the rewrite match NumPy, values and gradients.
"""
import numpy as np
import pytest

from gdnflow import ops
from gdnflow.config import override
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm
from gdnflow.ops.conv.algorithms.subpixel import Subpixel, split_axis, subpixel_plan
from gdnflow.ops.conv.algorithms.winograd import WinogradF4
from gdnflow.ops.conv.geometry import STAGES, conv_geometry, normalize_padding
from gdnflow.ops.conv import planning
from gdnflow.ops.conv.planning import ConvPlanner, conv_algorithm
from gdnflow.ops.conv.reference import NumpyConv
from gdnflow.testing import assert_backends_match
from phase_layout import interleave_phases, split_phases


def _geometry(x_shape, w_shape, stride, padding):
    pair = (lambda v: (v, v) if isinstance(v, int) else tuple(v))
    return conv_geometry("conv2d", x_shape, w_shape, pair(stride),
                         normalize_padding("conv2d", padding), (1, 1), 1)


def _phase_tap(r, t, axis):
    """subpixel.cu's phase_tap: the kernel tap of inner tap t in phase r, or -1."""
    a, b = divmod(r + axis.pad, axis.stride)
    m = a + axis.inner_pad - t
    tap = axis.stride * m + b
    return tap if m >= 0 and tap < axis.kernel else -1


def _weight_model(plan, g, w):
    rows, cols = plan.rows, plan.cols
    w_sub = np.zeros(plan.inner.w_shape)
    for rh in range(rows.stride):
        for rw in range(cols.stride):
            phase = rh * cols.stride + rw
            for th in range(rows.taps):
                for tw in range(cols.taps):
                    kh, kw = _phase_tap(rh, th, rows), _phase_tap(rw, tw, cols)
                    if kh >= 0 and kw >= 0:
                        w_sub[phase * g.c_in:(phase + 1) * g.c_in, :, th, tw] = w[:, :, kh, kw].T
    return w_sub


def _split_model(plan, g, x):
    return split_phases(x, plan.rows.stride, plan.cols.stride, plan.rows.cells, plan.cols.cells)


def _interleave_model(plan, g, x_sub):
    return interleave_phases(x_sub, plan.rows.stride, plan.cols.stride, g.h, g.w)


CASES = {
    "gdn_5x5_s2_even": ((2, 3, 16, 12), (4, 3, 5, 5), 2, 2),
    "gdn_5x5_s2_odd": ((2, 3, 17, 13), (4, 3, 5, 5), 2, 2),
    "5x5_s2_asymmetric": ((1, 2, 11, 14), (3, 2, 5, 5), 2, (1, 2, 2, 0)),
    "4x4_s2": ((2, 2, 9, 10), (3, 2, 4, 4), 2, 1),
    "3x3_s2": ((1, 3, 15, 8), (2, 3, 3, 3), 2, 1),
    "3x3_s2_unpadded": ((1, 2, 9, 7), (2, 2, 3, 3), 2, 0),
    "5x5_s3": ((1, 2, 13, 11), (2, 2, 5, 5), 3, 2),
    "5x3_s21": ((1, 2, 10, 9), (3, 2, 5, 3), (2, 1), (2, 1)),
    "tiny": ((1, 1, 1, 2), (1, 1, 5, 5), 2, 2),
}


@pytest.mark.parametrize("case", CASES)
def test_rewrite_model_equals_the_strided_convolution(case, rng):
    x_shape, w_shape, stride, padding = CASES[case]
    g = _geometry(x_shape, w_shape, stride, padding)
    plan = subpixel_plan(g)
    assert plan is not None
    assert (plan.inner.oh, plan.inner.ow) == (plan.rows.cells, plan.cols.cells)
    assert plan.inner.x_shape == g.y_shape
    x, w = rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    gy = rng.standard_normal(g.y_shape)
    w_sub = _weight_model(plan, g, w)
    # Each tap of w sits exactly once in w', everything else is zero.
    assert np.count_nonzero(w_sub) == w.size
    np.testing.assert_allclose(np.sort(w_sub[w_sub != 0]), np.sort(w.ravel()))
    gx = _interleave_model(plan, g, NumpyConv.forward(plan.inner, gy, w_sub))
    np.testing.assert_allclose(gx, NumpyConv.backward_data(g, gy, w), rtol=1e-10, atol=1e-10)
    y = NumpyConv.backward_data(plan.inner, _split_model(plan, g, x), w_sub)
    np.testing.assert_allclose(y, NumpyConv.forward(g, x, w), rtol=1e-10, atol=1e-10)


def test_autoencoder_layer_becomes_a_3x3_stride_1_convolution():
    g = _geometry((16, 128, 128, 128), (128, 128, 5, 5), 2, 2)
    plan = subpixel_plan(g)
    assert (plan.rows.taps, plan.cols.taps) == (3, 3)
    assert plan.inner.stride == (1, 1) and plan.inner.padding == (1, 1, 1, 1)
    assert plan.inner.w_shape == (512, 128, 3, 3) and plan.inner.x_shape == (16, 128, 64, 64)


def test_split_axis_refuses_a_negative_padding_after():
    # Bottom padding so large that C's output has rows no phase cell reaches.
    assert split_axis(size=4, out_size=6, kernel=3, stride=2, pad=1) is None


@pytest.mark.parametrize("stride,dilation,groups", [(1, 1, 1), (2, 2, 1), (2, 1, 2)])
def test_not_supported(stride, dilation, groups):
    g = conv_geometry("conv2d", (1, 4, 9, 9), (4, 4 // groups, 3, 3), (stride, stride),
                      (1, 1, 1, 1), (dilation, dilation), groups)
    assert not Subpixel.supports(g)


def test_heuristic_takes_the_rewrite_where_the_inner_convolution_is_winograd():
    planner = ConvPlanner(autotune=False)
    wide = _geometry((16, 128, 128, 128), (128, 128, 5, 5), 2, 2)
    assert WinogradF4.preferred(subpixel_plan(wide).inner)
    assert planner.choose(wide, "forward") is Subpixel
    assert planner.choose(wide, "backward_data") is Subpixel
    assert planner.choose(wide, "backward_weight") is not Subpixel
    rgb = _geometry((16, 3, 256, 256), (128, 3, 5, 5), 2, 2)       # 12 inner output channels
    assert planner.choose(rgb, "forward") is not Subpixel


def test_the_rewrite_runs_bound_to_the_planner_in_effect():
    # The planner offers the class; the operator runs an instance that asks the
    # same planner for the inner convolution's algorithm.
    wide = _geometry((16, 128, 128, 128), (128, 128, 5, 5), 2, 2)
    forced = _ForcedSubpixel(Im2colGemm)
    with override(conv_planner=forced):
        algorithm = conv_algorithm("cuda", wide, "forward")
        assert isinstance(algorithm, Subpixel) and algorithm.planner is forced
        assert algorithm.planner.choose(subpixel_plan(wide).inner, "backward_data") is Im2colGemm
    default = conv_algorithm("cuda", wide, "backward_data")
    assert isinstance(default, Subpixel) and default.planner is planning.planner
    assert conv_algorithm("cuda", wide, "backward_weight") is Im2colGemm
    assert conv_algorithm("numpy", wide, "forward") is NumpyConv


# --------------------------------------------------------------------- GPU --
class _ForcedSubpixel:
    """A planner that runs Subpixel wherever it can and ``inner`` for the
    stride-1 convolution inside it where that applies (Winograd: through phase
    views; im2col: explicit split and interleave kernels); the default elsewhere."""

    def __init__(self, inner):
        self.inner = inner
        self.default = ConvPlanner(autotune=False)

    def choose(self, g, stage):
        for algorithm in (Subpixel, self.inner):
            if stage in getattr(algorithm, "stages", STAGES) and algorithm.supports(g):
                return algorithm
        return self.default.choose(g, stage)


INNER = {"winograd": WinogradF4, "im2col": Im2colGemm}


@pytest.mark.gpu
@pytest.mark.parametrize("inner", INNER)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_conv2d_through_subpixel_cuda_matches_numpy(case, activation, inner, rng):
    x_shape, w_shape, stride, padding = CASES[case]
    x, w, b = (rng.standard_normal(x_shape), rng.standard_normal(w_shape),
               rng.standard_normal(w_shape[0]))
    with override(conv_planner=_ForcedSubpixel(INNER[inner])):
        assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, stride=stride, padding=padding,
                                                         activation=activation),
                              [x, w, b], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("inner", INNER)
@pytest.mark.parametrize("shape", [(2, 6, 9, 11), (3, 96, 8, 8), (1, 5, 1, 2)], ids=str)
@pytest.mark.parametrize("output_padding", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose2d_through_subpixel_cuda_matches_numpy(shape, output_padding, bias, inner,
                                                              rng):
    c_in = shape[1]
    x, w, b = (rng.standard_normal(shape), rng.standard_normal((c_in, c_in, 5, 5)) / c_in,
               rng.standard_normal(c_in))
    kwargs = dict(stride=2, padding=2, output_padding=output_padding)
    with override(conv_planner=_ForcedSubpixel(INNER[inner])):
        if bias:
            assert_backends_match(lambda x, w, b: ops.conv_transpose2d(x, w, b, **kwargs),
                                  [x, w, b], rtol=1e-4)
        else:
            assert_backends_match(lambda x, w: ops.conv_transpose2d(x, w, **kwargs), [x, w],
                                  rtol=1e-4)
