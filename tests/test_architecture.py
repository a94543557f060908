"""gdnflow's house plan, checked from the source: layers, imports, module size, settings.

The layer order below is the one place it is written (docs/architecture.md
draws it). A module may import modules of its own layer and of lower layers,
never of a higher one, and the imports between gdnflow's modules form no
cycle. ``gdnflow/__init__.py`` is the package's front door: it wires the
layers together (and loads optional parts on first use), so it may import
any of them, and only the command line above it imports it.
"""
import ast
import configparser
import pathlib
import subprocess
import sys

import pytest


ROOT = pathlib.Path(__file__).resolve().parents[1]     # the checkout
PACKAGE = ROOT / "gdnflow"

#: Lowest first. A name covers the module or package of that name and everything below it.
LAYERS = (
    ("errors", "config", "version", "step_state", "precision"),
    ("registry", "backends", "step_context"),
    ("tensor",),
    ("autograd",),
    ("testing",),
    ("ops",),
    ("nn",),
    ("models", "optim", "inference", "step", "distributed"),
    ("io", "data", "plots", "commandline"),
    ("plugins", "sparse"),
    ("codec", "train", "classify", "benchmarking", "inference_bench", "demo"),
    ("cli", "__main__"),
)
#: What ``import gdnflow`` must leave unloaded until it is used.
OPTIONAL = ("gdnflow.sparse", "gdnflow.io.onnx", "gdnflow.io.keras", "gdnflow.codec",
            "gdnflow.train", "gdnflow.classify", "gdnflow.inference", "gdnflow.plugins", "gdnflow.step",
            "gdnflow.data", "gdnflow.distributed", "gdnflow.backends.cuda.runtime",
            "gdnflow.backends.cuda.kernels")
MAX_LINES = 600
LOCAL_IMPORT_REASON = "# local import:"


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module):
    """The index in LAYERS of a gdnflow module (its first component below gdnflow)."""
    if module == "gdnflow":
        return len(LAYERS) - 1.5        # the front door: above the library, below the CLI
    top = module.split(".")[1]
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py's LAYERS; "
                         "add its package there (and to docs/architecture.md)")


def _imports(module):
    """(imported gdnflow module, line, whether at module level, the line's text) for ``module``."""
    path = MODULES[module]
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    top_level = set()
    for node in tree.body:
        top_level.add(node)
        if isinstance(node, (ast.If, ast.Try)):     # optional imports at module level
            for child in ast.walk(node):
                top_level.add(child)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # "from gdnflow.ops import conv": the submodule, where it is one
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                     for a in node.names]
        else:
            continue
        text = "\n".join(lines[max(node.lineno - 2, 0):node.end_lineno])
        for name in dict.fromkeys(names):
            found.append((name, node.lineno, node in top_level, text))
    return sorted(found)


def _gdnflow_edges():
    edges = {}
    for module in MODULES:
        if module == "gdnflow":
            continue
        for name, line, _, _ in _imports(module):
            if name == "gdnflow" or not name.startswith("gdnflow."):
                continue
            while name not in MODULES:          # "gdnflow.x.y" where y is a name in x
                name = name.rsplit(".", 1)[0]
            if name != module:
                edges.setdefault(module, {}).setdefault(name, line)
    return edges


def test_every_module_sits_in_a_layer():
    placed = {name for names in LAYERS for name in names}
    unplaced = sorted(m for m in MODULES if m != "gdnflow" and m.split(".")[1] not in placed)
    assert not unplaced, f"modules in no layer of LAYERS (add their package there): {unplaced}"


def test_no_import_runs_up_the_layers():
    upward = []
    for module, targets in _gdnflow_edges().items():
        for target, line in targets.items():
            if _layer(target) > _layer(module):
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target} "
                              f"(layer {LAYERS[_layer(target)]} is above {LAYERS[_layer(module)]})")
    assert not upward, "imports running up the layers:\n" + "\n".join(upward)


def test_no_module_imports_the_package_front_door():
    offenders = [f"{MODULES[m].relative_to(ROOT)}:{line}"
                 for m in MODULES if _layer(m) < len(LAYERS) - 1
                 for name, line, _, _ in _imports(m) if name == "gdnflow"]
    assert not offenders, ("modules importing gdnflow/__init__ (import what you need from the "
                           "module that defines it):\n" + "\n".join(offenders))


def _find_cycle(edges):
    """One import cycle as a list of modules, or None (iterative depth-first search)."""
    state = {}
    for start in sorted(edges):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(edges.get(start, ()))))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(edges.get(child, ())))))
    return None


def test_no_import_cycle_between_modules():
    cycle = _find_cycle(_gdnflow_edges())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert _find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b": 1, "c": 1}, "b": {"c": 1}}) is None


def test_function_local_imports_state_their_reason():
    unexplained = [f"{MODULES[m].relative_to(ROOT)}:{line}"
                   for m in MODULES
                   for _, line, at_top, text in _imports(m)
                   if not at_top and LOCAL_IMPORT_REASON not in text]
    assert not unexplained, (f"imports inside functions without a '{LOCAL_IMPORT_REASON} <why>' "
                             "comment (on the line or the one above):\n" + "\n".join(unexplained))


def test_no_module_is_over_the_size_limit():
    too_long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
                if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them along their jobs): {too_long}"


def test_import_gdnflow_loads_no_optional_part():
    code = ("import sys, gdnflow; print('\\n'.join(m for m in sys.modules "
            "if m.startswith('gdnflow')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    early = [m for m in loaded if any(m == o or m.startswith(o + ".") for o in OPTIONAL)]
    assert not early, f"import gdnflow loaded optional parts: {early}"


# ------------------------------------- tests and benchmarks set no globals --
def _module_aliases(tree):
    """{name: gdnflow module} for the names the file's imports bind to gdnflow modules."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gdnflow"):
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases["gdnflow"] = "gdnflow"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gdnflow"):
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _module_named(node, aliases):
    """The gdnflow module that the expression ``node`` names (``conv``, ``gf.ops.conv``), or None."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _module_named(node.value, aliases)
        if base and f"{base}.{node.attr}" in MODULES:
            return f"{base}.{node.attr}"
    return None


def global_assignments(source):
    """Lines of ``source`` that assign (or patch) a global of a gdnflow module."""
    tree = ast.parse(source)
    aliases = _module_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and _module_named(t.value, aliases)
                   for t in targets):
                found.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("setattr", "delattr", "setitem") and node.args):
            first = node.args[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith("gdnflow"):
                found.append(node.lineno)
            elif _module_named(first, aliases):
                found.append(node.lineno)
            elif (node.func.attr == "setitem" and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)
                  and str(node.args[1].value).startswith("gdnflow")):
                found.append(node.lineno)         # sys.modules["gdnflow..."] = stand-in
    return sorted(found)


def test_the_global_assignment_check_sees_patches():
    source = ("import gdnflow.ops.conv as conv_module\nfrom gdnflow.ops import conv\n"
              "conv_module.planner = 1\nmonkeypatch.setattr(conv, 'X', 2)\n"
              "monkeypatch.setattr('gdnflow.io.checkpoint._write', 3)\n"
              "monkeypatch.setitem(sys.modules, 'gdnflow.backends.cuda.runtime', 4)\n"
              "module.shift = 5\nconv_module.Planner.count = 6\ngf.ops.conv.X = 7\n")
    assert global_assignments("import gdnflow as gf\n" + source) == [4, 5, 6, 7, 10]


@pytest.mark.parametrize("folder", ["tests", "benchmarks"])
def test_tests_and_benchmarks_assign_no_module_globals(folder):
    offenders = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if path == pathlib.Path(__file__):
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line}" for line in global_assignments(path.read_text())]
    assert not offenders, ("assignments to gdnflow modules' globals (use gdnflow.config.override, "
                           "gdnflow.backends.cuda.simulated or a hook):\n" + "\n".join(offenders))


def test_operator_classes_follow_the_naming_rule():
    # <Operation>Op for operators; the plain name belongs to the nn layer (Conv2d).
    code = ("import gdnflow.sparse; from gdnflow import registry; "
            "print('\\n'.join(f'{c.__module__}.{c.__qualname__}' for c in "
            "map(registry.get, registry.names()) if c.__module__.startswith('gdnflow')))")
    classes = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.split()
    assert classes, "no built-in operator found"
    wrong = [c for c in classes if not c.endswith("Op")]
    assert not wrong, f"operator classes not named <Operation>Op: {wrong}"


def _names_bound_at_top(tree):
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_no_package_function_is_shadowed_by_a_submodule():
    # Importing gdnflow.x.y sets the attribute gdnflow.x.y to the module, replacing a
    # function y defined in gdnflow/x/__init__.py (as cuda.runtime() was, on the GPU).
    clashes = []
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for name in _names_bound_at_top(ast.parse(path.read_text())):
            if f"{module}.{name}" in MODULES:
                clashes.append(f"{module}.{name}")
    assert not clashes, f"functions or values with the name of a submodule: {clashes}"


def test_setup_cfg_lists_every_package():
    # A package missing there is left out of a non-editable install (as CI's is).
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert packages <= listed, f"packages missing from setup.cfg: {sorted(packages - listed)}"


def test_every_gdnflow_error_is_a_gdnflow_error():
    bases = {}
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                                    for b in node.bases]

    def reaches_base(name, seen=()):
        return name == "GdnflowError" or any(
            b not in seen and reaches_base(b, seen + (name,)) for b in bases.get(name, ()))

    errors = [n for n in bases if n.endswith("Error") and n != "GdnflowError"]
    assert len(errors) > 10
    assert not [n for n in errors if not reaches_base(n)], "errors outside GdnflowError"
