"""Image folders (reading, small images, deterministic crops) and the background loader
(order, clean stop, exceptions carried to the consumer)."""
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gdnflow import config
from gdnflow.data import (BackgroundLoader, ImageFolder, ImageReadError, ImageTooLargeError,
                          NoImagesError, image_size, load_image, pad_to_multiple, read_rgb8)
from gdnflow.data import images as images_module

Image = pytest.importorskip("PIL.Image")


def write_image(path, array):
    Image.fromarray(array).save(path)
    return path


@pytest.fixture
def folder(tmp_path, rng):
    """Five RGB images of different sizes (two nested one level down) and one tiny one."""
    (tmp_path / "nested").mkdir()
    for i, (h, w) in enumerate([(40, 52), (48, 40), (64, 64), (37, 45), (50, 33)]):
        where = tmp_path / ("nested" if i >= 3 else "") / f"im{i}.png"
        write_image(where, rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    write_image(tmp_path / "tiny.png", rng.integers(0, 256, (12, 20, 3), dtype=np.uint8))
    (tmp_path / "notes.txt").write_text("not an image")
    return tmp_path


def test_load_image_modes(tmp_path, rng):
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    Image.fromarray(rgb[:, :, 0]).save(tmp_path / "grey.png")
    Image.fromarray(np.dstack([rgb, np.full((5, 7), 9, np.uint8)])).save(tmp_path / "rgba.png")
    Image.fromarray(rgb[:, :, 0].astype(np.uint16) * 257).save(tmp_path / "grey16.png")
    Image.fromarray(rgb).save(tmp_path / "photo.jpg", quality=95)
    np.testing.assert_array_equal(load_image(tmp_path / "rgb.png"),
                                  rgb.transpose(2, 0, 1) / np.float32(255))
    grey = load_image(tmp_path / "grey.png")
    assert grey.shape == (3, 5, 7) and np.array_equal(grey[0], grey[2])
    np.testing.assert_allclose(grey[1], rgb[:, :, 0] / 255, atol=1e-7)
    np.testing.assert_array_equal(load_image(tmp_path / "rgba.png"), load_image(tmp_path / "rgb.png"))
    np.testing.assert_allclose(load_image(tmp_path / "grey16.png"), grey, atol=1e-7)
    jpeg = load_image(tmp_path / "photo.jpg")
    assert jpeg.dtype == np.float32 and jpeg.shape == (3, 5, 7)
    assert 0 <= jpeg.min() and jpeg.max() <= 1


def test_read_rgb8_gives_the_file_s_bytes(tmp_path, rng):
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    Image.fromarray(np.dstack([rgb, np.full((5, 7), 9, np.uint8)])).save(tmp_path / "rgba.png")
    for name in ("rgb.png", "rgba.png"):
        pixels = read_rgb8(tmp_path / name)
        assert pixels.dtype == np.uint8 and np.array_equal(pixels, rgb), name


def test_images_over_the_pixel_limit_are_refused_from_the_header(tmp_path, rng):
    pillow_limit = Image.MAX_IMAGE_PIXELS
    path = write_image(tmp_path / "big.png", rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    with config.override(max_image_pixels=1199):
        for read in (load_image, read_rgb8, image_size):
            with pytest.raises(ImageTooLargeError, match=r"big.png: 40x30 pixels \(1200\) is more "
                                                         r"than the limit of 1199 .*--max-pixels"):
                read(path)
        assert read_rgb8(path, max_pixels=1200).shape == (30, 40, 3)      # raised for one call
        with pytest.raises(NoImagesError, match="big.png: 40x30"):
            ImageFolder([path], crop=16)
    with config.override(max_image_pixels=1200):
        assert image_size(path) == (30, 40)
    # Pillow's own limit is lifted only while gdnflow reads, and restored after a refusal too.
    assert Image.MAX_IMAGE_PIXELS == pillow_limit


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_unreadable_images_name_their_file(tmp_path, rng, damage):
    good = write_image(tmp_path / "good.png", rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    data = good.read_bytes()
    bad = tmp_path / "bad.png"
    bad.write_bytes(data[:len(data) // 2] if damage == "truncated" else b"\x89PNG" + bytes(40))
    for read in (load_image, read_rgb8):
        with pytest.raises(ImageReadError, match=r"^\S*bad.png: cannot (read|decode) the image"):
            read(bad)
    with pytest.raises(ImageReadError, match="missing.png: no such image file"):
        read_rgb8(tmp_path / "missing.png")
    # In a folder: a header that reads is listed; decoding it names the file.
    if damage == "truncated":
        data_set = ImageFolder([good, bad], crop=32)
        with pytest.raises(ImageReadError, match="bad.png"):
            data_set.image(1)


def test_folder_lists_images_recursively_and_pads_small_ones(folder, caplog):
    with caplog.at_level(logging.WARNING, logger="gdnflow"):
        data = ImageFolder(folder, crop=32)
    assert len(data) == 6
    assert [p.relative_to(folder).as_posix() for p in data.paths] == [
        "im0.png", "im1.png", "im2.png", "nested/im3.png", "nested/im4.png", "tiny.png"]
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "1 of 6 images" in notices[0] and "padded" in notices[0]
    tiny = [p.name for p in data.paths].index("tiny.png")
    crop = data.crop_sample(tiny, 0, 0, False)
    assert crop.shape == (3, 32, 32)
    np.testing.assert_array_equal(crop[:, :12, :20], data.image(tiny))
    np.testing.assert_array_equal(crop[:, 12, :20], crop[:, 10, :20])        # reflection


def test_folder_skips_small_images_with_one_notice(folder, caplog):
    with caplog.at_level(logging.WARNING, logger="gdnflow"):
        data = ImageFolder(folder, crop=40, small="skip")
    names = sorted(p.name for p in data.paths)
    assert names == ["im0.png", "im1.png", "im2.png"]
    assert len(caplog.records) == 1 and "skipped" in caplog.records[0].getMessage()
    with pytest.raises(NoImagesError, match="smaller than"):
        ImageFolder(folder, crop=128, small="skip")


def test_folder_errors(tmp_path):
    with pytest.raises(NoImagesError, match="does not exist"):
        ImageFolder(tmp_path / "missing")
    with pytest.raises(NoImagesError, match="no images"):
        ImageFolder(tmp_path)
    (tmp_path / "broken.png").write_bytes(b"not a png")
    with pytest.raises(NoImagesError, match="unreadable"):
        ImageFolder(tmp_path)


def test_default_data_set_is_scikit_image_photos_or_a_clear_error():
    try:
        data = ImageFolder(None)
    except NoImagesError as exc:
        assert "pass a folder" in str(exc)
    else:
        paths = images_module.sample_photos()
        assert data.paths == paths
        assert len(paths) >= 5 and all(p.exists() for p in paths)
        assert all(min(images_module.image_size(p)) >= 256 for p in paths)
    # Without scikit-image (here: a package name nothing installs), the error says what to install.
    with pytest.raises(NoImagesError, match="gdnflow\\[data\\]"):
        images_module.sample_photos("gdnflow_test_no_such_package")


def test_batches_are_a_function_of_seed_and_step(folder):
    data = ImageFolder(folder, crop=32)
    a = data.batch(seed=1, step=5, batch_size=4)
    assert a.shape == (4, 3, 32, 32) and a.dtype == np.float32
    np.testing.assert_array_equal(a, ImageFolder(folder, crop=32).batch(1, 5, 4))
    with ThreadPoolExecutor(3) as pool:
        np.testing.assert_array_equal(a, data.batch(1, 5, 4, pool=pool))
    assert not np.array_equal(a, data.batch(1, 6, 4))
    assert not np.array_equal(a, data.batch(2, 5, 4))


def test_the_cache_keeps_what_fits_and_crops_read_the_file_s_pixels(folder):
    data = ImageFolder(folder, crop=32, cache_bytes=4 * 64 * 64)     # the 64x64 image alone
    paths = {p.name: i for i, p in enumerate(data.paths)}
    big, other = paths["im2.png"], paths["im0.png"]
    expected = read_rgb8(folder / "im2.png")
    np.testing.assert_array_equal(data.pixels(big), expected)
    first = data.picture(big)
    assert data.picture(big) is first                                # cached
    data.pixels(other)                                               # evicts it
    assert len(data._cache) == 1 and data._cache_bytes == 4 * 52 * 40
    assert data.picture(big) is not first                            # decoded again
    crop = data.crop_sample(big, 5, 9, False)
    np.testing.assert_array_equal(crop, expected[5:37, 9:41].transpose(2, 0, 1) / np.float32(255))


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_shards_of_a_batch_are_disjoint_and_make_the_whole_batch(folder, ranks):
    data = ImageFolder(folder, crop=32)
    whole = data.batch(seed=1, step=5, batch_size=4)
    shards = [ImageFolder(folder, crop=32).batch(1, 5, 4, shard=(r, ranks)) for r in range(ranks)]
    assert all(len(s) == 4 // ranks for s in shards)
    np.testing.assert_array_equal(np.concatenate(shards), whole)
    plan = [index for index, *_ in data.batch_plan(1, 5, 4)]
    assert len(set(plan)) == 4          # within an epoch: each shard's images are its own


def test_a_batch_that_does_not_split_evenly_is_refused(folder):
    with pytest.raises(ValueError, match="batch of 6 crops does not split evenly over 4 "
                       "processes: use a batch size that is a multiple of 4"):
        ImageFolder(folder, crop=32).batch(1, 0, 6, shard=(1, 4))


def test_each_epoch_visits_every_image_once(folder):
    data = ImageFolder(folder, crop=32)
    plans = [data.batch_plan(3, step, 2) for step in range(6)]     # 12 samples: two epochs of 6
    order = [index for plan in plans for index, *_ in plan]
    assert sorted(order[:6]) == sorted(order[6:]) == list(range(6))
    assert order[:6] != order[6:]            # a new order each epoch (for this seed)
    for plan in plans:
        for index, top, left, flip, scale in plan:
            h, w = data.sizes[index]
            assert 0 <= top <= max(h - 32, 0) and 0 <= left <= max(w - 32, 0)


def test_flip_mirrors_the_crop(folder):
    data = ImageFolder(folder, crop=32)
    np.testing.assert_array_equal(data.crop_sample(2, 3, 4, True),
                                  data.crop_sample(2, 3, 4, False)[:, :, ::-1])


def test_pad_to_multiple():
    image = np.arange(3 * 5 * 7, dtype=np.float32).reshape(3, 5, 7)
    padded = pad_to_multiple(image, 4)
    assert padded.shape == (3, 8, 8)
    np.testing.assert_array_equal(padded[:, :5, :7], image)
    assert pad_to_multiple(padded, 4) is padded
    assert pad_to_multiple(np.zeros((3, 1, 1), np.float32), 16).shape == (3, 16, 16)


# -------------------------------------------------------------- loader --
def test_loader_yields_steps_in_order_from_start():
    with BackgroundLoader(lambda step: step * 10, start=3, stop=9, prefetch=2) as loader:
        assert list(loader) == [30, 40, 50, 60, 70, 80]
    assert not loader.alive


def test_loader_passes_a_pool_to_parallel_batches():
    seen = []

    def make(step, pool=None):
        seen.append(pool)
        return step

    with BackgroundLoader(make, stop=2, workers=3) as loader:
        assert list(loader) == [0, 1]
    assert all(isinstance(p, ThreadPoolExecutor) for p in seen)


def test_loader_makes_prefetch_batches_at_once_and_queues_them_in_order():
    # Each batch waits for three others to be in the making: one at a time would break
    # the barrier. Later steps finish first (shorter sleeps): the order must hold anyway.
    barrier = threading.Barrier(4, timeout=5)

    def make(step, pool=None):
        if step < 4:
            barrier.wait()
        time.sleep(0.01 * (12 - step))
        if step == 9:
            raise BadBatch("no batch 9")
        return step

    loader = BackgroundLoader(make, start=0, stop=12, prefetch=4, workers=2)
    assert [next(loader) for _ in range(9)] == list(range(9))
    with pytest.raises(BadBatch, match="no batch 9"):
        next(loader)
    assert not loader.alive


def test_loader_stops_cleanly_while_the_queue_is_full():
    made = []
    loader = BackgroundLoader(lambda step: made.append(step) or step, prefetch=2)
    assert next(loader) == 0
    deadline = time.monotonic() + 2
    while len(made) < 3 and time.monotonic() < deadline:      # the worker fills the queue...
        time.sleep(0.01)
    assert loader.alive                                        # ...and waits on it
    started = time.monotonic()
    loader.close()
    assert not loader.alive and time.monotonic() - started < 1.0
    assert len(made) <= 4                                      # bounded: no run-away prefetch
    with pytest.raises(StopIteration):
        next(loader)
    loader.close()                                             # twice is fine


def test_loader_stops_when_the_consumer_leaves_the_loop_early():
    with BackgroundLoader(lambda step: step) as loader:
        for step in loader:
            if step == 2:
                break
    assert not loader.alive


class BadBatch(RuntimeError):
    pass


def test_loader_carries_worker_exceptions_to_the_consumer():
    def make(step):
        if step == 2:
            raise BadBatch("no batch 2")
        return step

    loader = BackgroundLoader(make)
    assert next(loader) == 0 and next(loader) == 1
    with pytest.raises(BadBatch, match="no batch 2") as info:
        next(loader)
    assert any("step 2" in note for note in getattr(info.value, "__notes__", ["step 2"]))
    assert not loader.alive
    with pytest.raises(StopIteration):
        next(loader)


def test_loader_threads_do_not_outlive_it():
    before = threading.active_count()
    for _ in range(3):
        with BackgroundLoader(lambda step, pool=None: step, stop=5, workers=2) as loader:
            list(loader)
    time.sleep(0.05)
    assert threading.active_count() <= before


def test_an_ico_bomb_is_refused_without_decoding(tmp_path):
    # An ICO whose directory says 16x16 wraps a 4000x4000 PNG: Pillow's ICO reader
    # decodes the embedded image inside Image.open, so gdnflow does not open ICO at all.
    import io
    import struct
    from PIL import Image
    from gdnflow.data.images import ImageReadError, read_rgb8
    png = io.BytesIO()
    Image.new("1", (4000, 4000)).save(png, "PNG")
    payload = png.getvalue()
    header = struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", 16, 16, 0, 0, 1, 32,
                                                         len(payload), 22)
    path = tmp_path / "bomb.png"
    path.write_bytes(header + payload)
    with pytest.raises(ImageReadError, match="bomb.png: cannot read the image"):
        read_rgb8(path, max_pixels=1000)


@pytest.mark.parametrize("alpha,warned", [(200, True), (255, False)])
def test_transparency_is_dropped_with_a_warning_naming_the_file(tmp_path, caplog, alpha, warned):
    from PIL import Image
    pixels = np.random.default_rng(1).integers(0, 256, (5, 7, 4), dtype=np.uint8)
    pixels[..., 3] = 255
    pixels[2, 3, 3] = alpha
    path = tmp_path / "see-through.png"
    Image.fromarray(pixels, "RGBA").save(path)
    with caplog.at_level("WARNING", logger="gdnflow"):
        rgb = read_rgb8(path)
    np.testing.assert_array_equal(rgb, pixels[..., :3])      # colours kept, alpha dropped
    assert ("see-through.png has transparent pixels" in caplog.text) == warned
    caplog.clear()
    read_rgb8(path)
    assert "transparent" not in caplog.text                    # once per file
