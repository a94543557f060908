"""Where the CUDA sources are, installed or in a checkout.

Kept apart from the kernel loader so that code without PyCUDA (the nvcc
compile check in CI, plugin tooling) can find the files too.
"""
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


def resolve(file):
    """The path of a CUDA source: a name in :func:`source_dir` or a path of its own."""
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
