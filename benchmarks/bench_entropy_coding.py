"""The substream split of the .gdn file: what it costs in rate, what it gains in time.

    python benchmarks/bench_entropy_coding.py --out benchmarks/results/entropy_coding.md
    python benchmarks/bench_entropy_coding.py --repeats 3 --size 768x512   # photos resized
    python benchmarks/bench_entropy_coding.py --data corpus/heldout --repeats 0 \
        --architectures factorized_prior,hyperprior --qualities 1,2,3,4     # rate only

For each shipped quality (``--qualities``) of each architecture
(``--architectures``) and each photo (scikit-image's coffee, chelsea and
astronaut, or the images of ``--data``, at their own size unless ``--size``),
the latents are computed once on NumPy; then:

- rate: the file in one stream (format version 2; a hyperprior's version 4), in
  substreams coding every group (7; 8) and in the newest version (11; 13: the
  quiet groups that are all zero left out), each with the split the encoder
  chooses, and the increases in percent, per photo and summed per quality;
- time: the entropy coding alone (``Codec.encode_latents`` and
  ``Codec.decode_latents``: the file bytes from the latents and back) of all
  the photos, per megapixel, the median of ``--repeats`` rounds (each round
  runs every coder in turn, so a passing load weighs on all), with the substreams
  coded one after another (version 2: one stream; versions 7 and 11: serial map),
  in a thread pool of 1 and 2 threads, and in a pool of 2 processes (``--repeats 0``:
  no timing).

All the files decode to the same latents (checked). The timings are medians on
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

from gdnflow.codec import pretrained, read_image
from gdnflow.codec.format import unpack
from gdnflow.data.images import list_images

PHOTOS = ("coffee", "chelsea", "astronaut")


def photos(size, folder=None):
    """{name: uint8 (H, W, 3)}: scikit-image's photos (or ``folder``'s images), resized to
    ``size`` (w, h) if given."""
    if folder is None:
        import skimage.data     # local import: scikit-image is needed by this benchmark only
        images = {name: getattr(skimage.data, name)() for name in PHOTOS}
    else:
        images = {path.stem: read_image(path) for path in list_images(folder)}
    if size:
        images = {name: np.asarray(Image.fromarray(image).resize(size, Image.LANCZOS))
                  for name, image in images.items()}
    return images


def latents_of(codec, image):
    """The arguments of ``codec.encode_latents`` for ``image`` (its side information too)."""
    y = codec.analyse(image)
    extra = (codec.side_information(y),) if hasattr(codec, "side_information") else ()
    return (codec.quantize(y), *image.shape[:2], *extra)


def measure(codecs, latents, repeats):
    """{coder name: (encode s, decode s)}: the median over ``repeats`` rounds of the time to
    code all ``latents`` (:func:`latents_of` each) and decode them back. Each round runs
    every coder in turn, so a load that comes and goes weighs on all alike."""
    files = {name: [codec.encode_latents(*arguments) for arguments in latents]
             for name, codec in codecs.items()}
    times = {name: ([], []) for name in codecs}
    for _ in range(repeats):
        for name, codec in codecs.items():
            start = time.perf_counter()
            for arguments in latents:
                codec.encode_latents(*arguments)
            middle = time.perf_counter()
            for data in files[name]:
                codec.decode_latents(data)
            times[name][0].append(middle - start)
            times[name][1].append(time.perf_counter() - middle)
    return {name: (statistics.median(e), statistics.median(d)) for name, (e, d) in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here too")
    parser.add_argument("--repeats", type=int, default=7, help="timing rounds (0: rate only)")
    parser.add_argument("--size", help="resize the photos to WIDTHxHEIGHT")
    parser.add_argument("--data", help="a folder of photos instead of scikit-image's three")
    parser.add_argument("--architectures", default="factorized_prior")
    parser.add_argument("--qualities", default="1,2,3")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    images = photos(size, args.data)
    threads = {n: ThreadPoolExecutor(n) for n in (1, 2)}
    processes = ProcessPoolExecutor(2)
    rate_rows, summary_rows, time_rows = [], [], []
    for architecture in args.architectures.split(","):
        for quality in (int(v) for v in args.qualities.split(",")):
            codec = pretrained(architecture, quality=quality, device="numpy")
            kind, model = type(codec), codec.model
            one, plain, newest = kind.versions[:3]   # range-coded ones
            codecs = {f"v{one} one stream": kind(model, version=one),
                      f"v{plain} serial (every group)": kind(model, version=plain),
                      f"v{newest} serial": codec,
                      f"v{newest} 1 thread": kind(model, executor=threads[1]),
                      f"v{newest} 2 threads": kind(model, executor=threads[2]),
                      f"v{newest} 2 processes": kind(model, executor=processes)}
            single_coder = codecs[f"v{one} one stream"]
            plain_coder = codecs[f"v{plain} serial (every group)"]
            latents, sizes = [], []
            for name, image in images.items():
                arguments = latents_of(codec, image)
                latents.append(arguments)
                files = [c.encode_latents(*arguments) for c in (single_coder, plain_coder, codec)]
                decoded = [codec.decode_latents(data)[1] for data in files]
                same = all(np.array_equal(decoded[0], d) for d in decoded[1:])
                assert same, f"{name} q{quality}: the files decode to different latents"
                groups, bands = unpack(files[-1])[0].splits[-1]
                sizes.append(tuple(len(data) for data in files))
                height, width = image.shape[:2]
                rate_rows.append(f"| {architecture} | {quality} | {name} {width}x{height} | "
                                 + " | ".join(str(n) for n in sizes[-1])
                                 + f" | {groups}x{bands} | "
                                 f"{100 * (sizes[-1][1] / sizes[-1][0] - 1):.3f}% | "
                                 f"{100 * (sizes[-1][2] / sizes[-1][0] - 1):.3f}% |")
                print(rate_rows[-1], flush=True)
            increases = [100 * (quiet / single - 1) for single, _, quiet in sizes]
            totals = [sum(column) for column in zip(*sizes)]
            summary_rows.append(f"| {architecture} | {quality} | {len(sizes)} | "
                                + " | ".join(str(n) for n in totals)
                                + f" | {100 * (totals[1] / totals[0] - 1):.3f}% | "
                                f"{100 * (totals[2] / totals[0] - 1):.3f}% | "
                                f"{max(increases):.3f}% |")
            megapixels = sum(a[1] * a[2] for a in latents) / 1e6
            if args.repeats:
                for coder, (encode, decode) in measure(codecs, latents, args.repeats).items():
                    time_rows.append(f"| {architecture} | {quality} | {coder} | "
                                     f"{1e3 * encode / megapixels:.1f} | "
                                     f"{1e3 * decode / megapixels:.1f} |")
    processes.shutdown()
    for pool in threads.values():
        pool.shutdown()
    command = ("`python benchmarks/bench_entropy_coding.py --repeats "
               f"{args.repeats}" + (f" --size {args.size}" if args.size else "")
               + (f" --data {args.data}" if args.data else "")
               + f" --architectures {args.architectures} --qualities {args.qualities}`")
    lines = [
        "# Entropy coding in substreams: rate cost and time",
        "",
        f"{command}, {datetime.date.today()}, host `{platform.node()}`, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end. Shipped "
        f"checkpoints on NumPy; {len(images)} photos "
        + (f"from {args.data}." if args.data else "(scikit-image's)."),
        "",
        "## Rate: the file in one stream and in substreams, per quality",
        "",
        "Substreams coding every group (versions 7 and 8), and leaving out the quiet groups "
        "that are all zero (the newest versions, 11 and 13); the increases are against one "
        "stream.",
        "",
        "| architecture | quality | photos | one stream, bytes | substreams, bytes | "
        "newest, bytes | increase (substreams) | increase (newest) | largest increase "
        "(newest) |",
        "|---|---|---|---|---|---|---|---|---|",
        *summary_rows,
        "",
        "## Rate per photo",
        "",
        "| architecture | quality | photo | one stream, bytes | substreams, bytes | newest, "
        "bytes | split (groups x bands of y) | increase (substreams) | increase (newest) |",
        "|---|---|---|---|---|---|---|---|---|",
        *rate_rows,
    ]
    if time_rows:
        lines += [
            "",
            "## Time of the entropy coding alone, ms per megapixel",
            "",
            f"All {len(images)} photos coded (decoded) in a row, the median of {args.repeats} "
            "rounds, each round running every coder in turn.",
            "",
            "| architecture | quality | coder | encode | decode |",
            "|---|---|---|---|---|",
            *time_rows,
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
