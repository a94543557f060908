"""Where the CUDA sources are, installed or in a checkout.

Kept apart from the kernel loader so that code without PyCUDA (the nvcc
compile check in CI, plugin tooling) can find the files too.

A source is named by a file name in :func:`source_dir`, a path of its own (a
plugin's ``.cu`` beside its module), or an :class:`InlineSource`.
"""
import dataclasses
import re
from pathlib import Path

COMMON_HEADER = "gdnflow_common.cuh"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"' + re.escape(COMMON_HEADER) + r'"\s*$', re.M)


def source_dir():
    """The folder holding gdnflow's ``.cu`` files.

    An installed package carries them as ``gdnflow/cuda_src``; a checkout has
    them at the top level, beside ``gdnflow/``.
    """
    package = Path(__file__).resolve().parents[2]
    installed = package / "cuda_src"
    if (installed / COMMON_HEADER).exists():
        return installed
    return package.parent / "cuda_src"


def source_files():
    """Every ``.cu`` file gdnflow ships, sorted by name."""
    return sorted(source_dir().glob("*.cu"))


@dataclasses.dataclass(frozen=True)
class InlineSource:
    """CUDA source text given from Python instead of a file, for quick experiments.

    Ship a ``.cu`` file where you can (editors, nvcc and sanitizers see files).
    Equal ``text`` and ``name`` make equal, hashable values, so the loader's
    cache, keyed on the source, compiles one module per distinct text.
    ``name`` stands in for the file name in error messages.
    """

    text: str
    name: str = "inline.cu"

    def __str__(self):
        return self.name


def resolve(file):
    """The path of a CUDA source: a name in :func:`source_dir` or a path of its own.

    An :class:`InlineSource` is returned as it is.
    """
    if isinstance(file, InlineSource):
        return file
    path = Path(file)
    if not path.is_absolute() and not path.exists():
        path = source_dir() / file
    return path


def expand_source(file):
    """The text of a CUDA file with ``#include "gdnflow_common.cuh"`` expanded in place.

    The kernel loader does this, not nvcc: PyCUDA hashes a source that has
    includes by running the preprocessor first, an extra nvcc run per module
    even when its disk cache already holds the binary.
    """
    path = resolve(file)
    if isinstance(path, InlineSource):
        text = path.text
    else:
        try:
            text = path.read_text()
        except OSError as exc:
            raise FileNotFoundError(f"cannot read CUDA source {path}: {exc.strerror}") from None
    header = (source_dir() / COMMON_HEADER).read_text()
    # The #line directive keeps nvcc's line numbers those of the file itself.
    return _INCLUDE.sub(lambda _: f'{header}\n#line {_line_after_include(text)} "{path.name}"',
                        text, count=1)


def _line_after_include(text):
    match = _INCLUDE.search(text)
    return text.count("\n", 0, match.end()) + 2 if match else 1


# nvcc reports "FILE(LINE): error: ..." (or "catastrophic error" for a missing include).
_NVCC_ERROR = re.compile(r"\((\d+)\): (?:catastrophic )?error")


_owner_lookups = []


def on_owner_lookup(lookup):
    """Ask ``lookup(path)`` who owns a CUDA source when a compile error names it.

    ``lookup`` returns a label (``"plugin 'x' (module m)"``) or None; gdnflow's
    plugin layer installs one. Returns ``lookup``, so it can decorate.
    """
    if lookup not in _owner_lookups:
        _owner_lookups.append(lookup)
    return lookup


def owner_of(path):
    """The first label an :func:`on_owner_lookup` hook gives ``path``, else None."""
    for lookup in _owner_lookups:
        owner = lookup(path)
        if owner:
            return owner
    return None


def compile_error_message(path, nvcc_output, defines=(), owner=None):
    """The text of a :class:`~gdnflow.errors.KernelCompileError`.

    Says who owns the source (``owner``, e.g. a plugin), the file, the line of
    nvcc's first error, the ``-D`` defines, then nvcc's own output.
    """
    match = _NVCC_ERROR.search(nvcc_output)
    where = f"{path}, line {match.group(1)}" if match else str(path)
    who = f"{owner}: " if owner else ""
    built = f" (defines {dict(defines)})" if defines else ""
    return f"{who}nvcc failed on {where}{built}:\n{nvcc_output.strip()}"
