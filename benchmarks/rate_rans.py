"""What format version 14 (rANS lanes) costs in rate against version 11 (range-coded
substreams): the same latents coded both ways, on the held-out photos, per quality.

    python benchmarks/rate_rans.py --data DIR [--photos 6] [--side 1024] [--out FILE]

Each photo is resized to at most ``--side`` pixels a side; NumPy backend (the
coders are exact: the GPU writes the same bytes, tests/codec/test_rans.py).
"""
import argparse

import numpy as np
from PIL import Image

from gdnflow.benchmarking import emit, markdown_table
from gdnflow.codec import Codec, read_image
from gdnflow.codec.format import FORMAT_VERSION, RANS_VERSION
from gdnflow.codec.zoo import SHIPPED, shipped_checkpoint
from gdnflow.data.images import list_images


def resized(path, side):
    """The photo at ``path`` with its longer side at most ``side`` pixels."""
    image = Image.fromarray(read_image(path))
    scale = min(1.0, side / max(image.size))
    size = (max(16, round(image.width * scale)), max(16, round(image.height * scale)))
    return np.asarray(image.resize(size, Image.LANCZOS))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="folder of held-out photos")
    parser.add_argument("--photos", type=int, default=6)
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--out")
    args = parser.parse_args()
    images = [resized(p, args.side) for p in list_images(args.data)[:args.photos]]
    rows = []
    for entry in SHIPPED:
        if entry.architecture != "factorized_prior":
            continue
        codec = Codec.from_checkpoint(shipped_checkpoint(entry.architecture, entry.quality),
                                      "numpy")
        sizes = {FORMAT_VERSION: 0, RANS_VERSION: 0}
        for image in images:
            q = codec.quantize(codec.analyse(image))
            for version in sizes:
                codec.version = version
                sizes[version] += len(codec.encode_latents(q, *image.shape[:2]))
        extra = sizes[RANS_VERSION] - sizes[FORMAT_VERSION]
        rows.append([f"codec_q{entry.quality}", str(sizes[FORMAT_VERSION]),
                     str(sizes[RANS_VERSION]), f"{extra:+d}",
                     f"{100 * extra / sizes[FORMAT_VERSION]:+.2f}%"])
    emit(markdown_table(
        f"Version 14 (rANS lanes) against version 11 (range-coded), the same latents, "
        f"{len(images)} held-out photos at most {args.side} pixels a side",
        ["codec", "version 11 bytes", "version 14 bytes", "difference", "relative"], rows,
        notes=["NumPy backend; bytes summed over the photos; the split is the same"],
        gpu="none"), args.out)


if __name__ == "__main__":
    main()
