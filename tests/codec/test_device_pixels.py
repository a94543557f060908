"""The GPU codec's pixel conversions (cuda_src/codec_pixels.cu) against their NumPy
twins, image_to_array and to_uint8: bit for bit, on values at the rounding
boundaries, with reflection-padded tiles, built for the host and on the GPU; and a
GPU codec's files and images against the NumPy codec's."""
import numpy as np
import pytest

from gdnflow.backends import cuda
from gdnflow.codec import device_pixels
from gdnflow.codec.codec import Codec, image_to_array, reflected_indices, to_uint8
from gdnflow.codec.device_pixels import DeviceImage, uint8_pixels
from gdnflow.tensor import Tensor

from codec_kit import make_model, smooth_image
from host_kernels import HostMemory, ShimDevice, host_builder

HOST_SHIM = """
extern "C" void host_unit_pixels(const unsigned char* image, const int* rows,
                                 const int* columns, float* x, int height, int width,
                                 int image_width) {
    for (int i = 0; i < 3 * height * width; ++i)
        x[i] = unit_pixel(i, image, rows, columns, height, width, image_width);
}
extern "C" void host_uint8_pixels(const float* x, unsigned char* out, int height, int width,
                                  int top, int left, int out_height, int out_width) {
    for (int i = 0; i < 3 * out_height * out_width; ++i)
        out[i] = uint8_pixel(i, x, height, width, top, left, out_width);
}
"""


@pytest.fixture(scope="module")
def host_device(tmp_path_factory):
    build = host_builder(tmp_path_factory.mktemp("codec_pixels_host"), "codec_pixels.cu",
                         suffix=HOST_SHIM)
    return ShimDevice(build(), device_pixels.SOURCE)


def boundary_pixels(rng, shape):
    """float32 values around every k/255 and (k + 1/2)/255 (where rounding turns), beyond
    [0, 1], and random ones."""
    k = rng.integers(-3, 259, shape).astype(np.float32)
    x = (k + rng.choice([0.0, 0.5], shape).astype(np.float32)) / np.float32(255)
    steps = rng.integers(-2, 3, shape)
    x = np.nextafter(x, np.where(steps > 0, np.inf, -np.inf).astype(np.float32))
    x = np.where(steps == 0, (k + 0.5) / np.float32(255), x).astype(np.float32)
    random = rng.random(shape, dtype=np.float32) * 1.2 - 0.1
    return np.where(rng.random(shape) < 0.3, random, x).astype(np.float32)


def padded_indices(image, multiple):
    height, width = image.shape[:2]
    return (reflected_indices(height, -(-height // multiple) * multiple),
            reflected_indices(width, -(-width // multiple) * multiple))


def expected_tile(image, rows, columns):
    return image_to_array(image[np.ix_(rows, columns)])


def check_unit_tiles(image):
    rows, columns = padded_indices(image, 16)
    for r, c in [(slice(None), slice(None)), (slice(3, 40), slice(0, 17)),
                 (slice(len(rows) - 9, None), slice(len(columns) - 20, None))]:
        got = DeviceImage(image).tile(rows[r], columns[c])
        array = cuda.get_runtime().to_numpy(got.data)
        assert array.shape == (1, 3, len(rows[r]), len(columns[c]))
        np.testing.assert_array_equal(array[0], expected_tile(image, rows[r], columns[c]))


def check_uint8_crops(x):
    full = x[0]
    for top, left, height, width in [(0, 0, *full.shape[1:]), (5, 7, 11, 23),
                                     (full.shape[1] - 13, 1, 13, full.shape[2] - 1)]:
        got = uint8_pixels(Tensor.wrap(cuda.get_runtime().from_numpy(x), "cuda"), top, left,
                           height, width)
        np.testing.assert_array_equal(
            got, to_uint8(full[:, top:top + height, left:left + width]))


def test_host_built_unit_pixels_equal_image_to_array(host_device, rng):
    image = rng.integers(0, 256, (37, 45, 3), np.uint8)
    with cuda.simulated(host_device):
        check_unit_tiles(image)
    assert host_device.launched == ["unit_pixels"] * 3


def test_host_built_uint8_pixels_equal_to_uint8(host_device, rng):
    x = boundary_pixels(rng, (1, 3, 41, 53))
    with cuda.simulated(host_device):
        check_uint8_crops(x)
    # the values straddle the roundings: the crops' pixels take many levels
    assert len(np.unique(to_uint8(x[0]))) > 200


def test_a_crop_outside_the_pixels_is_refused(host_device):
    x = Tensor.wrap(HostMemory(np.zeros((1, 3, 8, 8), np.float32)), "cuda")
    with cuda.simulated(host_device), pytest.raises(ValueError, match="5x4 crop at"):
        uint8_pixels(x, 4, 0, 5, 4)


@pytest.mark.gpu
def test_gpu_unit_pixels_equal_image_to_array(rng):
    check_unit_tiles(rng.integers(0, 256, (301, 517, 3), np.uint8))


@pytest.mark.gpu
def test_gpu_uint8_pixels_equal_to_uint8(rng):
    check_uint8_crops(boundary_pixels(rng, (1, 3, 203, 131)))


@pytest.mark.gpu
def test_gpu_codec_latents_and_images_match_numpy():
    """The GPU codec's latents equal the NumPy codec's up to float rounding (at most a
    few elements one step off), and it decodes the NumPy codec's file within 1 level."""
    model = make_model()
    cpu = Codec(model)
    gpu_model = make_model()
    gpu_model.to("cuda")
    gpu = Codec(gpu_model)
    image = smooth_image(np.random.default_rng(5), 150, 211)
    q_cpu, q_gpu = (c.quantize(c.analyse(image)) for c in (cpu, gpu))
    assert np.mean(q_cpu != q_gpu) < 1e-3 and np.abs(q_cpu - q_gpu).max() <= 1
    data = cpu.compress(image)
    levels = np.abs(gpu.decompress(data).astype(int) - cpu.decompress(data).astype(int))
    assert levels.max() <= 1


def test_pixels_that_are_not_float32_are_refused(host_device):
    """A 16-bit synthesis output (autocast) would be read as half as many float32s."""
    x = Tensor.wrap(HostMemory(np.zeros((1, 3, 8, 8), np.float16)), "cuda")
    with cuda.simulated(host_device), pytest.raises(ValueError, match="must be float32"):
        uint8_pixels(x, 0, 0, 8, 8)
