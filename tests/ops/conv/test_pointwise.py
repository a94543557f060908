"""The direct 1x1 convolution kernel (gdnflow/ops/conv/algorithms/pointwise.py and
pointwise_tiles.py, cuda_src/pointwise.cu).

On the CPU: the tile choice and the planner's choice; and, where nvcc is
installed, the kernel's per-thread code compiled for the host and run over
every block and thread (forced tile shapes, odd sizes, both vector widths,
transposed weights, the fused epilogue), driven by the module's own Python,
against NumPy. On the GPU: CUDA against NumPy with the kernel forced, at odd
sizes and MobileNetV2's shapes, forward and gradients.
"""
import dataclasses

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.backends import cuda
from gdnflow.config import override
from gdnflow.ops.conv.algorithms import pointwise, pointwise_tiles
from gdnflow.ops.conv.algorithms.grouped import GroupedDirect
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm, Pointwise
from gdnflow.ops.conv.algorithms.pointwise import Im2colDirect, PointwiseDirect
from gdnflow.ops.conv.algorithms.pointwise_tiles import PointwiseConfig
from gdnflow.ops.conv.epilogue import epilogue_numpy
from gdnflow.ops.conv.geometry import conv_geometry
from gdnflow.ops.conv.planning import ConvPlanner
from gdnflow.ops.conv.reference import NumpyConv
from gdnflow.testing import assert_backends_match, relative_error
from host_kernels import (HOST_CHECK_PRELUDE, HostArray, LaunchRecord, host_builder,
                          host_kernel)

# MobileNetV2's 1x1 layers: (C_in, size, C_out).
MOBILENET_POINTWISE = [(32, 112, 16), (16, 112, 96), (96, 56, 24), (24, 56, 144), (144, 56, 24),
                       (144, 28, 32), (32, 28, 192), (192, 28, 32), (192, 14, 64), (64, 14, 384),
                       (384, 14, 64), (384, 14, 96), (96, 14, 576), (576, 14, 96), (576, 7, 160),
                       (160, 7, 960), (960, 7, 160), (960, 7, 320), (320, 7, 1280)]


def _geometry(x_shape, c_out, groups=1):
    return conv_geometry("conv2d", x_shape, (c_out, x_shape[1] // groups, 1, 1), (1, 1),
                         (0, 0, 0, 0), (1, 1), groups)


# ------------------------------------------------------ choices on the CPU --
def test_intensity_formula():
    # 16 -> 96 per pixel: 16*96 multiply-adds (2 flop each) over 4*(16+96) bytes.
    g = _geometry((64, 16, 112, 112), 96)
    assert pointwise_tiles.intensity(g) == pytest.approx(2 * 16 * 96 / (4 * (16 + 96)))


@pytest.mark.parametrize("c_in,size,c_out", MOBILENET_POINTWISE)
def test_planner_takes_the_direct_kernel_for_memory_bound_layers(c_in, size, c_out):
    g = _geometry((64, c_in, size, size), c_out)
    planner = ConvPlanner(autotune=False)
    memory_bound = pointwise_tiles.intensity(g) <= pointwise.MAX_INTENSITY
    expected = PointwiseDirect if memory_bound else Pointwise
    assert planner.choose(g, "forward") is expected
    assert planner.choose(g, "backward_data") is expected
    assert planner.choose(g, "backward_weight") is Pointwise           # always the GEMM
    assert PointwiseDirect in ConvPlanner.supported(g, "forward")      # autotune may compare
    assert PointwiseDirect not in ConvPlanner.supported(g, "backward_weight")


def test_memory_bound_mobilenet_layers_are_the_narrow_ones():
    chosen = [(c_in, c_out) for c_in, size, c_out in MOBILENET_POINTWISE
              if PointwiseDirect.preferred(_geometry((64, c_in, size, size), c_out))]
    assert chosen == [(32, 16), (16, 96), (96, 24), (24, 144), (144, 24), (144, 32), (32, 192),
                      (192, 32)]


def test_grouped_and_strided_1x1_stay_elsewhere():
    planner = ConvPlanner(autotune=False)
    grouped = _geometry((2, 8, 5, 5), 4, groups=2)
    assert not PointwiseDirect.supports(grouped)
    assert planner.choose(grouped, "forward") is GroupedDirect       # few channels per group
    assert planner.choose(grouped, "backward_data") is Pointwise
    strided = conv_geometry("conv2d", (1, 8, 9, 9), (4, 8, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1)
    assert not PointwiseDirect.supports(strided)
    assert planner.choose(strided, "forward") is Im2colDirect        # after im2col
    assert planner.choose(strided, "backward_data") is Im2colGemm


@pytest.mark.parametrize("vec_x", [1, 4])
def test_candidate_configs_satisfy_the_kernel_constraints(vec_x):
    configs = pointwise_tiles.candidate_configs(vec_x)
    assert configs
    for c in configs:
        slots = c.bn // vec_x
        assert c.tm % 4 == 0 and c.tn in (4, 8)                 # 16-byte shared reads
        assert c.threads % 32 == 0 and 64 <= c.threads <= 256
        assert c.threads % slots == 0                           # fixed columns per thread
        assert c.bk >= c.threads // slots                       # one pass covers a step
        assert c.bk % c.ksplit == 0 and (c.tx * c.ty) % 32 == 0  # whole groups of warps
        assert c.shared_bytes <= 48 * 1024


@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("c_in,size,c_out", MOBILENET_POINTWISE)
def test_choose_config_fits_the_layer(batch, c_in, size, c_out):
    hw = size * size
    vec_x = 4 if hw % 4 == 0 else 1
    for m, k in ((c_out, c_in), (c_in, c_out)):           # forward, backward-data
        config = pointwise_tiles.choose_config(m, k, hw, batch * hw, vec_x, 132)
        assert config in pointwise_tiles.candidate_configs(vec_x)
        m_tiles = -(-m // config.bm)
        # At most a third of the multiply-adds on rows past m.
        assert m_tiles * config.bm <= 1.34 * m or m < 16
        if batch == 64:
            blocks = m_tiles * -(-batch * hw // config.bn)
            assert blocks >= 0.9 * 132                       # (nearly) every SM has work
            # Memory and arithmetic add up in the model (they overlap only in part).
            floor = (4 * batch * hw * (m + k) / pointwise_tiles.HBM_BYTES_PER_S
                     + batch * hw * m * k / pointwise_tiles.FMA_PER_S)
            assert pointwise_tiles.predicted_seconds(config, m, k, batch * hw) < 2.5 * floor


def test_cost_model_prefers_exact_channel_tiles():
    # 24 output channels: a 24-row tile beats 32 rows with a quarter idle.
    config = pointwise_tiles.choose_config(24, 96, 3136, 64 * 3136, 4, 132)
    assert config.bm == 24
    wide = PointwiseConfig(8, 8, 32, 4, 8, 4)                # BM 32
    assert pointwise_tiles.predicted_seconds(config, 24, 96, 64 * 3136) < \
        pointwise_tiles.predicted_seconds(wide, 24, 96, 64 * 3136)


# ---------------------------------------- CUDA code, run on the host (nvcc) --

# Every block in turn (in reverse order when `backwards`): all threads copy
# steps 0 .. STAGES-2, then for each step all threads copy step + STAGES-1
# and multiply the current one (the kernel's order; its barrier comes before
# the copies), then groups 1 .. KSPLIT-1 save their sums, group 0 adds them
# and stores. Shared memory starts as NaN.
_SHIM = """
extern "C" int host_pointwise_conv(int backwards, int blocks, int threads,
        const float* a, const float* x, const float* bias, const float* residual, float* y,
        int M, int K, int HW, int NP, int m_tiles, int act) {
    host_faults = 0;
    PointwiseShared* sh = new PointwiseShared;
    std::vector<Copier> copiers(threads);
    float (*acc)[TM][TN] = new float[threads][TM][TN];
    const int steps = (K + BK - 1) / BK;
    for (int i = 0; i < blocks; ++i) {
        const int b = backwards ? blocks - 1 - i : i;
        float* raw = reinterpret_cast<float*>(sh);
        for (size_t k = 0; k < sizeof(PointwiseShared) / 4; ++k) raw[k] = NAN;
        const Tile tile = tile_of(b, m_tiles);
        for (int t = 0; t < threads; ++t) {
            copiers[t] = copier_of(tile, t, K, HW, NP);
            for (int r = 0; r < TM; ++r)
                for (int n = 0; n < TN; ++n) acc[t][r][n] = 0.0f;
            for (int s = 0; s < STAGES - 1 && s < steps; ++s)
                load_step(a, x, *sh, s, tile, copiers[t], s * BK, t, M, K, HW, NP);
        }
        for (int step = 0; step < steps; ++step) {
            const int next = step + STAGES - 1;
            if (next < steps)
                for (int t = 0; t < threads; ++t)
                    load_step(a, x, *sh, next % STAGES, tile, copiers[t], next * BK, t,
                              M, K, HW, NP);
            for (int t = 0; t < threads; ++t) multiply_step(*sh, step % STAGES, t, acc[t]);
        }
        for (int t = TILE_THREADS; t < threads; ++t) save_partial(acc[t], *sh, t);
        for (int t = 0; t < TILE_THREADS; ++t) add_partials(acc[t], *sh, t);
        for (int k = 0; k < TILE_THREADS; ++k) {
            const int t = backwards ? TILE_THREADS - 1 - k : k;
            store_outputs(acc[t], bias, residual, y, tile, t, M, HW, NP, act);
        }
    }
    delete[] acc;
    delete sh;
    return host_faults;
}
"""


@pytest.fixture(scope="module")
def host_build(tmp_path_factory):
    """defines -> pointwise.cu built for the host with the shim (compiled on first use)."""
    return host_builder(tmp_path_factory.mktemp("pointwise_host"), "pointwise.cu",
                        HOST_CHECK_PRELUDE, _SHIM)


@pytest.fixture
def on_host(host_build, simulate):
    """The module launches pointwise_conv on the host build; returns the launches' defines.

    ``launched.backwards = True`` runs blocks and storing threads in reverse order.
    """
    def check(d, grid, block, shared_bytes):
        assert grid[1:] == (1, 1) and block == (d["TX"] * d["TY"] * d["KSPLIT"], 1, 1)

    launched = LaunchRecord()
    simulate(host_kernel(launched, pointwise.SOURCE, "pointwise_conv", host_build, check),
             sm_count=132)
    return launched


# (N, C_in, H, W, C_out): odd channel counts, planes of 63, 36, 20, 1 pixels,
# tiles of pixels crossing images, more rows than one tile of channels.
HOST_CASES = {
    "odd_hw63": (3, 5, 7, 9, 6),
    "hw36_24": (1, 16, 6, 6, 24),
    "hw20_k37_m70": (3, 37, 4, 5, 70),
    "m100_k20": (2, 20, 8, 8, 100),
    "single_pixel": (1, 3, 1, 1, 2),
    "k45_tiny_columns": (2, 45, 2, 2, 13),
}
# Forced tiles: every thread-tile shape, each thread count per row of x.
# Stages 2-4, BK 8-32 (a K of 20 or 37 ends inside a step), 1-4 thread groups.
FORCED = {
    "24x256": PointwiseConfig(4, 8, 32, 6, 8, 4),
    "96x128": PointwiseConfig(12, 8, 16, 8, 8, 4),
    "128x64_bk16": PointwiseConfig(8, 4, 16, 16, 16, 4),
    "32x128_bk16_3stages": PointwiseConfig(4, 8, 16, 8, 16, 4, 3),
    "16x128_bk32": PointwiseConfig(4, 8, 16, 4, 32, 4, 2),
    "16x128_bk16_3stages_2groups": PointwiseConfig(8, 4, 32, 2, 16, 4, 3, 2),
    "16x128_bk32_4groups": PointwiseConfig(8, 4, 32, 2, 32, 4, 2, 4),
    "32x64_scalar": PointwiseConfig(4, 4, 16, 8, 8, 1),
    "64x128_scalar": PointwiseConfig(8, 8, 16, 8, 8, 1),
    "48x64_scalar": PointwiseConfig(12, 4, 16, 4, 8, 1),
    "32x128_scalar_bk16_4stages": PointwiseConfig(4, 8, 16, 8, 16, 1, 4),
    "16x64_scalar_bk16_4groups": PointwiseConfig(4, 4, 16, 4, 16, 1, 3, 4),
}


def _run_case(x_shape, c_out, rng, epilogue, offset=0):
    """(forward got, want, backward-data got, want) through PointwiseDirect on host arrays."""
    g = _geometry(x_shape, c_out)
    x, w = 3 * rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    bias = residual = None
    activation = 0
    if epilogue:
        bias, residual, activation = rng.standard_normal(c_out), rng.standard_normal(g.y_shape), 2
    want = epilogue_numpy(NumpyConv.forward(g, x, w), bias, residual, activation)
    y = PointwiseDirect.forward(
        g, HostArray(g.x_shape, x), HostArray(g.w_shape, w),
        None if bias is None else HostArray(bias.shape, bias), activation,
        residual=None if residual is None else HostArray(g.y_shape, residual, offset))
    assert y.guards_untouched()
    gy = rng.standard_normal(g.y_shape)
    gx = PointwiseDirect.backward_data(g, HostArray(g.y_shape, gy), HostArray(g.w_shape, w))
    assert gx.guards_untouched()
    return y.get(), want, gx.get(), NumpyConv.backward_data(g, gy, w)


@pytest.mark.parametrize("case", HOST_CASES)
@pytest.mark.parametrize("tile", FORCED)
def test_cuda_code_on_host_with_forced_tiles(case, tile, on_host, rng):
    n, c_in, h, w, c_out = HOST_CASES[case]
    config = FORCED[tile]
    assert config in pointwise_tiles.candidate_configs(config.vec_x)
    if (h * w % 4 == 0) != (config.vec_x == 4):
        pytest.skip("the kernel picks the other vector width for this plane")
    on_host.backwards = tile.endswith("scalar")
    for epilogue in (False, True):
        with override(pointwise_config_chooser=lambda *args: config):
            y, want, gx, gx_want = _run_case((n, c_in, h, w), c_out, rng, epilogue)
        assert relative_error(y, want) <= 1e-5          # NaN (an unwritten output) fails too
        if epilogue and y.size > 100:
            assert (y == 6).any() and (y == 0).any()
        assert relative_error(gx, gx_want) <= 1e-5
    assert [d["TRANS_A"] for d in on_host[-2:]] == [0, 1]


@pytest.mark.parametrize("x_shape,c_out", [((2, 16, 8, 8), 96), ((1, 96, 8, 8), 24),
                                           ((3, 144, 4, 4), 32), ((2, 160, 3, 3), 96),
                                           ((1, 64, 4, 4), 384)], ids=str)
def test_cuda_code_on_host_with_chosen_tiles(x_shape, c_out, on_host, rng):
    y, want, gx, gx_want = _run_case(x_shape, c_out, rng, epilogue=True)
    assert relative_error(y, want) <= 1e-5 and relative_error(gx, gx_want) <= 1e-5


def test_cuda_code_on_host_unaligned_residual(on_host, rng):
    # A residual view 4 bytes off 16: the whole call falls back to 1-float columns.
    y, want, _, _ = _run_case((2, 16, 8, 8), 24, rng, epilogue=True, offset=1)
    assert on_host[0]["VEC_X"] == 1 and relative_error(y, want) <= 1e-5


# -------------------------------------------------------------------- GPU --
class _Fixed:
    """A planner that answers ``algorithm`` wherever it offers the stage, else the GEMM path."""

    def __init__(self, algorithm):
        self.algorithm = algorithm

    def choose(self, g, stage):
        if stage in getattr(self.algorithm, "stages", ()) and self.algorithm.supports(g):
            return self.algorithm
        return Pointwise


# (x shape, C_out): HW not a multiple of 4, channels not multiples of any tile,
# batch 1 and 3.
ODD_CASES = [((1, 5, 7, 9), 6), ((3, 5, 7, 9), 13), ((3, 37, 6, 6), 70), ((1, 17, 11, 12), 33),
             ((3, 200, 5, 5), 9), ((1, 3, 1, 1), 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("x_shape,c_out", ODD_CASES, ids=str)
@pytest.mark.parametrize("activation,residual,bias", [(None, False, False), ("relu6", True, True),
                                                      ("relu", False, True), (None, True, False)])
def test_direct_cuda_matches_numpy_at_odd_sizes(x_shape, c_out, activation, residual, bias, rng):
    g = _geometry(x_shape, c_out)
    inputs = [3 * rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)]
    if bias:
        inputs.append(rng.standard_normal(c_out))
    if residual:
        inputs.append(rng.standard_normal(g.y_shape))

    def fn(x, w, *rest):
        b = rest[0] if bias else None
        r = rest[-1] if residual else None
        return ops.conv2d(x, w, b, activation=activation, residual=r)
    with override(conv_planner=_Fixed(PointwiseDirect)):
        assert_backends_match(fn, inputs, rtol=1e-4)


def _forced_on_gpu_cases():
    """(tile name, x shape, C_out, config): every forced tile at the plane's vector width,
    where that variant is a candidate, on a K that ends inside a step."""
    cases = []
    for x_shape, c_out in [((3, 37, 6, 6), 70), ((3, 45, 7, 9), 13)]:
        vec_x = 4 if x_shape[2] * x_shape[3] % 4 == 0 else 1
        for name, config in FORCED.items():
            config = dataclasses.replace(config, vec_x=vec_x)
            if config in pointwise_tiles.candidate_configs(vec_x):
                cases.append((name, x_shape, c_out, config))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("tile,x_shape,c_out,config", _forced_on_gpu_cases(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_direct_cuda_forced_tiles_match_numpy(tile, x_shape, c_out, config, rng):
    # Every forced tile (stages, BK, thread groups) compiled for the GPU.
    g = _geometry(x_shape, c_out)
    inputs = [3 * rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape),
              rng.standard_normal(c_out), rng.standard_normal(g.y_shape)]
    with override(conv_planner=_Fixed(PointwiseDirect),
                  pointwise_config_chooser=lambda *args: config):
        assert_backends_match(
            lambda x, w, b, r: ops.conv2d(x, w, b, activation="relu6", residual=r), inputs,
            rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("c_in,size,c_out", MOBILENET_POINTWISE)
def test_direct_cuda_matches_numpy_on_mobilenet_layers(c_in, size, c_out, rng):
    # Batch 2 of the real layer with its bias, forced; gradients too. No
    # activation at this size: a few of millions of outputs lie within float32
    # rounding of 0, where relu's gradient may differ between the backends.
    g = _geometry((2, c_in, size, size), c_out)
    x, w, b = rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape), \
        rng.standard_normal(c_out)
    with override(conv_planner=_Fixed(PointwiseDirect)):
        assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b), [x, w / np.sqrt(c_in), b],
                              rtol=1e-4)


@pytest.mark.gpu
def test_heuristic_runs_the_direct_kernel_on_a_narrow_layer(rng):
    planner = ConvPlanner(autotune=False)
    g = _geometry((3, 24, 20, 20), 144)
    x, w, b, r = (rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape),
                  rng.standard_normal(144), rng.standard_normal(g.y_shape))
    with override(conv_planner=planner):
        assert_backends_match(lambda x, w, b, r: ops.conv2d(x, w, b, residual=r),
                              [x, w / np.sqrt(24), b, r], rtol=1e-4)
    assert planner.cache[(g, "forward")] is PointwiseDirect
    assert planner.cache[(g, "backward_data")] is PointwiseDirect


@pytest.mark.gpu
def test_autotune_times_the_direct_kernel_too(rng):
    planner = ConvPlanner(autotune=True)
    g = _geometry((2, 16, 12, 12), 48)
    with override(conv_planner=planner):
        assert_backends_match(lambda x, w: ops.conv2d(x, w),
                              [rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)],
                              rtol=1e-4)
    assert set(planner.timings[(g, "forward")]) == {"pointwise_direct", "pointwise",
                                                    "im2col_direct", "im2col_gemm"}
    assert set(planner.timings[(g, "backward_weight")]) == {"pointwise", "im2col_gemm"}


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1])
def test_direct_cuda_with_unaligned_views(offset, rng):
    # Arrays that start 4 bytes past a 16-byte boundary (as a planned buffer
    # may): the kernel takes 1-float columns and must still be right.
    runtime = cuda.get_runtime()
    g = _geometry((2, 24, 8, 8), 40)
    x, w, r = (rng.standard_normal(g.x_shape).astype(np.float32),
               rng.standard_normal(g.w_shape).astype(np.float32),
               rng.standard_normal(g.y_shape).astype(np.float32))

    def view(values):
        flat = np.concatenate([np.zeros(offset, np.float32), values.ravel()])
        base = runtime.from_numpy(flat)
        return base.offset(offset, values.shape)
    got = PointwiseDirect.forward(g, view(x), view(w), None, 1, residual=view(r)).get()
    want = epilogue_numpy(NumpyConv.forward(g, x.astype(np.float64), w.astype(np.float64)),
                          None, r, 1)
    assert relative_error(got, want) <= 1e-4


@pytest.mark.gpu
def test_conv_transpose2d_1x1_through_the_direct_kernel(rng):
    # conv_transpose2d's forward is conv2d's backward-data (the transposed weight).
    x, w, b = rng.standard_normal((3, 20, 5, 7)), rng.standard_normal((20, 12, 1, 1)), \
        rng.standard_normal(12)
    with override(conv_planner=_Fixed(PointwiseDirect)):
        assert_backends_match(lambda x, w, b: ops.conv_transpose2d(x, w, b), [x, w, b],
                              rtol=1e-4)


@pytest.mark.gpu
def test_direct_and_gemm_paths_agree_on_a_real_layer(rng):
    # The same inputs through both algorithms, float32 on both sides.
    g = _geometry((4, 96, 56, 56), 24)
    x = gf.tensor(rng.standard_normal(g.x_shape), device="cuda")
    w = gf.tensor(rng.standard_normal(g.w_shape) / np.sqrt(96), device="cuda")
    direct = PointwiseDirect.forward(g, x.data, w.data).get()
    gemm = Pointwise.forward(g, x.data, w.data).get()
    assert relative_error(direct, gemm) <= 1e-5


class _Im2colDirectForward:
    """A planner that runs every forward through Im2colDirect, the rest through Im2colGemm."""

    @staticmethod
    def choose(g, stage):
        return Im2colDirect if stage == "forward" else Im2colGemm


@pytest.mark.gpu
@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 3, 17, 23), (8, 3, 3, 3), dict(padding=1)),                      # RGB, odd plane
    ((3, 3, 15, 15), (5, 3, 3, 3), dict(stride=2, padding=(0, 1, 1, 0))),  # odd, asymmetric
    ((1, 4, 12, 12), (6, 4, 5, 5), dict(stride=2, padding=2, dilation=1)),
    ((2, 5, 9, 11), (7, 5, 3, 3), dict(dilation=2, padding=2)),
    ((2, 8, 10, 10), (16, 8, 1, 1), dict(stride=2)),                       # strided 1x1
], ids=str)
@pytest.mark.parametrize("chunked", [False, True])
def test_im2col_direct_matches_numpy(x_shape, w_shape, kwargs, chunked, rng):
    # With the epilogue (bias, relu6, residual) fused, and with the batch
    # lowered one image at a time (a workspace too small for two).
    y_shape = ops.conv2d(gf.tensor(np.zeros(x_shape, np.float32)),
                         gf.tensor(np.zeros(w_shape, np.float32)), **kwargs).shape
    inputs = [3 * rng.standard_normal(x_shape), rng.standard_normal(w_shape),
              rng.standard_normal(w_shape[0]), rng.standard_normal(y_shape)]
    knobs = dict(conv_workspace_bytes=4) if chunked else {}
    with override(conv_planner=_Im2colDirectForward(), **knobs):
        assert_backends_match(
            lambda x, w, b, r: ops.conv2d(x, w, b, activation="relu6", residual=r, **kwargs),
            inputs, rtol=1e-4)


def test_small_products_take_the_direct_kernel():
    # MobileNetV2's 14x14 layers at batch 1: host time decides, K up to 384.
    assert PointwiseDirect.preferred(_geometry((1, 192, 14, 14), 64))
    assert PointwiseDirect.preferred(_geometry((1, 384, 14, 14), 96))
    assert not PointwiseDirect.preferred(_geometry((64, 192, 14, 14), 64))   # 154M FMAs
    assert not PointwiseDirect.preferred(_geometry((1, 576, 14, 14), 96))    # K = 576
    assert not PointwiseDirect.preferred(_geometry((1, 160, 7, 7), 960))     # backward K = 960
