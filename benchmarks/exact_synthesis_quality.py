"""What the exact synthesis costs in quality and in NumPy time: each shipped codec on the
held-out scikit-image photos, decoded by the model's float32 synthesis and by the exact one.

    python benchmarks/exact_synthesis_quality.py --out benchmarks/results/exact_synthesis.md

For each checkpoint (default: every shipped model) and photo (scikit-image's astronaut,
coffee, chelsea and rocket: held out from the shipped codecs' training,
checkpoints/corpus_manifest.json), the photo is compressed once on NumPy and the file
decoded both ways on NumPy. The table gives, per checkpoint over the photos, the PSNR of
each decoding, the share of pixel values in which the two decodings differ, the largest
difference (levels), and the NumPy decode time of each in seconds per megapixel (one
decode per photo, summed; the host's cores as NumPy's BLAS uses them).
"""
import argparse
import time
from pathlib import Path

import numpy as np

from gdnflow.benchmarking import emit, host_cpu, markdown_table
from gdnflow.codec import Codec
from gdnflow.codec.zoo import SHIPPED, shipped_checkpoint
from gdnflow.train.losses import psnr

#: scikit-image's held-out photos (checkpoints/corpus_manifest.json: held_out).
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")


def photos():
    """The held-out photos as uint8 (H, W, 3) arrays, by name."""
    import skimage.data     # local import: scikit-image is needed by this script only
    return {name: getattr(skimage.data, name)() for name in PHOTOS}


def timed(function):
    """(function's result, its wall time in seconds)."""
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def checkpoint_row(path, images):
    """The table's cells for the checkpoint at ``path`` over ``images`` (name -> array)."""
    codecs = {exact: Codec.from_checkpoint(path, "numpy", exact=exact) for exact in (False, True)}
    psnrs = {False: [], True: []}
    seconds = {False: 0.0, True: 0.0}
    differing, largest, values, megapixels = 0, 0, 0, 0.0
    for image in images.values():
        data = codecs[False].compress(image)
        decoded = {}
        for exact, codec in codecs.items():
            decoded[exact], elapsed = timed(lambda: codec.decompress(data))
            seconds[exact] += elapsed
            psnrs[exact].append(psnr(image, decoded[exact], 255))
        difference = np.abs(decoded[True].astype(np.int16) - decoded[False])
        differing += int(np.count_nonzero(difference))
        largest = max(largest, int(difference.max()))
        values += difference.size
        megapixels += image.shape[0] * image.shape[1] / 1e6
    return [Path(path).stem, f"{np.mean(psnrs[False]):.4f}", f"{np.mean(psnrs[True]):.4f}",
            f"{np.mean(psnrs[True]) - np.mean(psnrs[False]):+.4f}",
            f"{100 * differing / values:.2f}", largest,
            f"{seconds[False] / megapixels:.2f}", f"{seconds[True] / megapixels:.2f}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", nargs="+", help="codec checkpoints (default: shipped)")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    paths = args.checkpoint or [shipped_checkpoint(e.architecture, e.quality) for e in SHIPPED]
    images = photos()
    rows = [checkpoint_row(path, images) for path in paths]
    emit(markdown_table(
        f"The exact synthesis against the float32 one, on NumPy: {', '.join(PHOTOS)} "
        "(held out), mean PSNR over the photos",
        ["codec", "PSNR float32 (dB)", "PSNR exact (dB)", "difference (dB)",
         "pixel values differing (%)", "largest difference (levels)",
         "NumPy decode float32 (s/MP)", "NumPy decode exact (s/MP)"], rows,
        notes=[f"host CPU: {host_cpu()}; each photo compressed once, decoded once each way"],
        gpu="none"), args.out)


if __name__ == "__main__":
    main()
