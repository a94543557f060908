"""The substream split of the .gdn file: what it costs in rate, what it gains in time.

    python benchmarks/bench_entropy_coding.py --out benchmarks/results/entropy_coding.md
    python benchmarks/bench_entropy_coding.py --repeats 3 --size 768x512   # photos resized

For each shipped factorized-prior quality (1-3) and each photo (scikit-image's
coffee, chelsea and astronaut, at their own size unless ``--size``), the
latents are computed once on NumPy; then:

- rate: the file in one stream (format version 2) and in substreams (version 7,
  the split the encoder chooses), and the increase in percent;
- time: the entropy coding alone (``Codec.encode_latents`` and
  ``Codec.decode_latents``: the file bytes from the latents and back) of all
  the photos, per megapixel, the median of ``--repeats`` rounds (each round
  runs every coder in turn, so a passing load weighs on all), with the substreams
  coded one after another (version 2: one stream; version 7: serial map), in a
  thread pool of 1 and 2 threads, and in a pool of 2 processes.

Both files decode to the same latents (checked). The timings are medians on
whatever machine runs this: say how loaded it was.
"""
import argparse
import datetime
import os
import platform
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
from PIL import Image

from gdnflow.codec import pretrained
from gdnflow.codec.codec import Codec
from gdnflow.codec.format import unpack

PHOTOS = ("coffee", "chelsea", "astronaut")


def photos(size):
    """{name: uint8 (H, W, 3)}: scikit-image's photos, resized to ``size`` (w, h) if given."""
    import skimage.data     # local import: scikit-image is needed by this benchmark only
    out = {}
    for name in PHOTOS:
        image = getattr(skimage.data, name)()
        if size:
            image = np.asarray(Image.fromarray(image).resize(size, Image.LANCZOS))
        out[name] = image
    return out


def measure(codecs, latents, repeats):
    """{coder name: (encode s, decode s)}: the median over ``repeats`` rounds of the time to
    code all ``latents`` ([(q, (height, width))]) and decode them back. Each round runs
    every coder in turn, so a load that comes and goes weighs on all alike."""
    files = {name: [codec.encode_latents(q, *shape) for q, shape in latents]
             for name, codec in codecs.items()}
    times = {name: ([], []) for name in codecs}
    for _ in range(repeats):
        for name, codec in codecs.items():
            start = time.perf_counter()
            for q, shape in latents:
                codec.encode_latents(q, *shape)
            middle = time.perf_counter()
            for data in files[name]:
                codec.decode_latents(data)
            times[name][0].append(middle - start)
            times[name][1].append(time.perf_counter() - middle)
    return {name: (statistics.median(e), statistics.median(d)) for name, (e, d) in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here too")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--size", help="resize the photos to WIDTHxHEIGHT")
    parser.add_argument("--qualities", default="1,2,3")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    images = photos(size)
    threads = {n: ThreadPoolExecutor(n) for n in (1, 2)}
    processes = ProcessPoolExecutor(2)
    rate_rows, time_rows = [], []
    for quality in (int(v) for v in args.qualities.split(",")):
        codec = pretrained("factorized_prior", quality=quality, device="numpy")
        codecs = {"v2 one stream": Codec(codec.model, version=2),
                  "v7 serial": codec,
                  "v7 1 thread": Codec(codec.model, executor=threads[1]),
                  "v7 2 threads": Codec(codec.model, executor=threads[2]),
                  "v7 2 processes": Codec(codec.model, executor=processes)}
        latents = []
        for name, image in images.items():
            shape = image.shape[:2]
            q = codec.quantize(codec.analyse(image))
            latents.append((q, shape))
            single = codecs["v2 one stream"].encode_latents(q, *shape)
            split = codec.encode_latents(q, *shape)
            same = np.array_equal(codec.decode_latents(single)[1], codec.decode_latents(split)[1])
            assert same, f"{name} q{quality}: the two files decode to different latents"
            groups, bands = unpack(split)[0].splits[0]
            rate_rows.append(f"| {quality} | {name} {shape[1]}x{shape[0]} | {len(single)} | "
                             f"{len(split)} | {groups}x{bands} | "
                             f"{100 * (len(split) / len(single) - 1):.3f}% |")
            print(rate_rows[-1], flush=True)
        megapixels = sum(shape[0] * shape[1] for _, shape in latents) / 1e6
        for coder, (encode, decode) in measure(codecs, latents, args.repeats).items():
            time_rows.append(f"| {quality} | {coder} | {1e3 * encode / megapixels:.1f} | "
                             f"{1e3 * decode / megapixels:.1f} |")
    processes.shutdown()
    for pool in threads.values():
        pool.shutdown()
    lines = [
        "# Entropy coding in substreams: rate cost and time",
        "",
        f"`python benchmarks/bench_entropy_coding.py --repeats {args.repeats}"
        + (f" --size {args.size}" if args.size else "") + "`, "
        f"{datetime.date.today()}, host `{platform.node()}`, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end. Shipped "
        "factorized-prior checkpoints on NumPy; scikit-image's photos.",
        "",
        "## Rate: the file in one stream (v2) and in substreams (v7)",
        "",
        "| quality | photo | v2 bytes | v7 bytes | split (groups x bands) | increase |",
        "|---|---|---|---|---|---|",
        *rate_rows,
        "",
        "## Time of the entropy coding alone, ms per megapixel",
        "",
        f"All {len(images)} photos coded (decoded) in a row, the median of {args.repeats} "
        "rounds, each round running every coder in turn.",
        "",
        "| quality | coder | encode | decode |",
        "|---|---|---|---|",
        *time_rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
