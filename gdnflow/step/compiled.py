"""A training step captured once as a CUDA graph and replayed without Python.

::

    def train_step(batch, step):            # step: a gdnflow.step_context.StepContext
        out = model(batch, noise_key=KEY, noise_stream=step.index)
        loss = criterion(out, batch)
        optimizer.zero_grad()
        loss.backward()
        norm = gf.optim.clip_grad_norm(model.parameters(), 1.0, sync=False)
        step.guard_finite(loss, norm)        # a NaN stops updates on the device
        optimizer.step()
        return {"loss": loss, "grad_norm": norm}

    compiled = gf.compile_step(train_step, example_batch)
    for batch in data:
        out = compiled(batch)                # device scalars; nothing is read back
        schedule.step()                      # host-side changes reach the next replay
    print(out["loss"].item(), compiled.first_nonfinite_step())

What a call does, per batch shape (on the GPU):

1. the first call runs ``fn`` eagerly (warm-up: kernels compile, convolution
   algorithms are chosen, optimiser state is created);
2. the second runs it again with every allocation recorded (rehearsal),
   places those allocations in one arena (:func:`gdnflow.inference.memory.plan_memory`)
   and captures ``fn`` as a CUDA graph served from that arena;
3. every later call copies the batch into the step's static input, runs the
   hooks that the step registered (each optimiser writes this step's
   learning rate and bias corrections into the device array its kernel
   reads, and advances its counters), launches the graph, and returns the
   graph's output tensors: read them (``.item()``) only when you need them.

Every call is one real training step; the step counter (``step.index``, the
noise stream) advances by one per call. ``fn``'s Python code runs only in the
first two calls and during the capture: side effects in it (appending to a
list, printing) do not happen on replays. A batch of another shape gets its
own graph (up to ``max_graphs``, then it runs eagerly), and the step says
which through ``notify``. Parameters or optimiser state replaced after the
capture (``load_state_dict``) are noticed before the next replay: the graphs
are dropped and built again. On NumPy, or with ``graph=False``, every call
runs ``fn`` eagerly with the same context, so a step function behaves alike
everywhere.
"""
import warnings

import numpy as np

from gdnflow import step_state
from gdnflow.backends import cuda, default_device
from gdnflow.config import settings
from gdnflow.errors import GdnflowError
from gdnflow.inference.errors import PlanError
from gdnflow.inference.memory import ALIGNMENT, ArenaPool, RecordingPool, gc_paused, plan_memory
from gdnflow.step.staging import InputBuffer, check_real
from gdnflow.step_context import StepContext, StepCounter, new_flag, read_flag
from gdnflow.tensor import Tensor

#: Graphs (batch shapes) one compiled step keeps by default before running new shapes eagerly.
MAX_GRAPHS = 4


class CompiledStepWarning(UserWarning):
    """What a compiled step tells about itself: another graph captured, a shape run eagerly."""


class CompiledStep:
    """A training-step function, run as one CUDA graph per batch shape; see the module docstring.

    ``fn(batch, step)`` takes the batch (a Tensor, the step's static input)
    and a :class:`~gdnflow.step_context.StepContext`, and returns a Tensor,
    or a dict, list or tuple of Tensors (detached copies of the structure
    come back from each call). ``example_batch`` (an array or a Tensor) fixes
    the device and dtype of the input; calls may then pass arrays or Tensors.
    ``start_step``: the number of the first call's step (``step.index``).
    ``graph=False`` never captures. ``notify(message)`` receives what the
    step says about graphs (default: a :class:`CompiledStepWarning`).
    """

    def __init__(self, fn, example_batch, *, start_step=0, max_graphs=MAX_GRAPHS, graph=True,
                 notify=None):
        if not callable(fn):
            raise TypeError(f"compile_step: fn must be callable, got {type(fn).__name__}")
        if isinstance(example_batch, Tensor):
            self.device, self.dtype = example_batch.device, example_batch.dtype
        else:
            example = np.asarray(example_batch)
            self.device, self.dtype = default_device(), np.dtype(np.float32)
            check_real(example.dtype)
        if int(max_graphs) < 0:
            raise ValueError(f"compile_step: max_graphs must be >= 0, got {max_graphs!r}")
        self.fn = fn
        self.max_graphs = int(max_graphs)
        self.use_graphs = bool(graph) and self.device == "cuda"
        self.notify = notify or _warn
        self.counter = StepCounter(self.device, start_step)
        self.flag = new_flag(self.device)
        self._entries = {}          # (shape, matmul precision) -> _Entry

    # ------------------------------------------------------------ state --
    @property
    def step(self):
        """The number of the next call's step (what ``step.index`` holds during it)."""
        return self.counter.value

    @step.setter
    def step(self, value):
        self.counter.set(value)

    @property
    def graphs(self):
        """How many CUDA graphs (batch shapes) are captured now."""
        return sum(entry.graph is not None for entry in self._entries.values())

    def mode(self, batch_shape):
        """How the next call with a batch of ``batch_shape`` runs: "warm-up", "capture",
        "replay" or "eager"."""
        entry = self._entries.get(self._key(tuple(batch_shape)))
        if entry is None:
            return "warm-up" if self._may_capture() else "eager"
        return entry.next_mode

    def graph_for(self, batch_shape):
        """The captured :class:`~gdnflow.backends.cuda.graphs.CudaGraph` for ``batch_shape``
        (in the current matmul precision), or None: for timing the GPU work alone
        (replaying it skips the per-step hooks)."""
        entry = self._entries.get(self._key(tuple(batch_shape)))
        return entry.graph if entry is not None else None

    def first_nonfinite_step(self):
        """The number (step index + 1) of the first step whose guarded scalars were not
        finite, or None. Waits for the GPU: call it every few steps, not every step."""
        return read_flag(self.flag) or None

    def clear_nonfinite(self):
        """Reset the flag, so that updates run again (after restoring good parameters)."""
        self.flag = new_flag(self.device)
        self.reset()            # the graphs read the old flag's address

    def reset(self):
        """Drop every graph: the next call per shape warms up and captures again."""
        for entry in self._entries.values():
            entry.close()
        self._entries.clear()

    # ------------------------------------------------------------- call --
    def __call__(self, batch):
        """Run one training step on ``batch``; returns ``fn``'s outputs (see the class)."""
        shape = tuple(np.shape(batch.data if isinstance(batch, Tensor) else batch))
        key = self._key(shape)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._new_entry(key, shape)
        entry.input.load(batch)
        if entry.next_mode == "replay":
            stale = entry.stale()
            if stale is None:
                outputs = entry.replay()
            else:
                self.notify(f"compile_step: {stale} since the step was captured: capturing "
                            "it again")
                self.reset()
                entry = self._new_entry(key, shape, announce=False)
                entry.input.load(batch)
                outputs = self._run_eagerly(entry)
        elif entry.next_mode == "capture" and not self._may_capture():
            # Another shape took the last graph since this one warmed up.
            self.notify(f"compile_step: the step keeps at most {self.max_graphs} graphs, so a "
                        f"batch of shape {shape} runs eagerly, without a graph")
            entry.next_mode = "eager"
            outputs = self._run_eagerly(entry)
        elif entry.next_mode == "capture":
            outputs, failure = self._rehearse_and_capture(entry)
            if failure is not None:
                # The rehearsal was this call's step: count it, then say what failed.
                self.counter.set(self.counter.value + 1)
                if isinstance(failure, step_state.StepSyncError):
                    raise failure
                self.notify(str(failure))
                return outputs
        else:
            outputs = self._run_eagerly(entry)
        self.counter.set(self.counter.value + 1)
        return outputs

    def _key(self, shape):
        return shape, settings.matmul_precision

    def _may_capture(self):
        return self.use_graphs and self.graphs < self.max_graphs

    def _new_entry(self, key, shape, announce=True):
        capture = self._may_capture()
        if announce and self._entries:
            others = ", ".join(str(k[0]) for k in self._entries)
            if capture:
                self.notify(f"compile_step: a batch of shape {shape} (captured so far: {others}): "
                            f"capturing another graph for it ({self.graphs + 1} of at most "
                            f"{self.max_graphs})")
            elif self.use_graphs:
                self.notify(f"compile_step: a batch of shape {shape} (captured so far: {others}): "
                            f"the step keeps at most {self.max_graphs} graphs, so this shape "
                            "runs eagerly, without a graph")
        entry = self._entries[key] = _Entry(InputBuffer(shape, self.dtype, self.device),
                                            "warm-up" if capture else "eager")
        return entry

    def _context(self, phase):
        return StepContext(self.device, phase, self.counter, self.flag)

    def _run_eagerly(self, entry):
        context = self._context("eager")
        with context.running():
            outputs = self.fn(entry.input.tensor, context)
        if entry.next_mode == "warm-up":
            entry.next_mode = "capture"
        return _detached(outputs, "fn")

    def _rehearse_and_capture(self, entry):
        """This call's step, with its allocations recorded; then the capture for later calls.

        Returns (outputs, None), or (outputs, why the capture failed): the
        StepSyncError the step function raised while captured (something
        only a capture refuses), or a :class:`CaptureError` for any other
        failure (the shape then runs eagerly). The rehearsal's step has run
        either way.
        """
        from gdnflow.backends.cuda.graphs import CudaGraph  # local import: PyCUDA on first use
        runtime = cuda.get_runtime()
        rehearsal = self._context("rehearsal")
        recorder = RecordingPool(runtime.pool)
        with gc_paused():
            with runtime.allocating_from(recorder), rehearsal.running():
                outputs = _detached(self.fn(entry.input.tensor, rehearsal), "fn")
        graph = CudaGraph(runtime.stream)
        try:
            sizes = recorder.sizes
            offsets, total = plan_memory(sizes, recorder.freed_at)
            arena = runtime.allocate_outside_pool(max(total, ALIGNMENT),
                                                  "the compiled step's arena")
            pool = ArenaPool(arena, offsets, sizes, owner="compile_step: the step function")
            capture = self._context("capture")
            capture.reserved = list(rehearsal.constants)
            # The capture refills the rehearsal's page-locked tables: the
            # rehearsal's copies from them must have run first.
            runtime.stream.synchronize()
            with gc_paused(), runtime.allocating_from(pool), capture.running():
                captured = graph.capture(lambda: self.fn(entry.input.tensor, capture))
            if pool.count != len(sizes):
                raise PlanError(f"compile_step: the captured run made {pool.count} allocations, "
                                f"the rehearsal {len(sizes)}")
        except Exception as exc:
            graph.close()
            entry.next_mode = "eager"
            if isinstance(exc, step_state.StepSyncError):
                return outputs, exc
            failure = CaptureError(f"compile_step: capturing the step as a CUDA graph failed "
                                   f"({type(exc).__name__}: {exc}); batches of shape "
                                   f"{entry.input.shape} run eagerly from now on "
                                   "(compile_step(..., graph=False) never captures)")
            failure.__cause__ = exc
            return outputs, failure
        entry.keep(graph, arena, capture, _detached(captured, "fn"))
        return outputs, None


class CaptureError(GdnflowError, RuntimeError):
    """A step function could not be captured as a CUDA graph (it ran eagerly instead)."""


class _Entry:
    """One batch shape of a compiled step: its static input and, once captured, its graph."""

    def __init__(self, input_buffer, next_mode):
        self.input = input_buffer
        self.next_mode = next_mode      # "warm-up", "capture", "replay" or "eager"
        self.graph = self.arena = None
        self.hooks, self.constants, self.outputs, self.grads = [], [], None, []

    def keep(self, graph, arena, context, outputs):
        """Hold what the graph reads and writes for as long as it may be replayed."""
        self.graph, self.arena = graph, arena
        self.hooks, self.constants, self.outputs = context.hooks, context.constants, outputs
        # The gradients the graph writes: given back to their parameters after
        # each replay (another shape's capture may have replaced them).
        self.grads = [pair for hook in self.hooks for pair in getattr(hook, "gradients", ())]
        self.next_mode = "replay"

    def stale(self):
        """None if the graph may replay, else what changed since it was captured."""
        for p, g in self.grads:
            p.grad = g
        for hook in self.hooks:
            check = getattr(hook, "check", None)
            reason = check() if check is not None else None
            if reason is not None:
                return reason
        return None

    def replay(self):
        for hook in self.hooks:
            hook()
        self.graph.replay()
        # The same tensors each time, in a new structure (the caller may change it).
        return _detached(self.outputs, "fn")

    def close(self):
        if self.graph is not None:
            self.graph.close()
        self.graph = self.arena = self.outputs = None
        self.hooks, self.constants, self.grads = [], [], []


def _detached(outputs, what):
    """``outputs`` (a Tensor, or a dict/list/tuple of them) with every tensor cut from autograd."""
    if isinstance(outputs, Tensor):
        return Tensor.wrap(outputs.data, outputs.device)
    if isinstance(outputs, dict):
        return {k: _detached(v, what) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(_detached(v, what) for v in outputs)
    if outputs is None:
        return None
    raise TypeError(f"compile_step: {what} must return a Tensor, or a dict, list or tuple of "
                    f"Tensors (or None), got {type(outputs).__name__}")


def _warn(message):
    warnings.warn(message, CompiledStepWarning, stacklevel=4)


def compile_step(fn, example_batch, **options):
    """A :class:`CompiledStep` of ``fn(batch, step)``; see :mod:`gdnflow.step.compiled`."""
    return CompiledStep(fn, example_batch, **options)


__all__ = ["compile_step", "CompiledStep", "CompiledStepWarning", "CaptureError", "MAX_GRAPHS"]
