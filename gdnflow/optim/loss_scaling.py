"""Dynamic loss scaling: keeps small float16 gradients from flushing to zero.

A float16 gradient below 2^-24 rounds to zero. Multiplying the loss by a large
scale S before ``backward()`` multiplies every gradient by S (the chain rule
is linear), which lifts them into range; dividing the gradients by S before
the optimiser's update undoes it. Too large an S makes gradients overflow to
inf: such a step is skipped and S shrinks, and after a run of clean steps S
grows again (Micikevicius et al., "Mixed Precision Training", 2018; the
schedule of PyTorch's ``GradScaler``).
"""
import math
import numbers

from gdnflow import step_state
from gdnflow.autograd import no_grad
from gdnflow.optim.clip import _address, clip_grad_norm
from gdnflow.optim.optimizer import Optimizer
from gdnflow.tensor import Tensor


class DynamicLossScaler:
    """Scales the loss up for ``backward()`` and the gradients back down for the update::

        scaler = gdnflow.optim.DynamicLossScaler()
        for batch in data:
            opt.zero_grad()
            loss = model.loss(batch)
            scaler.scale(loss).backward()
            scaler.unscale(opt)                 # optional: only to clip in between
            gdnflow.optim.clip_grad_norm(model.parameters(), 1.0)
            scaler.step(opt)                    # False: the step was skipped

    The scale starts at ``init_scale``. A step whose gradients are not all
    finite is skipped (the parameters and the optimiser's state stay as
    they were) and the scale is multiplied by ``backoff_factor``, but not
    below ``min_scale``; after ``growth_interval`` taken steps in a row it
    is multiplied by ``growth_factor``, but not above ``max_scale``. With
    the default factors the scale stays a power of two, so scaling and
    unscaling change no gradient's rounding.

    The gradients count as finite when their global L2 norm after
    unscaling is (computed by :func:`~gdnflow.optim.clip_grad_norm`, in the
    gradients' dtype): an inf or NaN anywhere makes it inf or NaN, and so
    does a norm whose square overflows (above about 1.8e19 in float32),
    which counts as an overflow too. Deciding needs that norm on the host: one float is
    read back from the GPU per step (a synchronisation), so loss scaling
    runs in eager steps only; inside a compiled step function
    (:func:`gdnflow.step.compile_step`) every method but ``state_dict``
    raises :class:`~gdnflow.step_state.StepSyncError`.

    Attributes: ``scale_value`` (the current scale, a float),
    ``clean_steps`` (steps taken in a row since the last skipped step or
    growth) and ``skipped_steps`` (steps skipped so far).
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, min_scale=1.0, max_scale=2.0 ** 24):
        for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor),
                            ("backoff_factor", backoff_factor), ("min_scale", min_scale),
                            ("max_scale", max_scale)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not math.isfinite(value):
                raise ValueError(f"DynamicLossScaler: {name} must be a finite number, "
                                 f"got {value!r}")
        if not growth_factor > 1:
            raise ValueError(f"DynamicLossScaler: growth_factor must be > 1, got {growth_factor!r}")
        if not 0 < backoff_factor < 1:
            raise ValueError("DynamicLossScaler: backoff_factor must lie in (0, 1), got "
                             f"{backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral) \
                or growth_interval < 1:
            raise ValueError("DynamicLossScaler: growth_interval must be an int >= 1, got "
                             f"{growth_interval!r}")
        if not 0 < min_scale <= init_scale <= max_scale:
            raise ValueError("DynamicLossScaler: need 0 < min_scale <= init_scale <= max_scale, "
                             f"got min_scale={min_scale!r}, init_scale={init_scale!r}, "
                             f"max_scale={max_scale!r}")
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self.scale_value = float(init_scale)
        self.clean_steps = 0
        self.skipped_steps = 0
        # Whether the gradients were finite, once unscale() ran for this step; None before.
        self._unscaled_finite = None

    def __repr__(self):
        return (f"DynamicLossScaler(scale_value={self.scale_value!r}, "
                f"clean_steps={self.clean_steps}, skipped_steps={self.skipped_steps})")

    def scale(self, loss):
        """``loss * scale_value``, a gdnflow operation: its ``backward()`` gives scaled gradients."""
        _refuse_in_compiled_step("scale")
        if not isinstance(loss, Tensor):
            raise TypeError(f"DynamicLossScaler.scale: expected the loss as a Tensor, got "
                            f"{type(loss).__name__}")
        return loss * self.scale_value

    def unscale(self, optimizer_or_params):
        """Divide the gradients by the scale; return whether they are all finite.

        NumPy gradients are divided in place; on the GPU each gradient tensor
        gets a new array holding the quotient (parameters sharing one
        gradient array share the new one).

        ``optimizer_or_params``: an :class:`~gdnflow.optim.Optimizer` (its
        parameters' gradients) or parameters. Call it at most once between
        two :meth:`step` calls, which then does not unscale again; calling
        it is only needed to work on the true gradients before the step
        (clip them, log their norm).
        """
        _refuse_in_compiled_step("unscale")
        if self._unscaled_finite is not None:
            raise RuntimeError("DynamicLossScaler.unscale: already called since the last step(); "
                               "unscaling twice would divide the gradients twice")
        params = _parameters(optimizer_or_params)
        grads = [p.grad for p in params if p.grad is not None]
        # Autograd may hand one gradient array to several parameters: divide each array once.
        addresses = [_address(g) for g in grads]
        distinct = dict(zip(addresses, grads))
        inverse = 1.0 / self.scale_value
        with no_grad():
            unscaled = {}       # address -> the new array of a GPU gradient
            for address, g in distinct.items():
                if g.device == "numpy":
                    g.data *= g.dtype.type(inverse)
                else:
                    # No in-place scaling kernel on the GPU: the gradient tensors take
                    # the array of one affine launch (GPU-verified) instead.
                    unscaled[address] = (Tensor.wrap(g.data, g.device) * inverse).data
            for address, g in zip(addresses, grads):
                if address in unscaled:
                    g.data = unscaled[address].reshape(g.shape)
            # The global norm, clipping nothing: one float read back.
            norm = clip_grad_norm(params, max_norm=math.inf)
        self._unscaled_finite = math.isfinite(norm)
        return self._unscaled_finite

    def step(self, optimizer, params=None):
        """Unscale (unless :meth:`unscale` did) and update, or skip; then adjust the scale.

        With finite gradients: ``optimizer.step()`` runs, and after
        ``growth_interval`` such steps in a row the scale grows. Otherwise
        the update is skipped and the scale backs off. ``params``: the
        parameters whose gradients decide (the optimiser's by default).
        Returns True if the update ran.
        """
        _refuse_in_compiled_step("step")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"DynamicLossScaler.step: expected an Optimizer, got "
                            f"{type(optimizer).__name__}")
        if self._unscaled_finite is None:
            self.unscale(optimizer if params is None else params)
        finite, self._unscaled_finite = self._unscaled_finite, None
        if finite:
            optimizer.step()
            self.clean_steps += 1
            if self.clean_steps >= self.growth_interval:
                self.scale_value = min(self.scale_value * self.growth_factor, self.max_scale)
                self.clean_steps = 0
        else:
            self.scale_value = max(self.scale_value * self.backoff_factor, self.min_scale)
            self.clean_steps = 0
            self.skipped_steps += 1
        return finite

    def state_dict(self):
        """``{"scale": float, "clean_steps": int, "skipped_steps": int}``."""
        return {"scale": self.scale_value, "clean_steps": self.clean_steps,
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state_dict):
        """Restore what :meth:`state_dict` returned; refuse a malformed one (ValueError), unchanged."""
        _refuse_in_compiled_step("load_state_dict")
        expected = {"scale", "clean_steps", "skipped_steps"}
        if not isinstance(state_dict, dict) or set(state_dict) != expected:
            got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"DynamicLossScaler.load_state_dict: expected a dict with keys "
                             f"{sorted(expected)}, got {got}")
        scale = state_dict["scale"]
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) \
                or not self.min_scale <= scale <= self.max_scale:
            raise ValueError(f"DynamicLossScaler.load_state_dict: scale must be a number in "
                             f"[min_scale, max_scale] = [{self.min_scale}, {self.max_scale}], "
                             f"got {scale!r}")
        for key in ("clean_steps", "skipped_steps"):
            count = state_dict[key]
            if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
                raise ValueError(f"DynamicLossScaler.load_state_dict: {key} must be an int >= 0, "
                                 f"got {count!r}")
        self.scale_value = float(scale)
        self.clean_steps = int(state_dict["clean_steps"])
        self.skipped_steps = int(state_dict["skipped_steps"])
        self._unscaled_finite = None


def _parameters(optimizer_or_params):
    """The parameters of an optimiser, or the given ones, as a list."""
    if isinstance(optimizer_or_params, Optimizer):
        return [p for group in optimizer_or_params.param_groups for p in group["params"]]
    if isinstance(optimizer_or_params, Tensor):
        return [optimizer_or_params]
    return list(optimizer_or_params)


def _refuse_in_compiled_step(method):
    """Raise StepSyncError if a compiled step function runs: the scale is decided on the host."""
    if step_state.active() is not None:
        raise step_state.StepSyncError(
            f"DynamicLossScaler.{method}() inside a compiled step function: the scale changes "
            "with what the gradients held, which the host must read back each step and a "
            "captured step cannot. Loss scaling runs in eager steps for now")
