"""The optimiser base class: parameter groups, per-parameter state, state
dicts, and the two ways an update runs.

On NumPy an update is a few in-place array operations per parameter. On CUDA
every parameter of a group is updated by ONE launch of a multi-tensor kernel
in ``cuda_src/optim.cu``: the group's parameter, gradient and state pointers
sit in a device pointer table and a block map says which tensor and which
elements each CUDA block updates (the layout is documented in optim.cu and
built by :class:`FusedGroup`). The tables are uploaded once and again only
when a pointer changes: gradients are fresh arrays after every backward,
but in a steady training loop the memory pool tends to hand back the same
blocks, and then nothing is uploaded (one small copy when it does not).

Updates work on the parameters' arrays directly, never through operators, so
they record no autograd history whether or not they run under ``no_grad``.
"""
import numpy as np

from gdnflow.backends import cuda, get_backend
from gdnflow.errors import ShapeError
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
    ``kernel``, ``kernel_args``, ``per_tensor_scalars``
        the name of the multi-tensor kernel in optim.cu, the struct codes of
        its scalar arguments, and how many of the last ones may differ
        between the parameters of a group (see :class:`FusedGroup`);
    ``check_group(group)``
        validate and normalise a group's hyperparameters;
    ``prepare_state(p, state, group)``
        create the state a parameter's update needs, before its first update;
    ``update_scalars(state, group)``
        advance per-parameter counters and return the kernel's scalar arguments;
    ``update_numpy(param, grad, state, scalars)``
        the update on NumPy arrays, in place.
    """

    state_arrays = ()
    required_state = ()
    kernel = None
    kernel_args = ""
    per_tensor_scalars = 0

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
        so compiled inference plans of it know they are stale.
        """
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
                p.mark_changed()
                state = self.state.setdefault(id(p), {})
                self.prepare_state(p, state, group)
                scalars = self.update_scalars(state, group)
                if p.device == "numpy":
                    self.update_numpy(p.data, grad.data, state, scalars)
                else:
                    on_cuda.append((p, state, scalars))
            if on_cuda:
                fused = self._fused.get(index)
                if fused is None:
                    fused = self._fused[index] = FusedGroup()
                fused.run(self, [p for p in group["params"] if p.device == "cuda"], on_cuda)

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
    """The device tables of one parameter group's fused CUDA update.

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
    ``per_tensor``  float32, k per tensor: the last k scalar arguments
                    (``Optimizer.per_tensor_scalars``) for each tensor, used
                    only when they differ between the tensors of a step (Adam
                    parameters whose step counts differ because one had no
                    gradient on some step); otherwise the kernel takes them as
                    plain arguments and a null pointer here.

    Each array is uploaded again only when its contents change, so a step is
    one launch plus, at most, a copy of the pointer table (and of
    ``per_tensor`` when it is in use).
    """

    def __init__(self):
        self.sizes = None
        self.blocks = None
        self.n_blocks = 0
        self._arrays = {}           # name -> (host values as a tuple, device array)

    def run(self, optimizer, params, updates):
        """Update ``updates`` [(param, state, scalars)], all among the group's CUDA ``params``."""
        sizes = tuple(p.data.size for p in params)
        if sizes != self.sizes:
            self._build_blocks(sizes)
        if not self.n_blocks:
            return                   # only empty tensors: nothing to update
        n, k = len(params), optimizer.per_tensor_scalars
        position = {id(p): t for t, p in enumerate(params)}
        pointers = [p.data.ptr for p in params] + [0] * (n * (1 + len(optimizer.state_arrays)))
        tails = {}
        for p, state, scalars in updates:
            t = position[id(p)]
            pointers[n + t] = p.grad.data.ptr
            for row, name in enumerate(optimizer.state_arrays, start=2):
                if name in state:
                    pointers[row * n + t] = state[name].ptr
            tails[t] = scalars[len(scalars) - k:]
        # The leading scalars are the group's hyperparameters: the same for all.
        shared = updates[0][2][:len(updates[0][2]) - k]
        if len(set(tails.values())) <= 1:
            tail, per_tensor = next(iter(tails.values())), 0
        else:
            values = [0.0] * (n * k)
            for t, scalars in tails.items():
                values[t * k:(t + 1) * k] = scalars
            per_tensor, tail = self._upload("per_tensor", values, np.float32).ptr, (0.0,) * k
        table = self._upload("table", pointers, np.uint64)
        kernel = cuda.kernel(SOURCE, optimizer.kernel, "PPiP" + optimizer.kernel_args)
        kernel((self.n_blocks, 1, 1), (BLOCK, 1, 1), table.ptr, self.blocks.ptr, n, per_tensor,
               *shared, *tail)

    def _build_blocks(self, sizes):
        for size in sizes:
            if size >= 2 ** 31:
                raise ValueError(f"a parameter of {size} elements exceeds the 2^31 - 1 that "
                                 "gdnflow's kernels index")
        rows = [(t, begin, min(begin + CHUNK, size))
                for t, size in enumerate(sizes) for begin in range(0, size, CHUNK)]
        self.n_blocks = len(rows)
        self.sizes = sizes
        if rows:
            self.blocks = cuda.get_runtime().from_numpy(np.array(rows, dtype=np.int32).ravel())

    def _upload(self, name, values, dtype):
        """The device array ``name`` holding ``values``, copied only if they changed."""
        values = tuple(values)
        known, array = self._arrays.get(name, (None, None))
        if values == known:
            return array
        host = np.array(values, dtype=dtype)
        if array is None or array.size != host.size:
            array = cuda.get_runtime().from_numpy(host)
        else:
            # Into the same device array, on gdnflow's one stream: the copy
            # runs after every launch queued before it that reads the array.
            import pycuda.driver as drv     # local import: PyCUDA on first use
            drv.memcpy_htod_async(array.ptr, host, cuda.get_runtime().stream)
        self._arrays[name] = (values, array)
        return array
