"""Every CUDA source gdnflow ships compiles with nvcc (CI has nvcc, not a GPU)."""
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import gdnflow

from gdnflow.backends.cuda.kernel_arguments import (check_declarations, ptx_entries,
                                                    scan_declarations)
from gdnflow.backends.cuda.kernel_cache import ARCH_SPECIFIC_DEFINE, nvcc_arch
from gdnflow.backends.cuda.sources import COMMON_HEADER, expand_source, source_dir, source_files

NVCC = shutil.which("nvcc")


def test_sources_ship_with_the_package():
    files = {p.name for p in source_files()}
    assert {"elementwise.cu", "reduction.cu"} <= files
    assert (source_dir() / COMMON_HEADER).exists()


@pytest.fixture(scope="module")
def kernel_declarations():
    """Every kernel(FILE, "name", "types") call in gdnflow's own Python (read with ast)."""
    package = Path(gdnflow.__file__).resolve().parent
    return [d for file in sorted(package.rglob("*.py"))
            for d in scan_declarations(file, package.parent)]


#: Sources with kernels that only some module variants hold, and the defines of one such
#: variant: gdn.cu's 16-bit section; elementwise.cu's fused programs (any program will do,
#: its register 1 read as a concatenation, register 0 staged); pool.cu's fixed-window forward (the max pool of
#: a 3x3 window at stride 1); implicit_gemm.cu, whose kernels are all 16-bit.
POOL_WINDOW = (("POOL_KH", 3), ("POOL_KW", 3), ("POOL_SH", 1), ("POOL_SW", 1))
VARIANT_SECTIONS = {"gdn.cu": (("STORAGE_BF16", 1),),
                    "elementwise.cu": (("FUSED_INPUTS", 2), ("FUSED_CONCAT", 1), ("FUSED_STAGED", 1),
                                       ("FUSED_PROGRAM", "result = input0 * input1;")),
                    "pool.cu": POOL_WINDOW + (("POOL_MAX", 1),),
                    "implicit_gemm.cu": (("STORAGE_FP16", 1),)}


STORAGES = ("STORAGE_BF16", "STORAGE_FP16")
SIXTEEN_BIT_SOURCES = ("elementwise.cu", "conv2d.cu", "pool.cu", "depthwise.cu", "gdn.cu",
                       "subpixel.cu", "implicit_gemm.cu", "grouped.cu")
POOL_WINDOWS = {"3x3s1": POOL_WINDOW,
                "2x5s3x2": (("POOL_KH", 2), ("POOL_KW", 5), ("POOL_SH", 3), ("POOL_SW", 2))}
POOL_KINDS = {"average": (), "maximum": (("POOL_MAX", 1),)}
POOL_STORAGES = {"float": (), "bf16": (("STORAGE_BF16", 1),)}
WGMMA_TILES = {"128-row tile": (64, "m64n128k16"), "64-row tile": (32, "m64n64k16")}


def wgmma_defines(storage, warp_m):
    """The Hopper builds of implicit_gemm.cu (implicit_gemm.py's _defines with wgmma)."""
    return ((storage, 1), ("WGMMA", 1), (ARCH_SPECIFIC_DEFINE, 1), ("WARP_M", warp_m))


def every_build():
    """(source name, defines) of every nvcc run this module checks, the largest sources
    first (they take longest: started first, they do not end the run alone)."""
    builds = []
    for path in source_files():
        builds.append((path.name, ()))
        if path.name in VARIANT_SECTIONS:
            builds.append((path.name, VARIANT_SECTIONS[path.name]))
    builds += [(name, ((storage, 1),)) for name in SIXTEEN_BIT_SOURCES for storage in STORAGES]
    builds += [("implicit_gemm.cu", wgmma_defines(storage, warp_m))
               for storage in STORAGES for warp_m, _ in WGMMA_TILES.values()]
    builds += [("pool.cu", window + kind + storage) for window in POOL_WINDOWS.values()
               for kind in POOL_KINDS.values() for storage in POOL_STORAGES.values()]
    builds = list(dict.fromkeys(builds))
    return sorted(builds, key=lambda b: -(source_dir() / b[0]).stat().st_size)


class NvccBuilds:
    """Every build of :func:`every_build`, run by nvcc on all the machine's cores at once
    (one nvcc process keeps one core busy: one after another they took 2.5 of CI's 10
    minutes on two cores). Each keeps its PTX (and cubin, for an arch-specific build)."""

    def __init__(self, folder):
        self.folder = folder
        self.pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
        self.futures = {build: self.pool.submit(self._compile, index, *build)
                        for index, build in enumerate(every_build())}

    def _compile(self, index, name, defines):
        folder = self.folder / str(index)
        folder.mkdir()
        expanded = folder / name
        expanded.write_text(expand_source(source_dir() / name))
        arch = nvcc_arch("sm_90", defines)
        output = ["--cubin", "-o", str(folder / "out.cubin")] if arch != "sm_90" else \
            ["-c", "-o", str(folder / "out.o")]
        result = subprocess.run(
            [NVCC, f"-arch={arch}", "-O3", "-std=c++17", "-Werror", "all-warnings",
             *[f"-D{key}={value}" for key, value in defines], *output, "--keep",
             "--keep-dir", str(folder), str(expanded)],
            capture_output=True, text=True, timeout=600)
        return result, expanded.with_suffix(".ptx")

    def ptx(self, name, defines=()):
        """The PTX of ``name`` built with ``defines``; fails the test on an nvcc error or
        any warning."""
        result, ptx = self.futures[name, tuple(defines)].result()
        assert result.returncode == 0, f"nvcc failed on {name} {defines}:\n{result.stderr}"
        return ptx.read_text()

    def entries(self, name, defines=()):
        """nvcc's kernel entries ({name: parameters}) of that build."""
        return ptx_entries(self.ptx(name, defines))

    def close(self):
        for future in self.futures.values():
            future.cancel()
        self.pool.shutdown()


@pytest.fixture(scope="module")
def nvcc_builds(tmp_path_factory):
    """:class:`NvccBuilds`, started at the first test that asks."""
    builds = NvccBuilds(tmp_path_factory.mktemp("nvcc"))
    yield builds
    builds.close()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("path", source_files(), ids=lambda p: p.name)
def test_compiles_for_sm90_without_warnings(path, nvcc_builds, kernel_declarations):
    entries = nvcc_builds.entries(path.name)
    if path.name in VARIANT_SECTIONS:
        entries.update(nvcc_builds.entries(path.name, VARIANT_SECTIONS[path.name]))
    # The argument types gdnflow's Python declares for this file's kernels
    # (where they are string constants) against the parameters nvcc compiled.
    report = check_declarations(kernel_declarations, {path: entries}, complete=False)
    assert report.ok, "\n".join(report.problems)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("name", SIXTEEN_BIT_SOURCES)
def test_16_bit_storage_variants_compile_without_warnings(name, storage, nvcc_builds):
    # The module variants gdnflow.backends.cuda.storage_defines builds for 16-bit tensors.
    assert ".entry" in nvcc_builds.ptx(name, ((storage, 1),))


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("tile", WGMMA_TILES)
def test_implicit_gemm_wgmma_variants_compile_for_sm90a(storage, tile, nvcc_builds):
    # nvcc_arch gives sm_90a; ptxas runs too (the cubin beside the PTX).
    warp_m, shape = WGMMA_TILES[tile]
    defines = wgmma_defines(storage, warp_m)
    assert nvcc_arch("sm_90", defines) == "sm_90a" and nvcc_arch("sm_90", ()) == "sm_90"
    assert nvcc_arch("sm_100f", defines) == "sm_100f"
    ptx = nvcc_builds.ptx("implicit_gemm.cu", defines)
    assert ptx.count("wgmma.mma_async") == 4 and ptx.count(shape) == 4


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("storage", POOL_STORAGES)
@pytest.mark.parametrize("window", POOL_WINDOWS)
@pytest.mark.parametrize("kind", POOL_KINDS)
def test_fixed_window_pool_variants_compile_without_warnings(kind, window, storage, nvcc_builds):
    defines = POOL_WINDOWS[window] + POOL_KINDS[kind] + POOL_STORAGES[storage]
    assert "pool_forward_fixed" in nvcc_builds.entries("pool.cu", defines)


def test_the_channels_last_copy_is_launched_as_its_kernel_is_laid_out():
    # nchw_to_nhwc's tile and block size are fixed by its layout in implicit_gemm.cu, not
    # passed as defines: the launch (implicit_gemm.py) must size its grid with the same.
    from gdnflow.ops.conv.algorithms import implicit_gemm
    text = (source_dir() / "implicit_gemm.cu").read_text()
    for name in ("NHWC_TILE", "NHWC_THREADS"):
        values = re.findall(rf"^#define {name} (\d+)$", text, re.MULTILINE)
        assert values == [str(getattr(implicit_gemm, name))], (name, values)


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI runs from a non-editable install")
def test_ci_imports_the_installed_package():
    # CI installs with `pip install .` (not editable): the sources must come
    # from inside the installed package, not from the checkout beside it.
    package = Path(gdnflow.__file__).resolve().parent
    assert Path(sys.prefix).resolve() in package.parents, f"gdnflow imported from {package}"
    assert source_dir() == package / "cuda_src"
