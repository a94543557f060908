"""Codec speed end to end: image array to file bytes and back, beside Pillow's WebP and JPEG.

    python benchmarks/bench_codec_speed.py --data corpus/heldout --out table.md
    python benchmarks/bench_codec_speed.py --checkpoint runs/q3/checkpoint.h5 --device numpy

One photo (the first of ``--data``, or scikit-image's coffee) is resized (Lanczos) to
each of ``--sizes``. For each codec checkpoint (default: every shipped model) and
size, the codec compresses and decompresses the photo twice each (warm-up: kernels,
tables, and on a GPU the transforms' plans, built on a size's second call, are made then), then ``--repeats`` times; the table gives the medians
in milliseconds per megapixel, wall time on the host (uint8 array in, file bytes
out, and back: the transforms on ``--device``, the entropy coding on the host), the
bits per pixel and the PSNR. Every decoding on a GPU is compared with the NumPy
backend's decoding of the same file (``--no-numpy-check`` skips that): the largest
difference in levels is listed. Pillow's WebP (method 4 and 6) and JPEG at quality
75 are timed the same way in the same run. ``--processes N`` codes the
substreams in a pool of N processes (the warm-up fills each worker's models).
``--synthesis exact`` decodes with the exact synthesis (``Codec(..., exact=True)``,
checked against the NumPy backend's exact decoding: a difference of 0 levels is the
same bytes), ``both`` times each codec both ways.
"""
import argparse
import io
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from PIL import Image

from gdnflow.backends import default_device
from gdnflow.benchmarking import emit, host_cpu, markdown_table, median_wall_ms
from gdnflow.codec import Codec, read_image
from gdnflow.codec.zoo import SHIPPED, shipped_checkpoint
from gdnflow.data.images import list_images
from gdnflow.train.losses import psnr

#: Pillow's reference coders: (name, format, save options).
REFERENCES = (("WebP m4", "WEBP", {"quality": 75, "method": 4}),
              ("WebP m6", "WEBP", {"quality": 75, "method": 6}),
              ("JPEG", "JPEG", {"quality": 75}))


def photo(folder, size):
    """The first image of ``folder`` (scikit-image's coffee if None) resized to ``size`` (w, h)."""
    if folder is None:
        import skimage.data     # local import: only without --data
        image = skimage.data.coffee()
    else:
        image = read_image(list_images(folder)[0])
    return np.asarray(Image.fromarray(image).resize(size, Image.LANCZOS))


#: --synthesis: the codecs' ``exact`` values timed.
SYNTHESES = {"float": (False,), "exact": (True,), "both": (False, True)}
#: --format: which of a codec class's ``versions`` to write (None: the device's default).
FORMATS = {"default": None, "range-coded": 2, "plain": 1}


def time_codec(path, image, device, repeats, numpy_check, tile="auto", executor=None,
               variant="default", substream_bits=None, lanes=None, exact=False):
    """A row of the table for the codec checkpoint at ``path`` on ``image`` (tiles of
    ``tile``, the substreams coded by ``executor``'s map if not None; ``variant``: a key
    of :data:`FORMATS`: the device's default version, the newest range-coded one (11 or
    13), or the one before quiet groups (7 or 8); ``substream_bits``: the codec's, None for
    its default; ``lanes``: where the rANS lanes are coded, the codec's ``lanes``;
    ``exact``: decoding with the exact synthesis)."""
    codec = Codec.from_checkpoint(path, device, tile, exact)
    if executor is not None or FORMATS[variant] is not None or substream_bits is not None \
            or lanes is not None:
        version = None if FORMATS[variant] is None else type(codec).versions[FORMATS[variant]]
        codec = type(codec)(codec.model, tile, executor=executor, version=version,
                            substream_bits=substream_bits, lanes=lanes, exact=exact)
    codec.compress(image)               # the warm-up: kernels and tables built
    data = codec.compress(image)        # a GPU codec builds its analysis plans on a size's second
    decoded = codec.decompress(data)
    codec.decompress(data)              # ... and its synthesis plan
    encode_ms = median_wall_ms(lambda: codec.compress(image), repeats, warmup=0)
    decode_ms = median_wall_ms(lambda: codec.decompress(data), repeats, warmup=0)
    check = "-"
    # After the timing: in stop 51's runs, rows timed right after a NumPy decoding (on all
    # the host's cores) were up to 3x slow (codec_speed_h200.md); the cause is not settled.
    if numpy_check and device != "numpy":
        host = Codec.from_checkpoint(path, "numpy", exact=exact).decompress(data)
        check = int(np.abs(host.astype(np.int16) - decoded).max())
    return table_row(Path(path).stem + (" exact" if exact else ""), image, data, decoded,
                     encode_ms, decode_ms, check)


def time_reference(name, fmt, options, image, repeats):
    """A row of the table for one of Pillow's coders on ``image``."""
    picture = Image.fromarray(image)

    def encode():
        buffer = io.BytesIO()
        picture.save(buffer, fmt, **options)
        return buffer.getvalue()

    data = encode()

    def decode():
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    return table_row(name, image, data, decode(), median_wall_ms(encode, repeats, warmup=0),
                     median_wall_ms(decode, repeats, warmup=0))


def table_row(name, image, data, decoded, encode_ms, decode_ms, check="-"):
    """The table's cells for a coder whose file of ``image`` is ``data``, decoded to ``decoded``."""
    megapixels = image.shape[0] * image.shape[1] / 1e6
    return [name, f"{8 * len(data) / (megapixels * 1e6):.3f}", f"{psnr(image, decoded, 255):.2f}",
            f"{encode_ms / megapixels:.1f}", f"{decode_ms / megapixels:.1f}", check]


def size_argument(text):
    """'WxH' -> (w, h)."""
    width, height = (int(v) for v in text.lower().split("x"))
    return width, height


def tile_argument(text):
    """A tile side in pixels, None for 'none' (the whole image at once), or 'auto'."""
    return None if text.lower() == "none" else text if text == "auto" else int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", nargs="+", help="codec checkpoints (default: shipped)")
    parser.add_argument("--data", help="folder whose first image is the photo")
    parser.add_argument("--sizes", default="768x512,2048x1536",
                        help="comma-separated WxH (default 768x512,2048x1536)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", choices=["numpy", "cuda"], default=None)
    parser.add_argument("--no-numpy-check", dest="numpy_check", action="store_false")
    parser.add_argument("--tile", type=tile_argument, default="auto",
                        help="the codecs' tile side in pixels, none, or auto (the default: "
                             "the device's default)")
    parser.add_argument("--processes", type=int, default=0,
                        help="code the substreams in a pool of this many processes (0: one "
                             "after another in this process, the default)")
    parser.add_argument("--format", choices=list(FORMATS), default="default",
                        help="the format version written: the device's default (on a GPU, "
                             "version 14 for the factorized prior: rANS lanes), the newest "
                             "range-coded one (11 and 13), or versions 7 and 8 (every group "
                             "coded)")
    parser.add_argument("--substream-bits", type=int,
                        help="the substreams' payload bits aimed for (default: the codec's)")
    parser.add_argument("--lanes", choices=["host", "cuda", "numpy"],
                        help="where the rANS lanes are coded (default: the codec's default)")
    parser.add_argument("--synthesis", choices=list(SYNTHESES), default="float",
                        help="decode with the model's float32 synthesis (the default), the "
                             "exact synthesis, or both (a row each)")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    # spawn: the workers import only the coding, never the CUDA state of this process
    executor = ProcessPoolExecutor(args.processes, mp_context=get_context("spawn")) \
        if args.processes else None
    device = args.device or default_device()
    paths = args.checkpoint or [shipped_checkpoint(e.architecture, e.quality) for e in SHIPPED]
    tables = []
    for size in (size_argument(s) for s in args.sizes.split(",")):
        image = photo(args.data, size)
        rows = [time_codec(p, image, device, args.repeats, args.numpy_check, args.tile,
                           executor, args.format, args.substream_bits, args.lanes, exact)
                for p in paths for exact in SYNTHESES[args.synthesis]]
        rows += [time_reference(*reference, image, args.repeats) for reference in REFERENCES]
        gpu = None
        if device == "cuda":
            from gdnflow.benchmarking import gpu_name   # local import: PyCUDA only on a GPU
            gpu = gpu_name()
        tables.append(markdown_table(
            f"{size[0]}x{size[1]}: encode and decode, ms per megapixel (median of "
            f"{args.repeats}), gdnflow on {device}, tiles: {args.tile or 'the whole image'}, "
            f"format: {args.format}, substreams of "
            f"{args.substream_bits or 'the default'} bits, "
            "range-coded substreams coded "
            f"{f'in {args.processes} processes' if args.processes else 'one after another'}, "
            f"rANS lanes coded on {args.lanes or 'the default (host threads on a GPU)'}, "
            f"synthesis: {args.synthesis}",
            ["codec", "bpp", "PSNR dB", "encode ms/MP", "decode ms/MP",
             "max difference from the NumPy decoding (levels)"], rows,
            notes=[f"host CPU: {host_cpu()}; wall time, array in and out"],
            gpu=gpu or "none"))
    emit("\n".join(tables), args.out)


if __name__ == "__main__":
    main()
