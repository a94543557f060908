"""Augmented training crops: flips and downscales drawn as configured, crops of the scaled
image as Pillow would make them, the same crops for the same seed, the default unchanged
from the crops gdnflow always drew, and bad settings refused by name."""
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gdnflow.data import Augmentation, ImageFolder
from gdnflow.data.augment import HORIZONTAL, PYRAMID_STEP, VERTICAL, pyramid_level
from gdnflow.train import TrainConfig

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three smooth RGB images, 96x128, 120x90 and 64x64 (a 32x32 crop fits each)."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(5)
    for i, (h, w) in enumerate([(96, 128), (120, 90), (64, 64)]):
        coarse = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
        Image.fromarray(coarse).resize((w, h), Image.BICUBIC).save(folder / f"p{i}.png")
    return folder


def plans(data, augmentation, steps=250, batch_size=8, seed=4):
    return [p for step in range(steps)
            for p in data.batch_plan(seed, step, batch_size, augmentation)]


def test_the_default_draws_the_crops_gdnflow_always_drew(photos):
    """Position and horizontal flip from default_rng([seed, 1, step]): top, left, flip per
    sample, in that order; no scaling. Checkpoints of older runs resume onto these crops."""
    data = ImageFolder(photos, crop=32)
    for step in (0, 7):
        rng = np.random.default_rng([3, 1, step])
        for b, plan in enumerate(data.batch_plan(3, step, 5)):
            j = step * 5 + b
            assert plan.index == data.permutation(3, j // 3)[j % 3]
            h, w = data.sizes[plan.index]
            assert plan.top == rng.integers(0, h - 32 + 1)
            assert plan.left == rng.integers(0, w - 32 + 1)
            assert plan.flip == (HORIZONTAL if rng.random() < 0.5 else 0)
            assert plan.scale == 1.0


@pytest.mark.parametrize("flip, horizontal, vertical", [("none", 0, 0), ("horizontal", 0.5, 0),
                                                        ("both", 0.5, 0.5)])
def test_flips_happen_half_the_time_as_configured(photos, flip, horizontal, vertical):
    codes = np.array([p.flip for p in plans(ImageFolder(photos, crop=32), Augmentation(flip))])
    assert len(codes) == 2000
    h, v = (codes & HORIZONTAL) > 0, (codes & VERTICAL) > 0
    assert abs(h.mean() - horizontal) < 0.05 and abs(v.mean() - vertical) < 0.05
    if flip == "both":      # independent: each of the four combinations a quarter of the time
        assert abs((h & v).mean() - 0.25) < 0.05


def test_flipped_crops_are_mirrored(photos):
    data = ImageFolder(photos, crop=32)
    plain = data.crop_sample(0, 5, 9, 0)
    np.testing.assert_array_equal(data.crop_sample(0, 5, 9, HORIZONTAL), plain[:, :, ::-1])
    np.testing.assert_array_equal(data.crop_sample(0, 5, 9, VERTICAL), plain[:, ::-1, :])
    np.testing.assert_array_equal(data.crop_sample(0, 5, 9, HORIZONTAL | VERTICAL),
                                  plain[:, ::-1, ::-1])
    np.testing.assert_array_equal(data.crop_sample(0, 5, 9, True), plain[:, :, ::-1])


def test_scales_are_log_uniform_in_the_range_and_crops_fit(photos):
    data = ImageFolder(photos, crop=32)
    drawn = plans(data, Augmentation(scale_range=(0.25, 1.0)))
    # Only the 96x128 image can go down to 1/4 (32 / 96 = 1/3 is its floor): the others are
    # held at crop / min side (120x90: 32/90, 64x64: 1/2).
    floors = {i: 32 / min(data.sizes[i]) for i in range(len(data))}
    for p in drawn:
        assert floors[p.index] - 1e-12 <= p.scale <= 1.0
        h, w = data.sizes[p.index]
        assert 0 <= p.top <= round(h * p.scale) - 32 and 0 <= p.left <= round(w * p.scale) - 32
    first = np.array([p.scale for p in drawn if p.index == 0])
    # log-uniform on [1/4, 1], floored at 1/3: P(s = 1/3) = log(4/3) / log(4); above it
    # each octave alike
    assert abs(np.mean(np.isclose(first, 1 / 3)) - math.log(4 / 3) / math.log(4)) < 0.06
    assert abs(np.mean(first >= 0.5) - 0.5) < 0.06
    assert abs(np.mean((first > 1 / 3) & (first < 0.5)) - math.log(1.5) / math.log(4)) < 0.06
    # A range above every floor is drawn as it is.
    narrow = np.array([p.scale for p in plans(data, Augmentation(scale_range=(0.6, 0.8)), 50)])
    assert narrow.min() >= 0.6 and narrow.max() <= 0.8 and narrow.max() - narrow.min() > 0.15


def test_an_image_smaller_than_the_crop_is_never_scaled(tmp_path):
    Image.fromarray(np.full((20, 40, 3), 7, np.uint8)).save(tmp_path / "small.png")
    data = ImageFolder(tmp_path, crop=32)
    assert {p.scale for p in plans(data, Augmentation(scale_range=(0.25, 0.5)), 5)} == {1.0}
    assert data.batch(0, 0, 2, augmentation=Augmentation(scale_range=(0.25, 0.5))).shape == \
        (2, 3, 32, 32)


def test_a_scaled_crop_is_the_crop_of_the_scaled_image(photos):
    """As Pillow's Lanczos resize of the whole image, then the crop: within one level of 255
    down to PYRAMID_STEP (the two resizes round their 8-bit intermediate alike up to float
    rounding); below, resampled from a downscaled copy, within 1 level RMS and 3 at most."""
    data = ImageFolder(photos, crop=32)
    pixels = data.pixels(0)                                  # 96 x 128
    for scale, top, left in [(0.9, 5, 7), (0.75, 0, 60), (0.5, 0, 0), (0.5, 16, 32),
                             (0.37, 3, 11), (1 / 3, 0, 10)]:
        h, w = round(96 * scale), round(128 * scale)
        whole = np.asarray(Image.fromarray(pixels).resize((w, h), Image.LANCZOS))
        expected = whole[top:top + 32, left:left + 32].transpose(2, 0, 1) / 255
        crop = data.crop_sample(0, top, left, 0, scale)
        assert crop.dtype == np.float32 and crop.shape == (3, 32, 32)
        levels = 255 * (crop - expected)
        if scale >= PYRAMID_STEP:
            assert np.abs(levels).max() < 1.01
        else:
            assert np.sqrt(np.mean(levels ** 2)) < 1 and np.abs(levels).max() < 3.01, scale
        # Downscaling averages: the crop is smoother than a crop of the original.
        assert np.abs(np.diff(crop, axis=2)).mean() > np.abs(np.diff(data.crop_sample(
            0, top, left, 0), axis=2)).mean()


def test_the_same_seed_gives_the_same_augmented_batches(photos):
    vary = Augmentation(flip="both", scale_range=(0.3, 1.0))
    data = ImageFolder(photos, crop=32)
    batch = data.batch(9, 4, 6, augmentation=vary)
    np.testing.assert_array_equal(batch, ImageFolder(photos, crop=32).batch(9, 4, 6,
                                                                           augmentation=vary))
    with ThreadPoolExecutor(3) as pool:
        np.testing.assert_array_equal(batch, data.batch(9, 4, 6, pool=pool, augmentation=vary))
    halves = [data.batch(9, 4, 6, shard=(r, 2), augmentation=vary) for r in range(2)]
    np.testing.assert_array_equal(np.concatenate(halves), batch)
    assert not np.array_equal(batch, data.batch(10, 4, 6, augmentation=vary))
    assert not np.array_equal(batch, data.batch(9, 4, 6))      # the augmentation changes them
    # Flips and scales keep each sample's image and crop position stream: same images.
    assert [p.index for p in data.batch_plan(9, 4, 6, vary)] == \
        [p.index for p in data.batch_plan(9, 4, 6)]


@pytest.mark.parametrize("settings, message", [
    (dict(flip="vertical"), "flip must be one of none, horizontal, both, got 'vertical'"),
    (dict(scale_range=(0, 1)), r"0 < low <= high <= 1 .*got \(0, 1\)"),
    (dict(scale_range=(0.8, 0.5)), r"0 < low <= high <= 1 .*got \(0.8, 0.5\)"),
    (dict(scale_range=(0.5, 2)), r"0 < low <= high <= 1 .*got \(0.5, 2\)"),
    (dict(scale_range=(float("nan"), 1)), r"got \(nan, 1\)"),
    (dict(scale_range=(0.5,)), r"scale_range must be two numbers \(low, high\), got \(0.5,\)"),
    (dict(scale_range="ab"), "scale_range must be two numbers"),
])
def test_bad_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        Augmentation(**settings)
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings).check()


def test_a_crop_is_resampled_from_the_pyramid_level_just_above_its_scale():
    assert [pyramid_level(s) for s in (1.0, 0.71, 0.7, 0.5, 0.26, 0.25)] == [0, 0, 1, 2, 3, 4]
    for scale in np.random.default_rng(2).uniform(0.05, 1, 200):
        level = pyramid_level(scale)
        assert PYRAMID_STEP ** level >= scale > PYRAMID_STEP ** (level + 1)


def test_crops_come_from_pyramid_levels_made_once_and_cached(photos):
    data = ImageFolder(photos, crop=32)
    asked = []
    picture = data.picture
    data.picture = lambda index, level=0: asked.append(level) or picture(index, level)
    data.crop_sample(0, 3, 11, 0, 0.37)
    assert asked[0] == pyramid_level(0.37) == 2         # resampled from the level at 1/2
    del data.picture
    half = data.picture(0, 2)
    assert half.size == (64, 48) and data.picture(0, 2) is half
    assert data.picture(0, 3).size == (45, 34)       # 128 and 96 times 2^-1.5, rounded
