"""Compiled training steps: a whole step (forward, loss, backward, clipping, optimiser
updates) captured once as a CUDA graph and replayed per batch.

``gdnflow.compile_step(fn, example_batch)``; the step function's context is
:class:`gdnflow.step_context.StepContext`. See :mod:`gdnflow.step.compiled`
and docs/compiled_step.md.
"""
from gdnflow.step.compiled import (MAX_GRAPHS, CaptureError, CompiledStep, CompiledStepWarning,
                                   compile_step)
from gdnflow.step_context import StepContext, StepCounter
from gdnflow.step_state import StepSyncError

__all__ = ["compile_step", "CompiledStep", "CompiledStepWarning", "CaptureError", "StepContext",
           "StepCounter", "StepSyncError", "MAX_GRAPHS"]
