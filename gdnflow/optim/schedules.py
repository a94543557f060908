"""Learning-rate schedules: they set ``group["lr"]`` of an optimiser's groups.

Call ``schedule.step()`` once after each ``optimizer.step()``. Rates are
computed in closed form from the step count, so they do not drift over long
runs and a loaded state gives exactly the rates of the run that saved it.
"""
import math


class LRSchedule:
    """Base class: ``lr_at(step, base_lr)`` gives a group's rate after ``step`` calls of step().

    The base rates are the groups' ``lr`` when the schedule is built; the
    rate for step 0 is applied at once, so the first optimiser step uses it.
    """

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.last_step = 0
        self._apply()

    def lr_at(self, step, base_lr):
        """The learning rate of a group with base rate ``base_lr`` at ``step``."""
        raise NotImplementedError

    @property
    def last_lrs(self):
        """The learning rates of the groups now."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self):
        """Advance one step and set every group's learning rate."""
        self.last_step += 1
        self._apply()

    def _apply(self):
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(self.last_step, base)

    def hyperparameters(self):
        """The schedule's settings (what its constructor took besides the optimiser)."""
        return {}

    def state_dict(self):
        """``{"type", "last_step", "base_lrs", settings...}``: plain, JSON-able data."""
        return {"type": type(self).__name__, "last_step": self.last_step,
                "base_lrs": list(self.base_lrs), **self.hyperparameters()}

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned and set the groups' rates."""
        if state.get("type", type(self).__name__) != type(self).__name__:
            raise ValueError(f"{type(self).__name__}.load_state_dict: the state is of a "
                             f"{state['type']}")
        if len(state["base_lrs"]) != len(self.optimizer.param_groups):
            raise ValueError(f"{type(self).__name__}.load_state_dict: {len(state['base_lrs'])} "
                             f"base rates for {len(self.optimizer.param_groups)} groups")
        for key, value in self.hyperparameters().items():
            setattr(self, key, type(value)(state.get(key, value)))
        self.base_lrs = [float(lr) for lr in state["base_lrs"]]
        self.last_step = int(state["last_step"])
        self._apply()


class StepLR(LRSchedule):
    """lr = base_lr * gamma ^ floor(step / step_size): decay by ``gamma`` every ``step_size`` steps."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        if int(step_size) != step_size or step_size < 1:
            raise ValueError(f"StepLR: step_size must be a positive integer, got {step_size!r}")
        if not gamma > 0:
            raise ValueError(f"StepLR: gamma must be > 0, got {gamma!r}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer)

    def lr_at(self, step, base_lr):
        return base_lr * self.gamma ** (step // self.step_size)

    def hyperparameters(self):
        return {"step_size": self.step_size, "gamma": self.gamma}


class CosineLR(LRSchedule):
    """Linear warm-up, then cosine decay from base_lr to ``min_lr`` at ``total_steps``.

    With W = ``warmup_steps`` and T = ``total_steps`` (warm-up included), at step t::

        t <= W:      lr = base_lr * (t + 1) / (W + 1)
        W < t < T:   lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * (t - W) / (T - W))) / 2
        t >= T:      lr = min_lr

    so the warm-up climbs in equal steps from base_lr / (W + 1) to base_lr
    (reached at t = W, where the cosine starts), and never uses a rate of 0.
    Without warm-up the first step uses base_lr.
    """

    def __init__(self, optimizer, total_steps, min_lr=0.0, warmup_steps=0):
        if int(total_steps) != total_steps or total_steps < 1:
            raise ValueError(f"CosineLR: total_steps must be a positive integer, got {total_steps!r}")
        if int(warmup_steps) != warmup_steps or not 0 <= warmup_steps < total_steps:
            raise ValueError(f"CosineLR: warmup_steps must be an integer in [0, total_steps), "
                             f"got {warmup_steps!r}")
        if not min_lr >= 0:
            raise ValueError(f"CosineLR: min_lr must be >= 0, got {min_lr!r}")
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        self.min_lr = float(min_lr)
        super().__init__(optimizer)

    def lr_at(self, step, base_lr):
        warmup, total = self.warmup_steps, self.total_steps
        if step <= warmup:
            return base_lr * (step + 1) / (warmup + 1)
        if step >= total:
            return self.min_lr
        progress = (step - warmup) / (total - warmup)
        return self.min_lr + (base_lr - self.min_lr) * (1 + math.cos(math.pi * progress)) / 2

    def hyperparameters(self):
        return {"total_steps": self.total_steps, "min_lr": self.min_lr,
                "warmup_steps": self.warmup_steps}
