"""Operators and reverse-mode differentiation.

An :class:`Operator` instance is one application of an operation. Calling it
checks the inputs, runs ``forward_numpy`` or ``forward_cuda`` (chosen once,
here, by the inputs' device) and, if any input requires a gradient, becomes
the node of the graph that produced the output. A node keeps only what its
backward needs: the producing nodes (or leaf tensors) of its inputs, their
shapes, and the arrays the operator chose to save; it never holds its input
tensors themselves, so activations no backward needs are freed at once.

:func:`backward` sorts the graph iteratively (no recursion limit on deep
networks), calls each node's ``backward`` once, in reverse topological order,
adds gradients with ``+`` where a value feeds several operations, and frees
each node's saved arrays as soon as it has been used.

Gradient hooks: :func:`on_gradient_ready` asks for a call when a leaf's
``.grad`` is complete during a backward (every node that consumes the leaf has
added its share), :func:`on_backward_end` for a call when a backward returns.
Data-parallel training starts each bucket's all-reduce this way, while the
rest of the backward runs. Without hooks, backward does no extra work.

:func:`trace` reports every outermost operator application to a callback
(inference plans record a model's forward this way).
"""
import contextlib
import types
import weakref

from gdnflow import precision, registry
from gdnflow.errors import (DeviceLimitError, DeviceMismatchError, DTypeError, GraphFreedError,
                            ShapeError)
from gdnflow.tensor import Tensor

_grad_enabled = True
_active_trace = None        # the innermost trace() block's _Trace, or None
_gradient_hooks = {}        # id(leaf tensor) -> [(weak reference to the leaf, fn)]
_backward_end_hooks = {}    # handle key -> fn


class HookHandle:
    """What registering a hook returns: :meth:`remove` unregisters it."""

    __slots__ = ("_remove",)

    def __init__(self, remove):
        self._remove = remove

    def remove(self):
        """Unregister the hook (again: nothing)."""
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()


def on_gradient_ready(tensor, fn):
    """Call ``fn(tensor)`` during each backward once ``tensor.grad`` is complete.

    ``tensor`` is a leaf (a parameter). Complete means every operation of the
    graph that consumed it has added its contribution, so a parameter used
    twice fires once, after the second contribution; ``fn`` may read and
    replace ``tensor.grad``. A leaf the backward does not reach gets no call.
    The hook lives as long as ``tensor`` or until the returned
    :class:`HookHandle`'s ``remove()``.
    """
    key = id(tensor)
    entry = (weakref.ref(tensor, lambda _: _gradient_hooks.pop(key, None)), fn)
    _gradient_hooks.setdefault(key, []).append(entry)

    def remove():
        hooks = _gradient_hooks.get(key, [])
        if entry in hooks:
            hooks.remove(entry)
        if not hooks:
            _gradient_hooks.pop(key, None)
    return HookHandle(remove)


def on_backward_end(fn):
    """Call ``fn()`` when each :func:`backward` has finished (after the gradient-ready hooks).

    Returns a :class:`HookHandle`; ``remove()`` it when done.
    """
    key = object()
    _backward_end_hooks[key] = fn
    return HookHandle(lambda: _backward_end_hooks.pop(key, None))


class _Trace:
    """One :func:`trace` block: its callback and how deep inside an operator's forward we are."""

    __slots__ = ("record", "depth")

    def __init__(self, record):
        self.record = record
        self.depth = 0

    def apply(self, op, inputs):
        self.depth += 1
        try:
            output = op(*inputs)        # depth > 0: the untraced path
        finally:
            self.depth -= 1
        self.record(op, inputs, output)
        return output


@contextlib.contextmanager
def trace(record):
    """Within the block, call ``record(op, inputs, output)`` after each operator application.

    Only outermost applications are reported: an operator applied inside
    another one's forward (a composite built from others) is part of that one.
    Blocks nest; the innermost one receives the calls.
    """
    global _active_trace
    previous, _active_trace = _active_trace, _Trace(record)
    try:
        yield
    finally:
        _active_trace = previous


def grad_enabled():
    """True unless inside :func:`no_grad`."""
    return _grad_enabled


@contextlib.contextmanager
def no_grad():
    """Context in which operations record nothing (inference, optimiser steps)."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, False
    try:
        yield
    finally:
        _grad_enabled = previous


class Operator:
    """Base class of every operator, built-in or plugin.

    Subclasses implement:

    ``forward_numpy(*arrays)`` and ``forward_cuda(*arrays)``
        compute the output array from the input arrays (NumPy arrays or
        CudaArrays); keep what the backward needs with
        ``self.save(name=array, ...)`` and read it back as ``self.saved.name``.
    ``backward(grad_output)``
        return one gradient :class:`~gdnflow.tensor.Tensor` (or None) per
        input. Either write it with gdnflow operations (it then runs on both
        backends) or call ``self.dispatch("backward", ...)``, which runs
        ``backward_numpy`` / ``backward_cuda`` on arrays.
    ``check(*inputs)`` (optional)
        raise :class:`~gdnflow.errors.ShapeError` (or another error) naming
        what was expected and what came; the device and dtype agreement of the
        inputs is checked here, for every operator.

    A :class:`~gdnflow.errors.DeviceLimitError` (an array too large for the
    kernels, the GPU out of memory) raised by a forward or backward gets the
    operator's name and input shapes added to its message.

    ``autocast`` (class attribute) says how the operator takes 16-bit
    (float16, bfloat16) inputs: ``"float32"`` (the default: it has no 16-bit
    kernels; such inputs are refused, or widened under
    :func:`gdnflow.autocast`), ``"same"`` (it computes in its inputs' dtype),
    ``"lower"`` (a tensor-core product: under autocast its float32 inputs are
    rounded to 16 bits), ``"data"`` (16-bit kernels for the first input, float32
    parameters after it) or ``"exempt"`` (autocast leaves its inputs alone);
    see :mod:`gdnflow.precision`. An operator with 16-bit kernels computes
    them on NumPy with :func:`gdnflow.precision.emulate`.

    ``self.recording`` says, already during the forward, whether a backward
    may follow (so the forward can skip saving); ``self.needs_grad`` (one
    bool per input, when recording) tells which gradients are asked for;
    ``self.input_shapes`` holds the inputs' shapes.
    """

    op_name = None      # set by gdnflow.registry.register
    saved = ()
    recording = False   # until __call__ says otherwise (a forward run directly keeps nothing)
    autocast = "float32"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        precision.check_rule(cls.autocast, cls.__name__)

    def __call__(self, *inputs):
        # This runs once per operation, so it is written for speed: one pass
        # over the inputs; the descriptive checks run only when it fails.
        if precision.active_dtype is not None and inputs:
            inputs = self._autocast_inputs(inputs)
        if _active_trace is not None and not _active_trace.depth:
            return _active_trace.apply(self, inputs)
        record = False
        if not inputs:
            self._explain_bad_inputs(inputs)
        first = inputs[0]
        for t in inputs:
            if (not isinstance(t, Tensor) or t.device != first.device
                    or t.data.dtype != first.data.dtype) and not self._mixed_dtypes_allowed(inputs):
                self._explain_bad_inputs(inputs)
            if t.requires_grad:
                record = True
        if first.data.dtype.itemsize == 2 and self.autocast == "float32":
            self._refuse_half(first.data.dtype)
        self.check(*inputs)
        device = self.device = first.device
        self.input_shapes = tuple([t.data.shape for t in inputs])
        # Known before the forward, so that it saves only what a backward needs.
        self.recording = record = record and _grad_enabled
        self.needs_grad = tuple([t.requires_grad for t in inputs]) if record else None
        try:
            out = getattr(self, "forward_" + device)(*[t.data for t in inputs])
        except DeviceLimitError as exc:     # too large, out of memory: say which operator
            exc.add_operator(self.label, self.input_shapes)
            raise
        result = Tensor.wrap(out, device)
        if record:
            self.output_dtype = out.dtype   # the gradient a consumer's backward owes this node
            self.parents = tuple([
                (t.creator if t.creator is not None else t) if t.requires_grad else None
                for t in inputs])
            result.requires_grad = True
            result.creator = self
        return result

    @property
    def label(self):
        """The name used in error messages."""
        return self.op_name or type(self).__name__

    def _explain_bad_inputs(self, inputs):
        """Raise the error that says what is wrong with ``inputs``."""
        if not inputs:
            raise TypeError(f"{self.label}: expected at least one input tensor")
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor):
                raise TypeError(f"{self.label}: input {i} should be a gdnflow Tensor, "
                                f"got {type(t).__name__}")
        first = inputs[0]
        for i, t in enumerate(inputs[1:], 1):
            if t.device != first.device:
                raise DeviceMismatchError(
                    f"{self.label}: input 0 is on {first.device!r} but input {i} is on "
                    f"{t.device!r}; move them to one device with .to(device)")
            if (self.autocast == "data" and precision.is_half(first.dtype)
                    and t.dtype != precision.FLOAT32):
                raise DTypeError(f"{self.label}: input {i} is {t.dtype}, but beside 16-bit "
                                 f"data (input 0 is {first.dtype}) the inputs after the "
                                 "first (parameters) must be float32")
            if t.dtype != first.dtype:
                raise DTypeError(f"{self.label}: input 0 is {first.dtype} but input {i} is "
                                 f"{t.dtype}; convert one with .astype(), or compute under "
                                 "gdnflow.autocast(), which converts them")
        raise AssertionError("unreachable: inputs were valid")

    def _mixed_dtypes_allowed(self, inputs):
        """Whether inputs that differ in dtype are as an ``autocast = "data"`` operator
        takes them: 16-bit data first, float32 parameters after it (one device)."""
        if self.autocast != "data" or not all(isinstance(t, Tensor) for t in inputs):
            return False
        first = inputs[0]
        return (precision.is_half(first.data.dtype)
                and all(t.device == first.device and t.data.dtype == precision.FLOAT32
                        for t in inputs[1:]))

    def _autocast_inputs(self, inputs):
        """``inputs`` converted to the dtypes autocast gives this operator (see gdnflow.precision)."""
        if not all(isinstance(t, Tensor) for t in inputs):
            return inputs       # the checks after this say what is wrong
        targets = precision.autocast_targets(self.autocast, [t.data.dtype for t in inputs])
        if targets is None:
            return inputs
        cast = registry.get("cast")
        return tuple(t if t.data.dtype == d else cast(d)(t) for t, d in zip(inputs, targets))

    def _refuse_half(self, dtype):
        raise DTypeError(f"{self.label} has no {dtype} kernels: convert its inputs with "
                         f".astype('float32'), or run it under gdnflow.autocast(), which "
                         f"widens them for it")

    def check(self, *inputs):
        """Validate the inputs (shapes, parameters); the default accepts everything."""

    def dispatch(self, stage, *args):
        """Call ``<stage>_numpy`` or ``<stage>_cuda`` for this operator's device."""
        return getattr(self, f"{stage}_{self.device}")(*args)

    def wrap(self, array):
        """A constant tensor (no gradient) around an array on this operator's device."""
        return Tensor.wrap(array, self.device)

    def backward(self, grad_output):
        """Gradients with respect to the inputs; see the class docstring."""
        raise NotImplementedError(f"{self.label} has no backward")

    def save(self, **arrays):
        """Keep ``arrays`` (and any other values) for the backward, as ``self.saved.<name>``."""
        self.saved = types.SimpleNamespace(**arrays)

    def backpropagate(self, root, grad, retain_graph=False):
        """Run :func:`backward` from ``root``, the tensor this node produced (Tensor.backward)."""
        backward(root, grad, retain_graph=retain_graph)

    def release(self):
        """Drop the saved arrays (after backward has used them)."""
        self.saved = None


def backward(root, grad, retain_graph=False):
    """Accumulate d(root)/d(leaf) * grad into the ``.grad`` of every leaf that requires it."""
    order = _topological_order(root.creator)
    grads = {id(root.creator): grad}
    pending = _hooked_leaf_uses(order) if _gradient_hooks else None
    with no_grad():
        for node in reversed(order):
            grad_output = grads.pop(id(node), None)
            if grad_output is None:
                if pending:
                    _leaf_uses_done(node, pending)
                continue        # no gradient reaches this node
            if node.saved is None:
                raise GraphFreedError(
                    f"backward through {node.label}, whose saved arrays a previous "
                    "backward() freed; call backward(retain_graph=True) the first time "
                    "to go through a graph twice")
            try:
                input_grads = node.backward(grad_output)
            except DeviceLimitError as exc:
                exc.add_operator(f"the backward of {node.label}", node.input_shapes)
                raise
            if not retain_graph:
                node.release()
            if len(input_grads) != len(node.parents):
                raise RuntimeError(f"{node.label}.backward returned {len(input_grads)} "
                                   f"gradients for {len(node.parents)} inputs")
            for parent, g, shape in zip(node.parents, input_grads, node.input_shapes):
                if parent is None or g is None:
                    continue
                if g.shape != shape:
                    raise ShapeError(f"{node.label}.backward returned a gradient of shape "
                                     f"{g.shape} for an input of shape {shape}")
                dtype = parent.dtype if isinstance(parent, Tensor) else parent.output_dtype
                if g.dtype != dtype:
                    raise DTypeError(f"{node.label}.backward returned a {g.dtype} gradient "
                                     f"for a {dtype} input")
                if isinstance(parent, Tensor):      # a leaf
                    parent.grad = g if parent.grad is None else parent.grad + g
                else:
                    key = id(parent)
                    grads[key] = g if key not in grads else grads[key] + g
            if pending:
                _leaf_uses_done(node, pending)
    for fn in list(_backward_end_hooks.values()):
        fn()


def _hooked_leaf_uses(order):
    """{id(leaf): how many inputs of the nodes in ``order`` it is}, for the leaves with hooks."""
    pending = {}
    for node in order:
        for parent in node.parents:
            if isinstance(parent, Tensor) and id(parent) in _gradient_hooks:
                pending[id(parent)] = pending.get(id(parent), 0) + 1
    return pending


def _leaf_uses_done(node, pending):
    """Count ``node``'s uses of hooked leaves as done; call the hooks of the leaves now complete."""
    for parent in node.parents:
        key = id(parent)
        if key in pending:
            pending[key] -= 1
            if not pending[key]:
                del pending[key]
                for reference, fn in list(_gradient_hooks.get(key, ())):
                    if reference() is parent:
                        fn(parent)


def _topological_order(start):
    """Nodes reachable from ``start``, each after every node it consumes (iterative DFS)."""
    order, visited, stack = [], set(), [(start, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in node.parents:
            if isinstance(parent, Operator) and id(parent) not in visited:
                stack.append((parent, False))
    return order
