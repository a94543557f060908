"""What gdnflow's pictures share, drawn with Pillow's ImageDraw (no plotting library).

A panel is a framed plot area inside a rectangle of the picture: its title
above the frame, the frame inset by the margins :data:`MARGIN_L`,
:data:`MARGIN_R`, :data:`MARGIN_T`, :data:`MARGIN_B` (pixels), tick labels
in the margins. :func:`frame` draws one and returns the plot area;
:func:`nice_ticks` chooses round tick values, :func:`tick_label` writes
them, :func:`default_font` is the text font. The training run's curves
(:mod:`gdnflow.train.plots`) and the codec's rate-distortion plot
(:mod:`gdnflow.codec.evaluate`) are drawn with these.
"""
import math

from PIL import ImageFont

#: Margins (pixels) between a panel's edges and its plot area: left, right, top, bottom.
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 20, 34, 40


def default_font():
    """Pillow's default font at 13 pixels (Pillow >= 10.1), else its fixed default font."""
    try:
        return ImageFont.load_default(size=13)      # Pillow >= 10.1: a scalable default
    except TypeError:
        return ImageFont.load_default()


def nice_ticks(low, high, count=5):
    """About ``count`` round tick values covering [low, high].

    Ticks are multiples of 1, 2 or 5 times a power of ten, from the first
    at or above ``low`` up to ``high``; ``[low]`` if ``high <= low``, none
    if either end is not finite.
    """
    if not math.isfinite(low) or not math.isfinite(high):
        return []
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw), default=raw)
    start = math.ceil(low / step) * step
    return [start + i * step for i in range(int((high - start) / step) + 1)]


def tick_label(value):
    """A tick value as text: three significant digits, exponent notation from 10^4 up."""
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


def frame(draw, origin, size, title, font):
    """Draw a panel's title and frame; return its plot area (left, top, right, bottom).

    ``draw`` is a ``PIL.ImageDraw.Draw``; the panel covers ``size`` (width,
    height) pixels from ``origin`` (x, y), its plot area inset by the margins.
    """
    ox, oy = origin
    left, top = ox + MARGIN_L, oy + MARGIN_T
    right, bottom = ox + size[0] - MARGIN_R, oy + size[1] - MARGIN_B
    draw.text((left, oy + 8), title, fill=(0, 0, 0), font=font)
    draw.rectangle([left, top, right, bottom], outline=(120, 120, 120))
    return left, top, right, bottom
