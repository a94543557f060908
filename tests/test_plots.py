"""The helpers gdnflow's pictures share (gdnflow.plots): ticks, labels, a panel's frame."""
import math

import pytest
from PIL import Image, ImageDraw

from gdnflow import plots


def test_nice_ticks_are_round_and_cover_the_range():
    assert plots.nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert plots.nice_ticks(0.13, 0.91) == pytest.approx([0.2, 0.4, 0.6, 0.8])
    ticks = plots.nice_ticks(27.3, 31.9)
    assert ticks[0] >= 27.3 and ticks[-1] <= 31.9 and 3 <= len(ticks) <= 6
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1 and steps.pop() in (0.5, 1.0, 2.0)
    assert plots.nice_ticks(3.0, 3.0) == [3.0]
    assert plots.nice_ticks(0, math.inf) == [] and plots.nice_ticks(math.nan, 1) == []


def test_tick_labels():
    assert plots.tick_label(0.123456) == "0.123"
    assert plots.tick_label(29.5) == "29.5"
    assert plots.tick_label(123456) == "1.23e+05"


def test_frame_draws_inside_the_panel_and_returns_the_plot_area():
    image = Image.new("RGB", (300, 200), "white")
    area = plots.frame(ImageDraw.Draw(image), (100, 0), (200, 200), "title", plots.default_font())
    assert area == (100 + plots.MARGIN_L, plots.MARGIN_T, 300 - plots.MARGIN_R,
                    200 - plots.MARGIN_B)
    left, top, right, bottom = area
    assert image.getpixel((left, top)) == (120, 120, 120)      # the frame's corner
    assert image.getpixel(((left + right) // 2, (top + bottom) // 2)) == (255, 255, 255)
    assert image.crop((0, 0, 100, 200)).getcolors() == [(100 * 200, (255, 255, 255))]
