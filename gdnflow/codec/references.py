"""The reference codecs of ``gdnflow eval``: JPEG, WebP and JPEG 2000 through Pillow.

Each :class:`ReferenceCodec` has a setting that orders its files by size
(JPEG and WebP: quality 1-100 / 0-100; JPEG 2000: a compression ratio, from
high to low). A :class:`RateSweep` codes one image with one codec: it finds
the two neighbouring settings whose files bracket a given rate (binary
search, files coded on demand and kept), decodes them, and interpolates PSNR
and MS-SSIM linearly in bpp: the reference "at the same rate" as a model's
file. It also gives the points of the codec's rate-distortion curve
(``curve_settings``), and times every encode and decode.

The settings, as the field compares against these codecs: JPEG with
optimised Huffman tables and 4:2:0 chroma (libjpeg's default), WebP lossy
at method 6 (the slowest, best compression), JPEG 2000 with the irreversible
9/7 wavelet and colour transform (without it, OpenJPEG codes R, G and B
apart: about 3.5 dB worse) and one quality layer at the given rate, as a raw
codestream (``.j2k``: no JP2 boxes; ~80 bytes less). Every file's whole size
counts, headers included, as for ``.gdn`` files.
"""
import io
import math
import time

import numpy as np
from PIL import Image, features

from gdnflow.train.losses import ms_ssim, psnr


def quality_metrics(original, decoded):
    """{"psnr": dB, "ms_ssim": value} of two uint8 (H, W, 3) images (MS-SSIM NaN below 161 px)."""
    a = original.transpose(2, 0, 1).astype(np.float64) / 255
    b = decoded.transpose(2, 0, 1).astype(np.float64) / 255
    try:
        structural = ms_ssim(a, b)
    except ValueError:          # a side of 160 pixels or less: no five scales
        structural = float("nan")
    return {"psnr": psnr(a, b), "ms_ssim": structural}


def _save(image, format_name, **options):
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format_name, **options)
    return buffer.getvalue()


def decode_image(data):
    """uint8 (H, W, 3) pixels of an image file's bytes (any format Pillow reads)."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


class ReferenceCodec:
    """A Pillow codec swept over one setting; see the module docstring.

    ``settings``: every setting, in order of increasing file size;
    ``curve_settings``: the coarser grid of the mean rate-distortion curve;
    ``encode(image, setting)`` -> bytes; ``available``: Pillow was built with it.
    """

    def __init__(self, name, feature, settings, curve_settings, encode, details):
        self.name, self.feature = name, feature
        self.settings, self.curve_settings = tuple(settings), tuple(curve_settings)
        self._encode, self._details = encode, details

    @property
    def available(self):
        """True if this Pillow can write and read the format."""
        return bool(features.check(self.feature))

    def describe(self):
        """The codec, its library and version, and its settings, in one line."""
        return f"{self.name}: Pillow's {self.feature} {features.version(self.feature)}, {self._details}"

    def encode(self, image, setting):
        """The bytes of uint8 (H, W, 3) ``image`` coded at ``setting``."""
        return self._encode(image, setting)

    def setting_label(self, setting):
        """A setting as the tables print it ("q75", "1:48")."""
        return f"1:{setting:.4g}" if self.name == "JPEG 2000" else f"q{setting}"


#: JPEG 2000's compression ratios (to 24-bit RGB), from 1:800 (0.03 bpp) to 1:3 (8 bpp).
J2K_RATIOS = tuple(float(f"{r:.4g}") for r in np.geomspace(800, 3, 160))

JPEG = ReferenceCodec(
    "JPEG", "jpg", range(1, 101), (1, 2, 3, 5, 8, 12, 16, 20, 25, 30, 40, 50, 60, 70, 80, 90, 95),
    lambda image, q: _save(image, "JPEG", quality=int(q), optimize=True),
    "quality 1-100, optimize=True, 4:2:0")
WEBP = ReferenceCodec(
    "WebP", "webp", range(0, 101), (0, 5, 10, 15, 20, 30, 40, 50, 60, 70, 75, 80, 85, 90, 95),
    lambda image, q: _save(image, "WEBP", quality=int(q), method=6),
    "lossy, quality 0-100, method 6")
JPEG_2000 = ReferenceCodec(
    "JPEG 2000", "jpg_2000", J2K_RATIOS, J2K_RATIOS[::10],
    lambda image, ratio: _save(image, "JPEG2000", quality_mode="rates",
                               quality_layers=[ratio], irreversible=True, mct=1,
                               no_jp2=True),
    "irreversible 9/7 wavelet and colour transform, one layer at a compression ratio, "
    "raw codestream")
#: The reference codecs, by name, in the order the tables list them.
REFERENCE_CODECS = {codec.name: codec for codec in (JPEG, WEBP, JPEG_2000)}


class RateSweep:
    """One image coded by one reference codec at the settings asked for; see the module docstring."""

    def __init__(self, image, codec):
        self.image, self.codec = image, codec
        self.pixels = image.shape[0] * image.shape[1]
        self._files, self._points = {}, {}
        self.encode_seconds, self.decode_seconds = [], []

    def file(self, setting):
        """The bytes of the image coded at ``setting`` (coded once, then kept)."""
        if setting not in self._files:
            start = time.perf_counter()
            self._files[setting] = self.codec.encode(self.image, setting)
            self.encode_seconds.append(time.perf_counter() - start)
        return self._files[setting]

    def bpp(self, setting):
        """Bits per pixel of the file at ``setting``."""
        return 8 * len(self.file(setting)) / self.pixels

    def point(self, setting):
        """{"setting", "bpp", "psnr", "ms_ssim"} of the file at ``setting`` (decoded once)."""
        if setting not in self._points:
            data = self.file(setting)
            start = time.perf_counter()
            decoded = decode_image(data)
            self.decode_seconds.append(time.perf_counter() - start)
            self._points[setting] = {"setting": setting, "bpp": 8 * len(data) / self.pixels,
                                     **quality_metrics(self.image, decoded)}
        return self._points[setting]

    def bracket(self, bpp):
        """(low, high): neighbouring settings with bpp(low) < ``bpp`` <= bpp(high), or None.

        ``high`` is the first setting whose file reaches ``bpp`` (binary search:
        about log2 of the settings are coded); None when even the smallest
        file is larger, or the largest smaller.
        """
        settings = self.codec.settings
        low, high = 0, len(settings)
        while low < high:
            middle = (low + high) // 2
            if self.bpp(settings[middle]) >= bpp:
                high = middle
            else:
                low = middle + 1
        if low == len(settings) or (low == 0 and self.bpp(settings[0]) > bpp):
            return None
        return settings[max(low - 1, 0)], settings[low]

    def at_rate(self, bpp):
        """PSNR and MS-SSIM interpolated linearly in bpp at ``bpp``, or None out of range.

        Returns {"psnr", "ms_ssim", "settings": [low, high], "bpp": [low, high]}.
        """
        pair = self.bracket(bpp)
        if pair is None:
            return None
        a, b = (self.point(s) for s in pair)
        t = 1.0 if b["bpp"] == a["bpp"] else (bpp - a["bpp"]) / (b["bpp"] - a["bpp"])
        return {key: a[key] + t * (b[key] - a[key]) for key in ("psnr", "ms_ssim")} | \
            {"settings": list(pair), "bpp": [a["bpp"], b["bpp"]]}


def mean_curve(sweeps, low_bpp, high_bpp, pool=None):
    """A codec's mean (over images) rate-distortion curve around [``low_bpp``, ``high_bpp``].

    ``sweeps``: the codec's RateSweep of every image. The curve has the
    ``curve_settings`` whose mean bpp lies in the range, and the nearest one
    beyond each end (so the curve spans it): a list of {"setting", "bpp",
    "psnr", "ms_ssim"}, by increasing rate. ``pool`` (a ``concurrent.futures``
    executor) codes and measures the images in parallel, one task per image.
    """
    codec = sweeps[0].codec
    each = pool.map if pool is not None else map
    per_image = list(each(lambda sweep: [sweep.bpp(s) for s in codec.curve_settings], sweeps))
    rates = [(s, float(np.mean([bpps[i] for bpps in per_image])))
             for i, s in enumerate(codec.curve_settings)]
    rates.sort(key=lambda pair: pair[1])
    inside = [i for i, (_, b) in enumerate(rates) if low_bpp <= b <= high_bpp]
    first = max((inside[0] if inside else next((i for i, (_, b) in enumerate(rates)
                                                if b > high_bpp), len(rates))) - 1, 0)
    last = min((inside[-1] if inside else first) + 1, len(rates) - 1)
    chosen = rates[first:last + 1]
    per_image = list(each(lambda sweep: [sweep.point(s) for s, _ in chosen], sweeps))
    return [{"setting": setting, "bpp": bpp,
             **{key: finite_mean(points[i][key] for points in per_image)
                for key in ("psnr", "ms_ssim")}}
            for i, (setting, bpp) in enumerate(chosen)]


def finite_mean(values):
    """The mean of the finite values (None and NaN left out); NaN when there is none."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


__all__ = ["ReferenceCodec", "RateSweep", "REFERENCE_CODECS", "JPEG", "WEBP", "JPEG_2000",
           "mean_curve", "finite_mean", "quality_metrics", "decode_image"]
