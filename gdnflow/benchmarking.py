"""Timing helpers for benchmarks against PyTorch (GPU only): the scripts in
``benchmarks/`` and the ``gdnflow bench`` command use them.

Both sides are timed with CUDA events around the region, after a warm-up,
and reported as the median over many runs, in one process: gdnflow's events
are recorded on gdnflow's stream, PyTorch's on its current stream. Inputs
should not fit in L2 (50-60 MB on an H100/H200) unless the workload is small
by nature.
"""
import datetime
import platform
import statistics
import time

from gdnflow.backends import cuda


def gdnflow_stream():
    """The stream every gdnflow kernel runs on."""
    return cuda.get_runtime().stream


def time_gdnflow(fn, warmup=10, repeats=50):
    """Median milliseconds of ``fn()`` measured with events on gdnflow's stream."""
    import pycuda.driver as drv     # local import: PyCUDA on first use
    stream = gdnflow_stream()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    times = []
    start, end = drv.Event(), drv.Event()
    for _ in range(repeats):
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(end.time_since(start))
    return statistics.median(times)


def time_torch(fn, warmup=10, repeats=50):
    """Median milliseconds of ``fn()`` measured with events on PyTorch's current stream."""
    import torch    # local import: PyTorch, optional (the baseline), loaded on first use
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def median_wall_ms(fn, repeats, warmup=3):
    """Median wall milliseconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls: for
    work that ends on the host (NumPy, or a call that returns host data)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def pipelined_ms(fn, synchronize, steps=50, rounds=3, warmup=5):
    """Wall milliseconds per call of ``fn()`` called ``steps`` times back to back.

    Nothing waits between the calls, so the host queues work while the GPU
    runs it, as a training loop does; ``synchronize()`` waits for the GPU at
    the end of each round. Returns the median over ``rounds`` rounds: the
    step rate a loop of these calls reaches, host and GPU together.
    """
    for _ in range(warmup):
        fn()
    synchronize()
    rounds_ms = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        synchronize()
        rounds_ms.append((time.perf_counter() - start) * 1000 / steps)
    return statistics.median(rounds_ms)


def host_cpu():
    """The host CPU's model name (from /proc/cpuinfo; the platform's processor elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def torch_or_none(need_torchvision=False):
    """PyTorch with TF32 off and cuDNN in benchmark mode, or None if it cannot run here
    (or, with ``need_torchvision``, if torchvision is missing)."""
    try:
        import torch    # local import: PyTorch, optional (the baseline); may be absent
        if need_torchvision:
            # local import: torchvision, optional (the baseline models); may be absent
            import torchvision  # noqa: F401
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    return torch


def gpu_name():
    """The name of the GPU gdnflow runs on."""
    return cuda.get_runtime().name


def markdown_table(title, headers, rows, notes=(), gpu=None):
    """A markdown table headed by the title, GPU (``gpu``, else this process's), date and host;
    rows are lists of cells."""
    lines = [f"## {title}", "",
             f"GPU: {gpu or gpu_name()}; date: {datetime.date.today().isoformat()}; "
             f"host Python {platform.python_version()}, CPU {host_cpu()}", ""]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "---|" * len(headers))
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def emit(table, out_path=None):
    """Print the table and, if given, write it to ``out_path``."""
    print(table)
    if out_path:
        with open(out_path, "w") as f:
            f.write(table)
