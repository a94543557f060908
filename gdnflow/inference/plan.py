"""Inference plans: a model's forward for one input shape, optimised and on the GPU one CUDA graph.

:class:`InferencePlan` traces the model (:mod:`~gdnflow.inference.tracing`),
rewrites the program (:mod:`~gdnflow.inference.passes`) and, on the GPU,
plans its memory in one arena (:mod:`~gdnflow.inference.memory`) and
captures it as a :class:`~gdnflow.backends.cuda.graphs.CudaGraph`;
:class:`CompiledModel` keeps one plan per input shape and rebuilds them when
the weights change (``gdnflow.tensor.weights_version``); :func:`compile`
makes one. ``docs/inference.md`` tells how and why.
"""
import functools
import time
from collections import OrderedDict

import numpy as np

from gdnflow.autograd import no_grad
from gdnflow.backends import check_device, cuda, default_device, get_backend
from gdnflow.errors import ShapeError
from gdnflow.inference.errors import PlanError, StalePlanError
from gdnflow.inference.memory import ALIGNMENT, ArenaPool, RecordingPool, gc_paused, plan_memory
from gdnflow.inference.passes import lower_weights, optimize
from gdnflow.inference.tracing import trace
from gdnflow.ops.cast import cast
from gdnflow.precision import FLOAT32, as_dtype, autocast, is_half
from gdnflow.tensor import weights_version
from gdnflow.backends.cuda.weight_cache import frozen_weights
from gdnflow.config import override, settings
from gdnflow.tensor import Tensor
from gdnflow.testing import relative_error

#: The build checks its first result against the traced model within this
#: relative error (max |plan - model| / max |model|), per matmul precision.
#: Folding changes rounding by about 1e-6 in float32, and by TF32's own
#: rounding (2^-11 per product input) in "tf32"; a wrong plan is off by order 1.
VERIFY_TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2}
#: The same for plans in 16 bits (``dtype``): a check that the plan is not wrong,
#: looser than the accuracy docs/precision.md measures (bf16 keeps 8 bits).
VERIFY_TOLERANCE_16_BIT = {"bfloat16": 5e-2, "float16": 1e-2}


def plan_dtype(dtype):
    """``dtype`` of :func:`compile` as None (float32) or a 16-bit numpy dtype; else a ValueError."""
    if dtype is None:
        return None
    resolved = as_dtype(dtype)
    if resolved == FLOAT32:
        return None
    if not is_half(resolved):
        raise ValueError(f"compile: dtype must be fp32, bf16 or fp16, got {dtype!r}")
    return resolved


def _model_device(model):
    """The one device holding the model's parameters and buffers (the default if none)."""
    devices = {t.device for t in list(model.parameters()) + list(model.buffers())}
    if len(devices) > 1:
        raise PlanError(f"compile: the model's tensors are on several devices {sorted(devices)}; "
                        "move it with model.to(device)")
    return devices.pop() if devices else default_device()


def _check_eval_mode(model):
    training = [name.rstrip(".") or type(model).__name__
                for name, m in model.named_modules() if m.training]
    if training:
        raise PlanError(f"compile: {len(training)} module(s) are in training mode (first: "
                        f"{training[0]!r}); call model.eval() first: a plan freezes batch-norm "
                        "statistics and leaves dropout out")


class InferencePlan:
    """The model's forward for one input shape, optimised and (on the GPU) captured as a CUDA graph.

    ``InferencePlan(model, input_shape, device=None, graph=True, verify=True,
    dtype=None)`` builds it (docs/inference.md tells how; ``dtype``: see
    :func:`compile`); ``model`` must be in eval mode and
    all on ``device`` (by default the device of its parameters). ``graph``
    (GPU only): replay a CUDA graph from static buffers; False runs the
    optimised program operator by operator (for debugging, or models whose
    operators cannot be captured). ``verify``: check the first result
    against the traced model's (:data:`VERIFY_TOLERANCE`, or
    :data:`VERIFY_TOLERANCE_16_BIT` for a 16-bit plan).

    ``plan(x)`` takes a Tensor or NumPy array of exactly ``input_shape`` and
    returns what the model returns. With a graph the returned tensors live in
    the plan's arena and are overwritten by the next call (copy what you keep,
    e.g. ``y.numpy()``); the input is copied into the plan's static input
    buffer (``plan.input``; write there and call :meth:`replay` to skip the
    copy). A call after the weights changed raises :class:`StalePlanError`.

    ``stats`` counts what the build did: steps, folded batch norms, fused
    residuals and activations, allocations and their bytes, the arena's bytes,
    build seconds. ``describe()`` lists the steps.
    """

    def __init__(self, model, input_shape, device=None, graph=True, verify=True, dtype=None):
        started = time.perf_counter()
        #: None (float32), or the 16-bit dtype the plan computes in (under autocast).
        self.dtype = plan_dtype(dtype)
        _check_eval_mode(model)
        self.device = check_device(device) if device is not None else _model_device(model)
        if self.device != _model_device(model):
            raise PlanError(f"compile: the model is on {_model_device(model)!r}, not "
                            f"{self.device!r}; move it with model.to({self.device!r})")
        self.input_shape = tuple(int(s) for s in input_shape)
        #: The matmul precision the plan was built (and its graph captured) with.
        self.precision = settings.matmul_precision
        self.graph = None
        self._input = self._outputs = self._arena = None
        #: Filter transforms (Winograd U, the sub-pixel rewrite's weight) of the
        #: plan's constant weights, made once by the warm-up run: the graph reads them.
        self._derived_weights = None
        self.version, self.closed = None, False
        rng = np.random.default_rng(0)
        host = rng.standard_normal(self.input_shape).astype(np.float32)
        if self.device == "cuda" and graph:
            x = self._static_input(host)
        else:
            x = Tensor(host, device=self.device)
        self.program, reference = trace(model, x)
        reference = [t.numpy() for t in reference] if verify else None
        self.stats = {"traced_steps": len(self.program.steps)}
        self.stats.update(optimize(self.program))
        if self.dtype is not None:
            self.stats["lowered_weights"] = lower_weights(self.program, self.dtype)
        self.stats["steps"] = len(self.program.steps)
        if self.device == "cuda" and graph:
            self._capture(x)
            first = self._outputs
            if verify:
                self.graph.replay()
        else:
            with no_grad():
                first = self._run(x)
        tolerance = (VERIFY_TOLERANCE[self.precision] if self.dtype is None
                     else VERIFY_TOLERANCE_16_BIT[self.dtype.name])
        if verify:
            for i, (got, expected) in enumerate(zip(first, reference)):
                error = relative_error(got.numpy(), expected)
                if not error <= tolerance:
                    self.close()
                    raise PlanError(f"inference plan: output {i} differs from the model's by "
                                    f"{error:.3g} (relative, max-norm); the plan is wrong")
        # Taken last: running the model's forward may itself assign attributes.
        self.version = weights_version()
        self.stats["build_seconds"] = time.perf_counter() - started

    # -------------------------------------------------------------- build --
    def _run(self, x):
        """The program's outputs for ``x``: in the plan's 16-bit dtype under autocast (its
        outputs widened to float32), or as traced."""
        if self.dtype is None:
            return self.program.run(x)
        with autocast(self.dtype):
            return [cast(t, FLOAT32) for t in self.program.run(x)]

    def _static_input(self, host):
        """The plan's own input buffer (outside the pool, so never handed to anyone else)."""
        import pycuda.driver as drv     # local import: PyCUDA on first use
        cuda_array = get_backend("cuda").array_type
        cuda.check_index_range(host.size, f"the plan's input of shape {self.input_shape}")
        allocation = cuda.get_runtime().allocate_outside_pool(
            max(host.nbytes, 4), f"the plan's input buffer of shape {self.input_shape}")
        self._input = cuda_array(self.input_shape, np.dtype(np.float32), allocation)
        # Bound once: __call__ is the hot path.
        self._stream = cuda.get_runtime().stream
        self._cuda_array = cuda_array
        self._copy_dtod, self._copy_htod = drv.memcpy_dtod_async, drv.memcpy_htod_async
        self._copy_htod(self._input.ptr, host, self._stream)
        return Tensor.wrap(self._input, "cuda")

    def _capture(self, x):
        """Warm-up run, recording run, memory plan, then the capture (docs/inference.md, 3-4)."""
        from gdnflow.backends.cuda.graphs import CudaGraph  # local import: PyCUDA on first use
        runtime = cuda.get_runtime()
        self._derived_weights = {}
        # Every run below inside the plan's own frozen-weights cache: the warm-up
        # makes the filter transforms (from the pool, kept by the plan), the
        # recording run and the capture find them, so the graph has no
        # transform kernels and the arena no transformed filters.
        frozen = functools.partial(frozen_weights, self._derived_weights)
        with no_grad(), frozen():
            self._run(x)
            recorder = RecordingPool(runtime.pool)
            with runtime.allocating_from(recorder):
                outputs = self._run(x)
            del outputs         # the outputs live to the end: freed after the last allocation
        sizes = recorder.sizes
        offsets, total = plan_memory(sizes, recorder.freed_at)
        self._arena = runtime.allocate_outside_pool(max(total, ALIGNMENT),
                                                    "the inference plan's arena")
        arena_pool = ArenaPool(self._arena, offsets, sizes)
        self.graph = CudaGraph(runtime.stream)
        try:
            with no_grad(), frozen(), runtime.allocating_from(arena_pool), gc_paused():
                self._outputs = self.graph.capture(lambda: self._run(x))
        except Exception as exc:
            self.close()
            raise PlanError(f"inference plan: capturing the forward as a CUDA graph failed "
                            f"({type(exc).__name__}: {exc}); graph=False runs it without one"
                            ) from exc
        if arena_pool.count != len(sizes):
            self.close()
            raise PlanError(f"inference plan: the captured run made {arena_pool.count} "
                            f"allocations, the recording run {len(sizes)}")
        self.stats.update(allocations=len(sizes), allocated_bytes=sum(sizes),
                          arena_bytes=total, derived_weight_bytes=sum(
                              derived.nbytes for _, derived in self._derived_weights.values()))

    # ---------------------------------------------------------------- run --
    @property
    def stale(self):
        """True when weights changed (through gdnflow's API) since the plan was built."""
        return weights_version() != self.version

    @property
    def input(self):
        """The static input buffer as a Tensor (graph plans only): write it, then :meth:`replay`."""
        if self._input is None:
            raise PlanError("inference plan: only a CUDA-graph plan has a static input buffer")
        return Tensor.wrap(self._input, "cuda")

    def __call__(self, x):
        if weights_version() != self.version:
            raise StalePlanError("inference plan: the model's weights changed since the plan "
                                 "was built; build a new one (a CompiledModel does so itself)")
        if self.graph is None:
            if self.closed:
                raise PlanError("inference plan: called after close()")
            return self._run_program(x)
        self._copy_input(x)
        self.graph.replay()
        return self.program.pack([Tensor.wrap(t.data, "cuda") for t in self._outputs])

    def replay(self):
        """Run the graph on what the static input buffer holds; returns what ``plan(x)`` does."""
        if weights_version() != self.version:
            raise StalePlanError("inference plan: the model's weights changed since the plan "
                                 "was built")
        if self.graph is None:
            raise PlanError("inference plan: replay() needs a CUDA-graph plan")
        self.graph.replay()
        return self.program.pack([Tensor.wrap(t.data, "cuda") for t in self._outputs])

    def _run_program(self, x):
        if not isinstance(x, Tensor):
            x = Tensor(np.asarray(x, dtype=np.float32), device=self.device)
        elif x.device != self.device:
            x = x.to(self.device)
        if x.shape != self.input_shape:
            raise ShapeError(f"inference plan for input {self.input_shape}: got {x.shape}")
        # A graph replays the precision it was captured with; a step-by-step plan
        # runs its steps in the precision it was built (and verified) with.
        with no_grad(), override(matmul_precision=self.precision):
            return self.program.pack(self._run(x))

    def _copy_input(self, x):
        """Copy ``x`` (Tensor or array) into the static input buffer, on the stream."""
        data = x.data if isinstance(x, Tensor) else x
        if tuple(data.shape) != self.input_shape:
            raise ShapeError(f"inference plan for input {self.input_shape}: got "
                             f"{tuple(data.shape)}")
        target = self._input
        if isinstance(data, self._cuda_array):
            if data.ptr != target.ptr:
                self._copy_dtod(target.ptr, data.ptr, target.nbytes, self._stream)
        else:
            self._copy_htod(target.ptr, np.ascontiguousarray(data, dtype=np.float32),
                            self._stream)

    def describe(self):
        """The optimised program, one step per line."""
        return self.program.describe()

    def close(self):
        """Release the graph and the plan's buffers (tensors it returned keep the arena alive)."""
        if self.graph is not None:
            # The arena is freed below: let a replay still in flight finish first.
            self._stream.synchronize()
            self.graph.close()
        self.graph = None
        self._outputs = self._arena = self._input = self._derived_weights = None
        self.closed = True

    def __repr__(self):
        mode = "cuda graph" if self.graph is not None else f"{self.device}, step by step"
        return (f"InferencePlan(input {self.input_shape}, {self.stats.get('steps')} steps, "
                f"{mode})")


class CompiledModel:
    """A model's inference plans, one per input shape and matmul precision, rebuilt when its
    weights change.

    ``compiled(x)`` runs the plan for ``x.shape`` (building it on first use,
    see :class:`InferencePlan` for what the result is and how long it lasts).
    At most ``max_plans`` plans are kept (the least recently used goes
    first). ``on_stale``: "rebuild" (default) builds anew after the weights
    changed; "error" raises :class:`StalePlanError` instead. Options ``graph``
    and ``verify`` are passed to each :class:`InferencePlan`.

    ``eager_calls``: the first that many calls of each shape run the model
    itself (under no_grad, and autocast for a 16-bit ``dtype``; the result
    packed as a plan's: a Tensor, tuple or list) and build nothing; the next
    one builds the plan. A build costs a few forwards, so callers that see
    many shapes once each (a codec's image sizes) pass 1: only a shape met
    again gets a plan. With ``eager_calls``, a shape whose plan was dropped
    for ``max_plans`` runs eagerly from then on, so that more shapes than
    ``max_plans`` in rotation do not rebuild over and over.
    """

    def __init__(self, model, device=None, graph=True, verify=True, on_stale="rebuild",
                 max_plans=8, dtype=None, eager_calls=0):
        if on_stale not in ("rebuild", "error"):
            raise ValueError(f"compile: on_stale must be 'rebuild' or 'error', got {on_stale!r}")
        if isinstance(eager_calls, bool) or not (isinstance(eager_calls, int)
                                                  and eager_calls >= 0):
            raise ValueError(f"compile: eager_calls must be a whole number >= 0, got "
                             f"{eager_calls!r}")
        self.model = model
        self.device = check_device(device) if device is not None else _model_device(model)
        self.graph, self.verify, self.on_stale = graph, verify, on_stale
        self.dtype = plan_dtype(dtype)
        self.max_plans = int(max_plans)
        self.plans = OrderedDict()
        self.eager_calls = eager_calls
        #: Calls run eagerly so far per shape without a plan (the most recent shapes only);
        #: a shape whose plan was dropped counts as None: eager from then on.
        self.eager_counts = OrderedDict()
        #: How many plans were built, and how many of those because weights changed.
        self.builds = self.rebuilds = 0

    def plan(self, input_shape):
        """The plan for ``input_shape`` at the current matmul precision, built (or rebuilt
        if stale) when needed."""
        shape = (tuple(int(s) for s in input_shape), settings.matmul_precision)
        plan = self.plans.get(shape)     # (the dtype is the CompiledModel's own)
        if plan is not None and plan.stale:
            if self.on_stale == "error":
                raise StalePlanError("compiled model: the weights changed since its plans were "
                                     "built (on_stale='error'); call invalidate() to rebuild")
            self.invalidate()       # every plan is stale at once: the counter is global
            self.rebuilds += 1
            plan = None
        if plan is None:
            plan = InferencePlan(self.model, shape[0], self.device, self.graph, self.verify,
                                 self.dtype)
            self.builds += 1
            self.plans[shape] = plan
            while len(self.plans) > self.max_plans:
                dropped, old_plan = self.plans.popitem(last=False)
                old_plan.close()
                if self.eager_calls:
                    self._count_eager(dropped, None)
        else:
            self.plans.move_to_end(shape)
        return plan

    def __call__(self, x):
        shape = (tuple(x.shape), settings.matmul_precision)
        plan = self.plans.get(shape)
        if plan is None and self.eager_calls:
            count = self.eager_counts.get(shape, 0)
            if count is None or count < self.eager_calls:
                self._count_eager(shape, None if count is None else count + 1)
                return self._run_eagerly(x)
        if plan is None or plan.version != weights_version():
            plan = self.plan(shape[0])
            self.eager_counts.pop(shape, None)
        else:
            self.plans.move_to_end(shape)
        return plan(x)

    def _count_eager(self, shape, count):
        """Record ``shape``'s eager calls so far (None: eager for good), forgetting the
        oldest shapes past 8 * max_plans."""
        self.eager_counts.pop(shape, None)
        self.eager_counts[shape] = count
        while len(self.eager_counts) > 8 * self.max_plans:
            self.eager_counts.popitem(last=False)

    def _run_eagerly(self, x):
        """The model's own forward of ``x`` on the plans' device, packed as a plan packs
        its outputs (16-bit results widened to float32)."""
        x = x.to(self.device) if isinstance(x, Tensor) else Tensor(
            np.asarray(x, np.float32), device=self.device)
        with no_grad(), autocast(self.dtype, enabled=self.dtype is not None):
            y = self.model(x)
        widen = (lambda t: cast(t, FLOAT32)) if self.dtype is not None else (lambda t: t)
        if isinstance(y, Tensor):
            return widen(y)
        outputs = [widen(t) for t in y]
        return outputs if isinstance(y, list) else tuple(outputs)

    def invalidate(self):
        """Drop every plan (the next call builds afresh)."""
        for plan in self.plans.values():
            plan.close()
        self.plans.clear()

    close = invalidate

    def __repr__(self):
        return (f"CompiledModel({type(self.model).__name__} on {self.device!r}, plans for "
                f"{list(self.plans)})")


def compile(model, input_shape=None, device=None, graph=True, verify=True,  # noqa: A001
            on_stale="rebuild", max_plans=8, dtype=None, eager_calls=0):
    """Compile ``model`` (in eval mode) for inference; returns a :class:`CompiledModel`.

    ``input_shape``, if given, builds that plan at once (others are built on
    first use). ``dtype``: None or "fp32" (float32), "bf16" or "fp16": the
    plan then computes under :func:`gdnflow.autocast` of that dtype, its batch
    norms folded in float32 first and its products' weights rounded once at
    build; it takes and returns float32 tensors (docs/precision.md). See
    ``docs/inference.md`` for what a plan does and :class:`CompiledModel` and
    :class:`InferencePlan` for the options.
    """
    _check_eval_mode(model)
    compiled = CompiledModel(model, device, graph, verify, on_stale, max_plans, dtype,
                             eager_calls)
    if input_shape is not None:
        compiled.plan(input_shape)
    return compiled
