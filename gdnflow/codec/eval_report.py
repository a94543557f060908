"""What ``gdnflow eval`` writes from its results: the markdown tables and the rate-distortion plot.

The results are :func:`gdnflow.codec.evaluate.evaluate`'s dict (``eval.json``).
The plot is drawn by matplotlib (:mod:`gdnflow.plots`: no display, no global
backend touched, imported on first use).
"""
import math

from gdnflow.codec.bd_rate import rd_points
from gdnflow.plots import new_figure, png_bytes


def _number(value, digits, signed=False):
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_table(results):
    """The results as markdown: per image and model, the means, the BD-rates and the speed."""
    names = list(results["references"])
    lines = [_row(["image", "model", "bpp", "PSNR (dB)", "MS-SSIM",
                   *(f"{n} PSNR at that bpp" for n in names)]),
             "|---|---|---:|---:|---:|" + "---:|" * len(names)]
    for row in results["rows"]:
        lines.append(_row([row["image"], row["model"], f"{row['bpp']:.4f}",
                           _number(row["psnr"], 2), _number(row["ms_ssim"], 4),
                           *(_number(row["references"][n]["psnr"], 2)
                             if row["references"][n] else f"out of {n}'s range" for n in names)]))
    for mean in results["means"]:
        lines.append(_row([f"**mean of {mean['images']}**", mean["model"], f"{mean['bpp']:.4f}",
                           _number(mean["psnr"], 2), _number(mean["ms_ssim"], 4),
                           *(_number(mean["references"][n]["psnr"], 2) for n in names)]))
    lines += ["", "Mean PSNR difference, model minus reference at the model's rate (dB), on "
              "the images where the reference reaches that rate:", "",
              _row(["model", *names]), "|---|" + "---:|" * len(names)]
    for mean in results["means"]:
        lines.append(_row([mean["model"], *(
            f"{_number(mean['references'][n]['delta_psnr'], 2, signed=True)} "
            f"({mean['references'][n]['images']} of {mean['images']})" for n in names)]))
    lines += ["", "BD-rate of each model architecture against each reference codec (negative: "
              "the model needs that much less rate for the same quality):", "",
              _row(["model", "checkpoints", "anchor", "BD-rate (PSNR)", "BD-rate (MS-SSIM)"]),
              "|---|---|---|---:|---:|"]
    for entry in results["bd_rates"]:
        cells = []
        for key in ("psnr", "ms_ssim"):
            value = entry[key]
            cells.append(f"{value:+.1f}%" if value is not None else f"— ({entry[key + '_note']})")
        lines.append(_row([entry["architecture"], len(entry["checkpoints"]), entry["reference"],
                           *cells]))
    lines += ["", "Seconds per megapixel (median):", "",
              _row(["codec", "device", "encode", "decode"]), "|---|---|---:|---:|"]
    for entry in results["speed"]:
        lines.append(_row([entry["codec"], entry["device"], f"{entry['encode_s_per_mp']:.3f}",
                           f"{entry['decode_s_per_mp']:.3f}"]))
    lines += ["", "bpp: 8 x file size / pixels, headers included. References at the same "
              "rate: interpolated linearly in bpp between the two settings whose files "
              "bracket the model's. BD-rate (Bjøntegaard, VCEG-M33): log-rate fitted by a "
              "least-squares cubic in quality (lower degree below 4 points) through the mean "
              "points, integrated over the common quality range; MS-SSIM as -10 log10(1 - "
              "MS-SSIM). Model speed: from the image array to the file's bytes and back, on "
              "the model's device (the first image includes one-time set-up); references: "
              "every file the sweep coded. References: " +
              "; ".join(results["references"].values()) + ". Images: " +
              ", ".join(results["images"]) + "."]
    return "\n".join(lines) + "\n"


def _columns(pairs):
    """([bpp...], [quality...]) of (bpp, quality) pairs."""
    return [b for b, _ in pairs], [q for _, q in pairs]


def plot_rate_distortion(results):
    """PNG bytes of the rate-distortion plot: PSNR and MS-SSIM (dB) against bpp.

    Each reference codec's mean curve (grey shades, dashed), and each model
    architecture's checkpoints joined in order of rate (colours, labelled
    points).
    """
    panels = [("psnr", "PSNR (dB)")]
    if any(math.isfinite(m["ms_ssim"]) for m in results["means"]):
        panels.append(("ms_ssim", "MS-SSIM (dB), -10 log10(1 - MS-SSIM)"))
    figure = new_figure(6.2 * len(panels), 4.6, dpi=110)
    styles = [("0.15", "--", "s"), ("0.45", "-.", "^"), ("0.65", ":", "D")]
    for index, (key, label) in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), index + 1)
        for (name, curve), (colour, line, marker) in zip(results["reference_curves"].items(),
                                                         styles * 3):
            x, y = _columns(rd_points(curve, key))
            axes.plot(x, y, line, color=colour, marker=marker, markersize=3, label=name)
        for architecture in dict.fromkeys(m["architecture"] for m in results["means"]):
            points = sorted((m for m in results["means"] if m["architecture"] == architecture),
                            key=lambda m: m["bpp"])
            x, y = _columns(rd_points(points, key))
            axes.plot(x, y, "-o", linewidth=2, markersize=6, label=f"gdnflow {architecture}")
        axes.set_xlabel("bits per pixel")
        axes.set_ylabel(label)
        axes.grid(True, color="0.9")
        top = max(m["bpp"] for m in results["means"])
        axes.set_xlim(0, 1.6 * top)
        axes.legend(loc="lower right", fontsize="small")
    figure.suptitle(f"gdnflow eval: mean over {len(results['images'])} image"
                    f"{'' if len(results['images']) == 1 else 's'}")
    return png_bytes(figure)


__all__ = ["markdown_table", "plot_rate_distortion"]
