"""Inference plans: a model traced once, batch norm folded, activations and residual
adds fused, every buffer planned ahead, and on the GPU the whole forward replayed as
one CUDA graph.

::

    compiled = gdnflow.compile(model.eval(), (1, 3, 224, 224))
    y = compiled(x)     # a Tensor on a buffer the plan owns: the next call overwrites it

:func:`compile` (also ``gdnflow.compile``) returns a :class:`CompiledModel`,
which keeps one :class:`InferencePlan` per input shape (a new shape builds a
new plan). A plan is what the model computed for that shape: Python control
flow in ``forward`` is frozen, and a tensor that ``forward`` creates is frozen
as a constant (with a warning when it is not a parameter or buffer). Its
first result is checked against the model's (:class:`PlanError` if it
differs).

Stale weights: a plan must not run after the model's weights changed through
gdnflow's API (``gdnflow.nn.module.weights_version``); a stale
:class:`InferencePlan` raises :class:`StalePlanError`, a
:class:`CompiledModel` rebuilds (``on_stale="rebuild"``, the default) or
raises (``on_stale="error"``). Code that writes into a weight's array by hand
must call :func:`gdnflow.nn.module.weights_changed`.

Threads: tracing and capture change process-wide state (autograd's trace
hook, the runtime's allocator) for their duration; build plans while no
other thread runs gdnflow operations.

The modules: :mod:`~gdnflow.inference.program` (steps over numbered values),
:mod:`~gdnflow.inference.tracing`, :mod:`~gdnflow.inference.passes`,
:mod:`~gdnflow.inference.memory`, :mod:`~gdnflow.inference.plan`;
``docs/inference.md`` tells how a plan is built and why.
"""
from gdnflow.inference.errors import PlanError, StalePlanError
from gdnflow.inference.plan import CompiledModel, InferencePlan, compile  # noqa: A004
from gdnflow.inference.tracing import trace

__all__ = ["CompiledModel", "InferencePlan", "PlanError", "StalePlanError", "compile", "trace"]
