"""The reference codecs of gdnflow eval: sweeps, bracketing, mean curves and clear refusals."""
import numpy as np
import pytest

from gdnflow.codec.evaluate import reference_codecs
from gdnflow.codec.references import (JPEG_2000, REFERENCE_CODECS, RateSweep, decode_image,
                                      mean_curve)


@pytest.fixture(scope="module")
def photo_like():
    """A 96x120 smooth random image with some noise (structure that codecs can compress)."""
    rng = np.random.default_rng(3)
    coarse = rng.random((7, 9, 3))
    smooth = np.kron(coarse, np.ones((14, 14, 1)))[:96, :120]
    return np.clip(255 * (0.8 * smooth + 0.2 * rng.random((96, 120, 3))), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("name", list(REFERENCE_CODECS))
def test_each_codec_brackets_a_rate_between_neighbouring_settings(name, photo_like):
    codec = REFERENCE_CODECS[name]
    sweep = RateSweep(photo_like, codec)
    settings = codec.settings
    middle = len(settings) // 2
    target = 0.5 * (sweep.bpp(settings[middle]) + sweep.bpp(settings[middle + 5]))
    low, high = sweep.bracket(target)
    assert settings.index(high) == settings.index(low) + 1
    assert sweep.bpp(low) < target <= sweep.bpp(high)
    at = sweep.at_rate(target)
    a, b = sweep.point(low), sweep.point(high)
    assert min(a["psnr"], b["psnr"]) <= at["psnr"] <= max(a["psnr"], b["psnr"])
    assert at["settings"] == [low, high]
    # The files really decode to the image: better quality at a higher setting.
    assert sweep.point(settings[-1])["psnr"] > sweep.point(settings[0])["psnr"] + 3
    assert decode_image(sweep.file(high)).shape == photo_like.shape
    # About log2(len(settings)) files were coded to bracket one rate, not all of them.
    assert len(sweep.encode_seconds) < len(settings) // 2 + 12
    assert sweep.at_rate(0.5 * sweep.bpp(settings[0])) is None
    assert sweep.at_rate(2 * sweep.bpp(settings[-1])) is None


def test_jpeg_2000_s_setting_is_a_compression_ratio(photo_like):
    sweep = RateSweep(photo_like, JPEG_2000)
    # 24-bit pixels at ratio 1:12 -> about 2 bpp (the codestream's header on top).
    assert 1.8 < sweep.bpp(12.0) < 2.4
    assert JPEG_2000.setting_label(12.0) == "1:12"


def test_mean_curve_spans_the_asked_range(photo_like):
    flipped = photo_like[:, ::-1].copy()
    sweeps = [RateSweep(photo_like, JPEG_2000), RateSweep(flipped, JPEG_2000)]
    curve = mean_curve(sweeps, 0.5, 1.5)
    rates = [p["bpp"] for p in curve]
    assert rates == sorted(rates) and rates[0] < 0.5 and rates[-1] > 1.5
    assert sum(0.5 <= r <= 1.5 for r in rates) >= 2
    first = curve[0]["setting"]
    assert first in JPEG_2000.curve_settings
    assert curve[0]["psnr"] == pytest.approx(np.mean([s.point(first)["psnr"] for s in sweeps]))


def test_unknown_reference_codecs_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown reference codec 'AVIF'; choose from JPEG, WebP, "
                                         "JPEG 2000"):
        reference_codecs(["JPEG", "AVIF"])
    assert [c.name for c in reference_codecs(["WebP"])] == ["WebP"]
