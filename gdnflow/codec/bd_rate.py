"""The Bjøntegaard delta rate (BD-rate): how much less rate one codec needs than another.

G. Bjøntegaard, "Calculation of average PSNR differences between RD-curves"
(VCEG-M33, 2001): each codec's rate-distortion points are fitted with a
polynomial giving log(rate) as a function of quality (a cubic through the
usual four points; here a least-squares cubic through all the points given,
of lower degree when there are fewer than four). The two fits are integrated
over the quality range both curves cover, and the mean difference of log
rates is turned into a percentage::

    BD-rate = exp(mean over the overlap of (log R_test - log R_anchor)) - 1

Negative: the tested codec needs that much less rate than the anchor for the
same quality. Quality is PSNR in dB, or MS-SSIM as dB of its complement,
-10 log10(1 - MS-SSIM), as the learned-compression literature reports it
(:func:`ms_ssim_db`).
"""
import math

import numpy as np

from gdnflow.errors import GdnflowError


class BDRateError(GdnflowError, ValueError):
    """Points that admit no BD-rate: too few, non-positive rates, or no common quality range."""


def ms_ssim_db(value):
    """MS-SSIM as decibels of its complement: -10 log10(1 - value) (infinite at 1)."""
    return math.inf if value >= 1 else -10.0 * math.log10(1.0 - value)


def _fit(points, what):
    """(polynomial coefficients of log(rate) in quality, (lowest, highest) quality)."""
    points = [(float(r), float(q)) for r, q in points if math.isfinite(r) and math.isfinite(q)]
    if len({q for _, q in points}) < 2:
        raise BDRateError(f"BD-rate: the {what} curve needs at least 2 points of different "
                          f"quality, got {len(points)}")
    rates, qualities = np.array(points).T
    if (rates <= 0).any():
        raise BDRateError(f"BD-rate: the {what} curve has a rate <= 0 ({rates.min():g})")
    degree = min(3, len(set(qualities.tolist())) - 1)
    return np.polyfit(qualities, np.log(rates), degree), (qualities.min(), qualities.max())


def bd_rate(anchor, test):
    """The BD-rate of ``test`` against ``anchor``, in percent (see the module docstring).

    ``anchor`` and ``test``: sequences of (rate, quality) points (rate in any
    unit, the same for both, such as bits per pixel). Raises
    :class:`BDRateError` when a curve has fewer than 2 distinct qualities or
    a rate <= 0, or when the quality ranges do not overlap.
    """
    anchor_fit, (anchor_low, anchor_high) = _fit(anchor, "anchor")
    test_fit, (test_low, test_high) = _fit(test, "tested")
    low, high = max(anchor_low, test_low), min(anchor_high, test_high)
    if not high > low:
        raise BDRateError(f"BD-rate: the quality ranges do not overlap (anchor {anchor_low:.3g} "
                          f"to {anchor_high:.3g}, tested {test_low:.3g} to {test_high:.3g})")

    def mean_log_rate(coefficients):
        integral = np.polyint(coefficients)
        return (np.polyval(integral, high) - np.polyval(integral, low)) / (high - low)

    return 100.0 * math.expm1(mean_log_rate(test_fit) - mean_log_rate(anchor_fit))


def rd_points(points, key):
    """(bpp, quality) pairs of rate-distortion points (dicts with "bpp" and ``key``: "psnr",
    or "ms_ssim" as :func:`ms_ssim_db`), the non-finite ones left out."""
    convert = ms_ssim_db if key == "ms_ssim" else float
    return [(p["bpp"], convert(p[key])) for p in points if math.isfinite(p[key])]


__all__ = ["bd_rate", "rd_points", "ms_ssim_db", "BDRateError"]
