"""The optimiser base class: parameter groups, per-parameter state, state
dicts, and the two ways an update runs.

On NumPy an update is a few in-place array operations per parameter. On CUDA
every parameter of a group is updated by ONE launch of a multi-tensor kernel
in ``cuda_src/optim.cu``: the group's parameter, gradient and state pointers
sit in a device pointer table and a block map says which tensor and which
elements each CUDA block updates (the layout is documented in optim.cu and
built by :class:`FusedGroup`), and each tensor's scalars (learning rate,
bias corrections) sit in a device array the kernel reads. The pointer table
is uploaded again only when a pointer changes: gradients are fresh arrays
after every backward, but in a steady training loop the memory pool tends
to hand back the same blocks. Inside a compiled step the table is a
constant of the captured graph and the scalars are written before each
replay (:meth:`FusedGroup.run_in_step`).

Updates work on the parameters' arrays directly, never through operators, so
they record no autograd history whether or not they run under ``no_grad``.
"""
import numpy as np

from gdnflow import step_state
from gdnflow.backends import cuda, get_backend
from gdnflow.errors import DTypeError, ShapeError
from gdnflow.precision import is_half
from gdnflow.tensor import Tensor

SOURCE = "optim.cu"
#: Threads per block of the multi-tensor kernels.
BLOCK = 256
#: Elements one block updates (16 per thread): big enough that a 1M-element
#: tensor needs a few hundred blocks, small enough that a tiny one wastes little.
CHUNK = 4096


class Optimizer:
    """Base class of gdnflow's optimisers.

    ``params`` is an iterable of parameters (tensors that receive ``.grad``),
    or a list of dicts, each with a ``"params"`` list and any hyperparameters
    that differ from the optimiser's defaults (its own ``lr``, say): a
    *parameter group*. ``param_groups`` holds the groups with every
    hyperparameter filled in; change ``group["lr"]`` between steps to change
    the learning rate (the schedules in :mod:`gdnflow.optim.schedules` do).

    The optimiser keeps the Parameter objects it was given and updates their
    arrays (``p.data``) in place. ``Module.to()`` and ``Module.load_state_dict()``
    put *new* Parameter objects into the model, which an optimiser built
    before would not see: build the optimiser after moving or loading the
    model (:func:`gdnflow.io.load_checkpoint` keeps the objects, so an
    optimiser survives a resume).

    Subclasses give:

    ``state_arrays``
        the names of the per-parameter state arrays, in the order the CUDA
        kernel takes their pointer rows; ``required_state``: the entries a
        loaded state must have;
    ``kernel``
        the name of the multi-tensor kernel in optim.cu (see :class:`FusedGroup`);
    ``check_group(group)``
        validate and normalise a group's hyperparameters;
    ``prepare_state(p, state, group)``
        create the state a parameter's update needs, before its first update;
    ``update_scalars(state, group)``
        advance per-parameter counters and return the kernel's scalar arguments
        (numbers, the same count for every parameter; optim.cu reads them as floats);
    ``update_numpy(param, grad, state, scalars)``
        the update on NumPy arrays, in place.
    """

    state_arrays = ()
    required_state = ()
    kernel = None

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.param_groups = []
        #: id(parameter) -> {state name: backend array or int}. Keyed by id,
        #: not by the tensor, so that Tensor may define elementwise ==; the
        #: ids are stable because param_groups keeps every parameter alive.
        self.state = {}
        self._fused = {}            # group index -> FusedGroup
        groups = [params] if isinstance(params, (Tensor, dict)) else list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __repr__(self):
        groups = ", ".join(
            "{" + ", ".join(f"{k}={v!r}" for k, v in g.items() if k != "params")
            + f", {len(g['params'])} params}}" for g in self.param_groups)
        return f"{type(self).__name__}([{groups}])"

    # ----------------------------------------------------------- groups --
    def add_param_group(self, group):
        """Add a parameter group: a dict with ``"params"`` and optional hyperparameters."""
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"{type(self).__name__}: a parameter group is a dict with a "
                            f"'params' list, got {group!r:.80}")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: parameter {i} of group "
                                f"{len(self.param_groups)} is a {type(p).__name__}, not a Tensor")
            if is_half(p.dtype):
                raise DTypeError(f"{type(self).__name__}: parameter {i} of group "
                                 f"{len(self.param_groups)} is {p.dtype}; keep parameters in "
                                 "float32 and compute in 16 bits under gdnflow.autocast")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or seen & {id(p) for p in params}:
            raise ValueError(f"{type(self).__name__}: a parameter appears twice "
                             "(in one group or in two groups)")
        unknown = sorted(set(group) - set(self.defaults) - {"params"})
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown hyperparameters {unknown}; "
                             f"expected some of {sorted(self.defaults)}")
        full = dict(self.defaults)
        full.update((k, v) for k, v in group.items() if k != "params")
        full["params"] = params
        self.check_group(full)
        self.param_groups.append(full)

    def check_group(self, group):
        """Validate (and normalise in place) a group's hyperparameters."""

    def zero_grad(self):
        """Forget the gradient of every parameter (set ``.grad`` to None)."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    # ------------------------------------------------------------- step --
    def step(self):
        """Update every parameter that has a gradient; parameters without one are skipped.

        Each updated parameter is marked changed (:meth:`~gdnflow.tensor.Tensor.mark_changed`),
        so compiled inference plans of it know they are stale. Inside a
        compiled step function (:func:`gdnflow.step.compile_step`) the update
        is part of the step: its scalars are computed before each execution
        and it is skipped on the device once the step's finite flag is set.
        """
        step = step_state.active()
        for index, group in enumerate(self.param_groups):
            on_cuda = []
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if grad.shape != p.shape or grad.device != p.device:
                    raise ShapeError(f"{type(self).__name__}: a parameter of shape {p.shape} on "
                                     f"{p.device!r} has a gradient of shape {grad.shape} on "
                                     f"{grad.device!r}")
                state = self.state.setdefault(id(p), {})
                self.prepare_state(p, state, group)
                if p.device == "cuda":
                    on_cuda.append((p, state))
                else:
                    # As on the GPU, counters advance even on a step the flag skips.
                    scalars = self.update_scalars(state, group)
                    if step is None or not step.flag[0]:
                        p.mark_changed()
                        self.update_numpy(p.data, grad.data, state, scalars)
            if on_cuda:
                fused = self._fused.get(index)
                if fused is None:
                    fused = self._fused[index] = FusedGroup()
                params = [p for p in group["params"] if p.device == "cuda"]
                if step is not None:
                    fused.run_in_step(self, group, params, on_cuda, step)
                    continue
                for p, _ in on_cuda:
                    p.mark_changed()
                fused.run(self, params, [(p, state, self.update_scalars(state, group))
                                         for p, state in on_cuda])

    def prepare_state(self, p, state, group):
        """Create the state ``p``'s update needs (zeros on p's device)."""

    def update_scalars(self, state, group):
        """Advance the counters in ``state``; return the kernel's scalar arguments."""
        raise NotImplementedError

    def update_numpy(self, param, grad, state, scalars):
        """Update the NumPy array ``param`` in place from ``grad`` and ``state``."""
        raise NotImplementedError

    @staticmethod
    def zeros_like(p):
        """A zero array of p's shape and dtype on p's device (new state)."""
        return get_backend(p.device).full(p.shape, 0.0, p.dtype)

    # ------------------------------------------------------- state dict --
    def state_dict(self):
        """The optimiser's state as plain data, copied (later steps do not change it).

        ``{"type": class name, "param_groups": [{hyperparameters..., "params":
        [indices]}], "state": {index: {"step": int, name: NumPy array}}}``.
        Parameters are numbered across groups in order; a parameter that was
        never updated has no state entry.
        """
        groups, state, index = [], {}, 0
        for group in self.param_groups:
            indices = []
            for p in group["params"]:
                own = self.state.get(id(p))
                if own:
                    state[index] = {k: (np.array(get_backend(p.device).to_numpy(v))
                                        if not isinstance(v, (int, float)) else v)
                                    for k, v in own.items()}
                indices.append(index)
                index += 1
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": indices})
        return {"type": type(self).__name__, "param_groups": groups, "state": state}

    def check_state_dict(self, state_dict):
        """Raise ValueError listing every way ``state_dict`` does not fit this optimiser.

        Changes nothing; :meth:`load_state_dict` calls it first, and
        :func:`gdnflow.io.load_checkpoint` before it loads the model.
        """
        name = type(self).__name__
        problems = []
        kind = state_dict.get("type", name)
        if kind != name:
            raise ValueError(f"{name}.load_state_dict: the state is of a {kind}, not a {name}")
        groups = state_dict.get("param_groups", [])
        if [len(g.get("params", ())) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(
                f"{name}.load_state_dict: the state has groups of "
                f"{[len(g.get('params', ())) for g in groups]} parameters, this optimiser "
                f"{[len(g['params']) for g in self.param_groups]}")
        for i, group in enumerate(groups):
            unknown = sorted(set(group) - set(self.defaults) - {"params"})
            if unknown:
                problems.append(f"group {i}: unknown hyperparameters {unknown}")
            else:
                try:
                    self.check_group({**self.defaults, **group})
                except (TypeError, ValueError) as exc:
                    problems.append(f"group {i}: {exc}")
        params = [p for g in self.param_groups for p in g["params"]]
        for index, entry in state_dict.get("state", {}).items():
            if not 0 <= int(index) < len(params):
                problems.append(f"state for parameter {index}, but there are {len(params)}")
                continue
            p = params[int(index)]
            for key in self.state_arrays:
                if key in entry and tuple(np.shape(entry[key])) != p.shape:
                    problems.append(f"parameter {index} {key}: shape {tuple(np.shape(entry[key]))}"
                                    f", the parameter's is {p.shape}")
            unknown = sorted(set(entry) - set(self.state_arrays) - {"step"})
            missing = sorted(set(self.required_state) - set(entry))
            if unknown or missing:
                problems.append(f"parameter {index}: unknown state {unknown}, missing {missing}")
        if problems:
            raise ValueError(f"{name}.load_state_dict: " + "; ".join(problems))

    def load_state_dict(self, state_dict):
        """Restore what :meth:`state_dict` returned (arrays copied to each parameter's device).

        Checks everything first (:meth:`check_state_dict`) and changes nothing if
        the state does not fit.
        """
        self.check_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update((k, v) for k, v in saved.items() if k != "params")
            self.check_group(group)
        self.state = {}
        for index, entry in state_dict.get("state", {}).items():
            p = params[int(index)]
            backend = get_backend(p.device)
            self.state[id(p)] = {
                k: (backend.from_numpy(np.array(v, dtype=p.dtype)) if k in self.state_arrays
                    else int(v)) for k, v in entry.items()}


class FusedGroup:
    """The device arrays of one parameter group's fused CUDA update.

    For the group's n CUDA parameters (in group order) it keeps device
    arrays laid out as optim.cu expects:

    ``blocks``      int32, 3 per CUDA block: tensor index, first element, one
                    past the last; built once from the parameter sizes (CHUNK
                    elements per block);
    ``table``       uint64 pointers, (2 + len(state_arrays)) rows of n:
                    parameters, gradients, then each state array. A null
                    gradient tells the kernel to leave that tensor alone (it
                    has no gradient this step); a null state pointer is one
                    the update does not read (SGD without momentum);
    ``scalars``     float32, ``len(update_scalars(...))`` per tensor: the
                    step's scalar arguments of each tensor, written before
                    every update. The kernel reads them from this one array,
                    whose address never changes, so a captured step's launch
                    reads each replay's values (see :meth:`run_in_step`).

    An eager step uploads the scalars and, when a pointer changed, the table,
    then launches once.
    """

    def __init__(self):
        self.sizes = None
        self.blocks = None
        self.n_blocks = 0
        self.scalars = None
        self._table = (None, None)      # (host pointers as a tuple, device array)

    def run(self, optimizer, params, updates):
        """Update ``updates`` [(param, state, scalars)], all among the group's CUDA ``params``."""
        if not self._prepare(params):
            return                   # only empty tensors: nothing to update
        pointers = self._pointers(optimizer, params, [(p, state) for p, state, _ in updates])
        known, table = self._table
        if pointers != known:
            table = cuda.get_runtime().from_numpy(np.array(pointers, dtype=np.uint64))
            self._table = (pointers, table)
        self._write_scalars(params, [(p, scalars) for p, _, scalars in updates])
        self._launch(optimizer, table, len(params), skip=0)

    def run_in_step(self, optimizer, group, params, updates, step):
        """The update inside a compiled step function (``step``, a StepContext).

        ``updates`` [(param, state)]: the parameters with a gradient. The
        pointer table is a constant of the step (``step.upload_constant``);
        the scalars are computed and written by a hook that runs before each
        execution of the step (``step.on_replay``), which also advances the
        optimiser's counters and marks the parameters changed; the launch
        does nothing on the device once the step's finite flag is set.
        """
        if not self._prepare(params):
            return
        pointers = self._pointers(optimizer, params, updates)
        table = step.upload_constant(np.array(pointers, dtype=np.uint64))
        step.on_replay(_ScalarsHook(self, optimizer, group, params, updates))
        self._launch(optimizer, table, len(params), skip=step.skip_pointer())

    def _prepare(self, params):
        """Build the block map and the scalars array for ``params``; False if nothing to update."""
        sizes = tuple(p.data.size for p in params)
        if sizes != self.sizes:
            self._build_blocks(sizes)
            self.scalars = None
        return self.n_blocks > 0

    @staticmethod
    def _pointers(optimizer, params, updates):
        n = len(params)
        position = {id(p): t for t, p in enumerate(params)}
        pointers = [p.data.ptr for p in params] + [0] * (n * (1 + len(optimizer.state_arrays)))
        for p, state in updates:
            t = position[id(p)]
            pointers[n + t] = p.grad.data.ptr
            for row, name in enumerate(optimizer.state_arrays, start=2):
                if name in state:
                    pointers[row * n + t] = state[name].ptr
        return tuple(pointers)

    def _write_scalars(self, params, tensor_scalars):
        """Copy each tensor's scalars [(param, scalars)] into ``scalars`` (zeros elsewhere)."""
        count = len(tensor_scalars[0][1])
        host = np.zeros((len(params), count), dtype=np.float32)
        position = {id(p): t for t, p in enumerate(params)}
        for p, scalars in tensor_scalars:
            host[position[id(p)]] = scalars
        runtime = cuda.get_runtime()
        if self.scalars is None or self.scalars.size != host.size:
            self.scalars = runtime.from_numpy(host.ravel())
        else:
            import pycuda.driver as drv     # local import: PyCUDA on first use
            # On gdnflow's one stream: the copy runs after every launch queued
            # before it that reads the array.
            drv.memcpy_htod_async(self.scalars.ptr, host, runtime.stream)

    def _launch(self, optimizer, table, n, skip):
        kernel = cuda.kernel(SOURCE, optimizer.kernel, "PPiPP")
        kernel((self.n_blocks, 1, 1), (BLOCK, 1, 1), table.ptr, self.blocks.ptr, n,
               self.scalars.ptr, skip)

    def _build_blocks(self, sizes):
        self.blocks, self.n_blocks = block_map(sizes)
        self.sizes = sizes


_block_maps = {}    # tensor sizes -> (device block map, block count)


def block_map(sizes):
    """The device block map of optim.cu for tensors of ``sizes``: (array or None, block count).

    Three int32 per block (tensor, first element, one past the last), CHUNK
    elements per block. Made once per sizes and kept, so that a captured
    step (which cannot upload) finds the map its warm-up made.
    """
    known = _block_maps.get(sizes)
    if known is not None:
        return known
    for size in sizes:
        if size >= 2 ** 31:
            raise ValueError(f"a tensor of {size} elements exceeds the 2^31 - 1 that "
                             "gdnflow's kernels index")
    rows = [(t, begin, min(begin + CHUNK, size))
            for t, size in enumerate(sizes) for begin in range(0, size, CHUNK)]
    array = (cuda.get_runtime().from_numpy(np.array(rows, dtype=np.int32).ravel())
             if rows else None)
    _block_maps[sizes] = (array, len(rows))
    return _block_maps[sizes]


class _ScalarsHook:
    """Before each execution of a compiled step: one group's update scalars, written.

    Advances the counters of the parameters that had a gradient when the
    step was captured (as an eager step would), writes their scalars into
    the group's array and marks them changed. :meth:`check` says whether the
    captured launch still fits: the parameters and their state arrays must
    be the ones it was captured with (``load_state_dict`` replaces them).
    """

    def __init__(self, fused, optimizer, group, params, updates):
        self.fused, self.optimizer, self.group, self.params = fused, optimizer, group, params
        self.updates = updates
        #: (parameter, gradient) the captured launch reads: the step writes these
        #: gradients, whatever the step function did with ``p.grad`` afterwards.
        self.gradients = [(p, p.grad) for p, _ in updates]
        self.scalars = fused.scalars
        self.pointers = FusedGroup._pointers(optimizer, params, updates)

    def check(self):
        """None if the captured launch still fits, else why not."""
        for p, _ in self.updates:
            if self.optimizer.state.get(id(p)) is None:
                return "an optimiser's state was replaced (load_state_dict)"
        updates = [(p, self.optimizer.state[id(p)]) for p, _ in self.updates]
        for p, state in updates:
            # State a changed hyperparameter now needs (SGD's momentum buffer
            # once momentum is switched on) must exist: its new pointer then
            # makes the captured table stale below.
            self.optimizer.prepare_state(p, state, self.group)
        if self.fused.scalars is not self.scalars:
            return "an optimiser's parameter group changed (its scalars array was replaced)"
        if FusedGroup._pointers(self.optimizer, self.params, updates) != self.pointers:
            return "parameters, gradients or optimiser state were replaced (load_state_dict?)"
        return None

    def __call__(self):
        tensor_scalars = []
        for p, state in self.updates:
            p.mark_changed()
            tensor_scalars.append((p, self.optimizer.update_scalars(state, self.group)))
        if tensor_scalars:
            self.fused._write_scalars(self.params, tensor_scalars)
