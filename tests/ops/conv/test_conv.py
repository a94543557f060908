"""conv2d and conv_transpose2d: forward against naive loops, gradients against
finite differences, the adjoint identity, error messages, the algorithm
choice, and CUDA against NumPy (every algorithm, real layer shapes)."""
import contextlib
import types

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.backends import cuda
from gdnflow.config import override
from gdnflow.ops.conv import Conv2dOp
from gdnflow.ops.conv.algorithms import depthwise as depthwise_module
from gdnflow.ops.conv.algorithms.depthwise import Depthwise
from gdnflow.ops.conv.algorithms.grouped import GroupedDirect
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm, Pointwise
from gdnflow.ops.conv.algorithms.pointwise import Im2colDirect
from gdnflow.ops.conv.algorithms.winograd import WinogradF4
from gdnflow.ops.conv.epilogue import epilogue_numpy
from gdnflow.ops.conv.geometry import conv_geometry, normalize_padding
from gdnflow.ops.conv.planning import ConvPlanner
from gdnflow.ops.conv.reference import NumpyConv
from gdnflow.testing import assert_backends_match, gradcheck, relative_error
from host_kernels import (HOST_CHECK_PRELUDE, HostArray, LaunchRecord, host_builder,
                          host_kernel)


# ------------------------------------------------------ naive references --
def _pad4(padding):
    if isinstance(padding, int):
        return (padding,) * 4
    if len(padding) == 2:
        return padding[0], padding[0], padding[1], padding[1]
    return tuple(padding)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def naive_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """y[n, o, p, q] = b[o] + sum_{c,i,j} w[o,c,i,j] x[n, g*cg + c, p*sh - top + i*dh, ...]:
    one explicit loop per index, bounds checked tap by tap."""
    (sh, sw), (dh, dw) = _pair(stride), _pair(dilation)
    top, bottom, left, right = _pad4(padding)
    n, _, h, width = x.shape
    c_out, cg, kh, kw = w.shape
    og = c_out // groups
    oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    ow = (width + left + right - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, c_out, oh, ow))
    for m in range(n):
        for o in range(c_out):
            first = (o // og) * cg
            for p in range(oh):
                for q in range(ow):
                    total = 0.0 if b is None else b[o]
                    for c in range(cg):
                        for i in range(kh):
                            r = p * sh - top + i * dh
                            if not 0 <= r < h:
                                continue
                            for j in range(kw):
                                s = q * sw - left + j * dw
                                if 0 <= s < width:
                                    total += w[o, c, i, j] * x[m, first + c, r, s]
                    y[m, o, p, q] = total
    return y


def naive_conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1,
                           groups=1):
    """Every input pixel scatters x[n, c, p, q] * w[c, o] onto the full output, which is
    then cropped by the padding (one explicit loop per index)."""
    (sh, sw), (dh, dw), (oph, opw) = _pair(stride), _pair(dilation), _pair(output_padding)
    top, bottom, left, right = _pad4(padding)
    n, c_in, h, width = x.shape
    _, og, kh, kw = w.shape
    cg = c_in // groups
    full = np.zeros((n, og * groups, (h - 1) * sh + dh * (kh - 1) + 1 + oph,
                     (width - 1) * sw + dw * (kw - 1) + 1 + opw))
    for m in range(n):
        for c in range(c_in):
            first = (c // cg) * og
            for p in range(h):
                for q in range(width):
                    for o in range(og):
                        for i in range(kh):
                            for j in range(kw):
                                full[m, first + o, p * sh + i * dh, q * sw + j * dw] += (
                                    x[m, c, p, q] * w[c, o, i, j])
    oh = full.shape[2] - top - bottom
    ow = full.shape[3] - left - right
    y = full[:, :, top:top + oh, left:left + ow]
    return y if b is None else y + np.reshape(b, (1, -1, 1, 1))


# ------------------------------------------------------------------ cases --
# name -> (x shape, w shape, keyword arguments); odd sizes throughout.
CONV_CASES = {
    "basic": ((2, 3, 7, 9), (4, 3, 3, 3), dict(padding=1)),
    "stride2_odd": ((2, 3, 9, 7), (5, 3, 3, 3), dict(stride=2, padding=1)),
    "stride2_even_kernel_leftover": ((1, 2, 8, 7), (3, 2, 2, 2), dict(stride=2)),
    "asymmetric_padding": ((2, 2, 6, 7), (3, 2, 4, 2), dict(padding=(1, 2, 0, 1))),
    "pair_padding_rect_stride": ((1, 3, 7, 8), (2, 3, 3, 5), dict(stride=(2, 1), padding=(2, 1))),
    "dilation2": ((1, 3, 9, 8), (4, 3, 3, 3), dict(dilation=2, padding=2)),
    "groups2": ((2, 4, 7, 7), (6, 2, 3, 3), dict(groups=2, padding=1)),
    "groups2_stride2_dilation2": ((1, 4, 9, 9), (4, 2, 3, 3),
                                  dict(groups=2, stride=2, dilation=2, padding=(1, 2, 2, 1))),
    "depthwise3_s1": ((2, 4, 9, 11), (4, 1, 3, 3), dict(groups=4, padding=1)),
    "depthwise3_s2": ((2, 4, 9, 11), (4, 1, 3, 3), dict(groups=4, stride=2, padding=1)),
    "depthwise5_s1": ((2, 4, 9, 11), (4, 1, 5, 5), dict(groups=4, padding=2)),
    "depthwise5_s2": ((2, 4, 9, 11), (4, 1, 5, 5), dict(groups=4, stride=2, padding=2)),
    "depthwise3_dilation2": ((1, 3, 8, 9), (3, 1, 3, 3), dict(groups=3, dilation=2, padding=2)),
    "depthwise_asymmetric": ((1, 3, 8, 9), (3, 1, 3, 3),
                             dict(groups=3, stride=2, padding=(0, 1, 0, 1))),
    "channel_multiplier2": ((1, 3, 6, 7), (6, 1, 3, 3), dict(groups=3, padding=1)),
    "pointwise": ((2, 5, 7, 9), (6, 5, 1, 1), dict()),
    "pointwise_groups2": ((2, 4, 5, 3), (6, 2, 1, 1), dict(groups=2)),
    # More groups than images: the GEMMs batch over the groups (im2col.grouped_matmul).
    "pointwise_groups3_batch1": ((1, 6, 5, 3), (9, 2, 1, 1), dict(groups=3)),
    "groups3_batch2": ((2, 6, 5, 7), (6, 2, 3, 3), dict(groups=3, padding=1)),
    "1x1_stride2": ((2, 3, 7, 5), (4, 3, 1, 1), dict(stride=2)),
}

# name -> (x shape, w shape [C_in, C_out/groups, kh, kw], keyword arguments)
TRANSPOSE_CASES = {
    "s2_k5_p2_op1": ((2, 3, 5, 6), (3, 4, 5, 5), dict(stride=2, padding=2, output_padding=1)),
    "s1_k3_p1": ((2, 3, 6, 5), (3, 2, 3, 3), dict(padding=1)),
    "groups2_dilation2": ((1, 4, 5, 5), (4, 3, 3, 3),
                          dict(groups=2, dilation=2, stride=2, padding=1, output_padding=1)),
    "asymmetric": ((1, 2, 4, 5), (2, 3, 4, 3),
                   dict(stride=(2, 3), padding=(1, 2, 0, 1), output_padding=(1, 2))),
    "depthwise": ((2, 4, 5, 6), (4, 1, 3, 3), dict(groups=4, stride=2, padding=1,
                                                   output_padding=1)),
    "pointwise": ((2, 5, 4, 3), (5, 3, 1, 1), dict()),
}


def _case_arrays(rng, x_shape, w_shape, c_out):
    return (rng.standard_normal(x_shape), rng.standard_normal(w_shape),
            rng.standard_normal(c_out))


def _numpy64(*arrays, requires_grad=False):
    return [gf.tensor(a, device="numpy", dtype=np.float64, requires_grad=requires_grad)
            for a in arrays]


# ---------------------------------------------------------------- forward --
@pytest.mark.parametrize("name", CONV_CASES)
def test_conv2d_forward_matches_naive_loop(name, rng):
    x_shape, w_shape, kwargs = CONV_CASES[name]
    x, w, b = _case_arrays(rng, x_shape, w_shape, w_shape[0])
    got = ops.conv2d(*_numpy64(x, w, b), **kwargs).numpy()
    np.testing.assert_allclose(got, naive_conv2d(x, w, b, **kwargs), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("name", TRANSPOSE_CASES)
def test_conv_transpose2d_forward_matches_naive_loop(name, rng):
    x_shape, w_shape, kwargs = TRANSPOSE_CASES[name]
    x, w, b = _case_arrays(rng, x_shape, w_shape, w_shape[1] * kwargs.get("groups", 1))
    got = ops.conv_transpose2d(*_numpy64(x, w, b), **kwargs).numpy()
    np.testing.assert_allclose(got, naive_conv_transpose2d(x, w, b, **kwargs),
                               rtol=1e-11, atol=1e-12)


def test_output_size_formula():
    # OH = floor((H + top + bottom - dh*(kh-1) - 1)/sh) + 1
    g = conv_geometry("conv2d", (1, 2, 11, 10), (3, 2, 3, 4), (2, 3), (1, 0, 2, 1), (2, 1), 1)
    assert (g.oh, g.ow) == ((11 + 1 - 4 - 1) // 2 + 1, (10 + 3 - 3 - 1) // 3 + 1) == (4, 4)
    y = ops.conv2d(gf.zeros((1, 2, 11, 10), device="numpy"), gf.zeros((3, 2, 3, 4), device="numpy"),
                   stride=(2, 3), padding=(1, 0, 2, 1), dilation=(2, 1))
    assert y.shape == (1, 3, 4, 4)


def test_float32_stays_float32(rng):
    x = gf.tensor(rng.standard_normal((1, 2, 5, 5)), device="numpy")
    w = gf.tensor(rng.standard_normal((3, 2, 3, 3)), device="numpy")
    b = gf.tensor(rng.standard_normal(3), device="numpy")
    assert ops.conv2d(x, w, b, padding=1, activation="relu").dtype == np.float32
    assert ops.conv_transpose2d(ops.conv2d(x, w), gf.tensor(rng.standard_normal((3, 2, 3, 3)),
                                                            device="numpy")).dtype == np.float32


# -------------------------------------------------------------- gradients --
@pytest.mark.parametrize("name", CONV_CASES)
def test_conv2d_gradients(name, rng):
    x_shape, w_shape, kwargs = CONV_CASES[name]
    gradcheck(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
              _case_arrays(rng, x_shape, w_shape, w_shape[0]))


@pytest.mark.parametrize("name", TRANSPOSE_CASES)
def test_conv_transpose2d_gradients(name, rng):
    x_shape, w_shape, kwargs = TRANSPOSE_CASES[name]
    gradcheck(lambda x, w, b: ops.conv_transpose2d(x, w, b, **kwargs),
              _case_arrays(rng, x_shape, w_shape, w_shape[1] * kwargs.get("groups", 1)))


def test_gradients_without_bias_and_for_a_subset(rng):
    x, w = rng.standard_normal((2, 3, 5, 6)), rng.standard_normal((4, 3, 3, 3))
    gradcheck(lambda x, w: ops.conv2d(x, w, stride=2, padding=1), [x, w])
    xt, wt = _numpy64(x, w)
    wt.requires_grad = True
    ops.conv2d(xt, wt, padding=1).sum().backward()
    assert xt.grad is None and wt.grad.shape == w.shape
    gradcheck(lambda x, w: ops.conv2d(x, w, padding=1), [x, w], requires_grad=[True, False])


def test_nothing_is_saved_without_a_graph(rng):
    x, w = _numpy64(rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3)),
                    requires_grad=True)
    op = Conv2dOp(padding=1, activation="relu")
    with gf.no_grad():
        op(x, w)
    assert (op.saved.x, op.saved.w, op.saved.y) == (None, None, None)
    op = Conv2dOp(padding=1)
    w.requires_grad = False
    op(x, w)
    assert op.saved.x is None and op.saved.w is not None     # gx needs w, not x


# ---------------------------------------------------------------- adjoint --
@pytest.mark.parametrize("name", [n for n in CONV_CASES if "multiplier" not in n])
def test_conv_transpose_is_the_adjoint_of_conv(name, rng):
    x_shape, w_shape, kwargs = CONV_CASES[name]
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y = ops.conv2d(*_numpy64(x, w), **kwargs).numpy()
    v = rng.standard_normal(y.shape)
    # output_padding restores the input rows a strided conv2d leaves unread.
    g = conv_geometry("conv2d", x_shape, w_shape, _pair(kwargs.get("stride", 1)),
                      normalize_padding("conv2d", kwargs.get("padding", 0)),
                      _pair(kwargs.get("dilation", 1)), kwargs.get("groups", 1))
    top, bottom, left, right = g.padding
    extra = ((g.h + top + bottom - g.dilation[0] * (g.kh - 1) - 1) % g.stride[0],
             (g.w + left + right - g.dilation[1] * (g.kw - 1) - 1) % g.stride[1])
    back = ops.conv_transpose2d(*_numpy64(v, w), output_padding=extra, **kwargs).numpy()
    assert back.shape == x.shape
    np.testing.assert_allclose(np.vdot(y, v), np.vdot(x, back), rtol=1e-11)


# -------------------------------------------------------- fused epilogue --
EPILOGUES = [("relu", False, True), ("relu6", True, True), (None, True, False),
             ("relu6", False, False), ("relu", True, False)]


@pytest.mark.parametrize("activation,residual,bias", EPILOGUES)
@pytest.mark.parametrize("case", ["basic", "depthwise3_s1", "pointwise"])
def test_fused_epilogue_matches_separate_ops(case, activation, residual, bias, rng):
    x_shape, w_shape, kwargs = CONV_CASES[case]
    x, w, b = _case_arrays(rng, x_shape, w_shape, w_shape[0])
    x *= 3                                      # reach past 6 so relu6 clips
    xt, wt, bt = _numpy64(x, w, b)
    plain = ops.conv2d(xt, wt, bt if bias else None, **kwargs)
    r = gf.tensor(rng.standard_normal(plain.shape), device="numpy", dtype=np.float64)
    want = plain + r if residual else plain
    want = {"relu": ops.relu, "relu6": ops.relu6, None: lambda t: t}[activation](want).numpy()
    got = ops.conv2d(xt, wt, bt if bias else None, activation=activation,
                     residual=r if residual else None, **kwargs).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if activation == "relu6":
        assert (got == 6).any() and (got == 0).any()


@pytest.mark.parametrize("activation", ["relu", "relu6"])
def test_fused_epilogue_gradients(activation, rng):
    x_shape, w_shape, kwargs = CONV_CASES["stride2_odd"]
    x, w, b = _case_arrays(rng, x_shape, w_shape, w_shape[0])
    r = 2 * rng.standard_normal((2, 5, 5, 4))
    gradcheck(lambda x, w, b, r: ops.conv2d(x, w, b, activation=activation, residual=r,
                                            **kwargs), [x * 2, w, b, r])


# ----------------------------------------------------------------- errors --
def _zeros(*shape):
    return gf.zeros(shape, device="numpy")


def test_channel_mismatch_names_both_counts():
    with pytest.raises(gf.ShapeError, match=r"conv2d: input has C_in=5 channels but the weight "
                                            r"\(8, 4, 3, 3\) with groups=1 expects "
                                            r"w.shape\[1\]\*groups = 4"):
        ops.conv2d(_zeros(1, 5, 8, 8), _zeros(8, 4, 3, 3))
    with pytest.raises(gf.ShapeError, match=r"conv_transpose2d: input has C_in=3 channels but "
                                            r"the weight \(4, 2, 3, 3\) expects w.shape\[0\] = 4"):
        ops.conv_transpose2d(_zeros(1, 3, 8, 8), _zeros(4, 2, 3, 3))


def test_groups_must_divide_channels():
    with pytest.raises(gf.ShapeError,
                       match=r"conv2d: groups=3 does not divide the 4 input channels"):
        ops.conv2d(_zeros(1, 4, 8, 8), _zeros(6, 1, 3, 3), groups=3)
    with pytest.raises(gf.ShapeError,
                       match=r"conv2d: groups=2 does not divide the 5 output channels"):
        ops.conv2d(_zeros(1, 4, 8, 8), _zeros(5, 2, 3, 3), groups=2)
    with pytest.raises(gf.ShapeError, match=r"conv_transpose2d: groups=2 does not divide the 3 "
                                            r"input channels"):
        ops.conv_transpose2d(_zeros(1, 3, 8, 8), _zeros(3, 2, 3, 3), groups=2)


def test_kernel_larger_than_padded_input():
    with pytest.raises(gf.ShapeError, match=r"conv2d: kernel extent 5x5 \(kernel 3x3, dilation "
                                            r"\(2, 2\)\) is larger than the padded input 6x4"):
        ops.conv2d(_zeros(1, 1, 4, 2), _zeros(1, 1, 3, 3), dilation=2, padding=(1, 1, 1, 1))


def test_input_must_be_4d_and_bias_and_residual_must_fit():
    with pytest.raises(gf.ShapeError, match=r"conv2d: input must be 4-D \[N, C, H, W\], "
                                            r"got shape \(3, 8, 8\)"):
        ops.conv2d(_zeros(3, 8, 8), _zeros(2, 3, 3, 3))
    with pytest.raises(gf.ShapeError, match=r"conv2d: weight must be 4-D"):
        ops.conv2d(_zeros(1, 3, 8, 8), _zeros(2, 3, 3))
    with pytest.raises(gf.ShapeError, match=r"conv2d: bias must have shape \(2,\) .*got \(3,\)"):
        ops.conv2d(_zeros(1, 3, 8, 8), _zeros(2, 3, 3, 3), _zeros(3))
    with pytest.raises(gf.ShapeError, match=r"conv2d: residual must have the output's shape "
                                            r"\(1, 2, 6, 6\), got \(1, 2, 8, 8\)"):
        ops.conv2d(_zeros(1, 3, 8, 8), _zeros(2, 3, 3, 3), residual=_zeros(1, 2, 8, 8))
    with pytest.raises(gf.ShapeError, match=r"conv_transpose2d: bias must have shape \(4,\)"):
        ops.conv_transpose2d(_zeros(1, 4, 8, 8), _zeros(4, 2, 3, 3), _zeros(3), groups=2)


def test_bad_parameters():
    x, w = _zeros(1, 2, 8, 8), _zeros(2, 2, 3, 3)
    with pytest.raises(ValueError, match=r"conv2d: padding must be an int, a pair"):
        ops.conv2d(x, w, padding=(1, 2, 3))
    with pytest.raises(ValueError, match=r"conv2d: padding must be at least 0"):
        ops.conv2d(x, w, padding=-1)
    with pytest.raises(ValueError, match=r"conv2d: stride must be at least 1"):
        ops.conv2d(x, w, stride=(1, 0))
    with pytest.raises(ValueError, match=r"conv2d: activation must be one of "
                                         r"\['none', 'relu', 'relu6'\] or None, got 'gelu'"):
        ops.conv2d(x, w, activation="gelu")
    with pytest.raises(ValueError, match=r"conv_transpose2d: output_padding \(2, 2\) must be "
                                         r"smaller than the stride \(2, 2\)"):
        ops.conv_transpose2d(x, w, stride=2, output_padding=2)


# ------------------------------------------------------ algorithm choice --
def _geometry(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1):
    return conv_geometry("conv2d", x_shape, w_shape, _pair(stride),
                         normalize_padding("conv2d", padding), _pair(dilation), groups)


@pytest.mark.parametrize("geometry,expected", [
    (((64, 32, 112, 112), (32, 1, 3, 3), 1, 1, 1, 32), Depthwise),
    (((64, 96, 112, 112), (96, 1, 3, 3), 2, 1, 1, 96), Depthwise),
    (((1, 8, 20, 20), (8, 1, 5, 5), 2, 2, 1, 8), Depthwise),
    (((1, 8, 20, 20), (8, 1, 9, 9), 1, 4, 1, 8), Im2colGemm),        # kernel too large
    (((1, 8, 20, 20), (8, 1, 3, 3), 3, 1, 1, 8), Im2colGemm),        # stride 3
    # Grouped, few channels per group: the direct kernel's forward, the GEMM's gradients.
    (((1, 8, 20, 20), (16, 1, 3, 3), 1, 1, 1, 8), (GroupedDirect, Im2colGemm)),  # multiplier 2
    (((64, 960, 7, 7), (320, 960, 1, 1), 1, 0, 1, 1), Pointwise),   # compute-bound 1x1
    (((1, 8, 20, 20), (16, 4, 1, 1), 1, 0, 1, 2), (GroupedDirect, Pointwise)),
    # Memory-bound products with groups 1: the forward after im2col by the direct kernel.
    (((1, 8, 20, 20), (16, 8, 1, 1), 2, 0, 1, 1), (Im2colDirect, Im2colGemm)),   # strided 1x1
    (((1, 8, 20, 20), (16, 8, 1, 1), 1, 1, 1, 1), (Im2colDirect, Im2colGemm)),   # padded 1x1
    (((64, 3, 224, 224), (64, 3, 3, 3), 1, 1, 1, 1), (Im2colDirect, Im2colGemm)),  # RGB input
    # Image channels and a small output (batch 1): the grouped kernel, as one group.
    (((1, 3, 224, 224), (64, 3, 3, 3), 1, 1, 1, 1), (GroupedDirect, Im2colGemm)),
    (((1, 5, 224, 224), (64, 5, 3, 3), 1, 1, 1, 1), (Im2colDirect, Im2colGemm)),    # 5 channels
    (((1, 64, 20, 20), (64, 64, 3, 3), 2, 1, 1, 1), Im2colGemm),      # K = 576: compute-bound
])
def test_planner_heuristic(geometry, expected):
    x_shape, w_shape, stride, padding, dilation, groups = geometry
    g = _geometry(x_shape, w_shape, stride, padding, dilation, groups)
    planner = ConvPlanner(autotune=False)
    forward, backward = expected if isinstance(expected, tuple) else (expected, expected)
    assert planner.choose(g, "forward") is forward
    for stage in ("backward_data", "backward_weight"):
        assert planner.choose(g, stage) is backward
    assert len(planner.cache) == 3


def test_planner_prefers_winograd_for_wide_3x3_layers():
    g = _geometry((64, 64, 224, 224), (64, 64, 3, 3), 1, 1, 1, 1)
    planner = ConvPlanner(autotune=False)
    assert planner.choose(g, "forward") is WinogradF4
    assert planner.choose(g, "backward_data") is WinogradF4
    assert planner.choose(g, "backward_weight") is Im2colGemm     # no Winograd weight gradient


# -------------------------------------------------------------------- GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("name", CONV_CASES)
def test_conv2d_cuda_matches_numpy(name, rng):
    x_shape, w_shape, kwargs = CONV_CASES[name]
    assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
                          _case_arrays(rng, x_shape, w_shape, w_shape[0]), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", TRANSPOSE_CASES)
def test_conv_transpose2d_cuda_matches_numpy(name, rng):
    x_shape, w_shape, kwargs = TRANSPOSE_CASES[name]
    assert_backends_match(lambda x, w, b: ops.conv_transpose2d(x, w, b, **kwargs),
                          _case_arrays(rng, x_shape, w_shape, w_shape[1] * kwargs.get("groups", 1)),
                          rtol=1e-4)


# Depthwise planes of every tile class (8, 16 and 32 wide), several tiles
# across and down, odd sizes, every compiled kernel/stride/dilation variant.
DEPTHWISE_PLANES = [(2, 3, 37, 41), (1, 5, 13, 15), (3, 7, 7, 5), (1, 2, 70, 9)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", DEPTHWISE_PLANES, ids=str)
@pytest.mark.parametrize("k,stride,dilation", [(3, 1, 1), (3, 2, 1), (5, 1, 1), (5, 2, 1),
                                               (3, 1, 2), (7, 2, 1), (3, (1, 2), 1)])
def test_depthwise_cuda_matches_numpy(shape, k, stride, dilation, rng):
    c = shape[1]
    kwargs = dict(stride=stride, padding=dilation * (k // 2), dilation=dilation, groups=c)
    g = _geometry(shape, (c, 1, k, k), **kwargs)
    assert Depthwise.supports(g)
    assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
                          _case_arrays(rng, shape, (c, 1, k, k), c), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["basic", "groups2", "depthwise3_s2", "depthwise5_s1",
                                  "pointwise", "pointwise_groups2"])
@pytest.mark.parametrize("activation,residual", [("relu6", False), ("relu", True),
                                                 (None, True), ("relu6", True)])
def test_fused_epilogue_cuda_matches_numpy(case, activation, residual, rng):
    x_shape, w_shape, kwargs = CONV_CASES[case]
    x, w, b = _case_arrays(rng, x_shape, w_shape, w_shape[0])
    out_shape = ops.conv2d(*_numpy64(x, w), **kwargs).shape
    inputs = [3 * x, w, b] + ([rng.standard_normal(out_shape)] if residual else [])

    def fn(x, w, b, *r):
        return ops.conv2d(x, w, b, activation=activation, residual=r[0] if r else None,
                          **kwargs)
    assert_backends_match(fn, inputs, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["basic", "groups2_stride2_dilation2", "pointwise",
                                  "pointwise_groups2", "1x1_stride2"])
def test_gemm_paths_in_several_chunks(case, rng):
    # A workspace of about two images' columns: chunks of 2, 2 and 1 images,
    # so the chunk offsets and the weight gradient's accumulation run.
    x_shape, w_shape, kwargs = CONV_CASES[case]
    x_shape = (5,) + x_shape[1:]
    g = _geometry(x_shape, w_shape, **kwargs)
    per_image = (g.c_in * g.kh * g.kw + g.c_out) * g.oh * g.ow * 4
    with override(conv_workspace_bytes=2 * per_image + 4):
        assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
                              _case_arrays(rng, x_shape, w_shape, w_shape[0]), rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["depthwise3_s2", "pointwise", "basic"])
def test_every_supporting_algorithm_matches_numpy(case, rng):
    # Force each algorithm in turn, not only the one the heuristic picks.
    x_shape, w_shape, kwargs = CONV_CASES[case]
    g = _geometry(x_shape, w_shape, **kwargs)
    for algorithm in (Depthwise, Pointwise, Im2colGemm):
        if not algorithm.supports(g):
            continue
        with override(conv_planner=_Fixed(algorithm)):
            assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
                                  _case_arrays(rng, x_shape, w_shape, w_shape[0]), rtol=1e-4)


class _Fixed:
    """A planner that always answers one algorithm."""

    def __init__(self, algorithm):
        self.algorithm = algorithm

    def choose(self, g, stage):
        return self.algorithm


@pytest.mark.gpu
def test_autotune_picks_a_supporting_algorithm(rng):
    planner = ConvPlanner(autotune=True)
    x_shape, w_shape, kwargs = CONV_CASES["pointwise"]
    with override(conv_planner=planner):
        assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
                              _case_arrays(rng, x_shape, w_shape, w_shape[0]), rtol=1e-4)
    assert planner.timings
    # The direct kernels: no weight gradient; after im2col, the forward only.
    direct = {"forward": {"pointwise_direct", "im2col_direct"},
              "backward_data": {"pointwise_direct"}, "backward_weight": set()}
    for (_, stage), times in planner.timings.items():
        assert set(times) == {"pointwise", "im2col_gemm"} | direct[stage]


# Real layers at batch 1: (x shape, w shape, keyword arguments).
REAL_LAYERS = {
    "mobilenetv2_stem_3x3s2": ((1, 3, 224, 224), (32, 3, 3, 3), dict(stride=2, padding=1)),
    "mobilenetv2_dw_32_112": ((1, 32, 112, 112), (32, 1, 3, 3), dict(padding=1, groups=32)),
    "mobilenetv2_dw_96_s2": ((1, 96, 112, 112), (96, 1, 3, 3),
                             dict(stride=2, padding=1, groups=96)),
    "mobilenetv2_dw_960_7": ((1, 960, 7, 7), (960, 1, 3, 3), dict(padding=1, groups=960)),
    "mobilenetv2_pw_96_24": ((1, 96, 56, 56), (24, 96, 1, 1), dict()),
    "mobilenetv2_pw_320_1280": ((1, 320, 7, 7), (1280, 320, 1, 1), dict()),
    "vgg16_64_64_56": ((1, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    "vgg16_512_512_14": ((1, 512, 14, 14), (512, 512, 3, 3), dict(padding=1)),
    "gdn_analysis_5x5s2": ((1, 3, 64, 64), (128, 3, 5, 5), dict(stride=2, padding=2)),
    "gdn_analysis_128": ((1, 128, 32, 32), (128, 128, 5, 5), dict(stride=2, padding=2)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", REAL_LAYERS)
def test_real_layer_shapes_cuda_matches_numpy(name, rng):
    x_shape, w_shape, kwargs = REAL_LAYERS[name]
    fan_in = w_shape[1] * w_shape[2] * w_shape[3]
    x, w, b = _case_arrays(rng, x_shape, w_shape, w_shape[0])
    assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
                          [x, w / np.sqrt(fan_in), b], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("x_shape,w_shape", [((1, 192, 16, 16), (192, 128, 5, 5)),
                                             ((2, 128, 32, 32), (128, 3, 5, 5))], ids=str)
def test_gdn_synthesis_transposed_conv_cuda_matches_numpy(x_shape, w_shape, rng):
    x, w, b = _case_arrays(rng, x_shape, w_shape, w_shape[1])
    assert_backends_match(
        lambda x, w, b: ops.conv_transpose2d(x, w, b, stride=2, padding=2, output_padding=1),
        [x, w / np.sqrt(w_shape[0] * 25), b], rtol=1e-4)


# ------------------------------------ depthwise forward: tiling arithmetic --

# MobileNetV2's depthwise layers (channels, input size, stride), 3x3 padding 1.
MOBILENET_DEPTHWISE = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                       (192, 28, 2), (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]


def _strip_rows_staged(plan, h, oh, kh, sh, dh, pad_top, strip):
    """The input rows [a, b) strip_of in depthwise.cu stages for a strip."""
    r0 = strip * plan.strip_rows
    r1 = min(r0 + plan.strip_rows, oh)
    a = max(r0 * sh - pad_top, 0)
    b = min((r1 - 1) * sh - pad_top + (kh - 1) * dh + 1, h)
    return r0, r1, a, b


def _check_forward_plan(plan, planes, h, w, oh, ow, kh, sh, dh, pad_top, sw, x_align, y_align):
    assert plan is not None
    assert plan.threads % 32 == 0 and plan.threads <= depthwise_module.FORWARD_THREADS
    per_plane = plan.row_groups * plan.col_groups
    assert plan.planes_per_block * per_plane <= plan.threads
    assert plan.shared_bytes <= depthwise_module.SHARED_LIMIT
    assert plan.col_groups * plan.out_cols >= ow > (plan.col_groups - 1) * plan.out_cols
    assert plan.row_groups * plan.rpt >= plan.strip_rows
    assert plan.strips * plan.strip_rows >= oh > (plan.strips - 1) * plan.strip_rows
    assert plan.blocks == -(-planes // plan.planes_per_block) * plan.strips
    # Vector widths divide what they step over and the addresses.
    assert w % plan.vec_in == 0 and (plan.out_cols * sw) % plan.vec_in == 0
    assert ow % plan.vec_out == 0 and plan.out_cols % plan.vec_out == 0
    assert x_align % plan.vec_copy == 0 and y_align % plan.vec_out == 0
    assert plan.tile_floats % plan.vec_copy == 0 and plan.tile_floats % w == 0
    for strip in range(plan.strips):
        r0, r1, a, b = _strip_rows_staged(plan, h, oh, kh, sh, dh, pad_top, strip)
        assert r0 < r1
        if b > a:
            assert (b - a) * w <= plan.tile_floats
            # Every staged run starts and ends on a vector boundary.
            assert (a * w) % plan.vec_copy == 0 and ((b - a) * w) % plan.vec_copy == 0
            if plan.vec_copy > 1 and w % plan.vec_copy:
                assert plan.strips == 1 and a == 0 and b == h      # whole planes, contiguous
        # Every input row an output of the strip reads is staged (or outside the image).
        for oh_ in range(r0, r1):
            for i in range(kh):
                ih = oh_ * sh - pad_top + i * dh
                assert not 0 <= ih < h or a <= ih < b


@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("channels,size,stride", MOBILENET_DEPTHWISE)
def test_depthwise_plan_for_mobilenet_layers(batch, channels, size, stride):
    planes, out = batch * channels, (size + 2 - 3) // stride + 1
    plan = depthwise_module.forward_plan(planes, size, size, out, out, 3, stride, 1, 1, stride,
                                         4, 4, 132)
    _check_forward_plan(plan, planes, size, size, out, out, 3, stride, 1, 1, stride, 4, 4)
    if size >= 14:                      # 16-byte copies wherever a plane has 4k floats
        assert plan.vec_copy == 4
    if out >= 14:                       # and 8- or 16-byte stores of even rows
        assert plan.vec_out >= 2
    if batch == 64:                     # enough blocks for every SM, several resident each
        assert plan.blocks >= 4 * 132 and plan.threads >= 192
    # backward-data at stride 1 through the same kernel (flipped filter, padding 1)
    if stride == 1:
        back = depthwise_module.forward_plan(planes, out, out, size, size, 3, 1, 1, 1, 1, 4, 4, 132)
        _check_forward_plan(back, planes, out, out, size, size, 3, 1, 1, 1, 1, 4, 4)


@pytest.mark.parametrize("h,w,k,s,d,pad_top", [
    (13, 11, 3, 1, 1, 1), (37, 41, 7, 2, 1, 3), (70, 9, 5, 1, 2, 4), (9, 1100, 3, 1, 1, 1),
    (300, 300, 3, 2, 1, 1), (8, 9, 3, 2, 1, 0), (6, 7, 3, 1, 1, -1), (2, 2, 1, 1, 1, 0),
    (40, 2047, 3, 1, 1, 1), (5, 5, 5, 1, 2, 6), (30, 3001, 3, 1, 1, 1), (40, 1920, 5, 1, 1, 2)])
@pytest.mark.parametrize("planes", [1, 7, 1000])
@pytest.mark.parametrize("align", [1, 2, 4])
def test_depthwise_plan_arithmetic(h, w, k, s, d, pad_top, planes, align):
    # pad_top < 0 and padding past the kernel: backward-data's flipped geometry.
    bottom = max(pad_top, 0)
    oh = (h + pad_top + bottom - d * (k - 1) - 1) // s + 1
    ow = (w + 2 * max(pad_top, 0) - d * (k - 1) - 1) // s + 1
    plan = depthwise_module.forward_plan(planes, h, w, oh, ow, k, s, d, pad_top, s, align, align,
                                         132)
    _check_forward_plan(plan, planes, h, w, oh, ow, k, s, d, pad_top, s, align, align)


def test_depthwise_plan_refuses_what_no_tiling_fits():
    # Rows of more than 4096 outputs (256 threads of 16), and a 7x7 stride-2
    # kernel on 1920-wide rows (7 staged rows of one thread: 53 KB).
    assert depthwise_module.forward_plan(1, 3, 4100, 3, 4100, 3, 1, 1, 1, 1) is None
    assert depthwise_module.forward_plan(1, 40, 1920, 20, 960, 7, 2, 1, 3, 2) is None
    for g in (_geometry((1, 2, 3, 4100), (2, 1, 3, 3), 1, 1, 1, 2),
              _geometry((1, 2, 40, 1920), (2, 1, 7, 7), 2, 3, 1, 2)):
        assert not Depthwise.supports(g)
        assert ConvPlanner(autotune=False).choose(g, "forward") is Im2colGemm
    # 3x3 on a 4K row: one output row per thread, 16 outputs across, 48 KB.
    plan = depthwise_module.forward_plan(8, 2160, 3840, 2160, 3840, 3, 1, 1, 1, 1, 4, 4)
    assert (plan.rpt, plan.out_cols) == (1, 16)
    assert plan.shared_bytes > depthwise_module.FORWARD_SHARED_BYTES


# ------------------------------------ depthwise forward: CUDA code on host --


# After it: every block of a launch, each staging all its threads' copies into
# a poisoned shared tile, then running all its threads' outputs; blocks and
# threads in reverse order when `backwards` (a write that lands in another
# block's outputs then survives, as it may on the GPU).
_DW_SHIM = """
extern "C" int host_depthwise_forward(int backwards, int blocks, int threads, int shared_bytes,
        const storage_t* x, const storage_t* w, const storage_t* bias, storage_t* y,
        int planes, int C, int H, int W, int OH, int OW, int pad_top, int act,
        int planes_per_block, int strip_rows, int strips, int tile_floats,
        int row_groups, int col_groups) {
    host_faults = 0;
    const int values = shared_bytes / (int)sizeof(storage_t) + 8;
    storage_t* shared = static_cast<storage_t*>(
        std::aligned_alloc(16, (sizeof(storage_t) * values + 15) / 16 * 16));
    for (int i = 0; i < blocks; ++i) {
        const int b = backwards ? blocks - 1 - i : i;
        for (int k = 0; k < values; ++k) shared[k] = store_value(NAN);
        const Strip s = strip_of(b, planes, H, OH, pad_top, planes_per_block, strip_rows, strips);
        for (int t = 0; t < threads; ++t) stage_strip(x, shared, s, t, threads, H, W, tile_floats);
        for (int k = 0; k < threads; ++k)
            compute_strip(shared, w, bias, y, s, backwards ? threads - 1 - k : k, C, H, W, OH, OW,
                          pad_top, act, tile_floats, row_groups, col_groups);
    }
    std::free(shared);
    return host_faults;
}
"""


@pytest.fixture(scope="module")
def depthwise_host_build(tmp_path_factory):
    """defines -> depthwise.cu built for the host with the shim (compiled on first use)."""
    return host_builder(tmp_path_factory.mktemp("depthwise_host"), "depthwise.cu",
                        HOST_CHECK_PRELUDE, _DW_SHIM)


@pytest.fixture
def depthwise_on_host(depthwise_host_build, simulate):
    """Depthwise's module launches depthwise_forward on the host build; returns the launches.

    ``launched.backwards = True`` runs blocks and threads in reverse order;
    ``launched.device`` is the simulated device (its ``sm_count`` may be changed).
    """
    def check(defines, grid, block, shared_bytes):
        assert grid[1:] == (1, 1) and block[1:] == (1, 1) and block[0] <= 256
        assert shared_bytes <= depthwise_module.SHARED_LIMIT

    launched = LaunchRecord()
    kernel = host_kernel(launched, depthwise_module.SOURCE, "depthwise_forward",
                         depthwise_host_build, check, extra_ints=lambda shared: (shared,))
    launched.device = simulate(kernel, sm_count=132)
    return launched


# (x shape, kernel, stride, padding, dilation): every path of forward_plan.
DEPTHWISE_HOST_CASES = {
    "mnv2_112_s1_strips": ((2, 3, 112, 112), 3, 1, 1, 1),
    "mnv2_112_s2_strips": ((1, 3, 112, 112), 3, 2, 1, 1),
    "mnv2_56_s2": ((2, 3, 56, 56), 3, 2, 1, 1),
    "mnv2_28_s1": ((2, 5, 28, 28), 3, 1, 1, 1),
    "mnv2_14_s2": ((3, 5, 14, 14), 3, 2, 1, 1),
    "mnv2_7_s1": ((2, 5, 7, 7), 3, 1, 1, 1),
    "odd_13x11": ((2, 3, 13, 11), 3, 1, 1, 1),
    "k5_s2_odd": ((2, 3, 19, 23), 5, 2, 2, 1),
    "k7_s2": ((1, 2, 37, 41), 7, 2, 3, 1),
    "dilation2_k5": ((1, 3, 30, 26), 5, 1, 4, 2),
    "asymmetric": ((1, 3, 8, 9), 3, 2, (0, 1, 0, 1), 1),
    "rect_stride_1_2": ((2, 2, 17, 30), 3, (1, 2), 1, 1),
    "rect_stride_2_1": ((2, 2, 30, 17), 3, (2, 1), 1, 1),
    "padding_past_kernel": ((1, 2, 6, 8), 3, 1, 3, 1),      # backward padding -1
    "tall_narrow": ((1, 2, 70, 9), 5, 1, 2, 1),
    "wide_row": ((1, 1, 4, 1100), 3, 1, 1, 1),                # 8 outputs per thread
    "wider_row": ((1, 1, 10, 3000), 3, 1, 1, 1),              # 16 across, 48 KB budget
    "single_pixel": ((1, 3, 1, 1), 3, 1, 1, 1),
}


@pytest.mark.parametrize("case", DEPTHWISE_HOST_CASES)
@pytest.mark.parametrize("sm_count", [132, 1])               # 1: many planes per block
def test_depthwise_cuda_code_on_host_matches_numpy(case, sm_count, depthwise_on_host, rng):
    depthwise_on_host.device.sm_count = sm_count
    depthwise_on_host.backwards = sm_count == 1
    x_shape, k, stride, padding, dilation = DEPTHWISE_HOST_CASES[case]
    c = x_shape[1]
    g = _geometry(x_shape, (c, 1, k, k), stride, padding, dilation, c)
    assert Depthwise.supports(g)
    x, w, b = 3 * rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape), \
        rng.standard_normal(c)
    want = epilogue_numpy(NumpyConv.forward(g, x, w), b, None, 2)
    y = Depthwise.forward(g, HostArray(g.x_shape, x), HostArray(g.w_shape, w),
                          HostArray(b.shape, b), 2)
    got = y.get()
    # float32 rounding, measured against the clipped output (a single pixel may clip to
    # one small value): an index slip is O(1); NaN (an unwritten output) fails too.
    assert relative_error(got, want) <= 1e-4
    assert y.guards_untouched()
    if got.size > 50:
        assert (got == 6).any() and (got == 0).any()
    assert depthwise_on_host[-1]["FLIP"] == 0
    if g.stride == (1, 1):                              # backward-data through the forward kernel
        gy = rng.standard_normal(g.y_shape)
        gx = Depthwise.backward_data(g, HostArray(g.y_shape, gy), HostArray(g.w_shape, w))
        assert relative_error(gx.get(), NumpyConv.backward_data(g, gy, w)) <= 1e-5
        assert gx.guards_untouched() and depthwise_on_host[-1]["FLIP"] == 1


@pytest.mark.parametrize("offset", [1, 2])
def test_depthwise_cuda_code_on_host_unaligned_input(offset, depthwise_on_host, rng):
    # A view starting 4 or 8 bytes past a 16-byte boundary: narrower copies.
    g = _geometry((2, 3, 56, 56), (3, 1, 3, 3), 1, 1, 1, 3)
    x, w = rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    got = Depthwise.forward(g, HostArray(g.x_shape, x, offset), HostArray(g.w_shape, w)).get()
    assert depthwise_on_host[-1]["VEC_COPY"] == offset
    assert relative_error(got, NumpyConv.forward(g, x, w)) <= 1e-5


# Cases whose staged rows are whole 16-byte pieces when x is aligned: the copies' width then
# follows x's alignment alone.
DEPTHWISE_16_BIT_HOST_CASES = ["mnv2_112_s1_strips", "mnv2_112_s2_strips", "mnv2_56_s2",
                               "mnv2_28_s1", "wide_row"]


@pytest.mark.parametrize("case", DEPTHWISE_16_BIT_HOST_CASES)
@pytest.mark.parametrize("offset,vec_copy", [(0, 4), (4, 2), (2, 1)])
def test_depthwise_16_bit_cuda_code_on_host_matches_the_emulation(case, offset, vec_copy,
                                                                  depthwise_on_host, rng):
    # The fp16 build (-DSTORAGE_FP16) run on the host: its tile staged as 16-bit values
    # (cp.async of 8 or 4 bytes, or one value at a time, as x's alignment allows: x starts
    # offset values past a 16-byte boundary), widened to float32 as it is read.
    f16 = np.dtype(np.float16)
    x_shape, k, stride, padding, dilation = DEPTHWISE_HOST_CASES[case]
    c = x_shape[1]
    g = _geometry(x_shape, (c, 1, k, k), stride, padding, dilation, c)
    x = (3 * rng.standard_normal(g.x_shape)).astype(f16)
    w, b = rng.standard_normal(g.w_shape).astype(f16), rng.standard_normal(c).astype(f16)
    want = gf.precision.emulate(
        lambda x, w, b: epilogue_numpy(NumpyConv.forward(g, x, w), b, None, 2), x, w, b)
    y = Depthwise.forward(g, HostArray(g.x_shape, x, offset, f16),
                          HostArray(g.w_shape, w, dtype=f16), HostArray(b.shape, b, dtype=f16), 2)
    launch = depthwise_on_host[-1]
    assert launch["STORAGE_FP16"] == 1 and launch["VEC_COPY"] == vec_copy
    assert y.dtype == f16 and y.guards_untouched()
    # One rounding of float32 sums taken in another order: at most one unit apart.
    assert relative_error(y.get().astype(np.float32), want.astype(np.float32)) <= 2.0 ** -10


# -------------------------------------------- depthwise forward on the GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("channels,size,stride", MOBILENET_DEPTHWISE)
def test_depthwise_cuda_matches_numpy_on_mobilenet_layers(channels, size, stride, rng):
    # Batch 2 of the real layer with its bias, gradients too. No activation at
    # this size: among millions of outputs a few lie within float32 rounding
    # of 0, where relu's gradient may differ between the backends (the fused
    # activations are checked at small sizes above).
    x_shape = (2, channels, size, size)
    kwargs = dict(stride=stride, padding=1, groups=channels)
    x, w, b = _case_arrays(rng, x_shape, (channels, 1, 3, 3), channels)
    assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs), [x, w / 3, b],
                          rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", DEPTHWISE_HOST_CASES)
@pytest.mark.parametrize("sm_count", [None, 1])              # 1: many planes per block
def test_depthwise_cuda_matches_numpy_on_every_tiling(case, sm_count, rng):
    x_shape, k, stride, padding, dilation = DEPTHWISE_HOST_CASES[case]
    c = x_shape[1]
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=c)
    x, w, b = _case_arrays(rng, x_shape, (c, 1, k, k), c)
    with _gpu_reporting_sms(sm_count):
        assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs), [x, w, b],
                              rtol=1e-4)


class _RuntimeReportingSms:
    """The GPU's runtime, with ``sm_count`` reported as given (every other attribute,
    read or written, is the runtime's)."""

    def __init__(self, runtime, sm_count):
        object.__setattr__(self, "_runtime", runtime)
        object.__setattr__(self, "sm_count", sm_count)

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    def __setattr__(self, name, value):
        setattr(self._runtime, name, value)


def _gpu_reporting_sms(sm_count):
    """A block in which the algorithms run on the GPU but see ``sm_count`` multiprocessors
    (None: the device's own count, nothing simulated)."""
    if sm_count is None:
        return contextlib.nullcontext()
    from gdnflow.backends.cuda import kernels       # PyCUDA: GPU tests only
    runtime = _RuntimeReportingSms(kernels.get_runtime(), sm_count)
    device = types.SimpleNamespace(kernel=kernels.kernel, launch_grid=kernels.launch_grid,
                                   get_runtime=lambda: runtime)
    return cuda.simulated(device)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 2])
def test_depthwise_cuda_with_an_unaligned_input(offset, rng):
    g = _geometry((3, 4, 28, 28), (4, 1, 3, 3), 1, 1, 1, 4)
    x, w = (rng.standard_normal(g.x_shape).astype(np.float32),
            rng.standard_normal(g.w_shape).astype(np.float32))
    runtime = cuda.get_runtime()
    base = runtime.from_numpy(np.concatenate([np.zeros(offset, np.float32), x.ravel()]))
    view = base.offset(offset, g.x_shape)
    got = Depthwise.forward(g, view, runtime.from_numpy(w)).get()
    want = NumpyConv.forward(g, x.astype(np.float64), w.astype(np.float64))
    assert relative_error(got, want) <= 1e-4


def test_depthwise_alignment_in_floats():
    arrays = [types.SimpleNamespace(ptr=p) for p in (0, 4, 8, 12, 16, 24, 6, 1 << 40)]
    assert [depthwise_module.alignment(a) for a in arrays] == [4, 1, 2, 1, 4, 2, 1, 4]
