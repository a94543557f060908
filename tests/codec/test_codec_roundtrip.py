"""compress -> decompress against the model's evaluation path: latents equal
bit for bit, images equal (NumPy) or within one level (GPU)."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.codec import Codec, compress, decompress, read_image, to_uint8
from gdnflow.codec.codec import image_to_array
from gdnflow.data.images import load_image, pad_to_multiple


def evaluation_path(model, image):
    """(y_hat (M, h, w), uint8 reconstruction) of the model's own evaluation forward,
    on the padded image as the trainer's evaluation pads it."""
    x = pad_to_multiple(image_to_array(image), 16)
    device = model.g_a[0].weight.device
    model.eval()
    with gf.no_grad():
        out = model(gf.tensor(x[None], device=device))
    h, w = image.shape[:2]
    return out["y_hat"].numpy()[0], to_uint8(out["x_hat"].numpy()[0][:, :h, :w])


@pytest.mark.parametrize("kind", ["png", "jpg"])
def test_round_trip_equals_the_evaluation_path(model, image_files, kind):
    image = read_image(image_files[kind])
    assert image.shape == ((97, 131, 3) if kind == "png" else (131, 97, 3))
    # read_image gives the pixels load_image (the trainer's reader) gives.
    assert np.array_equal(image_to_array(image), load_image(image_files[kind]))
    codec = Codec(model)
    data = codec.compress(image)
    header, y_hat = codec.decode_latents(data)
    y_eval, x_eval = evaluation_path(model, image)
    assert y_hat.dtype == np.float32 and np.array_equal(y_hat, y_eval)
    assert np.array_equal(codec.decompress(data), x_eval)
    # Some latents lie outside the supports: the escapes are exercised.
    q = codec.quantize(codec.analyse(image))
    outside = (q < codec.tables.low[:, None, None]) | (q > codec.tables.high[:, None, None])
    assert outside.any()


@pytest.mark.parametrize("size", [(1, 1), (16, 16), (17, 33), (5, 200)])
def test_any_size(model, rng, size):
    image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    data = compress(model, image)
    decoded = decompress(model, data)
    assert decoded.shape == image.shape and decoded.dtype == np.uint8
    assert np.array_equal(decoded, evaluation_path(model, image)[1])


def test_compression_is_deterministic(model, small_image):
    assert Codec(model).compress(small_image) == Codec(model).compress(small_image)


def test_bad_images_are_refused(model):
    codec = Codec(model)
    with pytest.raises(ValueError, match="uint8 of shape"):
        codec.compress(np.zeros((8, 8, 3), np.float32))
    with pytest.raises(ValueError, match="uint8 of shape"):
        codec.compress(np.zeros((8, 8), np.uint8))
    with pytest.raises(ValueError, match="empty"):
        codec.compress(np.zeros((0, 8, 3), np.uint8))


def test_diverged_latents_are_refused(model, small_image):
    from gdnflow.codec import CodecError
    codec = Codec(model)
    y = codec.analyse(small_image)
    y[0, 0, 0] = np.nan
    with pytest.raises(CodecError, match="not finite"):
        codec.quantize(y)


@pytest.mark.gpu
def test_gpu_matches_numpy(model, image_files):
    """The GPU's file decodes to the GPU evaluation path's latents; a NumPy file decodes on
    the GPU to the same latents and an image within one level of NumPy's."""
    from gdnflow.models.factorized_prior import FactorizedPrior
    gpu_model = FactorizedPrior(8, 12, seed=0, device="cuda")
    gpu_model.load_state_dict(model.state_dict())
    cpu, gpu = Codec(model), Codec(gpu_model)
    assert gpu.tables.digest() == cpu.tables.digest()
    image = read_image(image_files["png"])
    # Encoding on the GPU: exactly the GPU evaluation path's latents.
    data_gpu = gpu.compress(image)
    y_eval, x_eval = evaluation_path(gpu_model, image)
    assert np.array_equal(gpu.decode_latents(data_gpu)[1], y_eval)
    assert np.array_equal(gpu.decompress(data_gpu), x_eval)
    assert np.array_equal(cpu.decode_latents(data_gpu)[1], y_eval)
    # Decoding a NumPy file on the GPU.
    data_cpu = cpu.compress(image)
    assert np.array_equal(gpu.decode_latents(data_cpu)[1], cpu.decode_latents(data_cpu)[1])
    difference = np.abs(gpu.decompress(data_cpu).astype(int) - cpu.decompress(data_cpu))
    assert difference.max() <= 1, difference.max()
