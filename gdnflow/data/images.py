"""Image folders for training and evaluating image-compression models.

Images are read with Pillow (PNG, JPEG, BMP, PPM, TIFF, WebP; grey, palette
and alpha images become RGB) as float32 (3, H, W) arrays in [0, 1], or as
uint8 (H, W, 3) by :func:`read_rgb8`. An image larger than
``gdnflow.config.settings.max_image_pixels`` (height x width, read from its
header before decoding; default Pillow's own error limit) is refused with
:class:`ImageTooLargeError`, and a file Pillow cannot read or decode
(truncated, corrupt) with :class:`ImageReadError`, each naming the file.

Training batches are a pure function of (seed, step): sample j = step * B + b
of the run is image ``perm_e[j mod n]`` of the epoch e = j // n, with
``perm_e`` a permutation drawn from (seed, e), and its crop position and
horizontal flip are drawn from (seed, step) (its downscale factor and vertical
flip, when asked for, from a second generator of (seed, step): see
:mod:`gdnflow.data.augment`). A batch can therefore be built by any thread, in
any order, and a resumed run needs only its step to see exactly the batches of
the uninterrupted one.

Decoded images are kept as Pillow RGB images (4 bytes a pixel, a third of
float32's memory), with the downscaled copies that scaled crops are resampled
from (:func:`~gdnflow.data.augment.pyramid_level`; at most as many pixels
again): a corpus of 300 megapixels fits the default 4 GiB cache. So a crop,
scaled or not, is cut and resampled by Pillow outside Python's lock and threads
build a batch in parallel; each crop becomes float32 k / 255 on its own (an
unscaled crop: the values the whole image would have given).

Data-parallel training shards each batch, not the folder: every process
draws the whole batch's plan (indices, crops, flips: no pixels) and reads
only its contiguous slice (:func:`shard_slice`), so the processes' slices
are disjoint and together are exactly the one-process batch of that seed
and step, whatever the number of processes (a resume may change it).
"""
import collections
import contextlib
import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from gdnflow.config import settings
from gdnflow.data.augment import (HORIZONTAL, PYRAMID_STEP, VERTICAL, Augmentation,
                                  pyramid_level, resampled_crop, scaled_size)
from gdnflow.errors import GdnflowError

_log = logging.getLogger("gdnflow")
_warned_transparent = set()     # files whose dropped alpha was reported

#: File name endings read as images (lower case).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
#: The Pillow formats gdnflow opens (those of IMAGE_EXTENSIONS): only formats whose
#: size Pillow reads from the header without decoding (its ICO reader, for one,
#: decodes the embedded image inside Image.open, before any size check).
PILLOW_FORMATS = ("PNG", "JPEG", "BMP", "PPM", "TIFF", "WEBP")

#: Natural colour photographs that scikit-image ships inside its wheel (no
#: download): the default training set when no folder is given.
SKIMAGE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg",
                  "motorcycle_left.png", "motorcycle_right.png", "hubble_deep_field.jpg")


class NoImagesError(GdnflowError, ValueError):
    """A folder (or the default data set) has no usable image; the message says what to do."""


class ImageTooLargeError(GdnflowError, ValueError):
    """An image with more pixels than the limit (a decompression bomb?); the message names it."""


class ImageReadError(GdnflowError, OSError):
    """An image file Pillow cannot open or decode (missing, truncated, corrupt); names the file."""


# Pillow's own bomb check reads the module global Image.MAX_IMAGE_PIXELS whenever an
# image is opened (and, for some formats, decoded). gdnflow checks its own limit from
# the header instead, so Pillow's is lifted while gdnflow opens or decodes an image:
# the first reader in lifts it, the last one out restores it (threads decode at once).
_pil_limit_lock = threading.Lock()
_pil_limit_users = 0
_pil_limit_saved = None


@contextlib.contextmanager
def _pillow_limit_lifted():
    global _pil_limit_users, _pil_limit_saved
    with _pil_limit_lock:
        if not _pil_limit_users:
            _pil_limit_saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        _pil_limit_users += 1
    try:
        yield
    finally:
        with _pil_limit_lock:
            _pil_limit_users -= 1
            if not _pil_limit_users:
                Image.MAX_IMAGE_PIXELS = _pil_limit_saved


# What Pillow raises on unreadable files: OSError (UnidentifiedImageError, "image file
# is truncated"), SyntaxError (a broken PNG chunk), EOFError, ValueError (bad fields).
_PILLOW_ERRORS = (OSError, SyntaxError, EOFError, ValueError)


@contextlib.contextmanager
def open_image(path, max_pixels=None):
    """``with open_image(path) as image:`` a Pillow image whose size is within the limit.

    ``max_pixels``: the most height x width allowed (None: the knob
    ``gdnflow.config.settings.max_image_pixels``). Raises ImageTooLargeError
    (checked from the header, before any decoding) or ImageReadError; both
    name ``path``. Decode inside the block (errors there are ImageReadError too).
    """
    limit = settings.max_image_pixels if max_pixels is None else int(max_pixels)
    with _pillow_limit_lifted():
        try:
            image = Image.open(path, formats=PILLOW_FORMATS)
        except FileNotFoundError:
            raise ImageReadError(f"{path}: no such image file") from None
        except _PILLOW_ERRORS as exc:
            raise ImageReadError(f"{path}: cannot read the image ({exc})") from None
        with image:
            width, height = image.size
            if width * height > limit:
                raise ImageTooLargeError(
                    f"{path}: {width}x{height} pixels ({width * height}) is more than the "
                    f"limit of {limit} (a decompression bomb?): if you trust the file, raise "
                    "it with --max-pixels N (gdnflow.config.settings.max_image_pixels)")
            try:
                yield image
            except _PILLOW_ERRORS as exc:
                if isinstance(exc, GdnflowError):
                    raise
                raise ImageReadError(f"{path}: cannot decode the image ({exc}): the file is "
                                     "truncated or corrupt") from None


def read_rgb8(path, max_pixels=None):
    """The image at ``path`` as uint8 (H, W, 3) RGB: grey, palette and alpha converted.

    16-bit and float grey images are scaled to 8 bits (their full range,
    65535 or 255) before the conversion, which would otherwise clip at 255.
    Transparency is dropped (each pixel keeps its colour); a warning names
    the file, once per process, when some pixel was not opaque. ``max_pixels`` and errors as
    :func:`open_image`.
    """
    with open_image(path, max_pixels) as image:
        if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
            array = np.asarray(image, dtype=np.float64)
            top = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
            grey = (np.clip(array / top, 0, 1) * 255).round().astype(np.uint8)
            return np.repeat(grey[:, :, None], 3, axis=2)
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            rgba = image.convert("RGBA")
            if np.asarray(rgba)[:, :, 3].min() < 255 and str(path) not in _warned_transparent:
                _warned_transparent.add(str(path))     # once per file: folders are read often
                _log.warning("gdnflow: %s has transparent pixels; the alpha channel is dropped "
                             "(each pixel keeps its colour)", path)
            image = rgba
        if image.mode != "RGB":
            image = image.convert("RGB")
        return np.asarray(image)


def load_image(path, max_pixels=None):
    """The image at ``path`` as a float32 array (3, H, W) in [0, 1] (RGB; alpha dropped).

    k / 255 of :func:`read_rgb8`'s pixels; ``max_pixels`` and errors as :func:`open_image`.
    """
    return rgb8_to_float(read_rgb8(path, max_pixels))


def rgb8_to_float(rgb):
    """uint8 (H, W, 3) pixels as float32 (3, H, W) in [0, 1]: k / 255."""
    return np.ascontiguousarray(rgb.transpose(2, 0, 1), dtype=np.float32) / np.float32(255)


def _picture_bytes(picture):
    """The memory of a Pillow RGB image's pixels (4 bytes each)."""
    return 4 * picture.width * picture.height


def image_size(path, max_pixels=None):
    """(height, width) of the image at ``path``, read from its header only (see :func:`open_image`)."""
    with open_image(path, max_pixels) as image:
        return image.height, image.width


def list_images(folder, recursive=True):
    """Sorted paths of the image files under ``folder`` (by IMAGE_EXTENSIONS)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NoImagesError(f"image folder {folder} does not exist or is not a folder")
    pattern = "**/*" if recursive else "*"
    return sorted(p for p in folder.glob(pattern)
                  if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def sample_photos(package="skimage"):
    """Paths of scikit-image's bundled natural photographs, or raise NoImagesError.

    The files are read straight from the installed package's ``data`` folder:
    scikit-image itself is not imported. ``package`` is the name the package
    is imported by; a name that is not installed raises NoImagesError saying
    how to install scikit-image.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise NoImagesError(
            "no training images: pass a folder of images (PNG/JPEG), or install "
            "scikit-image (pip install 'gdnflow[data]') to train on its sample photos")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    paths = [folder / name for name in SKIMAGE_PHOTOS if (folder / name).exists()]
    if not paths:
        raise NoImagesError(f"scikit-image is installed but its sample photos are not in "
                            f"{folder}: pass a folder of images")
    return paths


def pad_to_multiple(image, multiple, mode="reflect"):
    """(3, H, W) image padded at the bottom and right to multiples of ``multiple``.

    Returns the padded array (a new one; the image itself if no padding is
    needed). ``mode`` is numpy.pad's (reflect by default: no artificial edge
    for the codec to spend bits on).
    """
    h, w = image.shape[-2:]
    ph, pw = -h % multiple, -w % multiple
    if not ph and not pw:
        return image
    return _pad(image, ph, pw, mode)


def _pad(image, ph, pw, mode):
    # numpy reflects again as often as needed when a pad is longer than the side.
    pads = [(0, 0)] * (image.ndim - 2) + [(0, ph), (0, pw)]
    return np.pad(image, pads, mode=mode)


def shard_slice(batch_size, shard):
    """The samples ``slice`` of ``shard`` = (index, count) in a batch of ``batch_size``.

    Shard i of n takes samples [i B/n, (i + 1) B/n) of the batch; raises
    ValueError if ``batch_size`` is not a multiple of n (the global batch
    must split evenly for the processes' mean gradient to be the batch's).
    """
    index, count = (int(v) for v in shard)
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}: expected 0 <= index < count")
    if batch_size % count:
        raise ValueError(f"the batch of {batch_size} crops does not split evenly over {count} "
                         f"processes: use a batch size that is a multiple of {count}")
    size = batch_size // count
    return slice(index * size, (index + 1) * size)


class CropPlan(NamedTuple):
    """One training sample: image ``index``, scaled by ``scale``, cropped at (``top``, ``left``)
    of the scaled image, then flipped as ``flip`` says (HORIZONTAL and VERTICAL bits)."""

    index: int
    top: int
    left: int
    flip: int
    scale: float = 1.0


class ImageFolder:
    """The images of a folder (or a list of paths), as training crops and evaluation images.

    ``ImageFolder(root, crop=256, small="pad")``: ``root`` is a folder
    (searched recursively; None for scikit-image's sample photos, see
    :func:`sample_photos`) or a list of image paths. Images smaller than
    ``crop`` on either side are padded by reflection (``small="pad"``) or
    left out (``small="skip"``); either way one line says how many.
    ``cache_bytes`` bounds the memory of decoded images (and their downscaled
    copies) kept for reuse, as Pillow images of 4 bytes a pixel (least recently
    used are dropped; all of a small data set stays).

    :meth:`batch` gives training batches (see the module docstring), varied
    as an :class:`~gdnflow.data.augment.Augmentation` says;
    :meth:`evaluation_images` full images.
    """

    def __init__(self, root=None, crop=256, small="pad", cache_bytes=4 << 30):
        if small not in ("pad", "skip"):
            raise ValueError(f"ImageFolder: small must be 'pad' or 'skip', got {small!r}")
        self.crop = int(crop)
        if root is None:
            paths, self.source = sample_photos(), "scikit-image's sample photos"
        elif isinstance(root, (str, os.PathLike)):
            paths, self.source = list_images(root), str(root)
        else:
            paths, self.source = [Path(p) for p in root], f"{len(root)} listed images"
        if not paths:
            raise NoImagesError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in {self.source}")
        sizes = []
        unreadable = []
        for path in paths:
            try:
                sizes.append(image_size(path))
            except (ImageReadError, ImageTooLargeError) as exc:
                unreadable.append(str(exc))
                sizes.append(None)
        if unreadable:
            raise NoImagesError(f"{len(unreadable)} unreadable image(s) in {self.source}: "
                                + "; ".join(unreadable[:3]))
        small_ones = [i for i, (h, w) in enumerate(sizes) if h < self.crop or w < self.crop]
        if small == "skip" and len(small_ones) == len(paths):
            raise NoImagesError(f"every image in {self.source} is smaller than the "
                                f"{self.crop}x{self.crop} crop: pad them instead (gdnflow train "
                                "--small-images pad; ImageFolder(small='pad')) or use a smaller "
                                "crop")
        if small_ones:
            action = "padded by reflection" if small == "pad" else "skipped"
            _log.warning("gdnflow.data: %d of %d images in %s are smaller than %dx%d: %s",
                         len(small_ones), len(paths), self.source, self.crop, self.crop, action)
            if small == "skip":
                keep = sorted(set(range(len(paths))) - set(small_ones))
                paths, sizes = [paths[i] for i in keep], [sizes[i] for i in keep]
        self.paths = [Path(p) for p in paths]
        self.sizes = sizes
        self._cache = collections.OrderedDict()
        self._cache_bytes, self._cache_limit = 0, int(cache_bytes)
        self._lock = threading.Lock()
        self._permutations = {}

    def __len__(self):
        return len(self.paths)

    def __repr__(self):
        return f"ImageFolder({self.source!r}, {len(self)} images, crop={self.crop})"

    # -------------------------------------------------------------- images --
    def picture(self, index, level=0):
        """Image ``index`` as a Pillow RGB image (cached, shared: do not modify it); ``level``
        k > 0: the image downscaled by PYRAMID_STEP**k (Lanczos, from level k - 2, or 0)."""
        key = (index, level)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        # Made outside the lock: threads overlap.
        if level == 0:
            picture = Image.fromarray(read_rgb8(self.paths[index]))
        else:
            height, width = scaled_size(*self.sizes[index], PYRAMID_STEP ** level)
            picture = self.picture(index, max(0, level - 2)).resize((width, height), Image.LANCZOS)
        size = _picture_bytes(picture)
        with self._lock:
            if key not in self._cache and size <= self._cache_limit:
                self._cache[key] = picture
                self._cache_bytes += size
                while self._cache_bytes > self._cache_limit:
                    _, dropped = self._cache.popitem(last=False)
                    self._cache_bytes -= _picture_bytes(dropped)
        return picture

    def pixels(self, index):
        """Image ``index`` as uint8 (H, W, 3) RGB (a new array)."""
        return np.asarray(self.picture(index))

    def image(self, index):
        """Image ``index`` as (3, H, W) float32 in [0, 1] (a new array, from :meth:`pixels`)."""
        return rgb8_to_float(self.pixels(index))

    def evaluation_images(self, limit=None):
        """Yield (name, image (3, H, W) float32) for the first ``limit`` images (all if None)."""
        for index in range(len(self) if limit is None else min(limit, len(self))):
            yield self.paths[index].name, self.image(index)

    # ----------------------------------------------------------- training --
    def permutation(self, seed, epoch):
        """The order of the images in ``epoch`` of a run seeded with ``seed``."""
        key = (seed, epoch)
        with self._lock:
            order = self._permutations.get(key)
        if order is None:
            order = np.random.default_rng([seed, 0, epoch]).permutation(len(self))
            with self._lock:
                if len(self._permutations) > 4:     # batches move forward: old epochs go
                    self._permutations.pop(next(iter(self._permutations)))
                self._permutations[key] = order
        return order

    def batch_plan(self, seed, step, batch_size, augmentation=None):
        """The :class:`CropPlan` of each sample of the training batch at ``step``: no pixels read.

        ``augmentation`` (default ``Augmentation()``: horizontal flips, no
        scaling) decides the flips and scales; ``top`` and ``left`` are in the
        scaled image.
        """
        augmentation = augmentation or Augmentation()
        crops = np.random.default_rng([seed, 1, step])
        extra = np.random.default_rng([seed, 3, step])  # scales and vertical flips
        plan = []
        for b in range(batch_size):
            j = step * batch_size + b
            index = int(self.permutation(seed, j // len(self))[j % len(self)])
            h, w = self.sizes[index]
            scale = augmentation.scale(extra.random(), h, w, self.crop)
            vertical = extra.random()
            h, w = scaled_size(h, w, scale)
            top = int(crops.integers(0, max(h - self.crop, 0) + 1))
            left = int(crops.integers(0, max(w - self.crop, 0) + 1))
            flip = augmentation.flip_code(crops.random(), vertical)
            plan.append(CropPlan(index, top, left, flip, scale))
        return plan

    def crop_sample(self, index, top, left, flip, scale=1.0):
        """One training crop (3, crop, crop) float32, a new array.

        The image downscaled by ``scale`` (resampled from its pyramid level:
        :func:`~gdnflow.data.augment.resampled_crop`),
        or padded by reflection if it is smaller than the crop; then flipped
        as ``flip`` says (True or the HORIZONTAL bit: left to right; the
        VERTICAL bit: upside down).
        """
        h, w = self.sizes[index]
        if scale != 1.0:
            patch = resampled_crop(self.picture(index, pyramid_level(scale)),
                                   *scaled_size(h, w, scale), top, left, self.crop)
        elif h < self.crop or w < self.crop:
            pads = ((0, max(self.crop - h, 0)), (0, max(self.crop - w, 0)), (0, 0))
            pixels = np.pad(np.asarray(self.picture(index)), pads, mode="reflect")
            patch = pixels[top:top + self.crop, left:left + self.crop]
        else:
            patch = np.asarray(self.picture(index).crop((left, top, left + self.crop,
                                                          top + self.crop)))
        flip = int(flip)
        if flip & HORIZONTAL:
            patch = patch[:, ::-1]
        if flip & VERTICAL:
            patch = patch[::-1]
        return rgb8_to_float(patch)

    def batch(self, seed, step, batch_size, pool=None, shard=(0, 1), augmentation=None):
        """The training batch at ``step``: float32 (batch_size, 3, crop, crop), a new array.

        ``pool`` (a ``concurrent.futures`` executor) decodes the images of
        the batch in parallel; the result does not depend on it. ``shard``
        = (index, count): only that shard's slice of the batch of
        ``batch_size`` (see :func:`shard_slice`), batch_size / count crops.
        ``augmentation``: see :meth:`batch_plan`.
        """
        plan = self.batch_plan(seed, step, batch_size, augmentation)[shard_slice(batch_size, shard)]
        out = np.empty((len(plan), 3, self.crop, self.crop), np.float32)

        def fill(b):
            out[b] = self.crop_sample(*plan[b])

        if pool is None:
            for b in range(len(plan)):
                fill(b)
        else:
            for future in [pool.submit(fill, b) for b in range(len(plan))]:
                future.result()
        return out
