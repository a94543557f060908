"""What the rANS versions (14: factorized prior, 16: hyperprior) cost in rate: the same
latents coded as one stream (versions 2 and 4), in range-coded substreams (11 and 13) and
in rANS substreams, on the held-out photos, per quality.

    python benchmarks/rate_rans.py --data DIR [--photos 6] [--side 1024]
                                   [--substream-bits N] [--out FILE]

Each photo is resized to at most ``--side`` pixels a side; NumPy backend (the
coders are exact: the GPU writes the same bytes, tests/codec/test_rans.py).
"""
import argparse

import numpy as np
from PIL import Image

from gdnflow.benchmarking import emit, markdown_table
from gdnflow.codec import Codec, read_image
from gdnflow.codec.zoo import SHIPPED, shipped_checkpoint
from gdnflow.data.images import list_images


def resized(path, side):
    """The photo at ``path`` with its longer side at most ``side`` pixels."""
    image = Image.fromarray(read_image(path))
    scale = min(1.0, side / max(image.size))
    size = (max(16, round(image.width * scale)), max(16, round(image.height * scale)))
    return np.asarray(image.resize(size, Image.LANCZOS))


def file_sizes(codec, images, substream_bits):
    """{version: bytes summed over ``images``} for the one-stream, range-coded and rANS
    versions of ``codec``'s class, the same latents each time."""
    kind = type(codec)
    one, _, ranged, rans = kind.versions
    sizes = dict.fromkeys((one, ranged, rans), 0)
    for image in images:
        y = codec.analyse(image)
        q = codec.quantize(y)
        extra = (codec.side_information(y),) if hasattr(codec, "side_information") else ()
        for version in sizes:
            writer = kind(codec.model, version=version, substream_bits=substream_bits)
            sizes[version] += len(writer.encode_latents(q, *image.shape[:2], *extra))
    return sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="folder of held-out photos")
    parser.add_argument("--photos", type=int, default=6)
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--substream-bits", type=int,
                        help="the substreams' payload bits aimed for (default: each version's)")
    parser.add_argument("--out")
    args = parser.parse_args()
    images = [resized(p, args.side) for p in list_images(args.data)[:args.photos]]
    rows = []
    for entry in SHIPPED:
        codec = Codec.from_checkpoint(shipped_checkpoint(entry.architecture, entry.quality),
                                      "numpy")
        one, ranged, rans = file_sizes(codec, images, args.substream_bits).values()
        rows.append([f"{entry.architecture} q{entry.quality}", str(one), str(ranged), str(rans),
                     f"{100 * (rans - ranged) / ranged:+.2f}%",
                     f"{100 * (ranged - one) / one:+.2f}%", f"{100 * (rans - one) / one:+.2f}%"])
    emit(markdown_table(
        f"rANS substreams against range-coded ones and one stream, the same latents, "
        f"{len(images)} held-out photos at most {args.side} pixels a side, substreams of "
        + (f"about {args.substream_bits} bits" if args.substream_bits else
           "each version's default size"),
        ["codec", "one stream bytes", "range-coded substreams", "rANS substreams",
         "rANS vs range-coded", "range-coded split cost", "rANS split cost"], rows,
        notes=["NumPy backend; bytes summed over the photos; one stream: versions 2 and 4, "
               "range-coded: 11 and 13, rANS: 14 and 16; each codec's split (by default the "
               "hyperprior's substreams are twice the factorized prior's, "
               "hyperprior.HYPERPRIOR_SUBSTREAM_BITS)"],
        gpu="none"), args.out)


if __name__ == "__main__":
    main()
