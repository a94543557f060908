"""The latents quantised and dequantised on the GPU (cuda_src/codec_latents.cu) against
the host's quantize_latents and y_hat, bit for bit: built for the host (values at the
rounding boundaries, out of range, not finite) and on the GPU, and the GPU codecs'
compress and decompress against their host paths."""
import numpy as np
import pytest

from gdnflow.autograd import no_grad
from gdnflow.backends import cuda
from gdnflow.codec import Codec, codec_for, device_latents
from gdnflow.codec.zoo import SHIPPED, shipped_checkpoint
from gdnflow.codec.codec import dequantize_latents, quantize_latents
from gdnflow.codec.device_latents import dequantized_on_device, quantize_on_device
from gdnflow.codec.format import MAX_SYMBOL, CodecError
from gdnflow.tensor import Tensor
from gdnflow.testing import relative_error

from codec_kit import make_hyperprior, smooth_image
from host_kernels import HostMemory, ShimDevice, host_builder

HOST_SHIM = """
extern "C" int host_quantize_latents(const float* y, const float* medians, int size, int plane,
                                     float limit, int* q, int* out_of_range) {
    for (int i = 0; i < size; ++i) {
        const float v = rounded_latent(i, y, medians, plane);
        const bool inside = fabsf(v) < limit;
        if (!inside) *out_of_range = 1;
        q[i] = inside ? (int)v : 0;
    }
    return 0;
}
extern "C" void host_dequantize_latents(const int* q, const float* medians, int size, int plane,
                                        float* y_hat) {
    for (int i = 0; i < size; ++i) y_hat[i] = dequantized_latent(i, q, medians, plane);
}
"""


@pytest.fixture(scope="module")
def host_device(tmp_path_factory):
    build = host_builder(tmp_path_factory.mktemp("codec_latents_host"), "codec_latents.cu",
                         suffix=HOST_SHIM)
    return ShimDevice(build(), device_latents.SOURCE)


def boundary_latents(rng, shape=(5, 7, 9)):
    """y at and near the rounding boundaries around non-integer medians, float32."""
    medians = rng.uniform(-0.6, 0.6, shape[0]).astype(np.float32)
    halves = rng.integers(-40, 40, shape) + 0.5
    y = np.where(rng.random(shape) < 0.5, halves + medians[:, None, None],
                 rng.normal(0, 20, shape)).astype(np.float32)
    y.flat[::7] = np.nextafter(y.flat[::7], np.float32(np.inf))
    return y, medians


class _Stand:
    """What quantize_on_device reads of a cuda Tensor (shape, dtype, data.ptr), over
    host memory."""

    def __init__(self, memory):
        self.data, self.shape, self.dtype = memory, memory.shape, memory.dtype


def test_host_built_kernels_round_as_the_host(host_device, rng):
    y, medians = boundary_latents(rng)
    with cuda.simulated(host_device):
        q = quantize_on_device(_Stand(HostMemory(y[None])), medians)
    np.testing.assert_array_equal(q, quantize_latents(y, medians))


@pytest.mark.parametrize("bad", [np.nan, np.inf, float(MAX_SYMBOL) + 1])
def test_host_built_kernels_refuse_what_the_host_refuses(host_device, rng, bad):
    y, medians = boundary_latents(rng)
    y[2, 3, 4] = bad
    with pytest.raises(CodecError, match="beyond"):
        quantize_latents(y, medians)
    with cuda.simulated(host_device), pytest.raises(CodecError, match="beyond"):
        quantize_on_device(_Stand(HostMemory(y[None])), medians)


def test_host_built_dequantize_is_the_hosts_y_hat(host_device, rng):
    q = rng.integers(-3000, 3000, (4, 6, 5)).astype(np.int32)
    medians = rng.uniform(-0.6, 0.6, 4).astype(np.float32)
    with cuda.simulated(host_device):
        y_hat = dequantized_on_device(q, medians)
    np.testing.assert_array_equal(y_hat.data.array[0], dequantize_latents(q, medians))


@pytest.mark.gpu
def test_gpu_kernels_round_as_the_host(rng):
    y, medians = boundary_latents(rng, (13, 31, 17))
    q = quantize_on_device(Tensor(y[None], device="cuda"), medians)
    np.testing.assert_array_equal(q, quantize_latents(y, medians))
    y_hat = dequantized_on_device(q, medians).numpy()[0]
    np.testing.assert_array_equal(y_hat, dequantize_latents(q, medians))


@pytest.mark.gpu
@pytest.mark.parametrize("kind, height, y_hat_on_device", [
    ("factorized", 150, True), ("hyperprior", 150, True),
    ("hyperprior", 129, False)])    # 3 rows of padding past the synthesis's halo of 2
def test_gpu_codecs_compress_and_decompress_as_their_host_paths(model, kind, height,
                                                                y_hat_on_device):
    """On the device (y quantised there, y_hat made there where the synthesis reads all of
    it) the same bytes and pixels as through the host arrays."""
    net = (model if kind == "factorized" else make_hyperprior()).to("cuda")
    try:
        codec = codec_for(net)
        image = smooth_image(np.random.default_rng(4), height, 211)
        assert codec.analyse_on_device(image) is not None
        y = codec.analyse(image)
        extra = (codec.side_information(y),) if kind == "hyperprior" else ()
        data = codec.compress(image)
        assert data == codec.encode_latents(codec.quantize(y), height, 211, *extra)
        header, q = codec.decode_quantized(data)
        assert (codec.dequantize_on_device(q, height, 211) is not None) == y_hat_on_device
        np.testing.assert_array_equal(
            codec.decompress(data),
            codec.synthesise(codec.decode_latents(data)[1], height, 211))
    finally:
        net.to("numpy")


@pytest.mark.gpu
def test_gpu_synthesis_of_a_shape_decoded_again_runs_its_plan(model):
    """The first decode of a size runs g_s eagerly, the second builds its inference plan,
    the third replays it: the same pixels, up to a rounding boundary's level."""
    net = model.to("cuda")
    try:
        codec = codec_for(net)
        image = smooth_image(np.random.default_rng(5), 150, 211)
        data = codec.compress(image)
        first = codec.decompress(data)
        assert codec._plans.compiled["g_s"].builds == 0
        second, third = codec.decompress(data), codec.decompress(data)
        assert codec._plans.compiled["g_s"].builds == 1 and len(codec._plans.compiled["g_s"].plans) == 1
        np.testing.assert_array_equal(second, third)
        assert np.abs(second.astype(int) - first).max() <= 1
        assert np.mean(second == first) > 0.999
        _, q = codec.decode_quantized(data, on_device=True)
        y_hat = codec.dequantize_on_device(q, 150, 211)
        with no_grad():
            eager = codec.model.g_s(y_hat).numpy()
            planned = codec._synthesis(y_hat, True).numpy()
        assert relative_error(planned, eager) <= 1e-5
    finally:
        net.to("numpy")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["factorized", "hyperprior"])
def test_gpu_analysis_plans_write_the_eager_analysis_bytes(model, kind):
    """The first compress of a size runs g_a (and h_a) eagerly, the second builds their
    inference plans, the third replays them: the same file each time, so a file does not
    depend on how often its size was compressed before; the replayed y is the eager one."""
    net = (model if kind == "factorized" else make_hyperprior()).to("cuda")
    try:
        codec = codec_for(net)
        image = smooth_image(np.random.default_rng(6), 150, 211)
        first = codec.compress(image)
        names = ("g_a",) if kind == "factorized" else ("g_a", "h_a")
        assert all(codec._plans.compiled[name].builds == 0 for name in names)
        second, third = codec.compress(image), codec.compress(image)
        assert all(codec._plans.compiled[name].builds == 1 for name in names)
        assert first == second == third
        # Stronger than the bytes: the replayed y is the eager y (analyse runs g_a eagerly).
        np.testing.assert_array_equal(codec.analyse_on_device(image).numpy()[0],
                                      codec.analyse(image))
    finally:
        net.to("numpy")


@pytest.mark.gpu
@pytest.mark.parametrize("architecture, quality",
                         [(entry.architecture, entry.quality) for entry in SHIPPED])
def test_gpu_analysis_plans_of_the_shipped_codecs_are_the_eager_analysis(architecture, quality):
    """The same on the shipped models, at 768x512 and at a megapixel (the largest size with
    plans): which algorithms a plan's layers get depends on the shapes."""
    codec = Codec.from_checkpoint(shipped_checkpoint(architecture, quality), "cuda")
    rng = np.random.default_rng(quality)
    for height, width in ((512, 768), (1024, 1024)):
        image = smooth_image(rng, height, width)
        first, second, third = (codec.compress(image) for _ in range(3))
        assert first == second == third
        np.testing.assert_array_equal(codec.analyse_on_device(image).numpy()[0],
                                      codec.analyse(image))


@pytest.mark.gpu
def test_gpu_codec_of_a_model_in_training_mode_runs_its_transforms_eagerly(model):
    """A model put back in training mode after its codec was made (which puts it in eval
    mode): the plans' build refuses it, and the codec codes without plans, the same bytes
    as in eval mode."""
    net = model.to("cuda")
    try:
        codec = codec_for(net)
        image = smooth_image(np.random.default_rng(7), 150, 211)
        expected = codec.compress(image)        # eager: the first call of the size
        net.train()
        assert codec.compress(image) == codec.compress(image) == expected
        assert codec._plans.compiled["g_a"] is False
    finally:
        net.eval()
        net.to("numpy")


@pytest.mark.parametrize("height, whole", [(150, True), (128, True), (129, False)])
def test_a_one_tile_synthesis_reads_all_of_y_hat_unless_padding_passes_its_halo(height, whole):
    """The test that sends y_hat to the device (Codec.dequantize_on_device): a hyperprior
    image 129 rows high has 12 latent rows, its synthesis needs 9 and reads 2 more; at 150
    and 128 rows it reads them all."""
    from gdnflow.codec.codec import reads_all
    codec = codec_for(make_hyperprior())
    shape = (codec.tables.channels, 4 * -(-height // 64), 4 * -(-211 // 64))
    assert reads_all(codec._synthesis_tiles(height, 211, shape), shape) == whole
