"""What code inside a compiled training step sees: the step's context.

A function compiled by :func:`gdnflow.step.compile_step` is called with
``(batch, step)``, ``step`` being the :class:`StepContext` of that call. The
context is what lets the same Python code run eagerly, be rehearsed, and be
captured once as a CUDA graph that later calls replay without Python:

- ``step.index`` (a :class:`StepCounter`): the step number as the GPU reads
  it, from device memory, so that quantisation noise drawn from it
  (``noise_stream=step.index``) advances with every replay;
- ``step.guard_finite(*scalars)``: a device flag set, without reading anything
  back, when one of the scalars is NaN or infinite; every optimiser update
  after it in the step is skipped on the device from then on, and the flag
  keeps the number of the first bad step for the caller to read later;
- ``step.on_replay(hook)``: host work that must run before every execution of
  the step (an optimiser computing this step's bias corrections and learning
  rate into a device array the captured kernel reads);
- ``step.upload_constant(array)``: a host array copied to the GPU as part of
  the step (a pointer table): by a plain copy when the step runs, by a copy
  from page-locked memory recorded into the graph when it is captured.

Inside a step function nothing may read a device value back to the host
(``Tensor.numpy()``, ``item()``, and so any Python decision on a value) nor
make a tensor from host data (``gf.tensor(array)``, ``x + array``): the
values do not exist yet while the step is captured, and host data would be
frozen into the graph. Both raise :class:`~gdnflow.step_state.StepSyncError`
on both backends and in every phase (see :mod:`gdnflow.step_state`), so code
tested on NumPy fails as it would on the GPU.
"""
import numpy as np

from gdnflow import step_state
from gdnflow.backends import cuda

#: How a step context runs its code: ``"eager"`` (the work runs now),
#: ``"rehearsal"`` (runs now, with every allocation recorded for the graph's
#: memory plan) or ``"capture"`` (nothing runs; CUDA records it).
PHASES = ("eager", "rehearsal", "capture")
#: The most scalars one :meth:`StepContext.guard_finite` call checks.
MAX_GUARDED = 8

class StepCounter:
    """The number of a step, kept where a captured kernel can read it on every replay.

    ``value`` is the host's copy; :meth:`set` changes it and, on the GPU, the
    two 32-bit words in device memory (:meth:`device_words`) that kernels
    such as :func:`gdnflow.ops.entropy.uniform_noise` read at run time
    instead of taking the number as a launch argument.
    """

    def __init__(self, device, value=0):
        self.device = device
        self.value = 0
        self._words = None
        self.set(value)

    def set(self, value):
        """Make the step number ``value`` (an integer in [0, 2^64))."""
        value = int(value)
        if not 0 <= value < 2 ** 64:
            raise ValueError(f"StepCounter: a step number lies in [0, 2^64), got {value}")
        self.value = value
        if self.device == "cuda":
            words = np.array([value & 0xFFFFFFFF, value >> 32], dtype=np.uint32)
            if self._words is None:
                self._words = cuda.get_runtime().from_numpy(words)
            else:
                _copy_to_device(self._words, words)

    def device_words(self):
        """The device array (uint32, low word first) holding the number (CUDA only)."""
        if self._words is None:
            raise ValueError("StepCounter.device_words: the counter is not on the GPU")
        return self._words

    def __int__(self):
        return self.value

    __index__ = __int__

    def __repr__(self):
        return f"StepCounter({self.value}, device={self.device!r})"


class StepContext:
    """One running of a step function: its phase, step counter, finite flag and hooks.

    Made by :class:`gdnflow.step.CompiledStep`; see the module docstring for
    what the step function may call. ``flag`` is the first-bad-step flag (an
    int32 array of one element on the step's device: 0, or the number of the
    first step whose guarded scalars were not finite), shared by every
    context of one compiled step.
    """

    def __init__(self, device, phase, index, flag):
        if phase not in PHASES:
            raise ValueError(f"StepContext: phase must be one of {PHASES}, got {phase!r}")
        self.device, self.phase, self.index, self.flag = device, phase, index, flag
        #: The hooks registered while capturing; the graph runs them before each replay.
        self.hooks = []
        #: Page-locked host arrays the step copied constants from (the graph's, once captured).
        self.constants = []
        #: Capture only: the rehearsal's page-locked buffers, reused in order.
        self.reserved = []

    def running(self):
        """``with context.running():`` the step function runs in this context."""
        return step_state.running(self)

    def on_replay(self, hook):
        """Run ``hook()`` before this step's GPU work: now, or (captured) before every replay."""
        if self.phase == "capture":
            self.hooks.append(hook)
        else:
            with step_state.suspended():        # as on a replay: host work outside the step
                hook()

    def upload_constant(self, host):
        """A new device array holding ``host`` (a NumPy array whose values are fixed per step).

        Eager: a plain copy now. Rehearsal: a copy now through a new
        page-locked buffer, kept in ``constants``. Capture: the copy is
        recorded into the graph and runs on every replay (so the array, in the
        graph's arena, holds ``host`` again whatever ran in between); it reads
        the page-locked buffer the rehearsal made for the same call, filled
        with this call's values (CUDA cannot allocate page-locked memory while
        a capture runs).
        """
        host = np.ascontiguousarray(host)
        if self.device == "numpy":
            return host.copy()
        runtime = cuda.get_runtime()
        if self.phase == "eager":
            return runtime.from_numpy(host)
        import pycuda.driver as drv     # local import: PyCUDA only on the GPU
        if self.phase == "rehearsal":
            pinned = drv.pagelocked_empty(host.shape, host.dtype)
        else:
            if not self.reserved:
                raise step_state.StepSyncError(
                    "the step function uploaded more constant tables while captured than in its "
                    "rehearsal: it does not run the same way twice")
            pinned = self.reserved.pop(0)
            if pinned.shape != host.shape or pinned.dtype != host.dtype:
                raise step_state.StepSyncError(
                    f"a constant table of the captured step is {host.shape} {host.dtype}, the "
                    f"rehearsal's was {pinned.shape} {pinned.dtype}: the step function does not "
                    "run the same way twice")
        pinned[...] = host
        self.constants.append(pinned)
        array = runtime.empty(host.shape, host.dtype)
        if array.size:
            drv.memcpy_htod_async(array.ptr, pinned, runtime.stream)
        return array

    def guard_finite(self, *scalars):
        """Set the flag to this step's number if one of ``scalars`` (one-element tensors)
        is not finite and the flag is still 0; later optimiser updates are then skipped.

        Reads nothing back. At most :data:`MAX_GUARDED` scalars per call.
        """
        if not 1 <= len(scalars) <= MAX_GUARDED:
            raise ValueError(f"guard_finite: give 1 to {MAX_GUARDED} scalars, got {len(scalars)}")
        for i, s in enumerate(scalars):
            if getattr(s, "size", None) != 1 or s.device != self.device:
                raise ValueError(f"guard_finite: argument {i} must be a one-element tensor on "
                                 f"{self.device!r}, got {s!r}")
        if self.device == "numpy":
            if self.flag[0] == 0 and not all(np.isfinite(s.data).all() for s in scalars):
                self.flag[0] = min(self.index.value + 1, 2 ** 31 - 1)   # step.cu saturates too
            return
        pointers = [s.data.ptr for s in scalars] + [0] * (MAX_GUARDED - len(scalars))
        cuda.kernel("step.cu", "guard_finite", "PPi" + "P" * MAX_GUARDED)(
            (1, 1, 1), (32, 1, 1), self.flag.ptr, self.index.device_words().ptr,
            len(scalars), *pointers)

    def skip_pointer(self):
        """The flag's device address for an optimiser kernel that skips on a bad step."""
        return self.flag.ptr


def new_flag(device):
    """A first-bad-step flag (int32, one element, 0) on ``device``."""
    if device == "numpy":
        return np.zeros(1, dtype=np.int32)
    return cuda.get_runtime().full((1,), 0, np.int32)


def read_flag(flag):
    """The flag's value on the host (waits for the GPU): 0 or the first bad step's number."""
    if isinstance(flag, np.ndarray):
        return int(flag[0])
    return int(flag.get()[0])


def _copy_to_device(array, host):
    import pycuda.driver as drv     # local import: PyCUDA only on the GPU
    drv.memcpy_htod_async(array.ptr, host, cuda.get_runtime().stream)


__all__ = ["StepContext", "StepCounter", "new_flag", "read_flag", "PHASES", "MAX_GUARDED"]
