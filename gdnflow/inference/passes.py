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
- :func:`batch_norms_as_affine`: a batch norm (inference) that no convolution
  took (one after a concatenation, as in DenseNet) becomes ``x * s + t``
  with per-channel constants, which the next pass joins to what follows;
- :func:`fuse_transposed_layer_norms`: ``transpose(0, 2, ..., 1) -> layer_norm``
  over the last axis becomes one channels-first layer norm;
- :func:`fuse_elementwise`: chains of elementwise operators (the unary maps
  and broadcasting arithmetic) of one output shape, linked through values
  nothing else reads, become one
  :class:`~gdnflow.ops.fused_elementwise.FusedElementwise` step, with the
  transposes that feed them folded into how they read their inputs;
- :func:`fuse_concatenations`: a concatenation that only such a step reads,
  as it lies, becomes that step's concatenated input (DenseNet: the batch
  norm and ReLU after each concatenation read the parts in place);
- :func:`fuse_pooled_concatenations`: a max pool of a concatenation along the
  channels that nothing else reads pools the parts in place (SqueezeNet's
  fire modules before each pool);
- :func:`drop_unused`: steps whose results nothing reads are removed.
"""
import dataclasses
import math

import numpy as np

from gdnflow.autograd import Operator, no_grad
from gdnflow.inference.program import FusedConv, Step
from gdnflow.ops.arithmetic import AddOp, MulOp
from gdnflow.ops.batchnorm import BatchNormOp, fold_batch_norm
from gdnflow.ops.conv import Conv2dOp
from gdnflow.ops.broadcast import broadcast_strides
from gdnflow.ops.elementwise import ClampOp, ReLUOp, ReLU6Op
from gdnflow.ops.fused_elementwise import (MAX_INPUTS, MAX_INSTRUCTIONS, ConcatInput,
                                           FusedElementwise, Instruction, concat_input_problem,
                                           fusible)
from gdnflow.ops.shape import ConcatOp, TransposeOp, contiguous_strides
from gdnflow.ops.gdn import GDNOp
from gdnflow.ops.layernorm import LayerNormOp
from gdnflow.ops.pool import FIXED_MAX_PARTS, MaxPool2dOp, MaxPoolOfConcat
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


def batch_norms_as_affine(program):
    """Each batch norm (inference) left after :func:`fold_batch_norms` becomes a multiply and
    an add by per-channel constants (the fold of an identity layer); returns the count."""
    steps, count = [], 0
    for step in program.steps:
        op = step.call
        if (type(op) is not BatchNormOp or op.training
                or any(v not in program.constants for v in step.inputs[1:3])):
            steps.append(step)
            continue
        x, gamma, beta = step.inputs
        shape, like = program.shapes[x], program.constants[gamma]
        scale, shift = fold_batch_norm(np.ones(shape[1], like.numpy().dtype), None,
                                       like, program.constants[beta], op.running_mean,
                                       op.running_var, op.eps)
        per_channel = (shape[1],) + (1,) * (len(shape) - 2)
        s = _new_constant(program, scale.reshape(per_channel), like)
        t = _new_constant(program, shift.reshape(per_channel), like)
        scaled = _new_value(program, shape)
        steps += [Step(MulOp(), (x, s), scaled, "mul", ("batch_norm",)),
                  Step(AddOp(), (scaled, t), step.output, "add", ("batch_norm",))]
        count += 1
    program.steps = steps
    program.refresh()
    return count


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


def fuse_transposed_layer_norms(program):
    """A layer norm over the last axis of a transpose that moved the channels (axis 1) last,
    the transpose read by nothing else, becomes a channels-first layer norm; a transpose
    moving its result's channels back to axis 1 then goes into it too. Returns the count."""
    def match(step, producer_of, uses):
        op = step.call
        if type(op) is not LayerNormOp or op.channels_first:
            return None
        x = step.inputs[0]
        j = producer_of(x)
        ndim = len(program.shapes[x])
        if (j is None or uses[x] != 1 or type(program.steps[j].call) is not TransposeOp
                or op.axis % ndim != ndim - 1 or ndim < 3
                or program.steps[j].call.perm != (0,) + tuple(range(2, ndim)) + (1,)):
            return None
        fused = LayerNormOp(-1, op.eps, channels_first=True)
        return j, Step(fused, (program.steps[j].inputs[0],) + tuple(step.inputs[1:]),
                       step.output, "layer_norm", ("transpose", "layer_norm"))

    def match_back(step, producer_of, uses):
        # A transpose moving the channels back to axis 1, of such a layer norm's result
        # read by nothing else: the layer norm writes channels first itself.
        if type(step.call) is not TransposeOp:
            return None
        y = step.inputs[0]
        j = producer_of(y)
        ndim = len(program.shapes[y])
        if j is None or uses[y] != 1 or step.call.perm != (0, ndim - 1) + tuple(range(1, ndim - 1)):
            return None
        op = program.steps[j].call
        if type(op) is not LayerNormOp or not op.channels_first or op.channels_out_first:
            return None
        fused = LayerNormOp(-1, op.eps, channels_first=True, channels_out_first=True)
        return j, Step(fused, program.steps[j].inputs, step.output, "layer_norm",
                       program.steps[j].fused + ("transpose",))

    return _fuse_pass(program, match) + _fuse_pass(program, match_back)


class _Node:
    """One instruction of a chain being fused: a traced operator and its operands, each
    an input key (value, strides) or another :class:`_Node`."""

    __slots__ = ("call", "operands")

    def __init__(self, call, operands):
        self.call, self.operands = call, list(operands)


class _Chain:
    """Elementwise steps being fused, ending at one step (``root``): a DAG of
    :class:`_Node`, whose leaves read values through element strides over the
    chain's output shape, and the steps it replaces (``members``)."""

    def __init__(self, shape, root, member):
        self.shape, self.root, self.members = shape, root, {member}

    def nodes(self):
        """The nodes in an order where each comes after its operands."""
        order, seen = [], set()

        def visit(node):
            if id(node) in seen:
                return
            seen.add(id(node))
            for operand in node.operands:
                if isinstance(operand, _Node):
                    visit(operand)
            order.append(node)
        visit(self.root)
        return order

    def inputs(self):
        """The (value, strides) keys the nodes read, in first-read order."""
        keys = []
        for node in self.nodes():
            keys += [k for k in node.operands if not isinstance(k, _Node) and k not in keys]
        return keys

    def reads(self, key):
        """How many operands of the chain read input ``key``."""
        return sum(operand == key for node in self.nodes() for operand in node.operands)

    def fused(self):
        """The :class:`FusedElementwise` of the chain."""
        nodes, keys = self.nodes(), self.inputs()
        register = {id(node): len(keys) + t for t, node in enumerate(nodes)}
        return FusedElementwise(self.shape, [strides for _, strides in keys], [
            Instruction(node.call, tuple(register[id(k)] if isinstance(k, _Node)
                                         else keys.index(k) for k in node.operands))
            for node in nodes])


def _transposed(root, perm):
    """Copies of the nodes under ``root`` whose inputs are read through the transpose ``perm``
    of their output."""
    copies = {}

    def copy(node):
        if id(node) not in copies:
            copies[id(node)] = _Node(node.call, [
                copy(k) if isinstance(k, _Node) else (k[0], tuple(k[1][p] for p in perm))
                for k in node.operands])
        return copies[id(node)]
    return copy(root)


def fuse_elementwise(program):
    """Fuse chains of elementwise steps into one step each; returns how many steps it removed.

    A fusible step (:func:`~gdnflow.ops.fused_elementwise.fusible`) joins the
    chain of each input that another fusible step of the same output shape
    produced, where every reader of that value is in the chain (a value read
    twice inside the chain is computed once). An input that a transpose made,
    read by nothing else, is read through the transpose instead (the
    transpose step goes); a transposed chain joins with its inputs' strides
    permuted. A chain stays within the kernel's limits; a chain of one
    operator and no transpose stays as it was.
    """
    steps = program.steps
    producer_of = {step.output: i for i, step in enumerate(steps)}
    uses = program.uses()
    chains, absorbed = {}, set()
    for i, step in enumerate(steps):
        if not fusible(step.call):
            continue
        shape = program.shapes[step.output]
        before = set(absorbed)
        node = _Node(step.call, [])
        chain = _Chain(shape, node, i)
        for v in step.inputs:
            node.operands.append(_operand(chain, v, program, producer_of, uses, chains, absorbed))
        # Inputs made by a chain of this shape that only this chain reads: fold them in
        # (again after each: a folded chain may read what the rest of this one reads).
        while _fold_one(chain, program, producer_of, uses, chains, absorbed):
            pass
        if len(chain.inputs()) > MAX_INPUTS or len(chain.nodes()) > MAX_INSTRUCTIONS:
            # Its own operands did not fit beside what it took in: it takes nothing in.
            absorbed.intersection_update(before)
            chain = _Chain(shape, _Node(step.call, [
                (v, tuple(broadcast_strides(shape, program.shapes[v]))) for v in step.inputs]), i)
        chains[i] = chain
    removed = set()
    for i, chain in chains.items():
        if i in absorbed or len(chain.members) < 2:
            continue
        step = steps[i]
        fused = chain.fused()
        names = tuple(steps[j].name for j in sorted(chain.members))
        steps[i] = Step(fused, tuple(v for v, _ in chain.inputs()), step.output,
                        "fused_elementwise", names)
        removed |= chain.members - {i}
    program.steps = [s for j, s in enumerate(steps) if j not in removed]
    program.refresh()
    return len(removed)


def _fold_one(chain, program, producer_of, uses, chains, absorbed):
    """Fold into ``chain`` one chain whose result only ``chain`` reads; whether it did."""
    contiguous = tuple(contiguous_strides(chain.shape))
    for key in chain.inputs():
        j = producer_of.get(key[0])
        if (j in chains and j not in absorbed and program.shapes[key[0]] == chain.shape
                and key[1] == contiguous and chain.reads(key) == uses[key[0]]
                and _fits(chain, chains[j], replacing=key)):
            _substitute(chain, key, chains[j].root)
            chain.members |= chains[j].members
            absorbed.add(j)
            return True
    return False


def _fits(chain, other, replacing=None):
    """Whether ``chain`` with ``other`` merged in (for its input ``replacing``, if given)
    stays within the kernel's limits."""
    keys = (set(chain.inputs()) - {replacing}) | set(other.inputs())
    return (len(keys) <= MAX_INPUTS
            and len(chain.nodes()) + len(other.nodes()) <= MAX_INSTRUCTIONS)


def _substitute(chain, key, node):
    """Make every operand of ``chain`` reading input ``key`` read ``node`` instead."""
    for n in chain.nodes():
        n.operands = [node if operand == key else operand for operand in n.operands]


def _operand(chain, value, program, producer_of, uses, chains, absorbed):
    """The operand of ``chain``'s root for input ``value``: a read through a transpose
    (or the transposed chain behind it), else a plain (broadcast) read; chains read
    plainly are folded in afterwards."""
    steps = program.steps
    j = producer_of.get(value)
    if j is not None and uses[value] == 1 and type(steps[j].call) is TransposeOp:
        perm, source = steps[j].call.perm, steps[j].inputs[0]
        absorbed.add(j)
        chain.members.add(j)
        k = producer_of.get(source)
        if (k in chains and k not in absorbed and uses[source] == 1
                and program.shapes[value] == chain.shape):
            moved = _Chain(chain.shape, _transposed(chains[k].root, perm), k)
            if _fits(chain, moved):
                absorbed.add(k)
                chain.members |= chains[k].members
                return moved.root
        strides = contiguous_strides(program.shapes[source])
        return (source, tuple(broadcast_strides(chain.shape, program.shapes[value],
                                                [strides[p] for p in perm])))
    return (value, tuple(broadcast_strides(chain.shape, program.shapes[value])))


def fuse_concatenations(program):
    """A concatenation read only by a fused elementwise step, contiguously and at the step's
    shape, becomes the step's concatenated input (:class:`ConcatInput`: the kernel reads
    the parts, and the concatenated tensor is never made); returns the count."""
    def match(step, producer_of, uses):
        fused = step.call
        if not isinstance(fused, FusedElementwise) or fused.concat is not None:
            return None
        for r, v in enumerate(step.inputs):
            j = producer_of(v)
            if j is None or uses[v] != 1 or type(program.steps[j].call) is not ConcatOp:
                continue
            parts, axis = program.steps[j].inputs, program.steps[j].call.axis % len(fused.shape)
            widths = tuple(program.shapes[p][axis] for p in parts)
            if program.shapes[v] != fused.shape or concat_input_problem(
                    fused.shape, fused.strides, r, axis, widths) is not None:
                continue
            concat = ConcatInput(r, axis, widths, program.steps[j].call)
            replacement = FusedElementwise(fused.shape, fused.strides, fused.instructions, concat)
            return j, Step(replacement, step.inputs[:r] + step.inputs[r + 1:] + tuple(parts),
                           step.output, step.name, ("concat",) + step.fused)
        return None

    return _fuse_pass(program, match)


def fuse_pooled_concatenations(program):
    """A max pool (inference) of a concatenation along the channels of at most
    :data:`~gdnflow.ops.pool.FIXED_MAX_PARTS` parts, read by nothing else, with a window
    the fixed-window kernel is built for, becomes a :class:`MaxPoolOfConcat` reading the
    parts (the concatenated tensor is never made); returns the count."""
    def match(step, producer_of, uses):
        if type(step.call) is not MaxPool2dOp or not step.call.fixed_window():
            return None
        v = step.inputs[0]
        j = producer_of(v)
        if j is None or uses[v] != 1 or type(program.steps[j].call) is not ConcatOp:
            return None
        concat = program.steps[j]
        if (len(program.shapes[v]) != 4 or concat.call.axis % 4 != 1
                or not 1 < len(concat.inputs) <= FIXED_MAX_PARTS):
            return None
        return j, Step(MaxPoolOfConcat(step.call, concat.call), concat.inputs, step.output,
                       "max_pool2d", ("concat", "max_pool2d"))

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


def _new_value(program, shape):
    """A new value number, of ``shape``."""
    v = max(program.shapes) + 1
    program.shapes[v] = tuple(shape)
    return v


def _add_constant(program, tensor):
    """A new constant value holding ``tensor``."""
    v = _new_value(program, tensor.shape)
    program.constants[v] = tensor
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
            "batch_norm_as_affine": batch_norms_as_affine(program),
            "fused_transposed_layer_norm": fuse_transposed_layer_norms(program),
            "fused_elementwise": fuse_elementwise(program),
            "fused_concatenation": fuse_concatenations(program),
            "fused_pooled_concatenation": fuse_pooled_concatenations(program),
            "removed_unused": drop_unused(program)}
