"""What gdnflow's pictures share: a matplotlib figure that needs no display, its PNG bytes,
and the font of the picture sheets composed with Pillow.

The figures are drawn on matplotlib's Agg canvas directly (``Figure`` and
``FigureCanvasAgg``, not ``pyplot``), so no window opens and the global
backend of a program that also uses matplotlib is left alone. matplotlib
is imported on the first figure: ``import gdnflow`` does not load it. The
training run's curves (:mod:`gdnflow.train.plots`) and ``gdnflow eval``'s
rate-distortion plot (:mod:`gdnflow.codec.eval_report`) use these.
"""
import io

import numpy as np
from PIL import Image, ImageFont


def new_figure(width, height, dpi=100):
    """A matplotlib ``Figure`` of ``width`` x ``height`` inches on an Agg canvas, with a
    constrained layout (titles, labels and legends kept inside)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # local import: plotting only
    from matplotlib.figure import Figure                         # local import: plotting only
    figure = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def png_bytes(figure):
    """The figure rendered as the bytes of an RGB PNG file (white background, no alpha)."""
    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3]
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, "PNG")
    return buffer.getvalue()


def moving_average(values, window):
    """The mean of each ``window`` consecutive values, as many as ``values`` (the first ones
    padded with the first value): a training curve's trend."""
    if len(values) < 2 or window <= 1:
        return values
    window = min(window, len(values))
    padded = np.concatenate([np.full(window - 1, values[0]), values])
    return np.convolve(padded, np.ones(window) / window, mode="valid")


def default_font():
    """Pillow's default font at 13 pixels (Pillow >= 10.1), else its fixed default font:
    the captions of the sheets drawn with Pillow (reconstructions, the demo's comparison)."""
    try:
        return ImageFont.load_default(size=13)      # Pillow >= 10.1: a scalable default
    except TypeError:
        return ImageFont.load_default()


__all__ = ["new_figure", "png_bytes", "moving_average", "default_font"]
