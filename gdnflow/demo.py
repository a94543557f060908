"""``gdnflow demo``: a shipped codec, fine-tuned briefly, then tested on photos it never saw.

The first thing to run (the README's first line). In about a minute on two
CPU cores (seconds on a GPU) it shows the whole job of gdnflow:

1. **Training**: a shipped factorized-prior model (``--quality``, default 2)
   is fine-tuned for a few hundred steps (``--steps``) on scikit-image's
   sample photos, at a small learning rate: the progress bar, checkpoint,
   curves and reconstructions of a real run land in ``OUT/finetune``. So few
   steps change the model little: they show the training machinery, while
   the compression comes from the shipped weights.
2. **Compression** of two photos that no shipped model and no fine-tuning step
   saw (scikit-image's coffee and chelsea) to real ``.gdn`` files, decoded
   back; before and after the fine-tuning.
3. **The comparison**: JPEG and WebP (Pillow) at the same size as each
   ``.gdn`` file: PSNR interpolated at exactly that rate, and the largest of
   their files not larger than it, saved beside it and shown in
   ``OUT/comparison.png`` (a 1:1 crop of each, zoomed 2x).

Everything goes into a new folder (``runs/demo``, ``runs/demo-2``, ... or
``--out``); ``OUT/demo.json`` has every number.
"""
import io
import json
from pathlib import Path

from PIL import Image, ImageDraw

from gdnflow.backends import default_device
from gdnflow.codec.cli import unused_folder
from gdnflow.codec.codec import Codec, read_image
from gdnflow.codec.evaluate import image_bytes
from gdnflow.codec.references import JPEG, WEBP, RateSweep, decode_image, quality_metrics
from gdnflow.codec.zoo import SHIPPED, pretrained
from gdnflow.commandline import positive_int
from gdnflow.data.images import ImageFolder, NoImagesError, sample_photos
from gdnflow.io.files import write_bytes_atomic
from gdnflow.plots import default_font
from gdnflow.train.losses import LAMBDAS
from gdnflow.train.trainer import TrainConfig, Trainer

#: scikit-image's photos that the shipped models were not trained on.
HELD_OUT = ("coffee.png", "chelsea.png")
#: The qualities of the shipped factorized priors that the demo fine-tunes.
SHIPPED_QUALITIES = tuple(sorted(e.quality for e in SHIPPED
                                 if e.architecture == "factorized_prior"))
#: Fine-tuning: steps, crop side and batch per device, and the learning rate.
SETTINGS = {"numpy": (200, 64, 4), "cuda": (1000, 256, 8)}
FINE_TUNE_LR = 1e-5
#: The side of the compared crop (pixels of the photo) and its zoom in comparison.png.
CROP, ZOOM = 160, 2


def split_photos(photos):
    """(training photos, held-out photos) of scikit-image's sample photos."""
    held_out = [p for p in photos if p.name in HELD_OUT]
    if len(held_out) != len(HELD_OUT):
        raise NoImagesError(f"gdnflow demo needs scikit-image's {' and '.join(HELD_OUT)}; found "
                            f"{', '.join(p.name for p in photos) or 'no photos'}")
    return [p for p in photos if p.name not in HELD_OUT], held_out


def compress_photo(codec, path, out, suffix):
    """Compress ``path`` to ``out/<stem><suffix>.gdn`` and decode that file; a dict of numbers
    and the decoded pixels."""
    original = read_image(path)
    target = out / f"{path.stem}{suffix}.gdn"
    write_bytes_atomic(target, codec.compress(original))
    data = target.read_bytes()
    decoded = codec.decompress(data, str(target))
    write_bytes_atomic(target.with_suffix(".png"), image_bytes(decoded))
    pixels = original.shape[0] * original.shape[1]
    return {"file": str(target), "bytes": len(data), "bpp": 8 * len(data) / pixels,
            **quality_metrics(original, decoded)}, original, decoded


def same_size_reference(original, codec, bpp, out, stem):
    """A reference codec at the rate ``bpp``: interpolated metrics, and its largest file not
    larger (saved as ``out/<stem>.<codec>.<ext>``) with its pixels; None out of range."""
    sweep = RateSweep(original, codec)
    at = sweep.at_rate(bpp)
    if at is None:
        return None, None
    setting = at["settings"][0]         # the bracket's lower file is below the rate
    data = sweep.file(setting)
    extension = {"JPEG": "jpg", "WebP": "webp"}[codec.name]
    path = out / f"{stem}.{codec.name.lower()}.{extension}"
    write_bytes_atomic(path, data)
    point = sweep.point(setting)        # measured when the rate was bracketed
    return {"psnr_at_rate": at["psnr"], "ms_ssim_at_rate": at["ms_ssim"],
            "file": str(path), "setting": setting, "bytes": len(data),
            "psnr": point["psnr"], "ms_ssim": point["ms_ssim"]}, decode_image(data)


def run_demo(out=None, quality=2, steps=None, device=None, log=print, photos=None):
    """Run the demo (see the module docstring); returns the numbers written to demo.json.

    ``photos``: the image paths to draw the training and held-out photos from
    (default: scikit-image's sample photos; the held-out ones are those named
    as in :data:`HELD_OUT`).
    """
    if quality not in SHIPPED_QUALITIES:
        raise ValueError(f"gdnflow demo: --quality must be one of "
                         f"{', '.join(map(str, SHIPPED_QUALITIES))} (the shipped "
                         f"factorized-prior models), got {quality}")
    device = device or default_device()
    default_steps, crop, batch = SETTINGS[device]
    steps = default_steps if steps is None else int(steps)
    if steps < 1:
        raise ValueError(f"gdnflow demo: --steps must be at least 1, got {steps}")
    training, held_out = split_photos(sample_photos() if photos is None else list(photos))
    out = Path(out) if out is not None else unused_folder(Path("runs") / "demo")
    out.mkdir(parents=True, exist_ok=True)
    shipped = pretrained("factorized_prior", quality, device)
    before = {p.name: compress_photo(shipped, p, out, ".shipped")[0] for p in held_out}
    model = shipped.model
    config = TrainConfig(out_dir=str(out / "finetune"), steps=steps, crop=crop, batch_size=batch,
                         lmbda=LAMBDAS[quality - 1], N=model.N, M=model.M, lr=FINE_TUNE_LR,
                         eval_every=steps, checkpoint_every=0, eval_images=0, device=device)
    log(f"gdnflow demo: fine-tuning the shipped quality-{quality} model for {steps} steps on "
        f"{len(training)} of scikit-image's photos ({device}); then coding "
        f"{' and '.join(HELD_OUT)}, which it never saw")
    trainer = Trainer(config, model=model, train_data=ImageFolder(training, crop=crop),
                      eval_data=ImageFolder(held_out, crop=model.downsampling))
    trainer.run()
    codec = Codec(trainer.model)
    results = {"device": device, "quality": quality, "steps": steps,
               "checkpoint": str(out / "finetune" / "checkpoint.h5"), "photos": []}
    rows = []
    for path in held_out:
        ours, original, decoded = compress_photo(codec, path, out, "")
        entry = {"photo": path.name, "shipped": before[path.name], "fine_tuned": ours}
        pictures = [(f"{path.name}, original", original), (_caption("gdnflow", ours), decoded)]
        for reference in (JPEG, WEBP):
            numbers, pixels = same_size_reference(original, reference, ours["bpp"], out,
                                                  path.stem)
            entry[reference.name] = numbers
            if numbers is not None:
                label = f"{reference.name} {reference.setting_label(numbers['setting'])}"
                pictures.append((_caption(label, numbers), pixels))
        results["photos"].append(entry)
        rows.append(pictures)
    write_bytes_atomic(out / "comparison.png", _comparison_sheet(rows), overwrite=True)
    write_bytes_atomic(out / "demo.json", json.dumps(results, indent=1).encode(), overwrite=True)
    log(summary(results, out))
    return results


def _caption(name, numbers):
    return f"{name}: {numbers['bytes']:,} bytes, {numbers['psnr']:.2f} dB"


def summary(results, out):
    """The lines the demo prints at the end: a table per photo and where the files are."""
    lines = ["", "| photo | gdnflow bpp | gdnflow PSNR | shipped model PSNR (bpp) | JPEG PSNR at "
             "that bpp | WebP PSNR at that bpp |", "|---|---:|---:|---:|---:|---:|"]
    for entry in results["photos"]:
        ours, shipped = entry["fine_tuned"], entry["shipped"]
        refs = [f"{entry[name]['psnr_at_rate']:.2f} dB" if entry[name] else "out of range"
                for name in ("JPEG", "WebP")]
        lines.append(f"| {entry['photo']} | {ours['bpp']:.3f} | {ours['psnr']:.2f} dB | "
                     f"{shipped['psnr']:.2f} dB ({shipped['bpp']:.3f}) | {refs[0]} | {refs[1]} |")
    lines += ["", f"written to {out}: comparison.png (crops of each photo: gdnflow beside JPEG "
              "and WebP files no larger), the .gdn files and their decodings, demo.json, and "
              "the fine-tuning run in finetune/ (checkpoint.h5, curves.png, reconstructions.png)"]
    return "\n".join(lines)


def _comparison_sheet(rows):
    """PNG bytes: a row per photo of centre crops (original, gdnflow, references), captioned."""
    font = default_font()
    tile, caption, gap = CROP * ZOOM, 22, 8
    columns = max(len(r) for r in rows)
    size = (columns * (tile + gap) + gap, len(rows) * (tile + caption + gap) + gap)
    sheet = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(sheet)
    for i, pictures in enumerate(rows):
        y = gap + i * (tile + caption + gap)
        for j, (label, pixels) in enumerate(pictures):
            h, w = pixels.shape[:2]
            top, left = max(h // 2 - CROP // 2, 0), max(w // 2 - CROP // 2, 0)
            crop = Image.fromarray(pixels[top:top + CROP, left:left + CROP])
            x = gap + j * (tile + gap)
            sheet.paste(crop.resize((crop.width * ZOOM, crop.height * ZOOM), Image.NEAREST),
                        (x, y + caption))
            draw.text((x, y + 3), label, fill=(0, 0, 0), font=font)
    buffer = io.BytesIO()
    sheet.save(buffer, "PNG")
    return buffer.getvalue()


def cmd_demo(args):
    """``gdnflow demo``: run it; the exit status."""
    run_demo(args.out, args.quality, args.steps, args.device)
    return 0


def add_demo_parser(subparsers):
    """Add ``demo`` to the ``gdnflow`` command's subparsers; returns the new parser."""
    parser = subparsers.add_parser(
        "demo", help="fine-tune a shipped codec briefly, then code two photos it never saw "
        "beside JPEG and WebP at the same size",
        description=__doc__.split("\n\n")[0] + " About a minute on two CPU cores; seconds on "
        "a GPU. Needs scikit-image's sample photos (pip install 'gdnflow[data]').")
    parser.add_argument("--out", metavar="DIR", help="folder for everything it writes "
                        "(default: runs/demo, or runs/demo-2, -3, ... if taken)")
    parser.add_argument("--quality", type=int, choices=SHIPPED_QUALITIES, default=2,
                        help="the shipped factorized-prior model to start from (default 2)")
    parser.add_argument("--steps", type=positive_int, help="fine-tuning steps (default: "
                        f"{SETTINGS['numpy'][0]} on NumPy, {SETTINGS['cuda'][0]} on a GPU)")
    parser.add_argument("--device", choices=["numpy", "cuda"],
                        help="default: GDNFLOW_DEVICE, else cuda when usable, else numpy")
    parser.set_defaults(run=cmd_demo)
    return parser


__all__ = ["run_demo", "split_photos", "summary", "add_demo_parser", "HELD_OUT"]
