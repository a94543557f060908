"""The grouped convolution's direct kernel (cuda_src/grouped.cu): its CUDA code run on
the host against the NumPy reference (every block and thread, no GPU needed), the
planner's choice, and the GPU against NumPy."""
import numpy as np
import pytest

from gdnflow import ops
from gdnflow.config import override
from gdnflow.ops.conv.algorithms import grouped as grouped_module
from gdnflow.ops.conv.algorithms.grouped import GroupedDirect, outputs_per_thread, pixel_tiling
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm
from gdnflow.ops.conv.algorithms.pointwise import Im2colDirect
from gdnflow.ops.conv.epilogue import epilogue_numpy
from gdnflow.ops.conv.geometry import conv_geometry, normalize_padding
from gdnflow.ops.conv.planning import ConvPlanner
from gdnflow.ops.conv.reference import NumpyConv
from gdnflow.precision import emulate
from gdnflow.testing import assert_backends_match, relative_error
from host_kernels import HOST_CHECK_PRELUDE, HostArray, LaunchRecord, host_builder, host_kernel


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _geometry(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1):
    return conv_geometry("conv2d", x_shape, w_shape, _pair(stride),
                         normalize_padding("conv2d", padding), _pair(dilation), groups)


# (x shape, C_out, groups, kernel, stride, padding, dilation): RegNet's and ResNeXt's
# layers shrunk, a channel multiplier, 1x1, 5x5 and 7x7, strides and dilation, odd sizes,
# planes of one to several blocks.
GROUPED_CASES = {
    "regnet_8_per_group": ((2, 24, 13, 11), 24, 3, 3, 1, 1, 1),
    "regnet_stride2": ((2, 16, 15, 17), 16, 2, 3, 2, 1, 1),
    "resnext_4_per_group": ((1, 32, 9, 10), 32, 8, 3, 1, 1, 1),
    "wider_outputs": ((1, 12, 7, 9), 24, 3, 3, 1, 1, 1),          # OG 8 from CG 4
    "channel_multiplier": ((2, 6, 8, 9), 12, 6, 3, 1, 1, 1),      # CG 1, OG 2
    "odd_outputs_per_group": ((1, 9, 6, 7), 6, 3, 3, 1, 1, 1),    # OG 2, CG 3
    "pointwise_grouped": ((2, 16, 5, 6), 8, 4, 1, 1, 0, 1),
    "k5_dilation2": ((1, 8, 19, 14), 8, 2, 5, 1, 4, 2),
    "k7_stride2_asymmetric": ((1, 8, 20, 23), 16, 2, 7, (2, 1), (3, 2, 1, 3), 1),
    "many_pixel_tiles": ((1, 8, 40, 37), 8, 2, 3, 1, 1, 1),       # 1480 pixels: 6 blocks
    "single_pixel": ((3, 8, 1, 1), 8, 2, 3, 1, 1, 1),
    # Ungrouped first layers on image channels: RGB 3x3/2 (SqueezeNet, MobileNet),
    # RGB 7x7/2 (ResNet, GoogLeNet), gray 5x5/2 with 4 outputs, RGBA with 12.
    "rgb_stem_3x3_stride2": ((2, 3, 17, 19), 16, 1, 3, 2, 1, 1),
    "rgb_stem_7x7_stride2": ((1, 3, 23, 21), 8, 1, 7, 2, 3, 1),
    "gray_stem_5x5": ((2, 1, 11, 13), 4, 1, 5, 2, 2, 1),
    "rgba_stem_12_outputs": ((1, 4, 9, 8), 12, 1, 3, 1, 1, 1),
}


def _case(name):
    x_shape, c_out, groups, k, stride, padding, dilation = GROUPED_CASES[name]
    w_shape = (c_out, x_shape[1] // groups, k, k)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    return x_shape, w_shape, kwargs


# ---------------------------------------------------------- CUDA code on the host --
# Every block of a launch stages the chunk's weights into a poisoned buffer (every
# thread its share), then computes every thread's pixel; blocks and threads in reverse
# order when `backwards`.
_SHIM = """
extern "C" int host_grouped_conv_forward(int backwards, int blocks, int threads,
        const storage_t* x, const storage_t* w, const storage_t* bias, const storage_t* residual,
        storage_t* y,
        int c_in, int h, int wd, int c_out, int oh, int ow, int pad_top, int pad_left,
        int og, int pixel_tiles, int activation) {
    host_faults = 0;
    std::vector<float> weights(CG * KH * KW * OPT);
    for (int i = 0; i < blocks; ++i) {
        const GroupedBlock b = grouped_block(backwards ? blocks - 1 - i : i, c_out, og,
                                             pixel_tiles);
        for (float& v : weights) v = NAN;
        for (int t = 0; t < threads; ++t) stage_grouped_weights(w, weights.data(), b.o0, t, threads);
        for (int k = 0; k < threads; ++k) {
            const int p = b.tile * threads + (backwards ? threads - 1 - k : k);
            if (p < oh * ow)
                compute_grouped_pixel(x, weights.data(), bias, residual, y, b, p, c_in, h, wd,
                                      c_out, oh, ow, pad_top, pad_left, activation);
        }
    }
    return host_faults;
}
"""


@pytest.fixture(scope="module")
def grouped_host_build(tmp_path_factory):
    """defines -> grouped.cu built for the host with the shim (compiled on first use)."""
    return host_builder(tmp_path_factory.mktemp("grouped_host"), "grouped.cu",
                        HOST_CHECK_PRELUDE, _SHIM)


@pytest.fixture
def grouped_on_host(grouped_host_build, simulate):
    """GroupedDirect launches grouped_conv_forward on the host build; returns the launches."""
    def check(defines, grid, block, shared_bytes):
        assert grid[1:] == (1, 1) and block[1:] == (1, 1)
        assert block[0] % 32 == 0 and block[0] <= grouped_module.MAX_THREADS
        assert 4 * defines["CG"] * defines["KH"] * defines["KW"] * defines["OPT"] \
            <= grouped_module.SHARED_LIMIT

    launched = LaunchRecord()
    simulate(host_kernel(launched, grouped_module.SOURCE, "grouped_conv_forward",
                         grouped_host_build, check))
    return launched


@pytest.mark.parametrize("name", GROUPED_CASES)
@pytest.mark.parametrize("backwards", [False, True])
def test_grouped_cuda_code_on_host_matches_numpy(name, backwards, grouped_on_host, rng):
    grouped_on_host.backwards = backwards
    x_shape, w_shape, kwargs = _case(name)
    g = _geometry(x_shape, w_shape, **kwargs)
    assert GroupedDirect.supports(g)
    x, w = 3 * rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    b, r = rng.standard_normal(g.c_out), rng.standard_normal(g.y_shape)
    want = epilogue_numpy(NumpyConv.forward(g, x, w), b, r, 2)
    y = GroupedDirect.forward(g, HostArray(g.x_shape, x), HostArray(g.w_shape, w),
                              HostArray(b.shape, b), 2, residual=HostArray(r.shape, r))
    got = y.get()
    # An index slip is O(1); NaN (an unwritten output, an unstaged weight) fails too.
    assert relative_error(got, want) <= 1e-5
    assert y.guards_untouched()
    launch = grouped_on_host[-1]
    assert (launch["CG"], launch["OPT"]) == (g.c_in // g.groups, outputs_per_thread(g))
    assert (launch["SH"], launch["SW"], launch["KH"]) == (*g.stride, g.kh)


@pytest.mark.parametrize("name", ["regnet_stride2", "k7_stride2_asymmetric",
                                  "rgb_stem_3x3_stride2", "rgba_stem_12_outputs"])
def test_grouped_16_bit_cuda_code_on_host_matches_the_emulation(name, grouped_on_host, rng):
    # The fp16 build (-DSTORAGE_FP16) run on the host, with bias, residual and relu6:
    # float32 sums, each output rounded once, as the emulation computes.
    f16 = np.dtype(np.float16)
    x_shape, w_shape, kwargs = _case(name)
    g = _geometry(x_shape, w_shape, **kwargs)
    x, w = (3 * rng.standard_normal(g.x_shape)).astype(f16), \
        rng.standard_normal(g.w_shape).astype(f16)
    b, r = rng.standard_normal(g.c_out).astype(f16), rng.standard_normal(g.y_shape).astype(f16)
    want = emulate(lambda x, w, b, r: epilogue_numpy(NumpyConv.forward(g, x, w), b, r, 2),
                   x, w, b, r)
    y = GroupedDirect.forward(g, HostArray(g.x_shape, x, dtype=f16),
                              HostArray(g.w_shape, w, dtype=f16), HostArray(b.shape, b, dtype=f16),
                              2, residual=HostArray(r.shape, r, dtype=f16))
    assert grouped_on_host[-1]["STORAGE_FP16"] == 1
    assert y.dtype == f16 and y.guards_untouched()
    assert relative_error(y.get().astype(np.float32), want.astype(np.float32)) <= 2.0 ** -10


def test_grouped_without_bias_or_activation_on_host(grouped_on_host, rng):
    x_shape, w_shape, kwargs = _case("regnet_stride2")
    g = _geometry(x_shape, w_shape, **kwargs)
    x, w = rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    got = GroupedDirect.forward(g, HostArray(g.x_shape, x), HostArray(g.w_shape, w)).get()
    assert relative_error(got, NumpyConv.forward(g, x, w)) <= 1e-5


# ------------------------------------------------------------------- the tiling --
@pytest.mark.parametrize("pixels,expected", [(1, (32, 1)), (49, (64, 1)), (196, (224, 1)),
                                             (256, (256, 1)), (257, (160, 2)),
                                             (3136, (256, 13)), (12544, (256, 49))])
def test_pixel_tiling(pixels, expected):
    threads, tiles = pixel_tiling(pixels)
    assert (threads, tiles) == expected
    assert threads * tiles >= pixels > threads * (tiles - 1) - 32


@pytest.mark.parametrize("og,cg,k,expected", [(8, 8, 3, 8), (4, 4, 3, 4), (24, 8, 3, 8),
                                              (2, 1, 3, 2), (6, 3, 3, 2), (3, 3, 3, 1),
                                              (8, 64, 7, 2), (8, 300, 7, None)])
def test_outputs_per_thread(og, cg, k, expected):
    groups = 2
    g = _geometry((1, cg * groups, 9, 9), (og * groups, cg, k, k), padding=k // 2, groups=groups)
    assert outputs_per_thread(g) == expected
    assert GroupedDirect.supports(g) == (expected is not None)


# -------------------------------------------------------------- planner's choice --
@pytest.mark.parametrize("x_shape,w_shape,groups,forward", [
    ((32, 48, 56, 56), (48, 8, 3, 3), 6, GroupedDirect),         # RegNetY-400MF stage 1
    ((1, 440, 7, 7), (440, 8, 3, 3), 55, GroupedDirect),          # ... stage 4, batch 1
    ((1, 8, 20, 20), (16, 1, 3, 3), 8, GroupedDirect),            # channel multiplier 2
    ((8, 128, 28, 28), (128, 32, 3, 3), 4, Im2colGemm),           # 32 channels per group
])
def test_planner_prefers_the_grouped_kernel_for_narrow_groups(x_shape, w_shape, groups, forward):
    g = _geometry(x_shape, w_shape, 1, 1, 1, groups)
    planner = ConvPlanner(autotune=False)
    assert planner.choose(g, "forward") is forward
    # Forward only: the gradients stay with im2col + GEMM.
    assert planner.choose(g, "backward_data") is Im2colGemm
    assert planner.choose(g, "backward_weight") is Im2colGemm


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,forward", [
    ((1, 3, 224, 224), (64, 3, 3, 3), 2, 0, GroupedDirect),       # SqueezeNet 1.1's stem
    ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3, GroupedDirect),       # ResNet's and GoogLeNet's
    ((8, 1, 64, 64), (32, 1, 3, 3), 1, 1, GroupedDirect),         # a gray image
    ((8, 5, 64, 64), (32, 5, 3, 3), 1, 1, Im2colDirect),          # past MAX_STEM_CHANNELS
    ((32, 3, 224, 224), (16, 3, 3, 3), 2, 1, GroupedDirect),      # MobileNetV3's, 173 M
    # Past MAX_STEM_MULTIPLY_ADDS, where the im2col paths were faster: MobileNetV2's at
    # batch 32 (347 million) and the codec's at 768x512 (943 million) ...
    ((32, 3, 224, 224), (32, 3, 3, 3), 2, 1, Im2colDirect),
    ((1, 3, 512, 768), (128, 3, 5, 5), 2, 2, Im2colGemm),
    # ... but not on an output plane of an odd size up to MAX_ODD_PLANE_STEM_MULTIPLY_ADDS:
    # SqueezeNet's 111x111 at batch 32 and 64 (681 million, 1.36 billion), not at 128
    # (2.7 billion), and not past 3x3 windows (a 7x7 layer at 111x111, 1.2 billion at
    # batch 8).
    ((32, 3, 224, 224), (64, 3, 3, 3), 2, 0, GroupedDirect),
    ((64, 3, 224, 224), (64, 3, 3, 3), 2, 0, GroupedDirect),
    ((128, 3, 224, 224), (64, 3, 3, 3), 2, 0, Im2colDirect),
    ((8, 3, 224, 224), (64, 3, 7, 7), 2, 2, Im2colGemm),
])
def test_planner_runs_first_layers_on_image_channels_directly(x_shape, w_shape, stride, padding,
                                                             forward):
    g = _geometry(x_shape, w_shape, stride, padding)
    planner = ConvPlanner(autotune=False)
    assert planner.choose(g, "forward") is forward
    assert planner.choose(g, "backward_data") is not GroupedDirect
    assert planner.choose(g, "backward_weight") is not GroupedDirect


def test_grouped_kernel_refuses_what_it_does_not_compile():
    assert not GroupedDirect.supports(_geometry((1, 8, 9, 9), (8, 1, 3, 3), 1, 1, 1, 8))  # depthwise
    assert not GroupedDirect.supports(_geometry((1, 8, 9, 9), (8, 8, 3, 3), 1, 1, 1, 1))  # groups 1
    assert not GroupedDirect.supports(_geometry((1, 8, 20, 20), (8, 4, 9, 9), 1, 4, 1, 2))
    assert not GroupedDirect.supports(_geometry((1, 8, 20, 20), (8, 4, 3, 3), 3, 1, 1, 2))
    assert not GroupedDirect.supports(_geometry((1, 8, 20, 20), (8, 4, 3, 3), 1, 3, 3, 2))


# ------------------------------------------------------------------------- GPU --
class _Fixed:
    """A planner that answers GroupedDirect for the forward, the heuristic otherwise."""

    def __init__(self):
        self.heuristic = ConvPlanner(autotune=False)

    def choose(self, g, stage):
        return GroupedDirect if stage == "forward" else self.heuristic.choose(g, stage)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GROUPED_CASES)
@pytest.mark.parametrize("activation,residual", [(None, False), ("relu", True)])
def test_grouped_cuda_matches_numpy(name, activation, residual, rng):
    x_shape, w_shape, kwargs = _case(name)
    g = _geometry(x_shape, w_shape, **kwargs)
    x, w, b = (rng.standard_normal(x_shape), rng.standard_normal(w_shape),
               rng.standard_normal(w_shape[0]))
    inputs = [x, w / np.sqrt(np.prod(w_shape[1:])), b] + (
        [rng.standard_normal(g.y_shape)] if residual else [])

    def fn(x, w, b, *r):
        return ops.conv2d(x, w, b, activation=activation, residual=r[0] if r else None,
                          **kwargs)
    with override(conv_planner=_Fixed()):
        assert_backends_match(fn, inputs, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("channels,size,stride", [(48, 56, 1), (104, 28, 2), (440, 7, 1)])
def test_grouped_cuda_matches_numpy_on_regnet_layers(channels, size, stride, rng):
    # RegNetY-400MF's grouped 3x3 layers (8 channels per group) at batch 3, through the
    # heuristic (which picks the kernel for the forward).
    kwargs = dict(stride=stride, padding=1, groups=channels // 8)
    w_shape = (channels, 8, 3, 3)
    g = _geometry((3, channels, size, size), w_shape, **kwargs)
    assert ConvPlanner(autotune=False).choose(g, "forward") is GroupedDirect
    x, w, b = (rng.standard_normal(g.x_shape), rng.standard_normal(w_shape) / 8.5,
               rng.standard_normal(channels))
    assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs), [x, w, b], rtol=1e-4)
