"""Which compiled step function is running, if any, and the refusals that follow from it.

The lowest layer of the compiled-step machinery (no gdnflow imports beyond
errors): the runtime and :class:`~gdnflow.tensor.Tensor` consult it to
refuse host reads and host copies inside a step function. The context
itself, and what a step function can do with it, is
:mod:`gdnflow.step_context`.
"""
import contextlib
import threading

from gdnflow.errors import GdnflowError

# Per thread: a data-loader thread making tensors while a step runs is not inside it.
_state = threading.local()


class StepSyncError(GdnflowError, RuntimeError):
    """Code inside a compiled step function did what a captured step cannot replay:
    read a device value back, copy a host array in, or nest steps."""


def active():
    """The context (a :class:`~gdnflow.step_context.StepContext`) whose step function runs
    in this thread, or None."""
    return getattr(_state, "active", None)


def capturing():
    """True while a step function is being captured into a CUDA graph (in this thread)."""
    context = active()
    return context is not None and context.phase == "capture"


@contextlib.contextmanager
def running(context):
    """Within the block, :func:`active` is ``context``; steps do not nest."""
    if active() is not None:
        raise StepSyncError("a compiled step function called another compiled step: "
                            "steps do not nest")
    _state.active = context
    try:
        yield context
    finally:
        _state.active = None


@contextlib.contextmanager
def suspended():
    """Within the block no step function runs (host work a step does before its GPU work)."""
    previous, _state.active = active(), None
    try:
        yield
    finally:
        _state.active = previous


def refuse_host_data(what):
    """Raise :class:`StepSyncError` if a step function is running (``what`` brings host data in)."""
    if active() is not None:
        raise StepSyncError(
            f"{what} inside a compiled step function: a captured step would replay the values it "
            "had at capture on every step. Pass data that changes per step in the batch, draw "
            "random numbers on the device (uniform_noise with noise_stream=step.index), and make "
            "constant tensors before compiling the step")


def refuse_host_read(what):
    """Raise :class:`StepSyncError` if a step function is running (``what`` reads a value)."""
    if active() is not None:
        raise StepSyncError(
            f"{what} inside a compiled step function: a captured step runs on the GPU without "
            "Python, so no value can be read back during it. Return the tensor from the step "
            "function and read it after the call (clip_grad_norm: pass sync=False; to stop "
            "on NaN, step.guard_finite)")
