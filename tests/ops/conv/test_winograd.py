"""Winograd F(m x m, 3 x 3) convolution (gdnflow/ops/conv/algorithms/winograd.py,
cuda_src/winograd.cu), and the weight cache it keeps its transforms in
(gdnflow/backends/cuda/weight_cache.py).

On the CPU: the transform matrices satisfy the Winograd identity (float64),
a NumPy model of the whole algorithm driven by the module's tiling matches
the reference convolution (forward and backward-data, odd sizes, any
padding), chunks cover the tiles, the planner's choices; and, where nvcc is
installed, the CUDA per-thread code compiled for the host and run over
every thread index, orchestrated by the module's own Python, matches NumPy.
On the GPU: CUDA against NumPy with every Winograd variant forced.
"""
import ctypes

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.backends.cuda.weight_cache import frozen_weights, weight_cache
from gdnflow.config import override, settings
from gdnflow.ops.conv.algorithms import winograd
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm
from gdnflow.ops.conv.algorithms.pointwise import Im2colDirect
from gdnflow.ops.conv.algorithms.winograd import TRANSFORMS, WinogradF2, WinogradF4, tiling
from gdnflow.ops.conv.epilogue import epilogue_numpy
from gdnflow.ops.conv.geometry import conv_geometry, normalize_padding
from gdnflow.ops.conv.planning import ConvPlanner
from gdnflow.ops.conv.reference import NumpyConv
from gdnflow.testing import assert_backends_match, relative_error
from host_kernels import HostArray, host_builder
from phase_layout import interleave_phases, split_phases

WINOGRADS = (WinogradF4, WinogradF2)


def _geometry(x_shape, w_shape, padding=1, stride=1, dilation=1, groups=1):
    pair = (lambda v: (v, v) if isinstance(v, int) else tuple(v))
    return conv_geometry("conv2d", x_shape, w_shape, pair(stride),
                         normalize_padding("conv2d", padding), pair(dilation), groups)


# ------------------------------------------------------ transform matrices --
def _correlate_valid(d, g):
    """The m x m valid cross-correlation of an alpha x alpha tile with a 3x3 filter."""
    m = d.shape[0] - 2
    return np.array([[np.sum(d[p:p + 3, q:q + 3] * g) for q in range(m)] for p in range(m)])


@pytest.mark.parametrize("m", [2, 4])
def test_transforms_satisfy_the_winograd_identity(m, rng):
    # A^T [(G g G^T) .* (B^T d B)] A is the valid correlation of d with g, in 2-D
    # and (rows of the same matrices) in 1-D, for random tiles and filters.
    bt, g_mat, at = TRANSFORMS[m]
    alpha = m + 2
    assert bt.shape == (alpha, alpha) and g_mat.shape == (alpha, 3) and at.shape == (m, alpha)
    for _ in range(5):
        d, g = rng.standard_normal((alpha, alpha)), rng.standard_normal((3, 3))
        y = at @ ((g_mat @ g @ g_mat.T) * (bt @ d @ bt.T)) @ at.T
        np.testing.assert_allclose(y, _correlate_valid(d, g), rtol=1e-12, atol=1e-12)
        d1, g1 = d[0], g[0]
        y1 = at @ ((g_mat @ g1) * (bt @ d1))
        np.testing.assert_allclose(y1, [d1[p:p + 3] @ g1 for p in range(m)], atol=1e-12)


@pytest.mark.parametrize("m", [2, 4])
def test_each_transform_entry_is_needed(m):
    # Guard against a typo that the identity would still catch only by luck:
    # the identity fails once any nonzero entry of B^T, G or A^T is perturbed.
    rng = np.random.default_rng(m)
    d, g = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    want = _correlate_valid(d, g)
    for which in range(3):
        for index in zip(*np.nonzero(TRANSFORMS[m][which])):
            mats = [t.copy() for t in TRANSFORMS[m]]
            mats[which][index] *= 1.5
            bt, g_mat, at = mats
            y = at @ ((g_mat @ g @ g_mat.T) * (bt @ d @ bt.T)) @ at.T
            assert not np.allclose(y, want), (which, index)


# ---------------------------------------------------- NumPy model, tiling --
def numpy_winograd(t, x, u):
    """The algorithm of winograd.cu in NumPy float64, driven by a WinogradTiling.

    x [N, C_x, H_x, W_x]; u [C_y, C_x, 3, 3] as the pass applies it (already
    rotated and transposed for backward-data). Returns y [N, C_y, H_y, W_y].
    """
    bt, g_mat, at = TRANSFORMS[t.m]
    m, a = t.m, t.alpha
    # Canvas row r holds x row r - pad_top (zeros elsewhere); it covers every tile.
    canvas = np.zeros((t.n, t.c_x, t.tiles_h * m + 2, t.tiles_w * m + 2))
    r0, c0 = max(0, t.pad_top), max(0, t.pad_left)
    r1 = min(canvas.shape[2], t.pad_top + t.h_x)
    c1 = min(canvas.shape[3], t.pad_left + t.w_x)
    if r1 > r0 and c1 > c0:
        canvas[:, :, r0:r1, c0:c1] = x[:, :, r0 - t.pad_top:r1 - t.pad_top,
                                       c0 - t.pad_left:c1 - t.pad_left]
    d = np.lib.stride_tricks.sliding_window_view(canvas, (a, a), axis=(2, 3))[:, :, ::m, ::m]
    v = bt @ d @ bt.T                                           # N, C_x, th, tw, a, a
    transformed = g_mat @ u @ g_mat.T                           # C_y, C_x, a, a
    products = np.einsum("ocij,ncpqij->nopqij", transformed, v, optimize=True)
    y = (at @ products @ at.T).transpose(0, 1, 2, 4, 3, 5)     # N, C_y, th, m, tw, m
    y = y.reshape(t.n, t.c_y, t.tiles_h * m, t.tiles_w * m)
    return y[:, :, :t.h_y, :t.w_y]


# (x shape, C_out, padding): odd sizes, every padding form, paddings above 2
# (backward-data then crops: its padding 2 - p is negative).
TILING_CASES = [((2, 5, 17, 19), 7, 1), ((2, 5, 17, 19), 7, (0, 1, 1, 0)),
                ((1, 3, 5, 4), 2, 0), ((1, 2, 3, 3), 3, (2, 0, 0, 2)),
                ((1, 2, 6, 7), 3, (3, 1, 0, 4)), ((3, 2, 9, 8), 4, (1, 2)),
                ((1, 1, 1, 1), 2, 1)]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("x_shape,c_out,padding", TILING_CASES, ids=str)
def test_numpy_model_matches_reference_convolution(m, x_shape, c_out, padding, rng):
    g = _geometry(x_shape, (c_out, x_shape[1], 3, 3), padding)
    x, w = rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    forward = numpy_winograd(tiling(g, m, "forward"), x, w)
    np.testing.assert_allclose(forward, NumpyConv.forward(g, x, w), rtol=1e-10, atol=1e-10)
    gy = rng.standard_normal(g.y_shape)
    turned = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)       # [C_in, C_out], rotated
    back = numpy_winograd(tiling(g, m, "backward_data"), gy, turned)
    np.testing.assert_allclose(back, NumpyConv.backward_data(g, gy, w), rtol=1e-10, atol=1e-10)


def test_tiling_arithmetic():
    g = _geometry((2, 5, 17, 19), (7, 5, 3, 3), (0, 1, 1, 0))    # OH = 16, OW = 18
    t = tiling(g, 4, "forward")
    assert (t.c_x, t.h_x, t.w_x, t.c_y, t.h_y, t.w_y) == (5, 17, 19, 7, 16, 18)
    assert (t.pad_top, t.pad_left, t.alpha) == (0, 1, 6)
    assert (t.tiles_h, t.tiles_w, t.tiles) == (4, 5, 2 * 4 * 5)
    b = tiling(g, 2, "backward_data")
    assert (b.c_x, b.h_x, b.w_x, b.c_y, b.h_y, b.w_y) == (7, 16, 18, 5, 17, 19)
    assert (b.pad_top, b.pad_left) == (2, 1)
    assert (b.tiles_h, b.tiles_w) == (9, 10)
    with pytest.raises(ValueError, match="backward_weight"):
        tiling(g, 4, "backward_weight")


@pytest.mark.parametrize("tiles_per_image,c_x,c_y,workspace", [
    (49, 512, 512, 256 << 20), (3136, 64, 64, 256 << 20), (16, 3, 5, 1), (7, 2, 2, 2000)])
def test_chunks_cover_every_tile_within_the_workspace(tiles_per_image, c_x, c_y, workspace):
    t = winograd.WinogradTiling(4, 64, c_x, 4 * tiles_per_image, 4, c_y, 4 * tiles_per_image, 4,
                                1, 1)
    chunks = t.chunks(workspace)
    assert chunks[0][0] == 0 and sum(c for _, c in chunks) == t.tiles
    assert all(a + n == b for (a, n), (b, _) in zip(chunks, chunks[1:]))
    per_tile = 4 * 36 * (c_x + c_y)
    assert all(n * per_tile <= workspace or n == 1 for _, n in chunks)
    most = max(1, workspace // per_tile)
    assert len(chunks) == -(-t.tiles // most)                   # as few chunks as fit
    assert {n for _, n in chunks[:-1]} <= {chunks[0][1]} and chunks[-1][1] <= chunks[0][1]
    assert winograd.WinogradTiling(4, 0, 3, 5, 5, 3, 5, 5, 1, 1).chunks(workspace) == ()


# ----------------------------------------------------------------- planner --
VGG16_BATCH64 = [((64, 64, 112, 112), 128), ((64, 128, 112, 112), 128), ((64, 256, 56, 56), 256),
                 ((64, 512, 28, 28), 512), ((64, 512, 14, 14), 512), ((64, 256, 28, 28), 512)]


@pytest.mark.parametrize("x_shape,c_out", VGG16_BATCH64, ids=str)
def test_planner_prefers_winograd_for_wide_3x3_layers(x_shape, c_out):
    g = _geometry(x_shape, (c_out, x_shape[1], 3, 3))
    planner = ConvPlanner(autotune=False)
    assert planner.choose(g, "forward") is WinogradF4
    assert planner.choose(g, "backward_data") is WinogradF4
    assert planner.choose(g, "backward_weight") is Im2colGemm
    assert ConvPlanner.supported(g, "forward") == [WinogradF4, WinogradF2, Im2colDirect,
                                                   Im2colGemm]
    assert ConvPlanner.supported(g, "backward_weight") == [Im2colGemm]


@pytest.mark.parametrize("x_shape,w_shape,kwargs,expected", [
    ((64, 3, 224, 224), (64, 3, 3, 3), {}, Im2colDirect),       # 3 input channels: K = 27
    ((1, 512, 14, 14), (512, 512, 3, 3), {}, Im2colGemm),       # 196 pixels
    ((64, 128, 56, 56), (128, 128, 3, 3), dict(stride=2), Im2colGemm),
    ((64, 128, 56, 56), (128, 128, 3, 3), dict(dilation=2, padding=2), Im2colGemm),
    ((64, 128, 56, 56), (128, 64, 3, 3), dict(groups=2), Im2colGemm),
    ((64, 128, 56, 56), (128, 128, 5, 5), dict(padding=2), Im2colGemm),
])
def test_planner_keeps_im2col_elsewhere(x_shape, w_shape, kwargs, expected):
    g = _geometry(x_shape, w_shape, **{"padding": 1, **kwargs})
    assert ConvPlanner(autotune=False).choose(g, "forward") is expected
    assert (WinogradF2 in ConvPlanner.supported(g, "forward")) == winograd.supports(g)


# ------------------------------------------- CUDA code, run on the host --

_SHIM = """
// Host loops over every thread index of each kernel (the bounds of their
// grid-stride loops), for tests/ops/conv/test_winograd.py.
#define HOST_KERNELS(M)                                                                    \\
extern "C" void host_winograd_filter_f##M(const float* w, float* u, int C_y, int C_x,     \\
                                          int flip) {                                      \\
    for (int i = 0; i < C_y * C_x; ++i) filter_transform_pair<M>(w, u, i, C_y, C_x, flip); \\
}                                                                                          \\
extern "C" void host_winograd_input_f##M(const float* x, float* v, int C, int C0, int SH, \\
        int SW, int HS, int WS, int TH, int TW, int t0, int T, int pt, int pl) {           \\
    for (int i = 0; i < C * T; ++i)                                                        \\
        input_transform_tile<M>(x, v, i, C, C0, SH, SW, HS, WS, TH, TW, t0, T, pt, pl);    \\
}                                                                                          \\
extern "C" void host_winograd_output_f##M(const float* m, const float* b, const float* r, \\
        float* y, int C, int C0, int SH, int SW, int HS, int WS, int TH, int TW, int t0,   \\
        int T, int act, int vec) {                                                         \\
    for (int i = 0; i < C * T; ++i)                                                        \\
        output_transform_tile<M>(m, b, r, y, i, C, C0, SH, SW, HS, WS, TH, TW, t0, T, act, \\
                                 vec);                                                     \\
}
HOST_KERNELS(2)
HOST_KERNELS(4)
"""


@pytest.fixture(scope="module")
def host_library(tmp_path_factory):
    """winograd.cu and host loops over its per-thread functions, as a shared library."""
    return host_builder(tmp_path_factory.mktemp("winograd_host"), "winograd.cu",
                        suffix=_SHIM, opt="-O2")()


def _floats_at(ptr, count):
    return np.ctypeslib.as_array((ctypes.c_float * count).from_address(ptr))


def _host_matmul(a, b, c, m, n, k, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, batch=1,
                 stride_a=0, stride_b=0, stride_c=0):
    """blas.matmul on host pointers (row-major, float32), no transposes (all Winograd uses)."""
    assert not trans_a and not trans_b and alpha == 1.0 and beta == 0.0
    for i in range(batch):
        a_i = _floats_at(a + 4 * i * stride_a, m * k).reshape(m, k)
        b_i = _floats_at(b + 4 * i * stride_b, k * n).reshape(k, n)
        _floats_at(c + 4 * i * stride_c, m * n)[:] = (a_i @ b_i).ravel()


@pytest.fixture
def on_host(host_library, simulate):
    """Winograd's module runs its kernels on the host library and its GEMMs in NumPy."""
    kinds = {"P": ctypes.c_void_p, "i": ctypes.c_int}
    launched = []

    class Kernel:
        def __init__(self, file, name, arg_types, defines=()):
            assert file == winograd.SOURCE and not defines
            self.function = getattr(host_library, "host_" + name)
            self.function.argtypes = [kinds[k] for k in arg_types]
            self.name = name

        def launch(self, threads, *args):
            launched.append(self.name)
            self.function(*args)

    simulate(Kernel, matmul=_host_matmul)
    return launched


HOST_CASES = {
    "odd_pad1": ((2, 5, 17, 19), 7, 1),
    "odd_asymmetric": ((2, 5, 17, 19), 7, (0, 1, 1, 0)),
    "width_multiple_of_4": ((2, 3, 6, 8), 4, 1),                # vector stores
    "big_padding": ((1, 2, 6, 7), 3, (3, 1, 0, 4)),
    "single_pixel": ((1, 2, 1, 1), 3, 1),
}


@pytest.mark.parametrize("algorithm", WINOGRADS, ids=lambda a: a.name)
@pytest.mark.parametrize("case", HOST_CASES)
@pytest.mark.parametrize("epilogue", ["plain", "bias_relu6_residual"])
def test_cuda_code_on_host_matches_numpy(algorithm, case, epilogue, on_host, rng):
    x_shape, c_out, padding = HOST_CASES[case]
    g = _geometry(x_shape, (c_out, x_shape[1], 3, 3), padding)
    x, w = 3 * rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    bias = residual = None
    activation = 0
    if epilogue != "plain":
        bias, residual, activation = rng.standard_normal(c_out), rng.standard_normal(g.y_shape), 2
    want = epilogue_numpy(NumpyConv.forward(g, x, w), bias, residual, activation)
    got = algorithm.forward(g, HostArray(g.x_shape, x), HostArray(g.w_shape, w),
                            None if bias is None else HostArray(bias.shape, bias), activation,
                            residual=None if residual is None else HostArray(g.y_shape, residual))
    # float32 rounding, measured against the clipped output: an index slip is O(1).
    assert relative_error(got.get(), want) <= 1e-4
    if activation and got.size > 100:
        assert (got.get() == 6).any() and (got.get() == 0).any()
    gy = rng.standard_normal(g.y_shape)
    got = algorithm.backward_data(g, HostArray(g.y_shape, gy), HostArray(g.w_shape, w))
    assert relative_error(got.get(), NumpyConv.backward_data(g, gy, w)) <= 1e-4


# (real N, C0, H, W; phase strides; inner C_y, padding): H, W give ceil(H / sh) cells.
PHASE_CASES = {
    "2x2_odd": ((2, 3, 17, 13), (2, 2), 5, 1),
    "2x2_even": ((1, 2, 16, 12), (2, 2), 4, 1),
    "3x1_asymmetric": ((1, 2, 10, 7), (3, 1), 3, (0, 2, 1, 1)),
}


@pytest.mark.parametrize("algorithm", WINOGRADS, ids=lambda a: a.name)
@pytest.mark.parametrize("case", PHASE_CASES)
def test_cuda_code_on_host_through_phase_views(algorithm, case, on_host, rng):
    # The sub-pixel rewrite's use: the forward writes, and the backward-data
    # pass reads, the phase split of a real tensor (PhaseView) instead of an
    # NCHW tensor of the pass's own shape; against NumPy on the split.
    (n, c0, h, w), (sh, sw), c_y, padding = PHASE_CASES[case]
    cells = (-(-h // sh), -(-w // sw))
    pad = normalize_padding("conv2d", padding)
    inner_in = (cells[0] - pad[0] - pad[1] + 2, cells[1] - pad[2] - pad[3] + 2)
    g = _geometry((n, c_y) + inner_in, (sh * sw * c0, c_y, 3, 3), padding)
    assert (g.oh, g.ow) == cells
    view = winograd.PhaseView(c0, sh, sw, h, w)
    gy, w_sub = rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    bias = rng.standard_normal(c0)
    got = algorithm.forward(g, HostArray(g.x_shape, gy), HostArray(g.w_shape, w_sub),
                            HostArray(bias.shape, bias), output_phases=view)
    want = interleave_phases(NumpyConv.forward(g, gy, w_sub), sh, sw, h, w) + bias[:, None, None]
    assert got.shape == (n, c0, h, w) and got.guards_untouched()
    assert relative_error(got.get(), want) <= 1e-4
    x, bias = rng.standard_normal((n, c0, h, w)), rng.standard_normal(c_y)
    got = algorithm.backward_data(g, HostArray(x.shape, x), HostArray(g.w_shape, w_sub),
                                  input_phases=view, bias=HostArray(bias.shape, bias),
                                  activation=1)
    want = epilogue_numpy(NumpyConv.backward_data(g, split_phases(x, sh, sw, *cells), w_sub),
                          bias, None, 1)
    assert got.guards_untouched() and relative_error(got.get(), want) <= 1e-4


def test_cuda_code_on_host_in_chunks(on_host, rng):
    # Room for 7 tiles: 40 tiles in 6 chunks (7, 7, 7, 7, 7, 5), a chunk
    # boundary inside an image; the filter is transformed once per call.
    g = _geometry((2, 3, 17, 19), (5, 3, 3, 3), (0, 1, 1, 0))
    x, w = rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    with override(conv_workspace_bytes=7 * 4 * 36 * (3 + 5) + 100):
        assert [n for _, n in tiling(g, 4, "forward").chunks(settings.conv_workspace_bytes)] \
            == [7, 7, 7, 7, 7, 5]
        got = WinogradF4.forward(g, HostArray(g.x_shape, x), HostArray(g.w_shape, w))
    assert relative_error(got.get(), NumpyConv.forward(g, x, w)) <= 1e-4
    assert on_host.count("winograd_filter_f4") == 1 and on_host.count("winograd_input_f4") == 6


def test_frozen_weights_transform_each_weight_once(on_host, rng):
    g = _geometry((1, 3, 9, 9), (4, 3, 3, 3))
    x = HostArray(g.x_shape, rng.standard_normal(g.x_shape))
    w = HostArray(g.w_shape, rng.standard_normal(g.w_shape))
    with frozen_weights():
        first = WinogradF4.forward(g, x, w).get()
        w.array[:] = rng.standard_normal(w.size)     # a change the caller promised not to make
        again = WinogradF4.forward(g, x, w).get()
        with frozen_weights():                      # nested: the same cache
            WinogradF4.forward(g, x, w)
        WinogradF4.backward_data(g, HostArray(g.y_shape, rng.standard_normal(g.y_shape)), w)
    np.testing.assert_array_equal(first, again)      # the cached U was used
    assert on_host.count("winograd_filter_f4") == 2  # once per pass (forward, backward-data)
    after = WinogradF4.forward(g, x, w).get()        # outside: transformed afresh
    assert relative_error(after, NumpyConv.forward(g, x.get().astype(np.float64),
                                                   w.get().astype(np.float64))) <= 1e-4
    assert on_host.count("winograd_filter_f4") == 3 and weight_cache.entries is None


def test_frozen_weights_into_a_cache_of_the_callers(on_host, rng):
    # An inference plan keeps its transforms: they outlive the block, and the
    # block neither reads nor fills an enclosing block's cache.
    g = _geometry((1, 3, 9, 9), (4, 3, 3, 3))
    x = HostArray(g.x_shape, rng.standard_normal(g.x_shape))
    w = HostArray(g.w_shape, rng.standard_normal(g.w_shape))
    kept = {}
    with frozen_weights():
        enclosing = weight_cache.entries
        with frozen_weights(kept):
            first = WinogradF4.forward(g, x, w).get()
            assert weight_cache.entries is kept and enclosing == {}
        assert weight_cache.entries is enclosing
    assert weight_cache.entries is None and len(kept) == 1
    w.array[:] = rng.standard_normal(w.size)         # the cached U is the old weight's
    with frozen_weights(kept):
        np.testing.assert_array_equal(WinogradF4.forward(g, x, w).get(), first)
    assert on_host.count("winograd_filter_f4") == 1


# --------------------------------------------------------------------- GPU --
class _Forced:
    """A planner that runs ``algorithm`` wherever it can, and the default choice elsewhere."""

    def __init__(self, algorithm):
        self.algorithm = algorithm
        self.default = ConvPlanner(autotune=False)

    def choose(self, g, stage):
        if stage in self.algorithm.stages and self.algorithm.supports(g):
            return self.algorithm
        return self.default.choose(g, stage)


GPU_CASES = {
    "odd_pad1": ((2, 5, 17, 19), (7, 5, 3, 3), dict(padding=1)),
    "odd_asymmetric": ((2, 5, 17, 19), (7, 5, 3, 3), dict(padding=(0, 1, 1, 0))),
    "no_padding": ((3, 4, 10, 12), (6, 4, 3, 3), dict()),
    "big_padding": ((1, 3, 6, 7), (2, 3, 3, 3), dict(padding=(3, 1, 0, 4))),
    "vgg16_64_64_56_b1": ((1, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    "vgg16_512_512_14_b2": ((2, 512, 14, 14), (512, 512, 3, 3), dict(padding=1)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", WINOGRADS, ids=lambda a: a.name)
@pytest.mark.parametrize("case", GPU_CASES)
def test_winograd_cuda_matches_numpy(algorithm, case, rng):
    x_shape, w_shape, kwargs = GPU_CASES[case]
    fan_in = w_shape[1] * 9
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(
        w_shape[0])
    with override(conv_planner=_Forced(algorithm)):
        assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
                              [x, w / np.sqrt(fan_in), b], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", WINOGRADS, ids=lambda a: a.name)
@pytest.mark.parametrize("case", ["odd_pad1", "odd_asymmetric", "vgg16_64_64_56_b1"])
@pytest.mark.parametrize("activation,residual", [("relu", False), ("relu6", True), (None, True)])
def test_winograd_fused_epilogue_cuda_matches_numpy(algorithm, case, activation, residual, rng):
    x_shape, w_shape, kwargs = GPU_CASES[case]
    g = _geometry(x_shape, w_shape, **kwargs)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(
        w_shape[0])
    inputs = [3 * x, w / np.sqrt(w_shape[1] * 9), b]
    inputs += [rng.standard_normal(g.y_shape)] if residual else []

    def fn(x, w, b, *r):
        return ops.conv2d(x, w, b, activation=activation, residual=r[0] if r else None, **kwargs)
    with override(conv_planner=_Forced(algorithm)):
        assert_backends_match(fn, inputs, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", WINOGRADS, ids=lambda a: a.name)
def test_winograd_cuda_in_several_chunks(algorithm, rng):
    x_shape, w_shape, kwargs = GPU_CASES["odd_asymmetric"]
    alpha2 = (algorithm.m + 2) ** 2
    # The one workspace knob bounds the GEMM paths' columns too: the weight
    # gradient (im2col) then runs one image at a time.
    with override(conv_planner=_Forced(algorithm),
                  conv_workspace_bytes=7 * 4 * alpha2 * (5 + 7) + 100):
        assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, **kwargs),
                              [rng.standard_normal(x_shape), rng.standard_normal(w_shape),
                               rng.standard_normal(w_shape[0])], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", WINOGRADS, ids=lambda a: a.name)
def test_conv_transpose2d_through_winograd(algorithm, rng):
    # conv_transpose2d's forward is conv2d's backward-data, its backward-data conv2d's forward.
    x, w, b = (rng.standard_normal((2, 6, 11, 13)), rng.standard_normal((6, 4, 3, 3)),
               rng.standard_normal(4))
    with override(conv_planner=_Forced(algorithm)):
        assert_backends_match(
            lambda x, w, b: ops.conv_transpose2d(x, w, b, padding=(1, 0, 2, 1)), [x, w, b],
            rtol=1e-4)


@pytest.mark.gpu
def test_heuristic_runs_winograd_on_a_wide_layer(rng):
    x_shape, w_shape = (2, 128, 28, 28), (128, 128, 3, 3)
    g = _geometry(x_shape, w_shape)
    planner = ConvPlanner(autotune=False)
    assert planner.choose(g, "forward") is planner.choose(g, "backward_data") is WinogradF4
    with override(conv_planner=planner):
        assert_backends_match(lambda x, w, b: ops.conv2d(x, w, b, padding=1, activation="relu"),
                              [rng.standard_normal(x_shape), rng.standard_normal(w_shape) / 34,
                               rng.standard_normal(128)], rtol=1e-4)


@pytest.mark.gpu
def test_frozen_weights_on_the_gpu(rng):
    x = gf.tensor(rng.standard_normal((2, 64, 12, 12)), device="cuda")
    w = gf.tensor(rng.standard_normal((64, 64, 3, 3)) / 24, device="cuda")
    g = _geometry(x.shape, w.shape)
    with frozen_weights():
        first = WinogradF4.forward(g, x.data, w.data).get()
        second = WinogradF4.forward(g, x.data, w.data).get()
        assert len(weight_cache.entries) == 1
    np.testing.assert_array_equal(first, second)
    want = NumpyConv.forward(g, x.numpy().astype(np.float64), w.numpy().astype(np.float64))
    assert relative_error(first, want) <= 1e-4


def _three_by_three(x_shape, c_out):
    return conv_geometry("conv2d", x_shape, (c_out, x_shape[1], 3, 3), (1, 1), (1, 1, 1, 1),
                         (1, 1), 1)


def test_narrow_layers_prefer_f4_only_on_many_pixels():
    # DenseNet-121's 128 -> 32 growth layers at batch 32 (measured: winograd.NARROW_*).
    assert WinogradF4.preferred(_three_by_three((32, 128, 56, 56), 32))
    assert WinogradF4.preferred(_three_by_three((32, 128, 28, 28), 32))
    assert not WinogradF4.preferred(_three_by_three((32, 128, 14, 14), 32))
    assert not WinogradF4.preferred(_three_by_three((1, 128, 56, 56), 32))
    assert not WinogradF4.preferred(_three_by_three((32, 16, 56, 56), 32))   # too few channels
    planner = ConvPlanner(autotune=False)
    assert planner.choose(_three_by_three((32, 128, 56, 56), 32), "forward") is WinogradF4
    assert planner.choose(_three_by_three((32, 128, 14, 14), 32), "forward") is Im2colDirect
