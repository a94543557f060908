"""Tiled analysis and synthesis against the whole image at once: the receptive fields the
layers' geometry gives, and results equal to float32 rounding at odd sizes and tile sizes."""
import numpy as np
import pytest

from gdnflow.codec import Codec
from gdnflow.codec.codec import CUDA_WHOLE_SIDE, TILE
from gdnflow.codec.tiling import input_span, reflected_indices, tile_ranges
from gdnflow.data.images import pad_to_multiple


def test_receptive_fields_of_the_factorized_prior(model):
    # Four 5x5 stride-2 padding-2 layers: a latent reads 16 o - 30 .. 16 o + 30, worked
    # out by hand: [2o-2, 2o+2] -> [4o-6, 4o+6] -> [8o-14, 8o+14] -> [16o-30, 16o+30].
    for o in (0, 1, 7):
        assert input_span(model.g_a, o, o) == (16 * o - 30, 16 * o + 30)
    # A pixel i receives latent o when i = 16 o + t for t in [-30, 30] (the same taps).
    for i in range(-5, 70):
        latents = [o for o in range(-10, 10) if -30 <= i - 16 * o <= 30]
        assert input_span(model.g_s, i, i) == (min(latents), max(latents)), i


def test_reflected_indices_are_numpy_reflect_padding(rng):
    for size, padded in [(1, 16), (5, 16), (17, 32), (40, 48)]:
        row = rng.integers(0, 256, size)
        assert np.array_equal(row[reflected_indices(size, padded)],
                              pad_to_multiple(row[None, None], 16)[0, 0][:padded]), size


def test_tile_ranges_cover_the_side():
    assert tile_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert tile_ranges(3, None) == [(0, 3)]


@pytest.mark.parametrize("size, tile", [((97, 131), 16), ((97, 131), 48), ((70, 53), 32),
                                        ((33, 200), 64), ((1, 90), 16)])
def test_tiled_equals_untiled(model, rng, size, tile):
    """Tiles smaller than the image both ways, sizes not multiples of the tile.

    What is exact: every tile computes the same sums of the same products as the whole
    image; only BLAS's blocking of the sums may differ with the product's shape. So y
    and the decoded image agree to float32 rounding, and q and the image's uint8 levels
    are equal unless a value sits within those ulps of a rounding boundary: in
    practice, equal (asserted here).
    """
    image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    untiled, tiled = Codec(model, tile=None), Codec(model, tile=tile)
    assert len(tiled._latent_tiles(-(-size[0] // 16), -(-size[1] // 16))) > 1
    y, y_tiled = untiled.analyse(image), tiled.analyse(image)
    np.testing.assert_allclose(y_tiled, y, rtol=1e-5, atol=1e-5 * np.abs(y).max())
    q = untiled.quantize(y)
    assert np.array_equal(tiled.quantize(y_tiled), q)
    y_hat = q.astype(np.float32) + untiled.tables.medians[:, None, None]
    decoded = untiled.synthesise(y_hat, *size)
    assert np.array_equal(tiled.synthesise(y_hat, *size), decoded)
    assert tiled.compress(image) == untiled.compress(image)


def test_tile_must_be_a_multiple_of_16(model):
    for bad in (0, 8, 24, 100.5, -16, "big"):
        with pytest.raises(ValueError, match="multiple of 16"):
            Codec(model, tile=bad)


def test_the_default_tile_on_numpy(model):
    for codec in (Codec(model), Codec(model, tile="auto")):
        assert codec.tile == TILE and codec.tile_pixels(64, 64) == TILE
    assert Codec(model, tile=None).tile_pixels(4096, 4096) is None


@pytest.mark.gpu
def test_the_default_tile_on_the_gpu(model):
    """A GPU codec takes an image up to CUDA_WHOLE_SIDE a side in one tile, larger ones in
    tiles of TILE (device memory); an explicit tile is kept."""
    from gdnflow.models.factorized_prior import FactorizedPrior
    gpu_model = FactorizedPrior(8, 12, seed=0, device="cuda")
    codec = Codec(gpu_model)
    assert codec.tile == TILE and CUDA_WHOLE_SIDE > TILE
    assert codec.tile_pixels(CUDA_WHOLE_SIDE, 1536) is None
    assert codec.tile_pixels(CUDA_WHOLE_SIDE + 16, 64) == TILE
    assert Codec(gpu_model, tile=64).tile_pixels(64, 64) == 64


@pytest.mark.gpu
def test_tiled_equals_untiled_on_the_gpu(model, rng):
    """On the GPU the convolution planner may pick another algorithm for a tile's shape than
    for the whole image's (Winograd, sub-pixel...): agreement to float32 rounding of those."""
    from gdnflow.models.factorized_prior import FactorizedPrior
    gpu_model = FactorizedPrior(8, 12, seed=0, device="cuda")
    gpu_model.load_state_dict(model.state_dict())
    image = rng.integers(0, 256, (97, 131, 3), dtype=np.uint8)
    untiled, tiled = Codec(gpu_model.eval(), tile=None), Codec(gpu_model, tile=48)
    y, y_tiled = untiled.analyse(image), tiled.analyse(image)
    np.testing.assert_allclose(y_tiled, y, rtol=1e-4, atol=1e-4 * np.abs(y).max())
    q = untiled.quantize(y)
    assert np.mean(tiled.quantize(y_tiled) != q) < 1e-3
    y_hat = q.astype(np.float32) + untiled.tables.medians[:, None, None]
    difference = tiled.synthesise(y_hat, 97, 131).astype(int) - untiled.synthesise(y_hat, 97, 131)
    assert np.abs(difference).max() <= 1
