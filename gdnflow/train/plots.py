"""Pictures of a training run.

``plot_curves``: one panel per quantity (loss, bpp, PSNR) against the step,
drawn by matplotlib (its Agg canvas: no display, no global backend):
training values (thin, light: per step; thick: a moving average) and
evaluations (dots). ``plot_reconstructions``: originals beside their
reconstructions, captioned with rate and PSNR (composed with Pillow).
"""
import math

import numpy as np
from PIL import Image, ImageDraw

from gdnflow.io.files import atomic_output, write_bytes_atomic
from gdnflow.plots import default_font, moving_average, new_figure, png_bytes

PANELS = (("loss", "rate-distortion loss"), ("bpp", "rate (bits per pixel)"), ("psnr", "PSNR (dB)"))


def _save_png(image, path):
    """Write ``image`` to ``path`` atomically (a kill mid-write leaves the old picture)."""
    with atomic_output(path, overwrite=True) as temporary:
        image.save(temporary, format="PNG")


def _panel(axes, title, train, evals):
    """One panel: the training curve, its moving average and the evaluation dots."""
    train = [(s, v) for s, v in train if math.isfinite(v)]
    evals = [(s, v) for s, v in evals if math.isfinite(v)]
    axes.set_title(title, fontsize="medium")
    axes.set_xlabel("step")
    axes.grid(True, color="0.9")
    if not train and not evals:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
        return
    if train:
        steps, values = np.array(train).T
        axes.plot(steps, values, color="#aabee1", linewidth=0.8)
        smooth = moving_average(values, max(len(values) // 50, 1))
        axes.plot(steps, smooth, color="#1e50aa", linewidth=2, label="training (moving average)")
    if evals:
        steps, values = np.array(evals).T
        axes.plot(steps, values, "o", color="#d23c28", markersize=4,
                  label="evaluation (rounded latents, full images)")
    values = np.array([v for _, v in train + evals])
    # Robust vertical range: early steps of a run are far off; clip to the 2-98% span.
    if len(values) > 20:
        low, high = np.percentile(values, [2, 98])
        pad = 0.05 * (high - low) or 0.5
        axes.set_ylim(low - pad, high + pad)


def plot_curves(history, eval_history, path):
    """Draw loss, bpp and PSNR against the step into the PNG ``path``; returns the path.

    ``history``: records with ``step`` and the three quantities (training);
    ``eval_history``: the same for evaluations (drawn as dots). The picture
    is written atomically.
    """
    figure = new_figure(5.2 * len(PANELS), 3.4)
    for i, (key, title) in enumerate(PANELS):
        axes = figure.add_subplot(1, len(PANELS), i + 1)
        _panel(axes, title, [(r["step"], float(r[key])) for r in history if key in r],
               [(r["step"], float(r[key])) for r in eval_history if key in r])
    handles, labels = figure.axes[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small")
    write_bytes_atomic(path, png_bytes(figure), overwrite=True)
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
