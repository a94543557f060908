"""Inference plans: a model traced once, batch norm folded, activations and residual
adds fused, every buffer planned ahead, and on the GPU the whole forward replayed as
one CUDA graph.

::

    compiled = gdnflow.inference.compile(model.eval(), (1, 3, 224, 224))
    y = compiled(x)     # a Tensor on a buffer the plan owns: the next call overwrites it

:func:`compile` returns a :class:`CompiledModel`, which keeps one
:class:`InferencePlan` per input shape (a new shape builds a new plan).
Building a plan:

1. **Trace.** The model runs once under ``no_grad`` on its device, with
   :func:`gdnflow.autograd.trace` reporting each operator application, so
   that it is recorded: the operator, the values it
   read (the input, earlier results, or constants: parameters, buffers,
   tensors made inside ``forward``) and the value it produced. The plan is the
   sequence of operators this input shape took: Python control flow in
   ``forward`` is frozen, and a tensor that ``forward`` creates is frozen as a
   constant (with a warning when it is not a parameter or buffer).
2. **Rewrite.** Steps that read only constants (weights) are evaluated
   once and become constants; so does the reparameterisation that a GDN
   operator applies to its stored beta and gamma (the step then takes the
   effective values, see :func:`fold_constants`). Then
   three local passes, each fusing a producer into its only consumer (a value
   that something else also reads, or that the model returns, is never
   fused away):

   - ``conv2d -> batch_norm`` (inference mode): the convolution gets
     ``weight * s`` and ``(bias - mean) * s + beta``, s = gamma / sqrt(var + eps)
     (:func:`gdnflow.ops.fold_batch_norm`, in float64, into new arrays);
   - ``conv2d -> add`` of a value of the same shape: the convolution's fused
     ``residual`` (the inverted residual blocks' skip connection);
   - ``conv2d -> relu / relu6 / clamp(0, 6)``: the convolution's fused
     ``activation``, applied after bias and residual as in its epilogue.

   Results nothing reads are dropped.
3. **Memory (GPU).** The rewritten program runs once to warm up (kernels
   compile, the convolution planner decides, the cuBLAS handle is made, and
   the filter transforms of the constant weights, Winograd's U and the
   sub-pixel rewrite's weight, are made once into a cache the plan keeps:
   every later run, the capture included, reads them through
   :func:`gdnflow.ops.winograd.frozen_weights`, so replays never transform
   a filter; ``stats["derived_weight_bytes"]`` is their size), then
   once more with the runtime's memory pool replaced by a recorder that notes,
   for every allocation, its size and when Python freed it: the buffers'
   lifetimes in allocation order. :func:`plan_memory` places every buffer at an
   offset of one arena (greedy by size, first fit) so that buffers whose
   lifetimes overlap never share bytes; the arena is allocated once.
4. **Capture (GPU).** The program runs a third time with the pool replaced by
   the plan: each allocation gets its planned arena address, in the recorded
   order (a different sequence is an error, never a silent misplacement), so
   nothing allocates while :class:`~gdnflow.backends.cuda.graphs.CudaGraph`
   captures the launches. The input lives in a static buffer of the plan.
   The first replay is checked against the traced (unfused) model's output.

Why explicit buffers rather than a warm pool: replaying a graph captured from
pool blocks is only safe while the pool hands no one else those blocks, which
nothing enforces; the plan's arena belongs to the plan alone, its size is
known when it is built (``stats["arena_bytes"]``), and lifetimes let
MobileNetV2's or VGG16's activations share a few buffers instead of one each.

Stale weights. Plans copy and fold the weights, and a CUDA graph holds their
addresses, so a plan must not run after the model's weights changed. Each
plan keeps :func:`gdnflow.nn.module.weights_version` from when it was built,
and every call compares it with the current one (one integer comparison):
``Module.to``/``load_state_dict``/attribute assignment/``train()``,
``Optimizer.step`` and ``io.load_checkpoint`` all advance it. A stale
:class:`InferencePlan` refuses to run (:class:`StalePlanError`); a
:class:`CompiledModel` rebuilds (``on_stale="rebuild"``, the default) or
refuses (``on_stale="error"``). Code that writes into a weight's array by
hand must call :func:`gdnflow.nn.module.weights_changed`. The counter is
process-wide, so a change to any model (building one counts) makes every
plan rebuild once: coarse, but never stale.

Threads: tracing and capture change process-wide state (autograd's trace
hook, the runtime's allocator) for their duration; build plans while no other thread
runs gdnflow operations.
"""
import contextlib
import dataclasses
import functools
import gc
import math
import time
import warnings
from collections import OrderedDict

import numpy as np

from gdnflow import autograd
from gdnflow.autograd import Operator, no_grad
from gdnflow.backends import check_device, default_device
from gdnflow.errors import GdnflowError, ShapeError
from gdnflow.nn.module import weights_version
from gdnflow.tensor import Tensor
from gdnflow.testing import relative_error

#: Arena offsets are multiples of this (cudaMalloc's own alignment; cuBLAS
#: and the vectorised kernels need at least 16 bytes).
ALIGNMENT = 256
#: The build checks its first result against the traced model within this
#: relative error (max |plan - model| / max |model|). Folding changes rounding
#: by about 1e-6; a wrong plan is off by order 1.
VERIFY_TOLERANCE = 1e-3


class PlanError(GdnflowError, RuntimeError):
    """An inference plan could not be built, or did not reproduce the model."""


class StalePlanError(PlanError):
    """A plan was called after the weights it was built from changed."""


# ----------------------------------------------------------------- program --
@dataclasses.dataclass
class Step:
    """One operator application of a program: ``values[output] = call(*values[inputs])``.

    ``call`` is the traced operator object, or a :class:`FusedConv`; ``name``
    names the operator and ``fused`` what was folded into it.
    """

    call: object
    inputs: tuple
    output: int
    name: str
    fused: tuple = ()


@dataclasses.dataclass(frozen=True)
class FusedConv:
    """conv2d with what the rewrite passes fused into it, run by :func:`gdnflow.ops.conv2d`.

    Inputs in the order x, w, then b if ``has_bias``, then the residual if
    ``has_residual``. ``activation`` is None, "relu" or "relu6".
    """

    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    activation: object = None
    has_bias: bool = False
    has_residual: bool = False

    def __call__(self, x, w, *extras):
        from gdnflow import ops
        b = extras[0] if self.has_bias else None
        residual = extras[-1] if self.has_residual else None
        return ops.conv2d(x, w, b, self.stride, self.padding, self.dilation, self.groups,
                          activation=self.activation, residual=residual)

    @classmethod
    def of(cls, call):
        """The FusedConv computing what ``call`` (a traced conv2d operator or a FusedConv) does."""
        if isinstance(call, FusedConv):
            return call
        from gdnflow.ops.conv import ACTIVATIONS    # name -> the code the operator stores
        names = {code: name for name, code in ACTIVATIONS.items() if name != "none"}
        return cls(call.stride, call.padding, call.dilation, call.groups,
                   names[call.activation], call.has_bias, call.has_residual)


class Program:
    """A straight-line sequence of :class:`Step` over numbered values.

    Value ``input_value`` is the model's input; ``constants`` maps values to
    the tensors they always hold; ``outputs`` are the values returned, packed
    as one tensor (``output_kind == "tensor"``) or a tuple or list;
    ``shapes`` records every value's shape from the trace.
    """

    def __init__(self, steps, constants, input_value, outputs, output_kind, shapes):
        self.steps = list(steps)
        self.constants = dict(constants)
        self.input_value = input_value
        self.outputs = tuple(outputs)
        self.output_kind = output_kind
        self.shapes = dict(shapes)
        self.refresh()

    def refresh(self):
        """Recompute, after a rewrite, which values each step lets go of.

        A value is dropped right after its last reader, so that its memory
        returns to the pool (and, when planning, its lifetime ends) there.
        """
        last = {}
        for index, step in enumerate(self.steps):
            for v in step.inputs:
                last[v] = index
            last.setdefault(step.output, index)
        keep = set(self.outputs) | set(self.constants)
        self.dead_after = [[] for _ in self.steps]
        for v, index in last.items():
            if v not in keep:
                self.dead_after[index].append(v)
        self.constants = {v: t for v, t in self.constants.items()
                          if v in last or v in self.outputs}

    def uses(self):
        """{value: how many step inputs and program outputs read it}."""
        count = {}
        for step in self.steps:
            for v in step.inputs:
                count[v] = count.get(v, 0) + 1
        for v in self.outputs:
            count[v] = count.get(v, 0) + 1
        return count

    def run(self, x):
        """The output tensors (a list, in ``outputs`` order) for the input tensor ``x``."""
        env = dict(self.constants)
        env[self.input_value] = x
        for step, dead in zip(self.steps, self.dead_after):
            call = step.call
            env[step.output] = call(*[env[v] for v in step.inputs])
            if isinstance(call, Operator):
                # The traced operator object is reused on every run: let go of
                # whatever it kept for a backward that never comes, or it would
                # hold a buffer until the next run.
                call.release()
            for v in dead:
                del env[v]
        return [env[v] for v in self.outputs]

    def pack(self, tensors):
        """``tensors`` (one per output value) in the model's output structure."""
        if self.output_kind == "tensor":
            return tensors[0]
        return tuple(tensors) if self.output_kind == "tuple" else list(tensors)

    def describe(self):
        """One line per step: the operator, what was fused into it, the output shape."""
        lines = []
        for step in self.steps:
            fused = "".join(f"+{f}" for f in step.fused)
            lines.append(f"{step.name}{fused} -> {self.shapes.get(step.output)}")
        return "\n".join(lines)


# ------------------------------------------------------------------- trace --
class _Tracer:
    """Records operator applications as :class:`Step` objects over numbered values.

    Values are told apart by the identity of their Tensor objects (and of
    their backend arrays, so that another wrapper of a traced array is the
    same value, not a constant). Every traced tensor is kept alive until the
    trace ends, so that no id is reused for another object meanwhile.
    """

    def __init__(self):
        self.steps = []
        self.by_tensor = {}
        self.by_array = {}
        self.constants = {}
        self.shapes = {}
        self.alive = []

    def new_value(self, tensor):
        v = len(self.shapes)
        self.by_tensor[id(tensor)] = v
        self.by_array[id(tensor.data)] = v
        self.shapes[v] = tuple(tensor.shape)
        self.alive.append(tensor)
        return v

    def value_of(self, tensor):
        v = self.by_tensor.get(id(tensor))
        if v is None:
            v = self.by_array.get(id(tensor.data))
            if v is not None:
                self.by_tensor[id(tensor)] = v
                self.alive.append(tensor)
            else:
                v = self.new_value(tensor)
                self.constants[v] = tensor
        return v

    def record(self, op, inputs, output):
        values = tuple(self.value_of(t) for t in inputs)
        self.steps.append(Step(op, values, self.new_value(output), op.label))


def _flatten_outputs(result):
    """(list of output tensors, "tensor" | "tuple" | "list") of what a model returned."""
    if isinstance(result, Tensor):
        return [result], "tensor"
    if isinstance(result, (tuple, list)) and all(isinstance(t, Tensor) for t in result):
        return list(result), "tuple" if isinstance(result, tuple) else "list"
    raise PlanError(f"compile: the model must return a Tensor or a tuple/list of Tensors, "
                    f"got {type(result).__name__}")


def trace(model, x):
    """Run ``model(x)`` under no_grad, recording its operators: (Program, model output list)."""
    tracer = _Tracer()
    input_value = tracer.new_value(x)
    with no_grad(), autograd.trace(tracer.record):
        result = model(x)
    outputs, kind = _flatten_outputs(result)
    output_values = [tracer.value_of(t) for t in outputs]
    state = {id(t) for t in list(model.parameters()) + list(model.buffers())}
    foreign = [tracer.shapes[v] for v, t in tracer.constants.items() if id(t) not in state]
    if foreign:
        warnings.warn(f"compile: {len(foreign)} tensor(s) that are neither parameters nor "
                      f"buffers of the model (shapes {foreign[:4]}) are frozen into the plan "
                      "as constants", stacklevel=3)
    program = Program(tracer.steps, tracer.constants, input_value, output_values, kind,
                      tracer.shapes)
    return program, outputs


# ----------------------------------------------------------------- rewrite --
def _op_types():
    """The operator classes the passes recognise (imported late: ops imports Tensor)."""
    from gdnflow.ops.batchnorm import BatchNorm
    from gdnflow.ops.conv import Conv2d
    from gdnflow.ops.elementwise import Add, Clamp, ReLU, ReLU6
    return Conv2d, BatchNorm, Add, ReLU, ReLU6, Clamp


def _conv_of(step):
    """The FusedConv form of ``step`` if it is a convolution, else None."""
    conv_type = _op_types()[0]
    if isinstance(step.call, FusedConv) or type(step.call) is conv_type:
        return FusedConv.of(step.call)
    return None


def _activation_of(step):
    """The activation ``step`` applies ("relu" or "relu6", also as a clamp), else None."""
    _, _, _, relu, relu6, clamp = _op_types()
    kind = type(step.call)
    if kind is relu:
        return "relu"
    if kind is relu6:
        return "relu6"
    if kind is clamp:
        low, high = step.call.params
        if low == 0 and high == 6:
            return "relu6"
        if low == 0 and high == math.inf:
            return "relu"
    return None


def _fuse_pass(program, match):
    """Apply ``match`` to every step; it may fuse the step with the producer of one of its inputs.

    ``match(step, producer_of, uses)`` returns None or (index of the producer
    to delete, the Step replacing ``step``). A producer already touched in
    this pass is left alone.
    """
    producer_of = {step.output: i for i, step in enumerate(program.steps)}
    uses = program.uses()
    steps, touched, count = list(program.steps), set(), 0
    for i, step in enumerate(program.steps):
        found = match(step, producer_of.get, uses)
        if found is None:
            continue
        j, replacement = found
        if j in touched:
            continue
        steps[i], steps[j] = replacement, None
        touched.update((i, j))
        count += 1
    program.steps = [s for s in steps if s is not None]
    program.refresh()
    return count


def _single_use_conv(program, value, producer_of, uses):
    """(index, step, FusedConv) of the convolution producing ``value`` if only one step reads it."""
    j = producer_of(value)
    if j is None or uses.get(value, 0) != 1:
        return None
    conv = _conv_of(program.steps[j])
    return None if conv is None else (j, program.steps[j], conv)


def fold_batch_norms(program):
    """conv2d -> batch_norm (inference) becomes one conv2d with folded weights; returns a count."""
    from gdnflow.ops.batchnorm import fold_batch_norm
    batch_norm_type = _op_types()[1]

    def match(step, producer_of, uses):
        op = step.call
        if type(op) is not batch_norm_type or op.training:
            return None
        found = _single_use_conv(program, step.inputs[0], producer_of, uses)
        if found is None:
            return None
        j, conv_step, conv = found
        if conv.activation or conv.has_residual:
            return None
        x, w = conv_step.inputs[:2]
        b = conv_step.inputs[2] if conv.has_bias else None
        gamma, beta = step.inputs[1], step.inputs[2]
        constants = program.constants
        if any(v not in constants for v in (w, gamma, beta) + ((b,) if b is not None else ())):
            return None     # folding needs the weights to be constants
        weight = constants[w]
        folded_w, folded_b = fold_batch_norm(
            weight, None if b is None else constants[b], constants[gamma], constants[beta],
            op.running_mean, op.running_var, op.eps)
        w2, b2 = _new_constant(program, folded_w, weight), _new_constant(program, folded_b, weight)
        fused = dataclasses.replace(conv, has_bias=True)
        return j, Step(fused, (x, w2, b2), step.output, "conv2d",
                       conv_step.fused + ("batch_norm",))

    return _fuse_pass(program, match)


def fuse_residuals(program):
    """conv2d -> add(., r) of equal shapes becomes conv2d(residual=r); returns the count."""
    add_type = _op_types()[2]

    def match(step, producer_of, uses):
        if type(step.call) is not add_type or len(step.inputs) != 2:
            return None
        a, b = step.inputs
        shape = program.shapes[step.output]
        if program.shapes[a] != shape or program.shapes[b] != shape or a == b:
            return None     # a broadcasting add is not the epilogue's residual
        candidates = []
        for value, other in ((a, b), (b, a)):
            found = _single_use_conv(program, value, producer_of, uses)
            if found and not found[2].activation and not found[2].has_residual:
                candidates.append((found, other))
        if not candidates:
            return None
        # Either operand may be the residual (addition commutes); fuse into the later conv.
        (j, conv_step, conv), other = max(candidates, key=lambda c: c[0][0])
        fused = dataclasses.replace(conv, has_residual=True)
        return j, Step(fused, conv_step.inputs + (other,), step.output, "conv2d",
                       conv_step.fused + ("residual",))

    return _fuse_pass(program, match)


def fuse_activations(program):
    """conv2d -> relu / relu6 / clamp(0, 6) becomes conv2d(activation=...); returns the count."""
    def match(step, producer_of, uses):
        activation = _activation_of(step)
        if activation is None:
            return None
        found = _single_use_conv(program, step.inputs[0], producer_of, uses)
        if found is None or found[2].activation:
            return None
        j, conv_step, conv = found
        fused = dataclasses.replace(conv, activation=activation)
        return j, Step(fused, conv_step.inputs, step.output, "conv2d",
                       conv_step.fused + (activation,))

    return _fuse_pass(program, match)


def drop_unused(program):
    """Remove steps whose results nothing reads (inference operators have no side effects)."""
    needed = set(program.outputs)
    kept = []
    for step in reversed(program.steps):
        if step.output in needed:
            kept.append(step)
            needed.update(step.inputs)
    removed = len(program.steps) - len(kept)
    program.steps = kept[::-1]
    program.refresh()
    return removed


def _new_constant(program, array, like):
    """A new constant value holding ``array`` on the device of tensor ``like``."""
    return _add_constant(program, Tensor(array, device=like.device, dtype=like.dtype))


def _add_constant(program, tensor):
    """A new constant value holding ``tensor``."""
    v = max(program.shapes) + 1
    program.constants[v] = tensor
    program.shapes[v] = tuple(tensor.shape)
    return v


def fold_constants(program):
    """Evaluate once, at build time, every step whose inputs are all constants; returns the count.

    Such steps compute from weights alone: their results become constants
    of the plan. A GDN operator that takes stored beta and gamma
    (``ops.gdn(..., parametrized=...)``, as the GDN layer calls it) computes
    their effective values inside; with both constant, those two values are
    evaluated here (counted as two) and the step becomes a GDN of the
    effective values.
    """
    from gdnflow.ops.gdn import GDNOperator
    constants = program.constants
    count, steps = 0, []
    with no_grad():
        for step in program.steps:
            if all(v in constants for v in step.inputs):
                value = step.call(*[constants[v] for v in step.inputs])
                if isinstance(step.call, Operator):
                    step.call.release()
                constants[step.output] = value
                count += 1
                continue
            op = step.call
            if (type(op) is GDNOperator and op.parametrized is not None
                    and step.inputs[1] in constants and step.inputs[2] in constants):
                x, beta, gamma = step.inputs
                plain, beta_eff, gamma_eff = op.fold_parameters(constants[beta],
                                                                constants[gamma])
                step = dataclasses.replace(step, call=plain, inputs=(
                    x, _add_constant(program, beta_eff), _add_constant(program, gamma_eff)))
                count += 2
            steps.append(step)
    program.steps = steps
    program.refresh()
    return count


def optimize(program):
    """Run every rewrite pass in order; returns {pass name: how many rewrites it made}."""
    return {"folded_constants": fold_constants(program),
            "folded_batch_norm": fold_batch_norms(program),
            "fused_residual": fuse_residuals(program),
            "fused_activation": fuse_activations(program),
            "removed_unused": drop_unused(program)}


# ------------------------------------------------------------------ memory --
def plan_memory(sizes, freed_at, alignment=ALIGNMENT):
    """Offsets in one arena for buffers with known lifetimes: (offsets, arena bytes).

    Buffer i is allocated i-th and freed when ``freed_at[i]`` allocations had
    been made (None: never, i.e. after the last), so it is live during
    [i, freed_at[i]) in allocation order, and two buffers conflict when those
    intervals overlap. Greedy by size: the largest buffers are placed first,
    each at the lowest aligned offset where it overlaps no conflicting buffer
    already placed (first fit). Non-conflicting buffers may share bytes: on
    one stream, everything that used a freed buffer was enqueued before
    anything that uses its successor.
    """
    n = len(sizes)
    ends = [n if f is None else int(f) for f in freed_at]
    for i, end in enumerate(ends):
        if end <= i:
            raise ValueError(f"plan_memory: buffer {i} is freed at {end}, before it exists")
    padded = [max(alignment, -(-int(s) // alignment) * alignment) for s in sizes]
    offsets, placed = [0] * n, []
    for i in sorted(range(n), key=lambda k: (-padded[k], k)):
        busy = sorted((offsets[j], offsets[j] + padded[j]) for j in placed
                      if j < ends[i] and i < ends[j])
        offset = 0
        for start, end in busy:
            if offset + padded[i] <= start:
                break
            offset = max(offset, end)
        offsets[i] = offset
        placed.append(i)
    total = max((offsets[i] + padded[i] for i in range(n)), default=0)
    return offsets, total


class _RecordedBlock:
    """A pool allocation that tells the recorder when Python frees it."""

    __slots__ = ("recorder", "index", "block")

    def __init__(self, recorder, index, block):
        self.recorder, self.index, self.block = recorder, index, block

    def __int__(self):
        return int(self.block)

    def __del__(self):
        self.recorder.freed_at[self.index] = len(self.recorder.sizes)


class _RecordingPool:
    """Stands in for the runtime's pool: allocates from it and records sizes and lifetimes."""

    def __init__(self, pool):
        self.pool = pool
        self.sizes, self.freed_at = [], []

    def allocate(self, nbytes):
        index = len(self.sizes)
        self.sizes.append(int(nbytes))
        self.freed_at.append(None)
        return _RecordedBlock(self, index, self.pool.allocate(nbytes))


class _ArenaBlock:
    """An address inside the plan's arena; keeps the arena alive while an array uses it."""

    __slots__ = ("arena", "ptr")

    def __init__(self, arena, ptr):
        self.arena, self.ptr = arena, ptr

    def __int__(self):
        return self.ptr


class _ArenaPool:
    """Stands in for the runtime's pool during capture: the recorded allocations, in order."""

    def __init__(self, arena, offsets, sizes):
        self.arena, self.base = arena, int(arena)
        self.offsets, self.sizes = offsets, sizes
        self.count = 0

    def allocate(self, nbytes):
        i = self.count
        if i >= len(self.sizes) or int(nbytes) != self.sizes[i]:
            recorded = f"{self.sizes[i]} bytes" if i < len(self.sizes) else "nothing"
            raise PlanError(f"inference plan: allocation #{i} asks for {int(nbytes)} bytes but "
                            f"the recording run made {recorded} there; the forward does not "
                            "allocate the same way twice (a cache filled on first use?)")
        self.count += 1
        return _ArenaBlock(self.arena, self.base + self.offsets[i])


@contextlib.contextmanager
def _gc_paused():
    """No cyclic garbage collection within the block.

    During capture a collected device allocation that is not pooled would be
    freed with cuMemFree, which CUDA refuses while a capture runs.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# ------------------------------------------------------------------- plans --
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

    ``InferencePlan(model, input_shape, device=None, graph=True, verify=True)``
    builds it (see the module docstring); ``model`` must be in eval mode and
    all on ``device`` (by default the device of its parameters). ``graph``
    (GPU only): replay a CUDA graph from static buffers; False runs the
    optimised program operator by operator (for debugging, or models whose
    operators cannot be captured). ``verify``: check the first result
    against the traced model's (:data:`VERIFY_TOLERANCE`).

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

    def __init__(self, model, input_shape, device=None, graph=True, verify=True):
        started = time.perf_counter()
        _check_eval_mode(model)
        self.device = check_device(device) if device is not None else _model_device(model)
        if self.device != _model_device(model):
            raise PlanError(f"compile: the model is on {_model_device(model)!r}, not "
                            f"{self.device!r}; move it with model.to({self.device!r})")
        self.input_shape = tuple(int(s) for s in input_shape)
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
        self.stats["steps"] = len(self.program.steps)
        if self.device == "cuda" and graph:
            self._capture(x)
            first = self._outputs
            if verify:
                self.graph.replay()
        else:
            with no_grad():
                first = self.program.run(x)
        if verify:
            for i, (got, expected) in enumerate(zip(first, reference)):
                error = relative_error(got.numpy(), expected)
                if not error <= VERIFY_TOLERANCE:
                    self.close()
                    raise PlanError(f"inference plan: output {i} differs from the model's by "
                                    f"{error:.3g} (relative, max-norm); the plan is wrong")
        # Taken last: running the model's forward may itself assign attributes.
        self.version = weights_version()
        self.stats["build_seconds"] = time.perf_counter() - started

    # -------------------------------------------------------------- build --
    def _static_input(self, host):
        """The plan's own input buffer (outside the pool, so never handed to anyone else)."""
        import pycuda.driver as drv
        from gdnflow.backends.cuda.runtime import CudaArray, get_runtime
        allocation = drv.mem_alloc(max(host.nbytes, 4))
        self._input = CudaArray(self.input_shape, np.dtype(np.float32), allocation)
        # Bound once: __call__ is the hot path.
        self._stream = get_runtime().stream
        self._cuda_array = CudaArray
        self._copy_dtod, self._copy_htod = drv.memcpy_dtod_async, drv.memcpy_htod_async
        self._copy_htod(self._input.ptr, host, self._stream)
        return Tensor.wrap(self._input, "cuda")

    def _capture(self, x):
        """Warm-up run, recording run, memory plan, then the capture (module docstring, 3-4)."""
        import pycuda.driver as drv
        from gdnflow.backends.cuda.graphs import CudaGraph
        from gdnflow.backends.cuda.runtime import get_runtime
        from gdnflow.backends.cuda.weight_cache import frozen_weights
        runtime = get_runtime()
        self._derived_weights = {}
        # Every run below inside the plan's own frozen-weights cache: the warm-up
        # makes the filter transforms (from the pool, kept by the plan), the
        # recording run and the capture find them, so the graph has no
        # transform kernels and the arena no transformed filters.
        frozen = functools.partial(frozen_weights, self._derived_weights)
        with no_grad(), frozen():
            self.program.run(x)
            recorder = _RecordingPool(runtime.pool)
            with runtime.allocating_from(recorder):
                outputs = self.program.run(x)
            del outputs         # the outputs live to the end: freed after the last allocation
        sizes = recorder.sizes
        offsets, total = plan_memory(sizes, recorder.freed_at)
        self._arena = drv.mem_alloc(max(total, ALIGNMENT))
        arena_pool = _ArenaPool(self._arena, offsets, sizes)
        self.graph = CudaGraph(runtime.stream)
        try:
            with no_grad(), frozen(), runtime.allocating_from(arena_pool), _gc_paused():
                self._outputs = self.graph.capture(lambda: self.program.run(x))
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
        with no_grad():
            return self.program.pack(self.program.run(x))

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
    """A model's inference plans, one per input shape, rebuilt when its weights change.

    ``compiled(x)`` runs the plan for ``x.shape`` (building it on first use,
    see :class:`InferencePlan` for what the result is and how long it lasts).
    At most ``max_plans`` plans are kept (the least recently used goes
    first). ``on_stale``: "rebuild" (default) builds anew after the weights
    changed; "error" raises :class:`StalePlanError` instead. Options ``graph``
    and ``verify`` are passed to each :class:`InferencePlan`.
    """

    def __init__(self, model, device=None, graph=True, verify=True, on_stale="rebuild",
                 max_plans=8):
        if on_stale not in ("rebuild", "error"):
            raise ValueError(f"compile: on_stale must be 'rebuild' or 'error', got {on_stale!r}")
        self.model = model
        self.device = check_device(device) if device is not None else _model_device(model)
        self.graph, self.verify, self.on_stale = graph, verify, on_stale
        self.max_plans = int(max_plans)
        self.plans = OrderedDict()
        #: How many plans were built, and how many of those because weights changed.
        self.builds = self.rebuilds = 0

    def plan(self, input_shape):
        """The plan for ``input_shape``, built (or rebuilt if stale) when needed."""
        shape = tuple(int(s) for s in input_shape)
        plan = self.plans.get(shape)
        if plan is not None and plan.stale:
            if self.on_stale == "error":
                raise StalePlanError("compiled model: the weights changed since its plans were "
                                     "built (on_stale='error'); call invalidate() to rebuild")
            self.invalidate()       # every plan is stale at once: the counter is global
            self.rebuilds += 1
            plan = None
        if plan is None:
            plan = InferencePlan(self.model, shape, self.device, self.graph, self.verify)
            self.builds += 1
            self.plans[shape] = plan
            while len(self.plans) > self.max_plans:
                self.plans.popitem(last=False)[1].close()
        else:
            self.plans.move_to_end(shape)
        return plan

    def __call__(self, x):
        shape = tuple(x.shape)
        plan = self.plans.get(shape)
        if plan is None or plan.version != weights_version():
            plan = self.plan(shape)
        else:
            self.plans.move_to_end(shape)
        return plan(x)

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
            on_stale="rebuild", max_plans=8):
    """Compile ``model`` (in eval mode) for inference; returns a :class:`CompiledModel`.

    ``input_shape``, if given, builds that plan at once (others are built on
    first use). See the module docstring for what a plan does and
    :class:`CompiledModel` and :class:`InferencePlan` for the options.
    """
    _check_eval_mode(model)
    compiled = CompiledModel(model, device, graph, verify, on_stale, max_plans)
    if input_shape is not None:
        compiled.plan(input_shape)
    return compiled
