"""Per-layer choice between the dense convolution and the direct sparse one.

:class:`SparseDispatcher` answers, for a convolution geometry and a weight
density, whether :func:`~gdnflow.sparse.conv.sparse_conv2d` or the dense
:func:`gdnflow.ops.conv2d` (whatever algorithm its planner picks) runs it:

- on the GPU it times both once on random data of that geometry and
  density (CUDA events, after a warm-up that also compiles) and keeps the
  faster; the answer is cached per (geometry, density to 0.01), so a
  network pays for it on its first forward. Do that first forward before
  capturing a CUDA graph: timing allocates.
- on NumPy it is a rule, not a measurement: dense (the NumPy sparse code
  is the reference, a gather through fancy indexing, slower than the
  BLAS-backed dense convolution at any density; docs/sparse.md has the
  measurements).

The policy comes from ``gdnflow.config.settings.sparse_policy`` ("auto",
"sparse" or "dense"; "sparse"/"dense" force one side everywhere), read at
each choice; when that knob is None, from the environment variable
``GDNFLOW_SPARSE``; else "auto". A dispatcher built with a policy of its own
uses that one. :func:`describe` lists the choices made so far (for
``gdnflow info``).
"""
import os
import statistics

import numpy as np

from gdnflow.autograd import no_grad
from gdnflow.backends import cuda
from gdnflow.config import settings
from gdnflow.ops.conv import conv2d
from gdnflow.sparse.conv import sparse_conv2d
from gdnflow.sparse.csr import random_csr
from gdnflow.sparse.geometry import padded_size
from gdnflow.tensor import Tensor

POLICIES = ("auto", "sparse", "dense")


def checked_policy(policy, source):
    """``policy`` if it is one of POLICIES, else a ValueError naming ``source``, its origin."""
    if policy not in POLICIES:
        raise ValueError(f"{source} must be one of {POLICIES}, got {policy!r} (GDNFLOW_SPARSE "
                         "and gdnflow.config.settings.sparse_policy take the same values)")
    return policy


def describe_geometry(g):
    """'N x C x H x W -> C_out, kh x kw / stride' of a ConvGeometry."""
    stride = g.stride[0] if g.stride[0] == g.stride[1] else g.stride
    return f"{g.n}x{g.c_in}x{g.h}x{g.w} -> {g.c_out}, {g.kh}x{g.kw}/{stride}"


class SparseDispatcher:
    """Chooses "sparse" or "dense" per (geometry, density, device); see the module docstring."""

    def __init__(self, policy=None):
        #: This dispatcher's own policy, or None: the knob's (see :attr:`policy`).
        self.own_policy = checked_policy(policy, "policy") if policy else None
        #: (geometry, density, device) -> "sparse" or "dense"
        self.cache = {}
        #: (geometry, density) -> {"sparse": ms, "dense": ms}, for what was measured.
        self.timings = {}

    @property
    def policy(self):
        """"auto", "sparse" or "dense": the dispatcher's own policy, else the knob
        ``settings.sparse_policy``, else ``GDNFLOW_SPARSE``, else "auto" (ValueError if
        the one that applies is none of these)."""
        if self.own_policy is not None:
            return self.own_policy
        if settings.sparse_policy is not None:
            return checked_policy(settings.sparse_policy, "gdnflow.config.settings.sparse_policy")
        return checked_policy(os.environ.get("GDNFLOW_SPARSE") or "auto", "GDNFLOW_SPARSE")

    def choose(self, g, density, device):
        """"sparse" or "dense" for geometry ``g`` with a weight of ``density`` on ``device``."""
        policy = self.policy
        if policy != "auto":
            return policy
        density = round(float(density), 2)
        key = (g, density, device)
        choice = self.cache.get(key)
        if choice is None:
            if g.groups != 1:
                choice = "dense"
            elif device == "numpy":
                choice = "dense"            # see the module docstring
            else:
                times = self.measure(g, density)
                choice = min(times, key=times.get)
            self.cache[key] = choice
        return choice

    def measure(self, g, density, repeats=5, trials=3, seed=0):
        """{"sparse": ms, "dense": ms} of one forward of ``g`` at ``density`` on the GPU.

        Each is warmed up twice (compiling its kernels), then timed ``trials``
        times over ``repeats`` calls between two events; the median trial counts.
        """
        import pycuda.driver as drv     # local import: PyCUDA on first use (CUDA events)
        rng = np.random.default_rng(seed)
        runtime = cuda.get_runtime()
        csr = random_csr(g.w_shape, max(density, 1e-6), padded_size(g), g.dilation, rng)
        x = Tensor(rng.standard_normal(g.x_shape, dtype=np.float32), device="cuda")
        w = Tensor(csr.to_dense(), device="cuda")
        runs = {
            "dense": lambda: conv2d(x, w, stride=g.stride, padding=g.padding,
                                    dilation=g.dilation),
            "sparse": lambda: sparse_conv2d(x, csr, stride=g.stride, padding=g.padding),
        }
        start, end = drv.Event(), drv.Event()
        times = {}
        with no_grad():
            for name, run in runs.items():
                run()
                run()
                trial_times = []
                for _ in range(trials):
                    start.record(runtime.stream)
                    for _ in range(repeats):
                        run()
                    end.record(runtime.stream)
                    end.synchronize()
                    trial_times.append(end.time_since(start) / repeats)
                times[name] = statistics.median(trial_times)
        self.timings[(g, density)] = times
        return times

    def describe(self):
        """One line per choice made so far: layer, density, choice and, if measured, the times."""
        policy = self.policy
        if policy != "auto":
            header = (f"sparse convolution: forced {policy} "
                      "(gdnflow.config sparse_policy or GDNFLOW_SPARSE)")
        else:
            header = "sparse convolution: per layer, measured on the GPU, dense on NumPy"
        lines = [header]
        for (g, density, device), choice in sorted(self.cache.items(), key=lambda kv: str(kv[0])):
            line = f"  {device}: {describe_geometry(g)}, density {density:.2f}: {choice}"
            times = self.timings.get((g, density))
            if times and device == "cuda":
                line += (f" (sparse {times['sparse']:.3f} ms, dense {times['dense']:.3f} ms, "
                         f"{times['dense'] / times['sparse']:.2f}x)")
            lines.append(line)
        if len(lines) == 1:
            lines.append("  no sparse layer has run in this process yet")
        return "\n".join(lines)


#: The process's dispatcher.
dispatcher = SparseDispatcher()


def describe():
    """The text ``gdnflow info`` shows about sparse-convolution choices (see SparseDispatcher)."""
    return dispatcher.describe()
