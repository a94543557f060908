"""The exact image synthesis (gdnflow.codec.exact_image): its GPU pass, built for the host
and on the GPU, gives NumPy's pixels byte for byte, at odd sizes, in groups of output
channels and replayed; its sums stay exact at their bounds; its pixels are the float32
synthesis's within a level."""
import ctypes
from pathlib import Path

import numpy as np
import pytest

from gdnflow import ops
from gdnflow.backends import cuda
from gdnflow.codec import exact_image, exact_layers
from gdnflow.codec.codec import Codec, dequantize_latents
from gdnflow.codec.exact_image import (ACTIVATION_LIMIT, GAMMA_SUM_BITS, ExactImageSynthesis,
                                       ExactInverseGDN)
from gdnflow.codec.exact_layers import SOURCE, ExactLayer, phase_threads
from gdnflow.nn.conv import ConvTranspose2d
from gdnflow.nn.gdn import GDN
from gdnflow.nn.layers import ReLU, Sequential
from gdnflow.tensor import Tensor

from codec_kit import make_model, smooth_image
from exact_synthesis_kit import HOST_SHIM, SHAPE, SHAPE_ARGS, GemmShimDevice
from host_kernels import HOST_CHECK_PRELUDE, host_builder

IMAGE_SHIM = HOST_SHIM + f"""
extern "C" void host_exact_input_units(const float* y, double* units, int count,
                                       int fraction_bits, double limit) {{
    for (int i = 0; i < count; ++i) units[i] = exact_input_unit(y[i], fraction_bits, limit);
}}
extern "C" void host_exact_squares(const double* x, double* squares, int count, int shift) {{
    for (int i = 0; i < count; ++i) squares[i] = exact_square(x[i], shift);
}}
extern "C" void host_exact_inverse_gdn(double* x, const double* norms, const double* beta,
                                       const int* norm_shift, int channels, int plane,
                                       double limit) {{
    for (int i = 0; i < channels * plane; ++i)
        x[i] = exact_inverse_gdn_value(x[i], norms[i], beta[i / plane], norm_shift[i / plane],
                                       limit);
}}
extern "C" int host_exact_phase_outputs(int channels, int height, int width, int stride,
                                         int* outputs) {{
    ExactLayerShape s{{1, 1, 1, channels, height, width, 1, 1, 1, stride, 0, 0}};
    int first, oy, ox;
    for (int j = 0; j < exact_phase_threads(s); ++j) {{
        const int count = exact_thread_channels(j, s, &first, &oy, &ox);
        for (int k = 0; k < EXACT_CHANNELS_PER_THREAD; ++k)
            outputs[j * EXACT_CHANNELS_PER_THREAD + k] =
                k < count ? ((first + k) * height + oy) * width + ox : -1;
    }}
    return exact_phase_threads(s);
}}
extern "C" void host_exact_pixels_from_products(const double* products, const double* bias,
                                                unsigned char* pixels, {SHAPE_ARGS},
                                                int first_channel, int image_channels,
                                                int shift) {{
    {SHAPE}
    for (int j = 0; j < exact_phase_threads(s); ++j)
        exact_pixel_thread(j, products, bias, pixels, s, first_channel, image_channels, shift);
}}
"""
SHIPPED = sorted(Path(__file__).resolve().parents[2].glob("checkpoints/*.h5"))


@pytest.fixture(scope="module")
def host_device(tmp_path_factory):
    build = host_builder(tmp_path_factory.mktemp("exact_image_host"), "exact_synthesis.cu",
                         prefix=HOST_CHECK_PRELUDE, suffix=IMAGE_SHIM)
    return GemmShimDevice(build(), SOURCE)


def image_model(seed=0):
    """The codec tests' FactorizedPrior(8, 12) with gammas off their initial diagonal and
    a last layer whose pixels span 0..255 (not clipped to one end)."""
    model = make_model(seed)
    rng = np.random.default_rng(seed + 5)
    state = model.state_dict()
    for name in ("g_s.1.gamma", "g_s.3.gamma", "g_s.5.gamma"):
        state[name] = rng.uniform(0.0, 0.6, state[name].shape).astype(np.float32)
    state["g_s.6.weight"] = state["g_s.6.weight"] * 6
    state["g_s.6.bias"] = np.full(3, 0.5, np.float32)
    model.load_state_dict(state)
    return model.eval()


def random_latents(shape, seed):
    return np.random.default_rng(seed).normal(0, 4, shape).astype(np.float32)


#: A transposed layer's GEMM in one group of output channels, or one channel a group.
GROUPS = {"one group": exact_image.GEMM_BYTES, "channel by channel": 1}


@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("shape", [(12, 3, 5), (12, 1, 1), (12, 7, 4)])
def test_host_built_kernels_give_the_numpy_pixels(host_device, shape, groups):
    exact = ExactImageSynthesis(image_model().g_s, GROUPS[groups])
    y_hat = random_latents(shape, sum(shape))
    launched_before = len(host_device.launched)
    with cuda.simulated(host_device):
        got = host_device.to_numpy(exact.device_pixels(host_device.from_numpy(y_hat)))
    expected = exact.pixels(y_hat)
    assert got.dtype == np.uint8 and expected.shape == (16 * shape[1], 16 * shape[2], 3)
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(expected)) > 40         # pixels across the range, not clipped
    # FactorizedPrior(8, 12): three transposed layers of 8 outputs, one of 3, three GDNs.
    gemms = 4 + 3 if groups == "one group" else 8 + 8 + 8 + 3 + 3
    assert host_device.launched[launched_before:].count("matmul") == gemms


@pytest.mark.parametrize("channels, height, width, stride", [(3, 4, 7, 2), (2, 3, 9, 3),
                                                             (6, 2, 5, 1), (1, 1, 1, 2),
                                                             (9, 2, 3, 2)])
def test_the_finishing_threads_take_every_output_once(host_device, channels, height, width,
                                                      stride):
    """The order of the finishing kernels' threads: each output exactly once, in blocks of
    CHANNELS_PER_THREAD channels (the last block short), odd widths' last phase padded; in
    a row, the even columns first, then the odd ones (stride 2)."""
    per_thread = exact_layers.CHANNELS_PER_THREAD
    function = host_device.library.host_exact_phase_outputs
    threads = -(-channels // per_thread) * height * stride * -(-width // stride)
    outputs = np.full(threads * per_thread, -2, np.int32)
    assert function(channels, height, width, stride,
                    outputs.ctypes.data_as(ctypes.c_void_p)) == threads
    assert threads == phase_threads((1, 1, 1, channels, height, width, 1, 1, 1, stride, 0, 0))
    taken = outputs[outputs >= 0]
    np.testing.assert_array_equal(np.sort(taken), np.arange(channels * height * width))
    assert (outputs == -2).sum() == 0
    if (channels, width, stride) == (3, 7, 2):
        np.testing.assert_array_equal(outputs[:8 * per_thread:per_thread],
                                      [0, 2, 4, 6, 1, 3, 5, -1])


@pytest.mark.parametrize("kernel, stride, padding, output_padding",
                         [(5, 2, 2, 1), (3, 1, 1, 0), (4, 3, 0, 2), (5, 2, 0, 0), (1, 2, 0, 1)])
def test_a_transposed_layer_sums_as_the_numpy_backend(kernel, stride, padding, output_padding):
    """ExactLayer's own transposed sums (a GEMM, then each tap's products added where they
    land) against the NumPy backend's float64 transposed convolution: the same integers."""
    layer = ConvTranspose2d(5, 7, kernel, stride=stride, padding=padding,
                            output_padding=output_padding)
    exact = ExactLayer(layer, False, 16, 24, "test")
    a = np.rint(np.random.default_rng(kernel + stride).normal(0, 2 ** 20, (5, 6, 9)))
    expected = ops.conv_transpose2d(
        Tensor(a[None], device="numpy", dtype=np.float64),
        Tensor(exact.weight, device="numpy", dtype=np.float64),
        Tensor(exact.bias, device="numpy", dtype=np.float64), stride=stride, padding=padding,
        output_padding=output_padding).numpy()[0]
    got = exact(a)
    assert got.shape == expected.shape == exact.output_shape(a.shape)
    np.testing.assert_array_equal(got, expected)


def test_images_past_a_megapixel_are_never_kept_as_graphs():
    exact = ExactImageSynthesis(image_model().g_s)
    assert exact.replayable_shape((12, 64, 64))              # 1024 x 1024
    assert not exact.replayable_shape((12, 64, 65))          # 1024 x 1040
    assert not exact.replayable_shape((12, 128, 96))         # 2048 x 1536


def test_host_built_kernels_take_a_layer_of_many_taps(host_device):
    """11x11 kernels at stride 2: 36 taps reach each output, past the direct kernels'
    MAX_EXACT_TAPS list, which the GEMM path does not need."""
    g_s = Sequential(ConvTranspose2d(6, 5, 11, stride=2, padding=5, output_padding=1),
                     GDN(5, inverse=True),
                     ConvTranspose2d(5, 3, 5, stride=2, padding=2, output_padding=1))
    exact = ExactImageSynthesis(g_s)
    assert exact.steps[0].reaching_taps == 36
    y_hat = random_latents((6, 5, 7), 12)
    with cuda.simulated(host_device):
        got = host_device.to_numpy(exact.device_pixels(host_device.from_numpy(y_hat)))
    np.testing.assert_array_equal(got, exact.pixels(y_hat))
    assert len(np.unique(got)) > 50


def test_the_pixels_are_the_float_synthesis_within_a_level():
    model = image_model()
    y_hat = random_latents((12, 6, 9), 3)
    codec = Codec(model, tile=None)
    expected = codec.synthesise(y_hat, 96, 144)
    got = ExactImageSynthesis(model.g_s).pixels(y_hat)
    difference = np.abs(got.astype(int) - expected)
    assert difference.max() <= 1 and np.mean(difference > 0) < 0.02


#: An inverse GDN of 16 channels: its stored gamma and beta (effective: their squares).
#: "near the bounds": gamma's rows sum to about 14.5 and beta is about 0.9 2^20, so that
#: both limit the exponent: rows of about 2^17.9 units, beta about 2^49.9, norms up to
#: about 2^50.9 (bounds 2^19 and 2^51, 2^53 in all).
BOUND_CASES = {"near the bounds": (0.95, 971.5), "no gamma": (0.0, 3.0)}


@pytest.mark.parametrize("case", BOUND_CASES)
def test_the_inverse_gdn_sums_exactly_at_its_bounds(host_device, case):
    """Activations at +-ACTIVATION_LIMIT: NumPy's and the host-built kernels' norms and
    outputs equal those computed with Python's integers."""
    gamma, beta = BOUND_CASES[case]
    gdn = GDN(16, inverse=True)
    rng = np.random.default_rng(4)
    state = gdn.state_dict()
    state["gamma"] = (gamma * rng.uniform(0.95, 1.0, (16, 16))).astype(np.float32)
    state["beta"] = np.full(16, beta, np.float32)
    gdn.load_state_dict(state)
    exact = ExactInverseGDN(gdn)
    x = rng.choice([-ACTIVATION_LIMIT, ACTIVATION_LIMIT, ACTIVATION_LIMIT - 1], (16, 2, 3))
    squares = [[round(int(v) ** 2 / 2 ** exact_image.SQUARE_SHIFT) for v in row.ravel()]
               for row in x]
    norms = [[int(exact.beta[i]) + sum(int(exact.gamma[i, j]) * squares[j][p]
                                       for j in range(16)) for p in range(6)] for i in range(16)]
    if case == "near the bounds":
        assert exact.gamma.sum(axis=1).max() > 2 ** (GAMMA_SUM_BITS - 1.2)
        assert exact.beta.max() > 2 ** 49.8 and max(max(row) for row in norms) > 2 ** 50.8
    x_sqrt_n = x.reshape(16, 6) * np.sqrt(np.ldexp(np.array(norms, np.float64),
                                                   -exact.norm_shift[:, None]))
    expected = np.clip(np.rint(x_sqrt_n), -ACTIVATION_LIMIT, ACTIVATION_LIMIT)
    np.testing.assert_array_equal(exact(x).reshape(16, 6), expected)
    # The kernels' steps, built for the host (the GEMM between them is NumPy's, exact).
    library = host_device.library
    on_host = np.ascontiguousarray(x, np.float64).ravel()
    device_squares = np.empty_like(on_host)
    library.host_exact_squares.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                           ctypes.c_int]
    library.host_exact_squares(on_host.ctypes.data, device_squares.ctypes.data, on_host.size,
                               exact_image.SQUARE_SHIFT)
    assert device_squares.reshape(16, 6).tolist() == squares
    device_norms = np.ascontiguousarray(exact.gamma @ device_squares.reshape(16, 6))
    library.host_exact_inverse_gdn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2 \
        + [ctypes.c_double]
    library.host_exact_inverse_gdn(on_host.ctypes.data, device_norms.ctypes.data,
                                   exact.beta.ctypes.data, exact.norm_shift.ctypes.data, 16, 6,
                                   ACTIVATION_LIMIT)
    np.testing.assert_array_equal(on_host.reshape(16, 6), expected)


def test_each_row_of_gamma_keeps_its_precision(host_device):
    """Rows of gamma whose sums differ by 10^6 (trained ones span up to 10^13): each
    channel's output within 1.5 units plus 2^-16 of itself of x sqrt(beta + gamma x^2) in
    float64, the same on NumPy and in the host-built kernel. With one scale for all rows,
    the small rows' entries (below half a unit of the large rows' scale) became zeros."""
    rng = np.random.default_rng(7)
    gdn = GDN(12, inverse=True)
    state = gdn.state_dict()
    # Stored values: the effective gamma and beta are about their squares.
    row_scales = np.where(np.arange(12) < 6, 13.0, 0.03)
    state["gamma"] = (row_scales[:, None] * rng.uniform(0.8, 1.0, (12, 12))).astype(np.float32)
    state["beta"] = np.full(12, 0.01, np.float32)
    gdn.load_state_dict(state)
    exact = ExactInverseGDN(gdn)
    units = 2.0 ** exact_image.FRACTION_BITS
    x = np.rint(rng.uniform(-2, 2, (12, 3, 5)) * units)
    gamma = gdn.effective_gamma.numpy().astype(np.float64)
    beta = gdn.effective_beta.numpy().astype(np.float64)
    squares = (x / units).reshape(12, -1) ** 2

    def inverse_gdn(gamma):
        return x * np.sqrt(beta[:, None] + gamma @ squares).reshape(x.shape)

    expected = inverse_gdn(gamma)
    got = exact(x.copy())
    assert (np.abs(got - expected) <= 1.5 + np.abs(expected) * 2.0 ** -16).all()
    # The small rows' gamma matters: without it their outputs are far off.
    small_rows_zeroed = np.where(row_scales[:, None] < 1, 0.0, gamma)
    assert np.abs(inverse_gdn(small_rows_zeroed) - expected)[6:].max() > 1000
    assert (exact.gamma.sum(axis=1) > 2.0 ** (GAMMA_SUM_BITS - 2)).all()
    library = host_device.library
    squares = np.rint(x * x * 2.0 ** -exact_image.SQUARE_SHIFT).reshape(12, -1)
    device_norms = np.ascontiguousarray(exact.gamma @ squares)
    on_host = np.ascontiguousarray(x, np.float64).ravel()
    library.host_exact_inverse_gdn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2 \
        + [ctypes.c_double]
    library.host_exact_inverse_gdn(on_host.ctypes.data, device_norms.ctypes.data,
                                   exact.beta.ctypes.data, exact.norm_shift.ctypes.data, 12, 15,
                                   ACTIVATION_LIMIT)
    np.testing.assert_array_equal(on_host.reshape(x.shape), got)


@pytest.mark.parametrize("module, message", [(ReLU(), "cannot compute ReLU"),
                                             (GDN(4), "only the inverse")])
def test_other_layers_are_refused_by_name(module, message):
    g_s = Sequential(ConvTranspose2d(4, 4, 5, stride=2, padding=2, output_padding=1), module,
                     ConvTranspose2d(4, 3, 5, stride=2, padding=2, output_padding=1))
    with pytest.raises(ValueError, match=message):
        ExactImageSynthesis(g_s)


def test_a_synthesis_ending_in_a_gdn_is_refused():
    g_s = Sequential(ConvTranspose2d(4, 4, 5, stride=2, padding=2, output_padding=1),
                     GDN(4, inverse=True))
    with pytest.raises(ValueError, match="must end with a transposed convolution"):
        ExactImageSynthesis(g_s)


@pytest.mark.gpu
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("shape", [(12, 3, 5), (12, 1, 1), (12, 17, 23)])
def test_gpu_pass_gives_the_numpy_pixels(shape, groups):
    exact = ExactImageSynthesis(image_model().g_s, GROUPS[groups])
    y_hat = random_latents(shape, sum(shape))
    runtime = cuda.get_runtime()
    got = runtime.to_numpy(exact.device_pixels(runtime.from_numpy(y_hat)))
    np.testing.assert_array_equal(got, exact.pixels(y_hat))


@pytest.mark.gpu
def test_gpu_passes_replayed_as_graphs_give_the_numpy_pixels():
    """Eager, captured and replayed passes, over two shapes (one graph kept): NumPy's pixels."""
    exact = ExactImageSynthesis(image_model().g_s, graph_shapes=1)
    runtime = cuda.get_runtime()
    for i, shape in enumerate([(12, 5, 7)] * 3 + [(12, 4, 4)] * 2 + [(12, 5, 7)] * 2):
        y_hat = random_latents(shape, i)
        got = runtime.to_numpy(exact.device_pixels(runtime.from_numpy(y_hat)))
        np.testing.assert_array_equal(got, exact.pixels(y_hat))
    assert exact.replays.kept() == [(12, 5, 7)]


@pytest.mark.gpu
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_gpu_pass_of_a_shipped_model_gives_the_numpy_pixels(path):
    """A shipped codec's decoded latents of a photo-like 160x224 image: the same bytes."""
    codec = Codec.from_checkpoint(path, device="numpy")
    image = smooth_image(np.random.default_rng(7), 160, 224)
    _, q = codec.decode_quantized(codec.compress(image))
    y_hat = dequantize_latents(q, codec.tables.medians)
    exact = ExactImageSynthesis(Codec.from_checkpoint(path, device="cuda").model.g_s)
    runtime = cuda.get_runtime()
    got = runtime.to_numpy(exact.device_pixels(runtime.from_numpy(y_hat)))
    np.testing.assert_array_equal(got, ExactImageSynthesis(codec.model.g_s).pixels(y_hat))


def test_an_exact_codec_decodes_the_same_bytes_whatever_its_tiles():
    """Tiles of 16 pixels (their halos overlapping), 48 and the whole image: the same bytes,
    the exact synthesis's pixels of the whole latents cropped to the image."""
    model = image_model()
    image = smooth_image(np.random.default_rng(2), 45, 70)
    data = Codec(model).compress(image)
    decoded = [Codec(model, tile=tile, exact=True).decompress(data) for tile in (16, 48, None)]
    _, q = Codec(model).decode_quantized(data)
    y_hat = dequantize_latents(q, Codec(model).tables.medians)
    whole = ExactImageSynthesis(model.g_s).pixels(y_hat)
    for got in decoded:
        np.testing.assert_array_equal(got, whole[:45, :70])
    float_decoded = Codec(model).decompress(data)
    assert np.abs(decoded[0].astype(int) - float_decoded).max() <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("path", [None, *SHIPPED], ids=lambda p: "test model" if p is None
                         else p.stem)
def test_a_gpu_codec_decodes_the_numpy_codecs_bytes(path):
    """The issue's claim: a file decoded by an exact GPU codec (on the device from the rANS
    lanes to the pixels, replayed from the second decode on) gives the NumPy codec's image
    byte for byte; at 200x296 (one tile on both)."""
    image = smooth_image(np.random.default_rng(9), 200, 296)
    if path is None:
        host, gpu = Codec(image_model(), exact=True), Codec(image_model().to("cuda"), exact=True)
    else:
        host, gpu = (Codec.from_checkpoint(path, device, exact=True)
                     for device in ("numpy", "cuda"))
    data = gpu.compress(image)
    expected = host.decompress(data)
    for _ in range(3):
        np.testing.assert_array_equal(gpu.decompress(data), expected)


@pytest.mark.gpu
def test_a_tiled_gpu_codec_decodes_the_numpy_codecs_bytes():
    """Tiles of 64 pixels on the GPU (each tile's latents uploaded, never replayed): the
    NumPy codec's bytes, whose tiles are its own."""
    image = smooth_image(np.random.default_rng(10), 150, 170)
    host = Codec(image_model(), exact=True)
    gpu = Codec(image_model().to("cuda"), tile=64, exact=True)
    data = gpu.compress(image)
    for _ in range(2):
        np.testing.assert_array_equal(gpu.decompress(data), host.decompress(data))
    assert not gpu.exact_synthesis.replays.kept()


def test_closing_a_numpy_codec_keeps_it_usable():
    codec = Codec(image_model(), exact=True)
    data = codec.compress(smooth_image(np.random.default_rng(11), 40, 50))
    first = codec.decompress(data)
    codec.close()
    np.testing.assert_array_equal(codec.decompress(data), first)


@pytest.mark.gpu
@pytest.mark.parametrize("path", [None, *[p for p in SHIPPED if "hyperprior" in p.stem][:1]],
                         ids=lambda p: "test model" if p is None else p.stem)
def test_closing_a_gpu_codec_releases_its_graphs_and_plans(path):
    """After two compressions and decodes of a size, a GPU codec keeps its analysis's plan,
    its exact synthesis's graph (and a hyperprior's its hyper-synthesis's); close() drops
    them and the codec decodes the same bytes after."""
    image = smooth_image(np.random.default_rng(12), 128, 192)
    codec = (Codec(image_model().to("cuda"), exact=True) if path is None
             else Codec.from_checkpoint(path, "cuda", exact=True))
    data = codec.compress(image)
    assert codec.compress(image) == data         # the second builds the analysis's plan
    decoded = [codec.decompress(data) for _ in range(3)]
    hyper = getattr(codec.tables, "hyper_synthesis", None)
    assert codec.exact_synthesis.replays.kept()
    assert hyper is None or hyper.replays.kept()
    assert any(plans and plans.plans for plans in codec._plans.compiled.values())
    codec.close()
    assert not codec.exact_synthesis.replays.kept()
    assert hyper is None or not hyper.replays.kept()
    assert not any(plans and plans.plans for plans in codec._plans.compiled.values())
    for _ in range(3):
        np.testing.assert_array_equal(codec.decompress(data), decoded[0])
    np.testing.assert_array_equal(decoded[1], decoded[0])
