"""Kernel argument types checked against the compiled kernels, without a GPU.

A kernel is launched with a ``struct`` format string naming its argument
types (``kernel(SOURCE, "swish_backward", "PPPi")``); a wrong string packs the
arguments wrongly and the kernel reads garbage, with no error. This module
finds those declarations in Python source (:func:`scan_declarations`, with
``ast``: calls ``kernel(FILE, "name", "types", ...)`` whose name and types
are string constants) and compares them with the parameter lists nvcc wrote
into the PTX (:func:`ptx_entries`), by count, size and kind per position
(:func:`check_declarations`).

PTX cannot tell a pointer from a 64-bit integer (both ``.u64``) nor a
signed int from an unsigned one, so ``P``, ``q`` and ``Q`` all fit an 8-byte
integer parameter and ``i`` and ``I`` a 4-byte one; a float (``f``, ``d``)
against an integer parameter, or any size mismatch, is an error. A struct
passed by value (``.param .align N .b8 name[K]``) matches the run of codes
that fills its K bytes (its fields, as the caller packs them).
Pure Python, no PyCUDA: CI runs it with nvcc alone.
"""
import ast
import dataclasses
import re
import struct
from pathlib import Path

from gdnflow.backends.cuda.limits import format_codes

#: The keyword names of ``kernel(file, name, arg_types, defines=())``.
_KERNEL_PARAMETERS = ("file", "name", "arg_types")
_FLOAT_CODES = "efd"
# ".visible .entry name(params)" (params hold no parenthesis)
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)")
_PARAM_TYPE = re.compile(r"\.([busf])(8|16|32|64)\b")
_ARRAY = re.compile(r"\[(\d+)\]")
_ALIGN = re.compile(r"\.align\s+(\d+)")


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One kernel parameter as PTX declares it: ``size`` in bytes and ``kind``.

    ``kind`` is ``"int"`` (``.u``/``.s``), ``"float"`` (``.f``) or ``"bits"``
    (``.b``, untyped), which matches either. ``struct`` marks a struct passed
    by value (``.param .align N .b8 name[K]``: K bytes, aligned to ``align``).
    """

    size: int
    kind: str
    struct: bool = False
    align: int = 1

    @property
    def letter(self):
        """How messages show it: the format code that fits it, or ``{K bytes}`` for a struct."""
        if self.struct:
            return f"{{{self.size} bytes}}"
        if self.kind == "float":
            return {4: "f", 8: "d", 2: "e"}.get(self.size, f"{{{self.size} bytes}}")
        return {8: "P", 4: "i", 2: "h", 1: "b"}.get(self.size, f"{{{self.size} bytes}}")


def ptx_entries(ptx):
    """``{kernel name: [Parameter, ...]}`` of every ``.entry`` in PTX text."""
    entries = {}
    for name, params in _ENTRY.findall(ptx):
        parameters = []
        for param in filter(None, (p.strip() for p in params.split(","))):
            kind, bits = _PARAM_TYPE.search(param).groups()
            count, align = _ARRAY.search(param), _ALIGN.search(param)
            size = int(bits) // 8 * (int(count.group(1)) if count else 1)
            parameters.append(Parameter(size, {"f": "float", "b": "bits"}.get(kind, "int"),
                                        struct=count is not None,
                                        # (".ptr .align 1" is the pointee's alignment)
                                        align=int(align.group(1)) if count and align
                                        else int(bits) // 8))
        entries[name] = parameters
    return entries


@dataclasses.dataclass
class Declaration:
    """One ``kernel(...)`` call found in Python source.

    ``where`` is ``"path:line"``; ``kernel`` and ``arg_types`` are the
    constant strings (None where the source computes them, and then
    ``unreadable`` says which); ``source`` is the file name of the ``.cu`` it
    names where that could be read (a string constant, a module constant, or
    the ``.cu`` name inside a call such as ``source_file(__file__, "x.cu")``).
    """

    where: str
    kernel: str = None
    arg_types: str = None
    source: str = None
    unreadable: str = None


def _constant_string(node, constants):
    """The string a node evaluates to, if it is built from constants: ``"PP" + "i" * 3``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and isinstance(constants.get(node.id), str):
        return constants[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = _constant_string(node.left, constants)
        right = _constant_string(node.right, constants)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for text, count in ((node.left, node.right), (node.right, node.left)):
            value, count = _constant_string(text, constants), _constant_int(count, constants)
            if value is not None and count is not None:
                return value * count
    return None


def _constant_int(node, constants):
    """The int a constant or a module constant's name stands for, or None."""
    value = node.value if isinstance(node, ast.Constant) else (
        constants.get(node.id) if isinstance(node, ast.Name) else None)
    return value if type(value) is int else None


def _source_name(node, constants, sources):
    """The ``.cu`` file name a kernel call's first argument names, or None."""
    if isinstance(node, ast.Name) and node.id in sources:
        return sources[node.id]
    value = _constant_string(node, constants)
    if value is not None:
        return Path(value).name if value.endswith(".cu") else None
    if isinstance(node, ast.Call):      # source_file(__file__, "x.cu"), InlineSource(..., name=)
        for arg in list(node.args) + [k.value for k in node.keywords]:
            name = _source_name(arg, constants, sources)
            if name is not None:
                return name
    return None


def scan_declarations(path, relative_to=None):
    """The :class:`Declaration` of every ``kernel(...)`` call in the Python file ``path``.

    A call counts if it is to a name or attribute ``kernel`` and passes at
    least the file, name and types (positionally or as ``file=``, ``name=``,
    ``arg_types=``). ``where`` names the file relative to ``relative_to``
    when it lies below it.
    """
    path = Path(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    constants, sources = {}, {}
    for node in tree.body:       # module constants: TYPES = "PPi", SOURCE = "x.cu", MAX = 8
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            value = _constant_string(node.value, constants)
            if value is None:
                value = _constant_int(node.value, constants)
            if value is not None:
                constants[node.targets[0].id] = value
            source = _source_name(node.value, constants, sources)
            if source is not None:
                sources[node.targets[0].id] = source
    shown = path
    if relative_to is not None and Path(relative_to) in path.parents:
        shown = path.relative_to(relative_to)
    found = []
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in calls:
        func = node.func
        if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) != "kernel":
            continue
        if any(isinstance(arg, ast.Tuple) for arg in node.args[:2]):
            continue        # a launch, kernel(grid, block, *args), not a declaration
        given = dict(zip(_KERNEL_PARAMETERS, node.args))
        given.update((k.arg, k.value) for k in node.keywords if k.arg in _KERNEL_PARAMETERS)
        if len(given) < len(_KERNEL_PARAMETERS):
            continue
        declaration = Declaration(
            f"{shown}:{node.lineno}", _constant_string(given["name"], constants),
            _constant_string(given["arg_types"], constants),
            _source_name(given["file"], constants, sources))
        unread = [what for what, value in (("kernel name", declaration.kernel),
                                          ("argument types", declaration.arg_types))
                  if value is None]
        if unread:
            declaration.unreadable = " and ".join(unread) + " computed, not a string constant"
        found.append(declaration)
    return found


def _describe(code):
    size = struct.calcsize(code)
    return f"{size}-byte {'float' if code in _FLOAT_CODES else 'pointer' if code == 'P' else 'int'}"


def _padded_size(codes, align):
    """Bytes a struct of fields ``codes`` takes: native alignment, rounded up to ``align``."""
    size = struct.calcsize("".join(codes))
    return -(-size // align) * align


def _runs(codes, parameters):
    """The codes grouped per parameter: one per scalar, a run filling a struct; None if short/long."""
    runs, position = [], 0
    for parameter in parameters:
        end = position + 1
        if parameter.struct:
            while end < len(codes) and _padded_size(codes[position:end], parameter.align) < (
                    parameter.size):
                end += 1
        if end > len(codes):
            return None
        runs.append(codes[position:end])
        position = end
    return runs if position == len(codes) else None


def compare(declaration, parameters, file_name):
    """Problems (one line each) between a declaration and a kernel's PTX ``parameters``.

    A struct parameter takes the run of codes that fills its size (its
    fields, as the caller packs them); other parameters take one code each.
    """
    try:
        codes = list(format_codes(declaration.arg_types))
        struct.calcsize("".join(codes))
    except struct.error as exc:
        return [f"{declaration.where}: argument types {declaration.arg_types!r} of "
                f"{declaration.kernel!r} are no struct format ({exc})"]
    runs = _runs(codes, parameters)
    if runs is None:
        shown = " ".join(p.letter for p in parameters)
        return [f"{declaration.kernel!r} takes {len(parameters)} parameters ({shown}) in "
                f"{file_name}; {declaration.where} declares {declaration.arg_types!r} "
                f"({len(codes)})"]
    problems = []
    for index, (run, parameter) in enumerate(zip(runs, parameters)):
        if parameter.struct:
            if _padded_size(run, parameter.align) != parameter.size:
                problems.append(
                    f"{declaration.kernel!r} parameter {index} is a {parameter.size}-byte struct "
                    f"in {file_name}; {declaration.where} declares {''.join(run)!r} "
                    f"({_padded_size(run, parameter.align)} bytes) in "
                    f"{declaration.arg_types!r}")
            continue
        (code,) = run
        is_float = code in _FLOAT_CODES
        kind_ok = parameter.kind == "bits" or (parameter.kind == "float") == is_float
        if struct.calcsize(code) != parameter.size or not kind_ok:
            problems.append(
                f"{declaration.kernel!r} parameter {index} is a {parameter.size}-byte "
                f"{parameter.kind} ({parameter.letter}) in {file_name}; {declaration.where} "
                f"declares {code!r} ({_describe(code)}) in {declaration.arg_types!r}")
    return problems


@dataclasses.dataclass
class ArgumentReport:
    """What :func:`check_declarations` found: one line per problem, match, or unread declaration.

    ``files`` lists the sources compiled, where the caller compiled them.
    """

    files: list = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)
    checked: list = dataclasses.field(default_factory=list)
    not_checked: list = dataclasses.field(default_factory=list)

    @property
    def ok(self):
        """True when no declaration disagrees with its kernel."""
        return not self.problems

    def summary(self):
        """One line: how many declarations matched, and which could not be read."""
        line = f"{len(self.checked)} kernel declarations match their kernels"
        if self.not_checked:
            line += "; not checked: " + "; ".join(self.not_checked)
        return line


def check_declarations(declarations, compiled, *, complete=True):
    """Compare ``declarations`` with ``compiled``, ``{.cu path or name: ptx_entries(...)}``.

    A declaration naming one of the compiled files is looked up there; one
    whose file could not be read is looked up in all of them. With
    ``complete`` False (only some of the sources were compiled), declarations
    naming another file, or whose kernel none of these files has, are left
    out instead of reported missing.
    """
    by_name = {Path(str(file)).name: entries for file, entries in compiled.items()}
    report = ArgumentReport()
    for declaration in declarations:
        if declaration.unreadable:
            report.not_checked.append(f"{declaration.where} ({declaration.unreadable})")
            continue
        if declaration.source in by_name:
            searched = [declaration.source]
        elif complete or declaration.source is None:
            searched = list(by_name)
        else:
            continue
        file_name = next((f for f in searched if declaration.kernel in by_name[f]), None)
        if file_name is None:
            if complete or declaration.source in by_name:
                report.problems.append(
                    f"missing kernel: {declaration.where} declares {declaration.kernel!r}; "
                    f"searched {', '.join(searched) or 'no .cu files'}: no extern \"C\" "
                    "__global__ kernel of that name")
            continue
        problems = compare(declaration, by_name[file_name][declaration.kernel], file_name)
        report.problems.extend(problems)
        if not problems:
            report.checked.append(f"{declaration.where} {declaration.kernel}")
    return report
