"""Third-party operators: what a plugin author needs, and how gdnflow finds plugins.

A plugin is a Python module (or package) whose import registers operators,
with their kernels in a ``.cu`` file beside it. It uses the same API as the
built-in operators, all importable from here::

    from gdnflow import plugins

    SOURCE = plugins.source_file(__file__, "swish.cu")   # the .cu beside this file

    @plugins.register("swish")
    class Swish(plugins.Operator):
        example_inputs = {"x": (2, 3, 4, 4)}             # for plugin-check and tests
        def forward_numpy(self, x): ...
        def forward_cuda(self, x):
            y = plugins.empty(x.shape, x.dtype)
            plugins.kernel(SOURCE, "swish_forward", "PPi").launch(x.size, x.ptr, y.ptr, x.size)
            ...
        def backward(self, grad_output): ...

``example_inputs`` (optional) describes the inputs in call order: a dict
``{name: shape or array}`` (a shape gets standard-normal values), or a
method taking a ``numpy.random.Generator`` and returning such a dict, for
inputs that need a range (a positive threshold, a valid probability).

Discovery
    An installed distribution names its module under the entry-point group
    ``gdnflow.operators`` (in setup.cfg: ``[options.entry_points]``,
    ``gdnflow.operators = swish = gdnflow_swish``). :func:`load_installed`
    imports each such module once and records a failure with its reason
    instead of raising: one broken plugin breaks nothing else.

    Importing gdnflow loads no plugin, so import stays fast and a broken
    plugin cannot break it. Plugins load on ``gdnflow plugins``, ``gdnflow
    plugin-check``, :func:`load_installed`, and the first time
    :func:`gdnflow.registry.get` is asked for a name nothing has registered.
    A program that calls a plugin's Python API simply imports the plugin.
    :func:`load` imports a plugin from a folder or a ``.py`` file (development).

Checks
    :func:`compile_check` compiles a plugin's ``.cu`` files with nvcc, as the
    kernel loader would, without a GPU, and checks the argument types its
    Python declares for each kernel against the compiled parameter lists
    (:func:`check_kernel_arguments`). :func:`check_operator` runs
    :func:`gradcheck` on the declared example inputs and, where CUDA is usable,
    :func:`assert_backends_match`. :func:`include_dir` is the folder holding
    ``gdnflow_common.cuh``, for running nvcc on a plugin's ``.cu`` directly.
"""
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path

import numpy as np

from gdnflow import registry
from gdnflow.autograd import Operator
from gdnflow.backends import cuda_available
from gdnflow.backends.cuda import empty, kernel, launch_grid
from gdnflow.backends import cuda
from gdnflow.backends.cuda import sources
from gdnflow.backends.cuda.kernel_arguments import (check_declarations, ptx_entries,
                                                    scan_declarations)
from gdnflow.backends.cuda.kernel_cache import KernelCache
from gdnflow.backends.cuda.sources import InlineSource, source_dir
from gdnflow.errors import (BackendUnavailableError, GdnflowError, KernelArgumentError,
                            KernelCompileError, ShapeError)
from gdnflow.registry import register
from gdnflow.tensor import Tensor
from gdnflow.testing import assert_backends_match, gradcheck

__all__ = [
    # writing an operator
    "Operator", "register", "Tensor", "ShapeError", "kernel", "empty", "launch_grid",
    "source_file", "InlineSource", "cuda_available", "include_dir",
    # testing it
    "gradcheck", "assert_backends_match", "example_arrays", "check_operator", "compile_check",
    "check_kernel_arguments", "default_arch",
    # finding plugins
    "ENTRY_POINT_GROUP", "Plugin", "PluginError", "load", "load_installed", "loaded",
    "find_operators", "plugin_of", "owner_of", "KernelCompileError", "KernelArgumentError",
]

ENTRY_POINT_GROUP = "gdnflow.operators"
#: The compile check's target where no GPU says otherwise (see :func:`default_arch`).
DEFAULT_ARCH = "sm_90"


class PluginError(GdnflowError, RuntimeError):
    """A plugin cannot be loaded or checked; the message names the plugin and why."""


def source_file(module_file, name):
    """The absolute path of the CUDA source ``name`` beside ``module_file`` (pass ``__file__``).

    Raises FileNotFoundError at once, so a plugin missing its ``.cu`` (not
    shipped as package data) fails when it loads, not at its first GPU launch.
    """
    path = Path(module_file).resolve().parent / name
    if not path.is_file():
        raise FileNotFoundError(f"CUDA source {path} not found (is it shipped as package data?)")
    return path


def include_dir():
    """The folder holding ``gdnflow_common.cuh``: ``nvcc -I"$(gdnflow info --include)" my.cu``.

    The kernel loader pastes the header in itself; nvcc run by hand (or an
    editor's language server) needs this folder on its include path.
    """
    return source_dir()


# ---------------------------------------------------------------- records --
@dataclasses.dataclass
class Plugin:
    """One plugin: where it came from, whether it loaded, what it registered.

    ``name`` is the entry-point name (or the file or folder name for
    :func:`load`), ``module`` the module imported, ``origin`` the
    distribution or path, ``error`` why the import failed (None if it
    loaded), ``folder`` where its files are, ``package`` whether that
    folder is the plugin's own package (then its ``.cu`` and ``.py`` files may
    sit in subfolders too) and ``file`` the module's own file.
    """

    name: str
    module: str
    origin: str
    error: str = None
    folder: Path = None
    package: bool = False
    file: Path = None

    @property
    def loaded(self):
        """True if the plugin imported without error."""
        return self.error is None

    @property
    def label(self):
        """How messages name the plugin."""
        return f"plugin {self.name!r} (module {self.module})"

    def operators(self):
        """Names of the registered operators defined in the plugin's module or below it."""
        return [name for name in registry.names()
                if _defined_in(registry.get(name), self.module)]

    def sources(self):
        """The plugin's CUDA sources: ``.cu`` files in its folder (and below, for a package)."""
        if self.folder is None:
            return []
        return sorted(self.folder.rglob("*.cu") if self.package else self.folder.glob("*.cu"))

    def python_files(self):
        """The plugin's Python files: its package's modules, or its one module file."""
        if self.package:
            return sorted(self.folder.rglob("*.py"))
        return [self.file] if self.file is not None else []

    def owns(self, path):
        """True if ``path`` is one of this plugin's files."""
        if self.folder is None:
            return False
        path = Path(path).resolve()
        return path.parent == self.folder or (self.package and self.folder in path.parents)


_plugins = []       # every Plugin loaded or tried, in order


@contextlib.contextmanager
def fresh_records():
    """Within the block gdnflow knows of no plugin tried before it; those records return after.

    For tests of plugin loading: each starts as a fresh process would, and
    the plugins it loads are forgotten (as records) when it ends.
    """
    saved = list(_plugins)
    _plugins.clear()
    try:
        yield
    finally:
        _plugins[:] = saved


def loaded():
    """Every plugin loaded or tried so far (installed ones and :func:`load`'s), in order."""
    return list(_plugins)


@sources.on_owner_lookup
def owner_of(path):
    """``"plugin 'name' (module m)"`` for the plugin owning a CUDA source, else None."""
    if isinstance(path, InlineSource):
        return None
    for plugin in _plugins:
        if plugin.owns(path):
            return plugin.label
    return None


def load_for_unknown_name():
    """Load the installed plugins; say which failed (for the registry's KeyError).

    gdnflow's front door gives this to :func:`gdnflow.registry.on_unknown_name`.
    """
    load_installed()
    return "".join(f"; plugin {p.name!r} failed to load: {p.error}"
                   for p in _plugins if not p.loaded)


def plugin_of(op_class):
    """The loaded :class:`Plugin` whose module defines ``op_class``, else None (a built-in)."""
    return next((p for p in _plugins if p.loaded and _defined_in(op_class, p.module)), None)


def _defined_in(cls, module):
    return cls.__module__ == module or cls.__module__.startswith(module + ".")


def _failure(exc, plugin):
    """``"Type: message"``, and the line of the plugin's own code that raised it, if one did."""
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<") and plugin.owns(f.filename)]
    if frames:
        reason += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return reason


def _forget(module):
    """Undo a failed import: the operators it registered and its half-built modules."""
    for name in registry.names():
        if _defined_in(registry.get(name), module):
            registry.unregister(name)
    for key in [k for k in sys.modules if k == module or k.startswith(module + ".")]:
        del sys.modules[key]


def _where(spec):
    """(folder, is a package, module file) of a module spec, or (None, False, None)."""
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None, False, None
    origin = Path(spec.origin).resolve()
    return origin.parent, spec.submodule_search_locations is not None, origin


# --------------------------------------------------------------- loading --
def load_installed():
    """Import the installed plugins (entry-point group ``gdnflow.operators``) not tried yet.

    A plugin that fails to import is recorded with its reason (see
    :func:`loaded`) and what it had registered is undone; nothing is raised.
    Returns the records of every installed plugin, in entry-point order.
    """
    records = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(entry, "dist", None)
        origin = f"{dist.name} {dist.version}" if dist is not None else "entry point"
        record = next((p for p in _plugins if p.name == entry.name and p.origin == origin), None)
        if record is None:
            record = Plugin(entry.name, entry.module, origin)
            try:
                record.folder, record.package, record.file = _where(
                    importlib.util.find_spec(entry.module))
            except Exception:     # a broken parent package: the import below says why
                pass
            try:
                entry.load()
            except Exception as exc:
                record.error = _failure(exc, record)
                _forget(entry.module)
            _plugins.append(record)
        records.append(record)
    return records


def load(path):
    """Import a plugin from a package folder (with ``__init__.py``) or a ``.py`` file.

    A package is imported under its folder's name, so that its modules can
    import each other by that name (refused if another module has the name).
    A single file gets a module name unique to its path, so that files of the
    same name in different folders do not collide. Loading the same path again
    returns its record. Raises :class:`PluginError`, naming the plugin and the
    cause, if the import fails, after undoing what it registered. Returns the
    :class:`Plugin`.
    """
    path = Path(path).resolve()
    if path.is_dir() and (path / "__init__.py").is_file():
        file, folder, package, name = path / "__init__.py", path, True, path.name
        module = name
        if not module.isidentifier():
            raise PluginError(f"cannot import the package folder {path}: {name!r} is not a "
                              "Python module name")
    elif path.is_file() and path.suffix == ".py":
        file, folder, package, name = path, path.parent, False, path.stem
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        module = f"gdnflow_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{digest}"
    else:
        raise PluginError(f"cannot load a plugin from {path}: give a .py file or a package "
                          "folder (one with __init__.py)")
    for record in _plugins:
        if record.origin == str(path) and record.loaded:
            return record
    record = Plugin(name, module, str(path), folder=folder, package=package, file=file)
    _plugins[:] = [p for p in _plugins if p.origin != str(path)]     # forget an earlier failure
    _plugins.append(record)
    if module in sys.modules:      # imported already (installed, or by the user's own import)
        existing = getattr(sys.modules[module], "__file__", None)
        if existing and Path(existing).resolve() == file:
            return record
        record.error = f"a module named {module!r} is already imported from {existing}"
        raise PluginError(f"{record.label} from {path} failed to load: {record.error}")
    spec = importlib.util.spec_from_file_location(
        module, file, submodule_search_locations=[str(path)] if package else None)
    try:
        # In sys.modules before it runs: imports inside a package look for it there.
        sys.modules[module] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[module])
    except Exception as exc:
        record.error = _failure(exc, record)
        _forget(module)
        raise PluginError(f"{record.label} from {path} failed to load: {record.error}") from exc
    return record


def find_operators(name):
    """Operator classes for ``name``: a plugin's path, an installed plugin, or an operator.

    Raises :class:`PluginError` saying what was looked for and what exists.
    """
    if Path(name).exists():
        plugin = load(name)
    else:
        plugin = next((p for p in load_installed() if p.name == name), None)
    if plugin is not None:
        if not plugin.loaded:
            raise PluginError(f"{plugin.label} failed to load: {plugin.error}")
        if not plugin.operators():
            raise PluginError(f"{plugin.label} registers no operator")
        return [registry.get(op) for op in plugin.operators()]
    if name in registry.names():
        return [registry.get(name)]
    installed = ", ".join(p.name for p in load_installed()) or "none"
    raise PluginError(f"no plugin, plugin path or operator named {name!r} "
                      f"(installed plugins: {installed})")


# ---------------------------------------------------------------- checks --
def example_arrays(op, rng):
    """The inputs ``op`` (an operator instance) declares in ``example_inputs``: (names, arrays).

    See the module docstring for the declaration; raises :class:`PluginError`
    if the operator declares none or declares them badly.
    """
    spec = getattr(op, "example_inputs", None)
    if spec is None:
        raise PluginError(f"{op.label} declares no example_inputs: give a dict "
                          "{input name: shape} in call order (see gdnflow.plugins)")
    if callable(spec):
        spec = spec(rng)
    if not isinstance(spec, dict) or not spec:
        raise PluginError(f"{op.label}.example_inputs should be a non-empty dict "
                          f"{{input name: shape or array}}, got {spec!r}")
    arrays = []
    for name, value in spec.items():
        if isinstance(value, tuple) and all(isinstance(d, int) and d > 0 for d in value):
            arrays.append(rng.standard_normal(value))
        elif isinstance(value, np.ndarray):
            arrays.append(value)
        else:
            raise PluginError(f"{op.label}.example_inputs[{name!r}] should be a shape (a tuple "
                              f"of positive ints) or a NumPy array, got {value!r}")
    return list(spec), arrays


def check_operator(op_class, *, seed=0):
    """Check an operator on its declared example inputs; return what ran, one line each.

    Runs :func:`gradcheck` (NumPy, float64) and, where CUDA is usable,
    :func:`assert_backends_match`; where it is not, the line says ``NOT RUN``
    and why. The operator is built with no arguments. Raises AssertionError
    naming the operator and its inputs (by their declared names) when a check
    fails, :class:`PluginError` when the operator declares no usable
    ``example_inputs``, and whatever the operator itself raises.
    """
    try:
        op = op_class()
    except TypeError as exc:
        raise PluginError(f"{op_class.__name__} cannot be built without arguments ({exc}); "
                          "plugin-check needs defaults for its parameters") from None
    names, arrays = example_arrays(op, np.random.default_rng(seed))
    inputs = ", ".join(f"{n} {a.shape}" for n, a in zip(names, arrays))

    def apply(*tensors):
        return op_class()(*tensors)

    done = []
    for check, what in ((gradcheck, "gradcheck (numpy, float64)"),
                        (assert_backends_match, "cuda against numpy (float32)")):
        if check is assert_backends_match and not cuda_available():
            done.append(f"{what}: NOT RUN (no CUDA device: "
                        f"{cuda.unavailable_reason() or 'none found'})")
            continue
        try:
            check(apply, arrays, seed=seed, names=names)
        except AssertionError as exc:
            raise AssertionError(f"{op.label} on inputs {inputs}: {what} failed: {exc}") from None
        done.append(f"{what}: passed on {inputs}")
    return done


def default_arch():
    """The compile check's target: this machine's GPU where CUDA is usable, else sm_90."""
    return cuda.get_runtime().arch if cuda_available() else DEFAULT_ARCH


def compile_check(target, *, defines=(), arch=None, compiler=None):
    """Compile CUDA sources with nvcc as the kernel loader would; return the files checked.

    ``target`` is a :class:`Plugin` or its name, a plugin's ``.py`` file or
    package folder (its ``.cu`` files), a ``.cu`` path, or an
    :class:`InlineSource`. Each file is expanded like the loader does
    (:func:`~gdnflow.backends.cuda.sources.expand_source`) and compiled to a
    cubin with the loader's nvcc options (``arch`` defaults to
    :func:`default_arch`; nothing is kept in the kernel cache): no GPU is
    needed, so CI can run it. Then the kernel argument types the plugin's
    Python declares are checked against the compiled kernels
    (:func:`check_kernel_arguments`). Raises :class:`KernelCompileError`
    naming the plugin, the file, the line and nvcc's message for every file
    that fails, :class:`KernelArgumentError` listing every declaration that
    disagrees with its kernel, and
    :class:`~gdnflow.errors.BackendUnavailableError` where nvcc is missing.
    ``compiler`` is the :class:`~gdnflow.backends.cuda.kernel_cache.KernelCache`
    whose nvcc compiles (default: the nvcc on PATH).
    """
    report = check_kernel_arguments(target, defines=defines, arch=arch, compiler=compiler)
    if not report.ok:
        raise KernelArgumentError("\n".join(report.problems))
    return report.files


def check_kernel_arguments(target, *, defines=(), arch=None, compiler=None):
    """Compile ``target``'s sources (as :func:`compile_check`) and check its kernel declarations.

    The declarations are the calls ``kernel(FILE, "name", "types", ...)``
    in the plugin's Python files whose name and types are string constants
    (see :mod:`gdnflow.backends.cuda.kernel_arguments`); each is compared
    with the parameter list nvcc compiled for that kernel: a kernel no file
    defines, a count, size or float/int mismatch is a problem; a declaration
    whose strings are computed is listed as not checked. Returns an
    :class:`~gdnflow.backends.cuda.kernel_arguments.ArgumentReport` (with
    ``files``, the sources compiled); raises like :func:`compile_check` when
    a file does not compile. ``compiler``: as for :func:`compile_check`.
    """
    owner, files, python_files, complete = _sources_of(target)
    ptx = _compile(files, defines, arch or default_arch(), owner, compiler or KernelCache())
    # Declarations are shown as "package/module.py:line".
    relative_to = Path(os.path.commonpath([f.parent for f in python_files])).parent if (
        python_files) else None
    declarations = [d for file in python_files for d in scan_declarations(file, relative_to)]
    report = check_declarations(declarations, {file: ptx_entries(text) for file, text in
                                               ptx.items()}, complete=complete)
    report.files = list(files)
    return report


def _compile(files, defines, arch, owner, compiler):
    """``{file: PTX text}``: each file expanded and compiled by ``compiler``'s nvcc for ``arch``
    (the loader's options), the PTX kept from the same run."""
    if not compiler.nvcc:
        raise BackendUnavailableError("nvcc is not on PATH: CUDA sources cannot be checked here")
    failures, ptx = [], {}
    for file in files:
        try:
            ptx[file] = compiler.compile_with_ptx(file, tuple(defines), arch, owner)[1]
        except KernelCompileError as exc:
            failures.append(str(exc))
    if failures:
        raise KernelCompileError("\n\n".join(failures))
    return ptx


def _sources_of(target):
    """(owner label or None, CUDA sources, Python files declaring kernels, whether complete).

    For :func:`check_kernel_arguments`'s ``target``; "complete" when the
    sources are all those the Python files may name (not one ``.cu`` of many).
    """
    if isinstance(target, InlineSource):
        return None, [target], [], False
    if isinstance(target, str) and not Path(target).exists():
        target = next((p for p in _plugins + load_installed() if p.name == target), None) or target
    if isinstance(target, Plugin):
        return target.label, target.sources(), target.python_files(), True
    path = Path(target).resolve()
    if path.suffix == ".cu" and path.is_file():
        plugin = next((p for p in _plugins if p.owns(path)), None)
        python_files = plugin.python_files() if plugin else sorted(path.parent.glob("*.py"))
        return None, [path], python_files, False
    if path.is_dir():
        return None, sorted(path.rglob("*.cu")), sorted(path.rglob("*.py")), True
    if path.suffix == ".py" and path.is_file():
        return None, sorted(path.parent.glob("*.cu")), [path], True
    raise PluginError(f"compile_check: {target!r} is no plugin, .cu file, plugin file or folder")
