"""Where the CUDA sources are, installed or in a checkout.

Kept apart from the kernel loader so that code without PyCUDA (the nvcc
compile check in CI, plugin tooling) can find the files too.
"""
from pathlib import Path

COMMON_HEADER = "gdnflow_common.cuh"


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
