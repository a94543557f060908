"""Cold start: wall time from a fresh process's start to its first output, kernel cache empty and warm.

    python benchmarks/bench_cold_start.py --out benchmarks/results/cold_start.md
    python benchmarks/bench_cold_start.py --device numpy      # a dry run of the script, no GPU

Each row runs fresh Python processes (``python -c``) and times, from just
before the process is started to the moment its first result is on the host:
``import gdnflow`` alone; MobileNetV2 (random weights, batch 1, 224x224) up
to its first output's ``.numpy()``; the shipped codec (factorized prior,
quality 2) up to its first ``compress`` of a 768x512 photo-like image.
"empty cache" runs get a new, empty ``GDNFLOW_KERNEL_CACHE`` each (PyCUDA's
own cache plays no part: gdnflow compiles with nvcc itself); "warm cache"
runs reuse the cache the last empty-cache run filled. PyTorch's MobileNetV2
in a fresh process is a row too where torch and torchvision import.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gdnflow import benchmarking as harness
from gdnflow.backends.cuda.kernel_cache import CACHE_VARIABLE

#: What each child prints once its first result is on the host: the marker and time.time().
MARKER = "FIRST_OUTPUT"

IMPORT_ONLY = f"""
import time
import gdnflow
print("{MARKER}", time.time())
"""

MOBILENET = f"""
import time
import numpy as np
import gdnflow as gf
from gdnflow.models import mobilenet_v2
model = mobilenet_v2(device=DEVICE, rng=np.random.default_rng(0)).eval()
x = gf.tensor(np.random.default_rng(1).standard_normal((1, 3, 224, 224), dtype=np.float32),
              device=DEVICE)
with gf.no_grad():
    model(x).numpy()
print("{MARKER}", time.time())
"""

CODEC = f"""
import time
import numpy as np
from gdnflow.codec import pretrained
rng = np.random.default_rng(0)
# A photo-like 768x512 image: smooth colour fields (a coarse grid, upsampled) plus noise.
coarse = rng.uniform(0, 255, (512 // 32 + 1, 768 // 32 + 1, 3))
rows, columns = np.linspace(0, coarse.shape[0] - 1, 512), np.linspace(0, coarse.shape[1] - 1, 768)
smooth = np.stack([[np.interp(columns, np.arange(coarse.shape[1]), coarse[int(r), :, c])
                    for r in rows] for c in range(3)], axis=-1)
image = np.clip(smooth + rng.normal(0, 3, smooth.shape), 0, 255).astype(np.uint8)
codec = pretrained("factorized_prior", quality=2, device=DEVICE)
codec.compress(image)
print("{MARKER}", time.time())
"""

TORCH_MOBILENET = f"""
import time
import torch
import torchvision
model = torchvision.models.mobilenet_v2().cuda().eval()
x = torch.randn(1, 3, 224, 224, device="cuda")
with torch.no_grad():
    model(x).cpu().numpy()
print("{MARKER}", time.time())
"""


def first_output_seconds(code, device, cache):
    """Seconds from starting ``python -c code`` (``DEVICE`` set) to its first output, the
    process using ``cache`` as its kernel cache; the child's stderr lines come too."""
    env = dict(os.environ, **{CACHE_VARIABLE: str(cache)})
    started = time.time()
    result = subprocess.run([sys.executable, "-c", f"DEVICE = {device!r}\n{code}"], env=env,
                            capture_output=True, text=True, timeout=600)
    stamps = [line.split()[1] for line in result.stdout.splitlines() if line.startswith(MARKER)]
    if result.returncode != 0 or not stamps:
        raise RuntimeError(f"the child process failed ({result.returncode}):\n{result.stderr}")
    return float(stamps[0]) - started, result.stderr


def measure(name, code, device, cold_runs, warm_runs, folder):
    """A table row: median seconds with an empty cache and with a warm one, modules compiled."""
    cold, compiled, cache = [], 0, None
    for run in range(cold_runs):
        cache = Path(folder) / f"{name}-{run}"
        seconds, _ = first_output_seconds(code, device, cache)
        cold.append(seconds)
        compiled = len(list(cache.rglob("*.cubin")))
    warm = [first_output_seconds(code, device, cache)[0] for _ in range(warm_runs)]
    return [name, _seconds(cold), _seconds(warm), compiled if device == "cuda" else "-"]


def _seconds(values):
    if not values:
        return "-"
    spread = f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else ""
    return f"{statistics.median(values):.2f}{spread}"


def main():
    """Run every row and print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--device", choices=("cuda", "numpy"), default="cuda",
                        help="where gdnflow runs (numpy: a dry run of the script without a GPU)")
    parser.add_argument("--cold-runs", type=int, default=2,
                        help="runs with an empty kernel cache per row (each a new cache)")
    parser.add_argument("--warm-runs", type=int, default=5,
                        help="runs with the warm cache per row (the median is reported)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gdnflow-cold-start-") as folder:
        for name, code in (("import gdnflow", IMPORT_ONLY),
                           ("MobileNetV2, batch 1, first output", MOBILENET),
                           ("codec q2, first compress of 768x512", CODEC)):
            rows.append(measure(name, code, args.device, args.cold_runs, args.warm_runs,
                                folder))
            print(" | ".join(map(str, rows[-1])), flush=True)
    if args.device == "cuda" and harness.torch_or_none(need_torchvision=True) is not None:
        torch_runs = [first_output_seconds(TORCH_MOBILENET, "cuda", "unused")[0]
                      for _ in range(max(args.warm_runs, 1))]
        rows.append(["PyTorch MobileNetV2, batch 1, first output", "-", _seconds(torch_runs), "-"])
    harness.emit(harness.markdown_table(
        "Cold start: seconds from process start to the first output",
        ["what", "empty kernel cache (s)", "warm kernel cache (s)", "modules in cache"], rows,
        [f"device {args.device}; median (min-max) of {args.cold_runs} empty-cache runs (each a "
         f"new {CACHE_VARIABLE}) and {args.warm_runs} warm runs; each run a new process, timed "
         "from just before it starts to its first result on the host (import included)",
         "targets (issue #27): empty cache <= 8 s, warm cache <= 1.5 s for MobileNetV2 and the "
         "codec",
         "modules in cache: cubins the last empty-cache run left (those it needed plus the "
         "ones compiled ahead in the background before it exited)",
         "PyTorch: its own first-call costs (CUDA context, cuDNN); it compiles nothing"],
        gpu=None if args.device == "cuda" else "none (NumPy dry run)"), args.out)


if __name__ == "__main__":
    main()
