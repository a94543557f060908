"""Peak memory and time of the codec on large photos, each phase in its own process.

    python benchmarks/codec_memory.py                       # NumPy: the table of the results file
    python benchmarks/codec_memory.py --device cuda         # adds the peak device memory
    python benchmarks/codec_memory.py --only 50mp --size 8660x5773

Makes photo-like PNGs (smooth colour fields plus noise, written once into
``--workdir``), then runs each phase as a new Python process (this script with
``--phase``): ``compress`` (read the PNG, analyse, quantise, code, write the
.gdn) and ``decompress`` (read the .gdn, decode, synthesise, write the PNG).
It reports each phase's peak resident memory (``os.wait4``'s ru_maxrss of that
process) and wall time; with ``--device cuda`` also the peak device memory
used while it ran (nvidia-smi's memory.used sampled every 50 ms, less the
value before it started: it includes the CUDA context).

Three parts (``--only`` picks): ``tiles`` sweeps the tile size on a 2048x2048
photo (the data behind gdnflow.codec.codec.TILE and CUDA_WHOLE_SIDE), ``50mp`` runs both
directions on the 50-megapixel photo with the default tile (TILE), ``untiled`` the
compress phase of a 3000x2000 photo with tiling off (the code before tiling
held the whole image's feature maps the same way).
"""
import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from gdnflow.codec.cli import save_image
from gdnflow.codec.codec import TILE, Codec, read_image

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = ROOT / "checkpoints" / "codec_q2.h5"


def make_photo(path, height, width, seed=0, block=512):
    """Write a photo-like RGB PNG: bilinear colour fields at 3 scales plus noise, made by row blocks."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    image = np.empty((height, width, 3), np.uint8)
    fields = []
    for cell in (600, 90, 14):          # coarse shapes, textures, fine detail
        coarse = rng.integers(0, 256, (height // cell + 2, width // cell + 2, 3), dtype=np.uint8)
        fields.append(Image.fromarray(coarse).resize((width, height), Image.BILINEAR))
    weights = (0.6, 0.3, 0.1)
    for top in range(0, height, block):
        box = (0, top, width, min(top + block, height))
        mix = sum(w * np.asarray(f.crop(box), np.float32) for w, f in zip(weights, fields))
        mix += rng.normal(0, 3, mix.shape).astype(np.float32)
        image[top:box[3]] = np.clip(mix + 0.5, 0, 255).astype(np.uint8)
    Image.fromarray(image).save(path, compress_level=1)


def run_phase(args):
    """The child process: one phase, nothing printed but a line of facts."""
    tile = None if args.tile == 0 else args.tile
    codec = Codec.from_checkpoint(args.checkpoint, args.device, tile=tile)
    if args.phase == "compress":
        image = read_image(args.input)
        Path(args.output).write_bytes(codec.compress(image))
    else:
        image = codec.decompress(Path(args.input).read_bytes(), args.input)
        save_image(args.output, image, overwrite=True)
    print(f"{args.phase} {image.shape[0]}x{image.shape[1]} -> {os.path.getsize(args.output)} bytes")


def device_memory_used():
    """MiB of device memory in use (nvidia-smi), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits", "-i", "0"], capture_output=True, text=True, timeout=10)
        return int(out.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def measure(phase, source, target, tile, checkpoint, device):
    """(peak RSS MiB, seconds, peak device MiB or None) of one phase in a new process."""
    command = [sys.executable, __file__, "--phase", phase, "--input", str(source), "--output",
               str(target), "--tile", str(tile or 0), "--checkpoint", str(checkpoint),
               "--device", device]
    baseline = device_memory_used() if device == "cuda" else None
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.wait(0.05):
            peak[0] = max(peak[0], (device_memory_used() or baseline) - baseline)

    sampler = threading.Thread(target=sample, daemon=True)
    if baseline is not None:
        sampler.start()
    start = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "GDNFLOW_DEVICE": device},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    out, err = child.stdout.read(), child.stderr.read()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{phase} of {source} failed:\n{out}{err}")
    print(f"  {out.strip()}: {usage.ru_maxrss / 1024:.0f} MiB, {seconds:.1f} s", flush=True)
    return usage.ru_maxrss / 1024, seconds, (peak[0] if baseline is not None else None)


def photo(workdir, height, width):
    """The path of a photo of that size in ``workdir``, made if missing."""
    path = Path(workdir) / f"photo_{height}x{width}.png"
    if not path.exists():
        print(f"making {path} ...", flush=True)
        make_photo(path, height, width)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT)
    parser.add_argument("--device", default="numpy", choices=["numpy", "cuda"])
    parser.add_argument("--size", default="5773x8660", help="the large photo, HEIGHTxWIDTH")
    parser.add_argument("--tiles", default="256,384,512,768,1024", help="the tile sweep")
    parser.add_argument("--only", choices=["tiles", "50mp", "untiled"], action="append")
    parser.add_argument("--workdir", default=Path(tempfile.gettempdir()) / "gdnflow_codec_memory")
    parser.add_argument("--phase", choices=["compress", "decompress"], help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--tile", type=int, default=512, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        return run_phase(args)
    parts = args.only or ["tiles", "50mp", "untiled"]
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    device_column = " peak device MiB |" if args.device == "cuda" else ""
    rows = []

    def record(label, phase, source, tile):
        target = work / (Path(source).stem + (".gdn" if phase == "compress" else "_hat.png"))
        rss, seconds, device = measure(phase, source, target, tile, args.checkpoint, args.device)
        cells = f" {rss:.0f} | {seconds:.1f} |" + (f" {device} |" if device is not None else "")
        rows.append(f"| {label} | {phase} | {tile or 'untiled'} |{cells}")
        return target

    if "tiles" in parts:
        source = photo(work, 2048, 2048)
        for tile in map(int, args.tiles.split(",")):
            coded = record("2048x2048", "compress", source, tile)
            record("2048x2048", "decompress", coded, tile)
    if "50mp" in parts:
        height, width = map(int, args.size.split("x"))
        source = photo(work, height, width)
        tile = TILE          # the default for an image this large, on either device
        label = f"{height}x{width} ({height * width / 1e6:.0f} MP)"
        coded = record(label, "compress", source, tile)
        record(label, "decompress", coded, tile)
    if "untiled" in parts:
        source = photo(work, 2000, 3000)
        coded = record("2000x3000", "compress", source, None)
        record("2000x3000", "decompress", coded, None)
    print(f"\n{datetime.date.today()}, {platform.node()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, device {args.device}, checkpoint {Path(args.checkpoint).name}\n")
    print(f"| image | phase | tile | peak RSS MiB | seconds |{device_column}")
    print("|---|---|---|---|---|" + ("---|" if device_column else ""))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
