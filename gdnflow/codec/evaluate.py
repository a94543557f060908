"""``gdnflow eval``: codec checkpoints on real files, against JPEG, WebP and JPEG 2000.

For every image of a folder and every checkpoint: compress to a ``.gdn``
file, take bpp from the file's size (8 * bytes / (H * W), header included),
decode the file read back, and measure PSNR and MS-SSIM of the 8-bit
reconstruction against the 8-bit original, and the time of both. Each
reference codec (:mod:`gdnflow.codec.references`: Pillow's JPEG, WebP and
JPEG 2000) codes the image at the two neighbouring settings whose files
bracket the model's size; its PSNR and MS-SSIM are interpolated linearly in
bpp: "WebP at the same rate". A model rate outside a codec's range has no
value for that codec (the table says so).

Then, over all images: each reference codec's mean rate-distortion curve
around the models' rates, and the BD-rate (:mod:`gdnflow.codec.bd_rate`) of
each model architecture (the mean points of its checkpoints, at least two)
against each reference codec, in PSNR and in MS-SSIM.

Outputs in the folder given: ``eval.md`` (per image and model, means,
BD-rates, speed), ``eval.json`` (every number), ``rd.png`` (PSNR and MS-SSIM
against bpp: the models' curves and the reference codecs', drawn by
matplotlib) and the ``.gdn`` files under ``files/<checkpoint>/``
(``files/codec_q2/photo.png.gdn``) with their decodings beside them
(``photo.png.decoded.png``). A checkpoint is named by its file's stem, or by
its folder for a run's ``checkpoint.h5``; labels add the model's kind and
lambda ("q3 (hyperprior, quality 3, lambda 0.0067)"). ``--force`` replaces
only a ``files`` folder that eval wrote (it holds ``.gdnflow-eval``) and that
holds none of the inputs; the earlier one is swapped out by rename.
"""
import contextlib
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import PIL
from PIL import Image
from tqdm import tqdm

from gdnflow.codec.bd_rate import BDRateError, bd_rate, rd_points
from gdnflow.codec.codec import Codec, read_image
from gdnflow.codec.eval_report import markdown_table, plot_rate_distortion
from gdnflow.codec.references import (REFERENCE_CODECS, RateSweep, finite_mean, mean_curve,
                                      quality_metrics)
from gdnflow.data.images import NoImagesError, list_images
from gdnflow.io.files import (TEMPORARY_SUFFIX, OutputError, OutputExistsError, check_outputs,
                              write_bytes_atomic)
from gdnflow.io.checkpoint import read_checkpoint_info
from gdnflow.train.losses import LAMBDAS

#: The folder of the .gdn files in the output folder.
FILES = "files"
#: The file that marks a ``files`` folder as eval's own (only such a folder is replaced).
FILES_MARKER = ".gdnflow-eval"
#: The reference curves span the models' rates divided and multiplied by this.
RATE_SPAN = 1.6


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


def reference_codecs(names):
    """The :class:`~gdnflow.codec.references.ReferenceCodec` of each name; a ValueError names
    an unknown one, or one this Pillow was built without."""
    unknown = [n for n in names if n not in REFERENCE_CODECS]
    if unknown:
        raise ValueError(f"gdnflow eval: unknown reference codec {unknown[0]!r}; choose from "
                         f"{', '.join(REFERENCE_CODECS)}")
    missing = [n for n in names if not REFERENCE_CODECS[n].available]
    if missing:
        raise ValueError(f"gdnflow eval: this Pillow {PIL.__version__} was built without "
                         f"{missing[0]} (feature {REFERENCE_CODECS[missing[0]].feature!r}); "
                         "leave it out with --references, or install a Pillow wheel")
    return [REFERENCE_CODECS[n] for n in names]


def evaluate(checkpoints, data, out_dir=None, device=None, force=False, log=None,
             references=tuple(REFERENCE_CODECS), progress=True, workers=1):
    """Evaluate codec checkpoints on the images of folder ``data`` against reference codecs.

    ``checkpoints``: paths; ``out_dir``: where the outputs go (see the module
    docstring; None: nothing is written but the ``.gdn`` files, to a
    temporary folder, so that bpp still comes from real files); ``force``:
    overwrite earlier outputs; ``references``: names of
    :data:`~gdnflow.codec.references.REFERENCE_CODECS`. ``log`` receives one
    line per image and model (default: printed above the progress bar);
    ``progress``: show a progress bar over images x (models + references)
    when standard error is a terminal. ``workers`` > 1: that many threads
    measure the decodings and run the reference codecs' sweeps, an image at
    a time each, while the models code the next images (Pillow and NumPy work
    outside Python's lock there); the results are the same, but the timings
    then share the machine with that work.
    Returns the results dict written to ``eval.json``.
    """
    if int(workers) < 1:
        raise ValueError(f"gdnflow eval: workers must be at least 1, got {workers!r}")
    codecs_used = reference_codecs(list(references))
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
    # Only on a terminal: in a log or a pipe a bar is noise, and an error's line must stand alone.
    bar = tqdm(total=len(images) * (len(codecs) + len(codecs_used)), unit="step",
               desc="gdnflow eval", disable=not (progress and sys.stderr.isatty()))
    log = log or bar.write
    # The .gdn files go to a scratch folder (inside out_dir, so that the move
    # below is a rename) and join the results only once all are measured and
    # the table, JSON and plot made: a failure leaves no partial result set.
    pool = ThreadPoolExecutor(workers, thread_name_prefix="gdnflow-eval") if workers > 1 \
        else contextlib.nullcontext()
    with bar, pool, tempfile.TemporaryDirectory(dir=out_dir, prefix=f".{FILES}.",
                                                suffix=TEMPORARY_SUFFIX) as scratch:
        pool = pool if workers > 1 else None
        files = Path(scratch) / FILES
        rows, sweeps = _measure(images, data, codecs, codecs_used, files, log, bar, pool,
                                ahead=2 * workers)
        files.mkdir(exist_ok=True)
        (files / FILES_MARKER).write_text("the .gdn files of gdnflow eval (eval.json)\n")
        means = [_model_mean(label, codec.model.name, [r for r in rows if r["model"] == label],
                             codecs_used) for label, _, codec in codecs]
        rates = [m["bpp"] for m in means]
        curves = {}
        for reference in codecs_used:
            curves[reference.name] = mean_curve(sweeps[reference.name], min(rates) / RATE_SPAN,
                                                max(rates) * RATE_SPAN, pool)
            bar.update(len(images))
        results = {
            "data": str(data), "images": [str(p.relative_to(data)) for p in images],
            "checkpoints": {label: str(path) for (label, _, _), path in zip(codecs, checkpoints)},
            "references": {r.name: r.describe() for r in codecs_used},
            "rows": rows, "means": means, "reference_curves": curves,
            "bd_rates": bd_rates(means, curves),
            "speed": _speed(rows, codecs, sweeps, device),
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


def _measure(images, data, codecs, references, files, log, bar, pool=None, ahead=0):
    """(rows, {reference name: [RateSweep per image]}) of every image coded by every codec
    (``.gdn`` files in ``files``). Each image's quality metrics and reference sweeps run
    as one task: in ``pool`` if given, while the models code at most ``ahead`` more
    images, else at once."""
    rows, sweeps = [], {r.name: [] for r in references}
    pending = []        # (rows of an image, the future of their measurements), in order

    def finish(waiting):
        """Report the rows of the images measured (in order), leaving at most ``waiting``."""
        while pending and (pending[0][1].done() or len(pending) > waiting):
            image_rows, future = pending.pop(0)
            for row, measured in zip(image_rows, future.result()):
                row.update(measured)
                log(_describe(row))
                bar.update(1)

    for path in images:
        original = read_image(path)
        image_sweeps = {r.name: RateSweep(original, r) for r in references}
        for name, sweep in image_sweeps.items():
            sweeps[name].append(sweep)
        pixels = original.shape[0] * original.shape[1]
        image_rows, decodings = [], []
        for label, stem, codec in codecs:
            # The image's whole relative name: a.png and a.jpg are two files.
            target = files / stem / f"{path.relative_to(data)}.gdn"
            target.parent.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            coded = codec.compress(original)
            encode_seconds = time.perf_counter() - start
            write_bytes_atomic(target, coded)
            data_read = target.read_bytes()
            start = time.perf_counter()
            decoded = codec.decompress(data_read, str(target))
            decode_seconds = time.perf_counter() - start
            write_bytes_atomic(target.with_suffix(".decoded.png"), image_bytes(decoded))
            image_rows.append({"image": str(path.relative_to(data)), "model": label,
                               "bytes": len(data_read), "bpp": 8 * os.path.getsize(target) / pixels,
                               "encode_s_per_mp": encode_seconds * 1e6 / pixels,
                               "decode_s_per_mp": decode_seconds * 1e6 / pixels})
            decodings.append(decoded)
        rows += image_rows
        task = (_measurements, original, decodings, [r["bpp"] for r in image_rows], image_sweeps)
        pending.append((image_rows, pool.submit(*task) if pool is not None else _done(*task)))
        finish(waiting=ahead)       # the waiting images' decodings are held in memory
    finish(waiting=0)
    # Each row's keys in one order, whatever finished first.
    keys = ("image", "model", "bytes", "bpp", "psnr", "ms_ssim", "encode_s_per_mp",
            "decode_s_per_mp", "references")
    return [{key: row[key] for key in keys} for row in rows], sweeps


def _measurements(original, decodings, rates, image_sweeps):
    """Per model of one image: its PSNR and MS-SSIM and each reference codec at its rate."""
    return [{**quality_metrics(original, decoded),
             "references": {name: sweep.at_rate(bpp) for name, sweep in image_sweeps.items()}}
            for decoded, bpp in zip(decodings, rates)]


def _done(function, *args):
    """A finished Future holding ``function(*args)`` (or its exception): the task run at once."""
    future = Future()
    try:
        future.set_result(function(*args))
    except Exception as exc:        # noqa: BLE001 (raised by result(), as a pool's would be)
        future.set_exception(exc)
    return future


def image_bytes(image, format_name="PNG"):
    """The bytes of a uint8 (H, W, 3) image as a file of Pillow's ``format_name``."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format_name)
    return buffer.getvalue()


def _model_mean(label, architecture, rows, references):
    """A model's means over images, and against each reference codec on the images where
    that codec reaches the model's rate."""
    mean = {"model": label, "architecture": architecture, "images": len(rows),
            "bpp": finite_mean(r["bpp"] for r in rows), "psnr": finite_mean(r["psnr"] for r in rows),
            "ms_ssim": finite_mean(r["ms_ssim"] for r in rows), "references": {}}
    for reference in references:
        matched = [r for r in rows if r["references"][reference.name] is not None]
        mean["references"][reference.name] = {
            "images": len(matched),
            "psnr": finite_mean(r["references"][reference.name]["psnr"] for r in matched),
            "ms_ssim": finite_mean(r["references"][reference.name]["ms_ssim"] for r in matched),
            "delta_psnr": finite_mean(r["psnr"] - r["references"][reference.name]["psnr"]
                                for r in matched)}
    return mean


def bd_rates(means, curves):
    """The BD-rate of each model architecture (its checkpoints' mean points) against each
    reference codec's mean curve, in PSNR and MS-SSIM: a list of dicts (value None with a
    note where a curve has too few points or the ranges do not overlap)."""
    results = []
    for architecture in dict.fromkeys(m["architecture"] for m in means):
        points = sorted((m for m in means if m["architecture"] == architecture),
                        key=lambda m: m["bpp"])
        for name, curve in curves.items():
            entry = {"architecture": architecture, "reference": name,
                     "checkpoints": [m["model"] for m in points]}
            for key in ("psnr", "ms_ssim"):
                try:
                    entry[key] = bd_rate(rd_points(curve, key), rd_points(points, key))
                except BDRateError as exc:
                    entry[key] = None
                    entry[f"{key}_note"] = str(exc).removeprefix("BD-rate: ")
            results.append(entry)
    return results


def _speed(rows, codecs, sweeps, device):
    """Seconds per megapixel to encode and decode: each model (median over images, on its
    device) and each reference codec (median over every file it coded and decoded)."""
    speed = []
    for label, _, codec in codecs:
        own = [r for r in rows if r["model"] == label]
        speed.append({"codec": label, "device": codec.device,
                      "encode_s_per_mp": statistics.median(r["encode_s_per_mp"] for r in own),
                      "decode_s_per_mp": statistics.median(r["decode_s_per_mp"] for r in own)})
    for name, image_sweeps in sweeps.items():
        per_mp = [(e * 1e6 / s.pixels, "encode") for s in image_sweeps for e in s.encode_seconds]
        per_mp += [(d * 1e6 / s.pixels, "decode") for s in image_sweeps for d in s.decode_seconds]
        speed.append({"codec": name, "device": "cpu (Pillow)", **{
            f"{kind}_s_per_mp": statistics.median(v for v, k in per_mp if k == kind)
            for kind in ("encode", "decode")}})
    return speed


def _describe(row):
    versus = "; ".join(
        f"{name} {ref['psnr']:.2f} dB" if ref else f"{name} out of range"
        for name, ref in row["references"].items())
    structural = "—" if not math.isfinite(row["ms_ssim"]) else f"{row['ms_ssim']:.4f}"
    return (f"{row['image']}, {row['model']}: {row['bytes']} bytes, {row['bpp']:.4f} bpp, "
            f"PSNR {row['psnr']:.2f} dB, MS-SSIM {structural}; at that rate: {versus}")


__all__ = ["evaluate", "bd_rates", "reference_codecs", "checkpoint_name", "checkpoint_label",
           "image_bytes"]
