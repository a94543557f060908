"""Rewrite passes over a traced :class:`~gdnflow.inference.program.Program` (in place).

Each pass returns how many rewrites it made; :func:`optimize` runs them in
order. A pass never fuses away a value that another step also reads or that
the program returns, and folds only constants (weights):

- :func:`fold_constants`: steps reading only constants are evaluated once;
  GDN's reparameterisation of constant beta and gamma too;
- :func:`fold_batch_norms`: ``conv2d -> batch_norm`` (inference mode) becomes
  one conv2d with weight ``w * s`` and bias ``(b - mean) * s + beta``,
  ``s = gamma / sqrt(var + eps)``;
- :func:`fuse_residuals`: ``conv2d -> add`` of a value of the same shape
  becomes conv2d with a fused ``residual``;
- :func:`fuse_activations`: ``conv2d -> relu / relu6 / clamp(0, 6)`` becomes
  conv2d with a fused ``activation`` (applied after bias and residual);
- :func:`drop_unused`: steps whose results nothing reads are removed.
"""
import dataclasses
import math

from gdnflow.autograd import Operator, no_grad
from gdnflow.inference.program import FusedConv, Step
from gdnflow.ops.arithmetic import AddOp
from gdnflow.ops.batchnorm import BatchNormOp, fold_batch_norm
from gdnflow.ops.conv import Conv2dOp
from gdnflow.ops.elementwise import ClampOp, ReLUOp, ReLU6Op
from gdnflow.ops.gdn import GDNOp
from gdnflow.precision import FLOAT32
from gdnflow.tensor import Tensor


def _conv_of(step):
    """The FusedConv form of ``step`` if it is a convolution, else None."""
    if isinstance(step.call, FusedConv) or type(step.call) is Conv2dOp:
        return FusedConv.of(step.call)
    return None


def _activation_of(step):
    """The activation ``step`` applies ("relu" or "relu6", also as a clamp), else None."""
    kind = type(step.call)
    if kind is ReLUOp:
        return "relu"
    if kind is ReLU6Op:
        return "relu6"
    if kind is ClampOp:
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
    def match(step, producer_of, uses):
        op = step.call
        if type(op) is not BatchNormOp or op.training:
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
    def match(step, producer_of, uses):
        if type(step.call) is not AddOp or len(step.inputs) != 2:
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
            if (type(op) is GDNOp and op.parametrized is not None
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


def lower_weights(program, dtype):
    """Round, once at build time, every constant that only 16-bit products read; returns the count.

    For plans in bfloat16 or float16 (run under :func:`gdnflow.autocast`):
    the weights and biases of convolutions, ``linear`` and ``matmul`` (the
    operators whose ``autocast`` rule is "lower") are converted here instead
    of on every run. Batch norm is folded before (in float32).
    """
    readers = {}
    for step in program.steps:
        for v in step.inputs:
            readers.setdefault(v, []).append(step.call)
    count = 0
    for v, tensor in list(program.constants.items()):
        calls = readers.get(v)
        if calls and tensor.dtype == FLOAT32 and all(
                isinstance(c, FusedConv) or getattr(c, "autocast", None) == "lower"
                for c in calls):
            program.constants[v] = tensor.astype(dtype)
            count += 1
    return count


def optimize(program):
    """Run every rewrite pass in order; returns {pass name: how many rewrites it made}."""
    return {"folded_constants": fold_constants(program),
            "folded_batch_norm": fold_batch_norms(program),
            "fused_residual": fuse_residuals(program),
            "fused_activation": fuse_activations(program),
            "removed_unused": drop_unused(program)}
