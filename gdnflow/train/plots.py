"""Pictures of a training run, drawn with Pillow's ImageDraw (no plotting library).

``plot_curves``: one panel per quantity (loss, bpp, PSNR) against the step:
training values (thin, light: per step; thick: a moving average) and
evaluations (dots). ``plot_reconstructions``: originals beside their
reconstructions, captioned with rate and PSNR.
"""
import math

import numpy as np
from PIL import Image, ImageDraw

from gdnflow.io.files import atomic_output
from gdnflow.plots import MARGIN_L, default_font, frame, nice_ticks, tick_label

PANEL_W, PANEL_H = 560, 300
TRAIN_LIGHT, TRAIN_DARK, EVAL = (170, 190, 225), (30, 80, 170), (210, 60, 40)
PANELS = (("loss", "rate-distortion loss"), ("bpp", "rate (bits per pixel)"), ("psnr", "PSNR (dB)"))


def _save_png(image, path):
    """Write ``image`` to ``path`` atomically (a kill mid-write leaves the old picture)."""
    with atomic_output(path, overwrite=True) as temporary:
        image.save(temporary, format="PNG")


def _moving_average(values, window):
    if len(values) < 2 or window <= 1:
        return values
    window = min(window, len(values))
    padded = np.concatenate([np.full(window - 1, values[0]), values])
    return np.convolve(padded, np.ones(window) / window, mode="valid")


def _panel(draw, origin, title, train, evals, font):
    """One panel: axes, ticks, the training curve and the evaluation dots."""
    ox = origin[0]
    left, top, right, bottom = frame(draw, origin, (PANEL_W, PANEL_H), title, font)
    points = [(s, v) for s, v in train if math.isfinite(v)] + \
             [(s, v) for s, v in evals if math.isfinite(v)]
    if not points:
        draw.text((left + 10, top + 10), "no data", fill=(120, 120, 120), font=font)
        return
    steps = [s for s, _ in points]
    values = np.array([v for _, v in points])
    # Robust vertical range: early steps of a run are far off; clip to the 2-98% span.
    low, high = np.percentile(values, [2, 98]) if len(values) > 20 else (values.min(), values.max())
    if high <= low:
        low, high = low - 0.5, high + 0.5
    pad = 0.05 * (high - low)
    low, high = low - pad, high + pad
    s_low, s_high = min(steps), max(max(steps), min(steps) + 1)

    def xy(step, value):
        x = left + (step - s_low) / (s_high - s_low) * (right - left)
        v = min(max(value, low), high)
        return x, bottom - (v - low) / (high - low) * (bottom - top)

    for tick in nice_ticks(low, high):
        _, y = xy(s_low, tick)
        draw.line([left, y, right, y], fill=(232, 232, 232))
        draw.text((ox + 6, y - 7), tick_label(tick), fill=(60, 60, 60), font=font)
    for tick in nice_ticks(s_low, s_high):
        x, _ = xy(tick, low)
        draw.line([x, bottom, x, bottom + 4], fill=(120, 120, 120))
        draw.text((x - 12, bottom + 8), f"{int(tick)}", fill=(60, 60, 60), font=font)
    draw.text((right - 30, bottom + 22), "step", fill=(60, 60, 60), font=font)
    finite = [(s, v) for s, v in train if math.isfinite(v)]
    if len(finite) > 1:
        draw.line([xy(s, v) for s, v in finite], fill=TRAIN_LIGHT, width=1)
        smooth = _moving_average(np.array([v for _, v in finite]), max(len(finite) // 50, 1))
        draw.line([xy(s, v) for (s, _), v in zip(finite, smooth)], fill=TRAIN_DARK, width=2)
    elif finite:
        x, y = xy(*finite[0])
        draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=TRAIN_DARK)
    for s, v in evals:
        if math.isfinite(v):
            x, y = xy(s, v)
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=EVAL)


def plot_curves(history, eval_history, path):
    """Draw loss, bpp and PSNR against the step into the PNG ``path``; returns the path.

    ``history``: records with ``step`` and the three quantities (training);
    ``eval_history``: the same for evaluations (drawn as dots).
    """
    font = default_font()
    image = Image.new("RGB", (PANEL_W * len(PANELS), PANEL_H + 24), "white")
    draw = ImageDraw.Draw(image)
    for i, (key, title) in enumerate(PANELS):
        train = [(r["step"], float(r[key])) for r in history if key in r]
        evals = [(r["step"], float(r[key])) for r in eval_history if key in r]
        _panel(draw, (i * PANEL_W, 0), title, train, evals, font)
    legend_y = PANEL_H + 4
    draw.line([MARGIN_L, legend_y + 8, MARGIN_L + 24, legend_y + 8], fill=TRAIN_DARK, width=2)
    draw.text((MARGIN_L + 30, legend_y), "training (moving average)", fill=(0, 0, 0), font=font)
    draw.ellipse([MARGIN_L + 236, legend_y + 4, MARGIN_L + 244, legend_y + 12], fill=EVAL)
    draw.text((MARGIN_L + 250, legend_y), "evaluation (rounded latents, full images)",
              fill=(0, 0, 0), font=font)
    _save_png(image, path)
    return path


def _to_pil(array, max_side, min_side):
    """An (3, H, W) array in [0, 1] as a Pillow image whose longer side is within
    [min_side, max_side]: shrunk smoothly, or enlarged by whole pixels (nearest)."""
    pixels = (np.clip(np.asarray(array, np.float64), 0, 1) * 255 + 0.5).astype(np.uint8)
    image = Image.fromarray(pixels.transpose(1, 2, 0))
    longer = max(image.size)
    if longer > max_side:
        scale, method = max_side / longer, Image.LANCZOS
    elif longer < min_side:
        scale, method = max(1, min_side // longer), Image.NEAREST
    else:
        return image
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, method)


def plot_reconstructions(items, path, max_side=384, min_side=192):
    """Originals (left) beside reconstructions (right), one row per item, into the PNG ``path``.

    ``items``: (name, original (3, H, W), reconstruction (3, H, W), bpp, psnr)
    with pixel values in [0, 1]. Large images are shrunk to ``max_side``
    pixels, small ones enlarged by whole pixels toward ``min_side``.
    """
    font = default_font()
    rows = [(name, _to_pil(a, max_side, min_side), _to_pil(b, max_side, min_side), bpp, quality)
            for name, a, b, bpp, quality in items]
    caption, gap, column = 40, 10, 250      # two caption lines; columns wide enough for them
    col_w = max([column] + [a.width for _, a, _, _, _ in rows])
    width = 2 * col_w + 3 * gap
    height = sum(a.height + caption for _, a, _, _, _ in rows) + gap * (len(rows) + 1) or 60
    sheet = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(sheet)
    y = gap
    for name, a, b, bpp, quality in rows:
        left, right = gap, 2 * gap + col_w
        draw.text((left, y + 2), name, fill=(0, 0, 0), font=font)
        draw.text((left, y + 19), "original", fill=(90, 90, 90), font=font)
        draw.text((right, y + 2), "reconstruction", fill=(0, 0, 0), font=font)
        draw.text((right, y + 19), f"{bpp:.3f} bpp, PSNR {quality:.2f} dB", fill=(90, 90, 90),
                  font=font)
        sheet.paste(a, (left, y + caption))
        sheet.paste(b, (right, y + caption))
        y += a.height + caption + gap
    _save_png(sheet, path)
    return path
