"""The BD-rate (gdnflow.codec.bd_rate) against values worked out by hand, and its refusals."""
import math

import numpy as np
import pytest

from gdnflow.codec.bd_rate import BDRateError, bd_rate, ms_ssim_db, rd_points


def curve(log_rate, qualities):
    """(rate, quality) points whose log-rate is ``log_rate(quality)``."""
    return [(math.exp(log_rate(q)), q) for q in qualities]


def test_a_constant_rate_ratio_is_the_bd_rate():
    anchor = curve(lambda q: 0.2 * q - 6, [28, 30.5, 33, 36])
    for ratio in (0.8, 1.25, 0.5):
        tested = [(r * ratio, q) for r, q in anchor]
        assert bd_rate(anchor, tested) == pytest.approx(100 * (ratio - 1), abs=1e-9)


def test_a_cubic_difference_integrates_to_its_mean_over_the_overlap():
    # log R_test - log R_anchor = ((q - 30) / 10)^3 on [30, 40]: mean 1/4, so exp(1/4) - 1.
    anchor = curve(lambda q: 0.0, [30, 33, 36, 40])
    tested = curve(lambda q: ((q - 30) / 10) ** 3, [30, 32, 37, 40])
    assert bd_rate(anchor, tested) == pytest.approx(100 * math.expm1(0.25), rel=1e-9)


def test_only_the_common_quality_range_counts():
    # The difference ((q - 30) / 10)^3 averages 1/4 over the common range [30, 40]; over the
    # tested curve's own range [30, 50] it would average 2.
    anchor = curve(lambda q: 0.0, [20, 26, 33, 40])
    tested = curve(lambda q: ((q - 30) / 10) ** 3, [30, 36, 43, 50])
    assert bd_rate(anchor, tested) == pytest.approx(100 * math.expm1(0.25), rel=1e-9)


def test_the_same_curve_sampled_elsewhere_has_no_bd_rate():
    # Points of one quadratic log-rate curve: both cubic fits are exact.
    def log_rate(q):
        return 0.004 * (q - 20) ** 2 + 0.05 * q - 3

    assert bd_rate(curve(log_rate, np.linspace(26, 38, 7)),
                   curve(log_rate, [27.5, 31, 34.2, 37])) == pytest.approx(0.0, abs=1e-9)


def test_two_or_three_points_fit_a_line_or_a_parabola():
    anchor = curve(lambda q: 0.15 * q, [28, 34])
    assert bd_rate(anchor, curve(lambda q: 0.15 * q - 0.2, [29, 31, 33])) == \
        pytest.approx(100 * math.expm1(-0.2), abs=1e-9)


def test_curves_that_admit_no_bd_rate_are_refused_with_the_reason():
    good = curve(lambda q: 0.1 * q, [30, 32, 34, 36])
    with pytest.raises(BDRateError, match="tested curve needs at least 2 points"):
        bd_rate(good, [(0.5, 31)])
    with pytest.raises(BDRateError, match="anchor curve has a rate <= 0"):
        bd_rate([(0.0, 30), (1.0, 35)], good)
    with pytest.raises(BDRateError, match=r"do not overlap \(anchor 30 to 36, tested 40 to 45\)"):
        bd_rate(good, curve(lambda q: 0.1 * q, [40, 45]))


def test_ms_ssim_in_decibels():
    assert ms_ssim_db(0.9) == pytest.approx(10.0)
    assert ms_ssim_db(0.99) == pytest.approx(20.0)
    assert ms_ssim_db(1.0) == math.inf


def test_rd_points_give_ms_ssim_in_decibels_and_leave_out_non_finite_points():
    points = [{"bpp": 0.1, "psnr": 30.0, "ms_ssim": 0.9},
              {"bpp": 0.2, "psnr": float("nan"), "ms_ssim": 0.99}]
    assert rd_points(points, "psnr") == [(0.1, 30.0)]
    assert rd_points(points, "ms_ssim") == [(0.1, pytest.approx(10.0)), (0.2, pytest.approx(20.0))]
