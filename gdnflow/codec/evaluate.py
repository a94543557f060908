"""``gdnflow eval``: rate and distortion of codec checkpoints on real files, against JPEG.

For every image of a folder and every checkpoint: compress to a ``.gdn``
file, take bpp from the file's size (8 * bytes / (H * W), header included),
decode the file read back, and measure PSNR and MS-SSIM of the 8-bit
reconstruction against the 8-bit original. JPEG (Pillow's libjpeg, 4:2:0
chroma subsampling, optimised Huffman tables, headers counted like ours) is
measured at the two neighbouring qualities whose file sizes bracket the
model's, and its PSNR and MS-SSIM interpolated linearly in bpp: "JPEG at the
same rate". A model rate below JPEG's quality 1 (or above 100) has no JPEG
value at that rate (the table says so).

Outputs in the folder given: ``eval.md`` (a markdown table, per image and
mean per model), ``eval.json`` (every number), ``rd.png`` (PSNR and
MS-SSIM against bpp: the models' mean points and JPEG's mean curve over a
sweep of qualities around their rates) and the ``.gdn`` files under
``files/<checkpoint>/`` (``files/codec_q2/photo.png.gdn``) with their decodings
beside them (``photo.png.decoded.png``). A checkpoint is named by its file's stem,
or by its folder for a run's ``checkpoint.h5``; labels add the model's kind and
lambda ("q3 (hyperprior, lambda 0.0067)"). ``--force``
replaces only a ``files`` folder that eval wrote (it holds ``.gdnflow-eval``)
and that holds none of the inputs; the earlier one is swapped out by rename.
"""
import io
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import PIL
from PIL import Image, ImageDraw, features

from gdnflow.codec.codec import Codec, read_image
from gdnflow.data.images import NoImagesError, list_images
from gdnflow.io.files import (TEMPORARY_SUFFIX, OutputError, OutputExistsError, check_outputs,
                              write_bytes_atomic)
from gdnflow.io.checkpoint import read_checkpoint_info
from gdnflow.plots import MARGIN_L, default_font, frame, nice_ticks, tick_label
from gdnflow.train.losses import LAMBDAS, ms_ssim, psnr

#: The folder of the .gdn files in the output folder.
FILES = "files"
#: The file that marks a ``files`` folder as eval's own (only such a folder is replaced).
FILES_MARKER = ".gdnflow-eval"
#: The JPEG qualities whose sizes are measured on each image (encoding only: cheap).
JPEG_QUALITIES = tuple(range(1, 101))
#: JPEG points on the plotted curve, spread over the plotted rates.
CURVE_POINTS = 12
#: The plot spans rates up to this multiple of the largest model rate.
PLOT_RATE_SPAN = 1.6


def jpeg_bytes(image, quality):
    """The bytes of a uint8 (H, W, 3) image as a JPEG file of ``quality`` (Pillow, optimised)."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=int(quality), optimize=True)
    return buffer.getvalue()


def decode_jpeg(data):
    """uint8 (H, W, 3) pixels of JPEG bytes."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def quality_metrics(original, decoded):
    """{"psnr": dB, "ms_ssim": value} of two uint8 (H, W, 3) images (MS-SSIM NaN below 161 px)."""
    a = original.transpose(2, 0, 1).astype(np.float64) / 255
    b = decoded.transpose(2, 0, 1).astype(np.float64) / 255
    try:
        structural = ms_ssim(a, b)
    except ValueError:          # a side of 160 pixels or less: no five scales
        structural = float("nan")
    return {"psnr": psnr(a, b), "ms_ssim": structural}


class JpegReference:
    """JPEG on one image: file sizes at every quality, metrics on demand (cached).

    ``JpegReference(image)`` measures the sizes of :data:`JPEG_QUALITIES`;
    :meth:`point` gives one quality's bpp and metrics; :meth:`at_rate` the
    metrics interpolated at a given bpp.
    """

    def __init__(self, image):
        self.image = image
        self.pixels = image.shape[0] * image.shape[1]
        self.bpp = {q: 8 * len(jpeg_bytes(image, q)) / self.pixels for q in JPEG_QUALITIES}
        self._points = {}

    def point(self, quality):
        """{"quality", "bpp", "psnr", "ms_ssim"} of JPEG at ``quality``."""
        if quality not in self._points:
            decoded = decode_jpeg(jpeg_bytes(self.image, quality))
            self._points[quality] = {"quality": quality, "bpp": self.bpp[quality],
                                     **quality_metrics(self.image, decoded)}
        return self._points[quality]

    def bracket(self, bpp):
        """(q_low, q_high): adjacent qualities with bpp(q_low) < bpp <= bpp(q_high), or None.

        q_high is the lowest quality reaching ``bpp``; None when even
        quality 1 is larger or quality 100 smaller.
        """
        qualities = sorted(self.bpp)
        for i, q in enumerate(qualities):
            if self.bpp[q] >= bpp:
                return None if i == 0 and self.bpp[q] > bpp else (qualities[max(i - 1, 0)], q)
        return None

    def at_rate(self, bpp):
        """JPEG's PSNR and MS-SSIM interpolated linearly in bpp at ``bpp``, or None out of range.

        Returns {"psnr", "ms_ssim", "qualities": (q_low, q_high), "bpp": (low, high)}.
        """
        pair = self.bracket(bpp)
        if pair is None:
            return None
        a, b = (self.point(q) for q in pair)
        t = 1.0 if b["bpp"] == a["bpp"] else (bpp - a["bpp"]) / (b["bpp"] - a["bpp"])
        return {key: a[key] + t * (b[key] - a[key]) for key in ("psnr", "ms_ssim")} | \
            {"qualities": list(pair), "bpp": [a["bpp"], b["bpp"]]}


def checkpoint_name(path):
    """A checkpoint's short name: its file stem, or its folder's name for a run's
    ``checkpoint.h5`` (runs/q3/checkpoint.h5 is "q3")."""
    path = Path(path)
    return path.parent.resolve().name or path.stem if path.stem == "checkpoint" else path.stem


def checkpoint_label(path, name=None):
    """``name`` (default: :func:`checkpoint_name`) with the model's architecture, its
    CompressAI quality (when its lambda is one of theirs) and lambda, as far as the
    checkpoint records them: "q3 (hyperprior, quality 3, lambda 0.0067)"."""
    label = name or checkpoint_name(path)
    try:
        info = read_checkpoint_info(path)
        details = [info["model_name"]]
        lmbda = info["extra"].get("train_config", {}).get("lmbda")
        if lmbda in LAMBDAS:
            details.append(f"quality {LAMBDAS.index(lmbda) + 1}")
        if lmbda is not None:
            details.append(f"lambda {lmbda:g}")
    except Exception:       # noqa: BLE001 (the label is cosmetic; loading reports real errors)
        return label
    return f"{label} ({', '.join(details)})"


def _mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


def evaluate(checkpoints, data, out_dir=None, device=None, force=False, log=print):
    """Evaluate codec checkpoints on the images of folder ``data`` against JPEG.

    ``checkpoints``: paths; ``out_dir``: where the outputs go (see the module
    docstring; None: nothing is written but the ``.gdn`` files, to a
    temporary folder, so that bpp still comes from real files); ``force``:
    overwrite earlier outputs. ``log`` receives one line per image and
    model. Returns the results dict written to ``eval.json``.
    """
    images = list_images(data)
    if not images:
        raise NoImagesError(f"no images in {data}")
    outputs = []
    if out_dir is not None:
        outputs = [Path(out_dir) / name for name in ("eval.md", "eval.json", "rd.png")]
        check_outputs(outputs, inputs=[*images, *checkpoints], force=force)
        _check_files_folder(Path(out_dir) / FILES, [*images, *checkpoints], force)
    codecs, stems = [], set()
    for path in checkpoints:
        # Names must differ: they label the rows and name the folders of .gdn files.
        stem = checkpoint_name(path)
        stem = next(f"{stem}-{i}" for i in range(2, len(checkpoints) + 2)
                    if f"{stem}-{i}" not in stems) if stem in stems else stem
        stems.add(stem)
        codecs.append((checkpoint_label(path, stem), stem, Codec.from_checkpoint(path, device)))
    # The .gdn files go to a scratch folder (inside out_dir, so that the move
    # below is a rename) and join the results only once all are measured and
    # the table, JSON and plot made: a failure leaves no partial result set.
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=f".{FILES}.",
                                     suffix=TEMPORARY_SUFFIX) as scratch:
        files = Path(scratch) / FILES
        rows, references = _measure(images, data, codecs, files, log)
        files.mkdir(exist_ok=True)
        (files / FILES_MARKER).write_text("the .gdn files of gdnflow eval (eval.json)\n")
        models = [label for label, _, _ in codecs]
        means = [_model_mean(label, [r for r in rows if r["model"] == label])
                 for label in models]
        results = {
            "data": str(data), "images": [str(p.relative_to(data)) for p in images],
            "checkpoints": {label: str(path) for (label, _, _), path in zip(codecs, checkpoints)},
            "jpeg": f"Pillow {PIL.__version__} (libjpeg {features.version('jpg')}), 4:2:0, "
                    "optimize=True",
            "rows": rows, "means": means,
            "jpeg_curve": jpeg_curve(references, max(m["bpp"] for m in means)),
        }
        if out_dir is not None:
            contents = [markdown_table(results).encode(),
                        json.dumps(results, indent=1).encode(), plot_rate_distortion(results)]
            _replace_folder(files, Path(out_dir) / FILES, Path(scratch) / "earlier")
            for path, content in zip(outputs, contents):
                write_bytes_atomic(path, content, overwrite=True)
    return results


def _check_files_folder(folder, inputs, force):
    """Refuse, before any work, a ``files`` folder eval may not replace.

    It may be replaced (with ``force``) only if it is a folder that eval
    wrote (it holds :data:`FILES_MARKER`) and none of the inputs is inside.
    """
    if not folder.exists() and not folder.is_symlink():
        return
    if not folder.is_dir() or folder.is_symlink():
        raise OutputError(f"{folder} exists and is not a folder of earlier results: move it away")
    inside = [p for p in inputs if folder.resolve() in Path(p).resolve().parents]
    if inside:
        raise OutputError(f"{folder} holds inputs of this evaluation ({inside[0]}): choose "
                          "another --out")
    if not (folder / FILES_MARKER).exists():
        raise OutputError(f"{folder} exists and was not written by gdnflow eval: move it away "
                          "or choose another --out")
    if not force:
        raise OutputExistsError(f"{folder} exists: pass --force to overwrite the earlier results")


def _replace_folder(new, target, aside):
    """Put folder ``new`` at ``target``; an earlier ``target`` goes to ``aside`` (a scratch path)."""
    if target.exists():
        os.rename(target, aside)
    try:
        os.rename(new, target)
    except OSError as exc:
        if aside.exists():
            os.rename(aside, target)        # the earlier results stay as they were
        raise OutputError(f"cannot write {target}: {exc.strerror}") from None


def _measure(images, data, codecs, files, log):
    """(rows, JPEG references) of every image coded by every codec (``.gdn`` files in ``files``)."""
    rows, references = [], []
    for path in images:
        original = read_image(path)
        reference = JpegReference(original)
        references.append(reference)
        for label, stem, codec in codecs:
            # The image's whole relative name: a.png and a.jpg are two files.
            target = files / stem / f"{path.relative_to(data)}.gdn"
            target.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(target, codec.compress(original))
            data_read = target.read_bytes()
            decoded = codec.decompress(data_read, str(target))
            write_bytes_atomic(target.with_suffix(".decoded.png"), image_bytes(decoded))
            bpp = 8 * os.path.getsize(target) / reference.pixels
            row = {"image": str(path.relative_to(data)), "model": label,
                   "bytes": len(data_read), "bpp": bpp,
                   **quality_metrics(original, decoded), "jpeg": reference.at_rate(bpp)}
            rows.append(row)
            log(_describe(row))
    return rows, references


def image_bytes(image, format_name="PNG"):
    """The bytes of a uint8 (H, W, 3) image as a file of Pillow's ``format_name``."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format_name)
    return buffer.getvalue()


def _model_mean(label, rows):
    jpeg = [r for r in rows if r["jpeg"] is not None]
    return {"model": label, "images": len(rows), "bpp": _mean(r["bpp"] for r in rows),
            "psnr": _mean(r["psnr"] for r in rows), "ms_ssim": _mean(r["ms_ssim"] for r in rows),
            "jpeg_images": len(jpeg),
            "jpeg_psnr": _mean(r["jpeg"]["psnr"] for r in jpeg),
            "jpeg_ms_ssim": _mean(r["jpeg"]["ms_ssim"] for r in jpeg),
            "delta_psnr": _mean(r["psnr"] - r["jpeg"]["psnr"] for r in jpeg)}


def jpeg_curve(references, top_bpp):
    """JPEG's mean (over images) bpp, PSNR and MS-SSIM at up to :data:`CURVE_POINTS` qualities.

    The qualities spread over the rates up to ``PLOT_RATE_SPAN * top_bpp``
    (by mean bpp), plus the first quality beyond, so the curve crosses the
    plot's right edge.
    """
    mean_bpp = {q: _mean(r.bpp[q] for r in references) for q in JPEG_QUALITIES}
    inside = [q for q in JPEG_QUALITIES if mean_bpp[q] <= PLOT_RATE_SPAN * top_bpp]
    beyond = [q for q in JPEG_QUALITIES if mean_bpp[q] > PLOT_RATE_SPAN * top_bpp][:1]
    if len(inside) > CURVE_POINTS:
        picks = np.linspace(0, len(inside) - 1, CURVE_POINTS).round().astype(int)
        inside = [inside[i] for i in sorted(set(picks))]
    curve = []
    for q in inside + beyond:
        points = [r.point(q) for r in references]
        curve.append({"quality": q, "bpp": mean_bpp[q], "psnr": _mean(p["psnr"] for p in points),
                      "ms_ssim": _mean(p["ms_ssim"] for p in points)})
    return curve


# ------------------------------------------------------------- report --
def _number(value, digits):
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _describe(row):
    jpeg = row["jpeg"]
    versus = (f"; JPEG at that rate {jpeg['psnr']:.2f} dB (q{jpeg['qualities'][0]}-"
              f"{jpeg['qualities'][1]})" if jpeg else "; JPEG cannot reach that rate")
    return (f"{row['image']}, {row['model']}: {row['bytes']} bytes, {row['bpp']:.4f} bpp, "
            f"PSNR {row['psnr']:.2f} dB, MS-SSIM {_number(row['ms_ssim'], 4)}{versus}")


def markdown_table(results):
    """The results as a markdown table: a row per image and model, then a mean row per model."""
    lines = ["| image | model | bpp | PSNR (dB) | MS-SSIM | JPEG PSNR at that bpp | "
             "JPEG MS-SSIM | Δ PSNR (dB) | JPEG qualities |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in results["rows"]:
        jpeg = row["jpeg"]
        if jpeg:
            versus = [_number(jpeg["psnr"], 2), _number(jpeg["ms_ssim"], 4),
                      f"{row['psnr'] - jpeg['psnr']:+.2f}",
                      f"{jpeg['qualities'][0]}–{jpeg['qualities'][1]}"]
        else:
            versus = ["—", "—", "—", "out of JPEG's range"]
        lines.append("| " + " | ".join([row["image"], row["model"], f"{row['bpp']:.4f}",
                                         _number(row["psnr"], 2), _number(row["ms_ssim"], 4),
                                         *versus]) + " |")
    for mean in results["means"]:
        delta = mean["delta_psnr"]
        lines.append("| " + " | ".join([
            f"**mean of {mean['images']}**", mean["model"], f"{mean['bpp']:.4f}",
            _number(mean["psnr"], 2), _number(mean["ms_ssim"], 4),
            _number(mean["jpeg_psnr"], 2), _number(mean["jpeg_ms_ssim"], 4),
            "—" if not math.isfinite(delta) else f"{delta:+.2f}",
            f"JPEG on {mean['jpeg_images']} of {mean['images']}"]) + " |")
    lines += ["", f"bpp: 8 x file size / pixels (headers included). JPEG: {results['jpeg']}, "
              "interpolated linearly in bpp between the two qualities whose sizes bracket "
              "the model's. Images: " + ", ".join(results["images"]) + "."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------- plot --
PLOT_W, PLOT_H = 560, 380
JPEG_COLOUR = (120, 120, 120)
MODEL_COLOURS = ((210, 60, 40), (30, 80, 170), (40, 150, 70), (150, 60, 170), (220, 140, 20))


def _rd_panel(draw, origin, title, key, results, font):
    """One panel: ``key`` (psnr or ms_ssim) against bpp: JPEG's curve and the models' points."""
    ox = origin[0]
    left, top, right, bottom = frame(draw, origin, (PLOT_W, PLOT_H), title, font)
    models = [(m["bpp"], m[key]) for m in results["means"] if math.isfinite(m[key])]
    curve = [(p["bpp"], p[key]) for p in results["jpeg_curve"] if math.isfinite(p[key])]
    if not models:
        draw.text((left + 10, top + 10), "no data (images too small?)", fill=JPEG_COLOUR,
                  font=font)
        return
    x_high = PLOT_RATE_SPAN * max(b for b, _ in models)
    shown = [v for b, v in curve if b <= x_high] + [v for _, v in models]
    y_low, y_high = min(shown), max(shown)
    pad = 0.08 * (y_high - y_low) or 0.5 * (abs(y_high) * 0.01 or 1)
    y_low, y_high = y_low - pad, y_high + pad

    def xy(b, v):
        return (left + b / x_high * (right - left),
                bottom - (min(max(v, y_low), y_high) - y_low) / (y_high - y_low) * (bottom - top))

    for tick in nice_ticks(y_low, y_high):
        _, y = xy(0, tick)
        draw.line([left, y, right, y], fill=(232, 232, 232))
        draw.text((ox + 6, y - 7), tick_label(tick), fill=(60, 60, 60), font=font)
    for tick in nice_ticks(0, x_high):
        x, _ = xy(tick, y_low)
        draw.line([x, bottom, x, bottom + 4], fill=(120, 120, 120))
        draw.text((x - 10, bottom + 8), tick_label(tick), fill=(60, 60, 60), font=font)
    draw.text((right - 110, bottom + 22), "bits per pixel", fill=(60, 60, 60), font=font)
    inside = [(b, v) for b, v in curve if b <= x_high]
    line = list(inside)
    if len(curve) > len(inside) and inside:
        # The curve is ordered by quality: continue it to the right edge,
        # toward the first point beyond.
        (b0, v0), (b1, v1) = inside[-1], curve[len(inside)]
        line.append((x_high, v0 + (v1 - v0) * (x_high - b0) / (b1 - b0) if b1 > b0 else v1))
    if len(line) > 1:
        draw.line([xy(b, v) for b, v in line], fill=JPEG_COLOUR, width=2)
    for b, v in inside:
        x, y = xy(b, v)
        draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=JPEG_COLOUR)
    for i, mean in enumerate(results["means"]):
        if math.isfinite(mean[key]):
            x, y = xy(mean["bpp"], mean[key])
            colour = MODEL_COLOURS[i % len(MODEL_COLOURS)]
            draw.ellipse([x - 5, y - 5, x + 5, y + 5], fill=colour)


def plot_rate_distortion(results):
    """PNG bytes of the rate-distortion plot: PSNR and MS-SSIM against bpp (module docstring)."""
    font = default_font()
    panels = [("psnr", "PSNR (dB), mean over images")]
    if any(math.isfinite(m["ms_ssim"]) for m in results["means"]):
        panels.append(("ms_ssim", "MS-SSIM, mean over images"))
    legend = 22 * (len(results["means"]) + 1) + 8
    image = Image.new("RGB", (PLOT_W * len(panels), PLOT_H + legend), "white")
    draw = ImageDraw.Draw(image)
    for i, (key, title) in enumerate(panels):
        _rd_panel(draw, (i * PLOT_W, 0), title, key, results, font)
    y = PLOT_H + 4
    draw.line([MARGIN_L, y + 8, MARGIN_L + 24, y + 8], fill=JPEG_COLOUR, width=2)
    draw.text((MARGIN_L + 30, y), f"JPEG ({results['jpeg']})", fill=(0, 0, 0), font=font)
    for i, mean in enumerate(results["means"]):
        y += 22
        colour = MODEL_COLOURS[i % len(MODEL_COLOURS)]
        draw.ellipse([MARGIN_L + 7, y + 3, MARGIN_L + 17, y + 13], fill=colour)
        draw.text((MARGIN_L + 30, y), f"{mean['model']}: {mean['bpp']:.3f} bpp, "
                  f"{mean['psnr']:.2f} dB", fill=(0, 0, 0), font=font)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()
