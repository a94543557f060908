"""``gdnflow compress``, ``gdnflow decompress`` and ``gdnflow eval``: the image codec's commands.

    gdnflow compress photo.png -o photo.gdn --checkpoint checkpoints/codec_q2.h5
    gdnflow compress photo.png --quality 3             # a shipped model (gdnflow.codec.zoo)
    gdnflow decompress photo.gdn -o photo_hat.png      # finds the checkpoint by model id
    gdnflow decompress photo.gdn --exact               # the same bytes on NumPy and GPUs
    gdnflow eval --checkpoint checkpoints/*.h5 --data photos/   # into runs/eval (-2, ...)

:func:`add_codec_parsers` adds the three subcommands to the ``gdnflow``
parser; ``python -m gdnflow.codec.cli`` runs them on their own. The outputs
are checked before any work (:func:`gdnflow.io.files.check_outputs`): none
is overwritten without ``--force``, none is one of the command's inputs, and
their folders must be writable. Every file is written atomically. Errors are
one line naming the file, exit status 1 (:mod:`gdnflow.commandline`).

``decompress`` without ``--checkpoint`` looks for the checkpoint whose
model id the file names in the folders of ``GDNFLOW_CHECKPOINTS``
(separated by ``os.pathsep``), then the file's own folder, then
``./checkpoints``, then the shipped models' folders.
"""
import os
import sys
from pathlib import Path

from PIL import Image

from gdnflow.codec.codec import Codec, find_checkpoint, read_header, read_image
from gdnflow.codec.eval_report import markdown_table
from gdnflow.codec.evaluate import evaluate, image_bytes
from gdnflow.codec.references import REFERENCE_CODECS, quality_metrics
from gdnflow.codec.format import CodecError
from gdnflow.codec.zoo import DEFAULT_SHIPPED_MODEL, SHIPPED, shipped_checkpoint, shipped_folders
from gdnflow.commandline import add_max_pixels_option, command_parser, positive_int, run
from gdnflow.io.files import check_inputs, check_outputs, output_paths, write_bytes_atomic
from gdnflow.io.formats import require_checkpoint

#: Environment variable: folders searched for checkpoints by ``decompress``.
CHECKPOINT_PATH_VARIABLE = "GDNFLOW_CHECKPOINTS"


def image_format(path):
    """Pillow's format name for an image file ``path`` (by its suffix); CodecError if none."""
    path = Path(path)
    formats = Image.registered_extensions()
    if path.suffix.lower() not in formats:
        raise CodecError(f"{path}: unknown image format {path.suffix!r} (use .png for a "
                         "lossless copy of the reconstruction)")
    return formats[path.suffix.lower()]


def save_image(path, image, overwrite=False):
    """Write a uint8 (H, W, 3) image atomically, in the format of ``path``'s suffix (Pillow)."""
    write_bytes_atomic(path, image_bytes(image, image_format(path)), overwrite=overwrite)


# ---------------------------------------------------------------- commands --
def cmd_compress(args):
    """Compress each image to a ``.gdn`` file; print its size, bpp and the PSNR of its decoding.

    Without ``--checkpoint`` the shipped ``--model`` of ``--quality`` (default: the scale
    hyperprior of quality 2) codes them."""
    check_inputs(args.images, "image")
    if args.checkpoint is None:
        model, quality = args.model or DEFAULT_SHIPPED_MODEL, args.quality or 2
        checkpoint = shipped_checkpoint(model, quality)
        print(f"the shipped {model.replace('_', ' ')} of quality {quality} ({checkpoint.name})")
    else:
        if args.quality is not None or args.model is not None:
            raise CodecError("--model and --quality choose a shipped model: give them or "
                             "--checkpoint, not both")
        checkpoint = args.checkpoint
        require_checkpoint(checkpoint, "gdnflow compress")
    outputs = check_outputs(output_paths(args.images, args.output, ".gdn"),
                            inputs=[*args.images, checkpoint], force=args.force)
    codec = Codec.from_checkpoint(checkpoint, args.device)
    for source, target in zip(args.images, outputs):
        image = read_image(source)
        write_bytes_atomic(target, codec.compress(image), overwrite=args.force)
        data = target.read_bytes()
        # Decoding the file just written checks it and gives the real PSNR.
        decoded = codec.decompress(data, str(target))
        height, width = image.shape[:2]
        bpp = 8 * os.path.getsize(target) / (height * width)
        print(f"{source} -> {target}: {height}x{width}, {len(data)} bytes, {bpp:.4f} bpp, "
              f"PSNR {quality_metrics(image, decoded)['psnr']:.2f} dB")
    return 0


def checkpoint_folders(file):
    """Folders ``decompress`` searches for a file's checkpoint, in order (module docstring)."""
    listed = os.environ.get(CHECKPOINT_PATH_VARIABLE, "")
    return [Path(p) for p in listed.split(os.pathsep) if p] + [Path(file).parent,
                                                               Path("checkpoints"),
                                                               *shipped_folders()]


def cmd_decompress(args):
    """Decode each ``.gdn`` file to an image; print its size and bpp."""
    check_inputs(args.files, ".gdn file")
    if args.checkpoint is not None:
        require_checkpoint(args.checkpoint, "gdnflow decompress")
    outputs = check_outputs(output_paths(args.files, args.output, ".png"),
                            inputs=[*args.files, *filter(None, [args.checkpoint])],
                            force=args.force)
    for target in outputs:
        image_format(target)        # an unknown suffix fails now, not after the decoding
    codecs = {}
    for source, target in zip(args.files, outputs):
        data = Path(source).read_bytes()
        header = read_header(data, str(source))
        checkpoint = args.checkpoint
        if checkpoint is None:
            folders = checkpoint_folders(source)
            checkpoint = find_checkpoint(header, folders)
            if checkpoint is None:
                raise CodecError(
                    f"{source}: no checkpoint with model id {header.model_id.hex()} in "
                    f"{', '.join(map(str, folders))}: pass --checkpoint")
        if checkpoint not in codecs:
            codecs[checkpoint] = Codec.from_checkpoint(checkpoint, args.device,
                                                       exact=args.exact)
        image = codecs[checkpoint].decompress(data, str(source))
        save_image(target, image, overwrite=args.force)
        bpp = 8 * len(data) / (header.height * header.width)
        print(f"{source} -> {target}: {header.height}x{header.width}, {len(data)} bytes, "
              f"{bpp:.4f} bpp")
    return 0


def cmd_eval(args):
    """Evaluate checkpoints against the reference codecs on a folder of images; print the
    tables, write the files."""
    for checkpoint in args.checkpoint:
        require_checkpoint(checkpoint, "gdnflow eval")
    out = args.out if args.out is not None else unused_folder(Path("runs") / "eval")
    results = evaluate(args.checkpoint, args.data, out, args.device, args.force,
                       log=(lambda line: None) if args.quiet else None,
                       references=args.references, progress=not args.quiet,
                       workers=args.workers)
    print()
    print(markdown_table(results), end="")
    print(f"\nwritten: {Path(out) / 'eval.md'}, eval.json, rd.png and files/")
    return 0


def unused_folder(base):
    """``base`` if nothing is there, else the first of ``base-2``, ``base-3``, ... that is free.

    ``eval`` without ``--out`` writes into a new folder each time, so no
    earlier result is ever overwritten or mixed with a new one.
    """
    candidate, n = Path(base), 1
    while candidate.exists():
        n += 1
        candidate = Path(f"{base}-{n}")
    return candidate


# ------------------------------------------------------------------ parsers --
def _device_option(parser):
    parser.add_argument("--device", choices=["numpy", "cuda"],
                        help="where the transforms run (default: GDNFLOW_DEVICE, else cuda when "
                        "usable, else numpy); a file decodes to the same latents on either, "
                        "to images within one level of each other")


def add_codec_parsers(subparsers):
    """Add ``compress``, ``decompress`` and ``eval`` to the ``gdnflow`` command's subparsers."""
    compress = subparsers.add_parser(
        "compress", help="compress images to .gdn files with a trained codec checkpoint",
        description="Compress images (PNG, JPEG, ...) with a codec checkpoint (factorized prior "
        "or scale hyperprior); print "
        "each file's bpp (8 x bytes / pixels) and the PSNR of its decoding.")
    compress.add_argument("images", nargs="+", metavar="IMAGE", help="images to compress")
    compress.add_argument("-o", "--output", metavar="OUT",
                          help="the .gdn file (one image) or a folder (several); default: "
                          "IMAGE with the suffix .gdn")
    compress.add_argument("--checkpoint", metavar="CKPT",
                          help="a gdnflow checkpoint of a factorized prior or a scale hyperprior "
                          "(gdnflow train); default: a shipped model (--model, --quality)")
    compress.add_argument("--model", choices=sorted({e.architecture for e in SHIPPED}),
                          help="the shipped model's architecture (default "
                          f"{DEFAULT_SHIPPED_MODEL} when no --checkpoint is given)")
    compress.add_argument("--quality", type=int, choices=sorted({e.quality for e in SHIPPED}),
                          help="the shipped model's quality (CompressAI's lambdas; default 2 "
                          "when no --checkpoint is given)")
    compress.add_argument("--force", action="store_true", help="overwrite existing files")
    add_max_pixels_option(compress)
    _device_option(compress)
    compress.set_defaults(run=cmd_compress)

    decompress = subparsers.add_parser(
        "decompress", help="decode .gdn files to images",
        description="Decode .gdn files to images (the format by the suffix of -o; PNG by "
        "default). Without --checkpoint, the checkpoint whose model id the file names is "
        f"looked for in ${CHECKPOINT_PATH_VARIABLE}, the file's folder, ./checkpoints and the "
        "shipped models.")
    decompress.add_argument("files", nargs="+", metavar="FILE", help=".gdn files to decode")
    decompress.add_argument("-o", "--output", metavar="IMAGE",
                            help="the image (one file) or a folder (several); default: FILE "
                            "with the suffix .png")
    decompress.add_argument("--checkpoint", metavar="CKPT",
                            help="the checkpoint the files were compressed with")
    decompress.add_argument("--force", action="store_true", help="overwrite existing files")
    decompress.add_argument("--exact", action="store_true",
                            help="decode with the exact synthesis: the same image bytes on "
                            "NumPy and on a GPU (within a level of the default's)")
    _device_option(decompress)
    decompress.set_defaults(run=cmd_decompress)

    evaluation = subparsers.add_parser(
        "eval", help="rate-distortion of codec checkpoints against JPEG, WebP and JPEG 2000, "
        "with BD-rates",
        description="Compress every image of a folder with each checkpoint; report bpp from the "
        "real files, PSNR and MS-SSIM, encode and decode time, and the reference codecs' PSNR "
        "and MS-SSIM at the same rates; the BD-rate of each model architecture against each "
        "reference codec; write markdown tables, a JSON file and a rate-distortion plot.")
    evaluation.add_argument("--checkpoint", nargs="+", required=True, metavar="CKPT",
                            help="one or more codec checkpoints to compare")
    evaluation.add_argument("--data", required=True, metavar="DIR", help="folder of images")
    evaluation.add_argument("--out", metavar="DIR",
                            help="folder for eval.md, eval.json, rd.png, the .gdn files and their "
                            "decodings (default: runs/eval, or runs/eval-2, -3, ... if taken)")
    evaluation.add_argument("--force", action="store_true", help="overwrite earlier results")
    evaluation.add_argument("--references", nargs="+", metavar="CODEC",
                            default=list(REFERENCE_CODECS), choices=list(REFERENCE_CODECS),
                            help="reference codecs to compare with (default: all of "
                            f"{', '.join(REFERENCE_CODECS)}; quote 'JPEG 2000')")
    evaluation.add_argument("--quiet", action="store_true",
                            help="no progress bar and no line per image (the tables still print)")
    evaluation.add_argument("--workers", type=positive_int, default=1, metavar="N",
                            help="threads measuring the decodings and running the reference "
                            "codecs while the models code the next images (default 1: one "
                            "after the other, so that the timings have the machine to "
                            "themselves; the results are the same)")
    add_max_pixels_option(evaluation)
    _device_option(evaluation)
    evaluation.set_defaults(run=cmd_eval)
    return compress, decompress, evaluation


def main(argv=None):
    """``python -m gdnflow.codec.cli compress|decompress|eval ...``: the exit status."""
    parser, subparsers = command_parser("gdnflow", __doc__.split("\n\n")[0])
    add_codec_parsers(subparsers)
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
