"""Every CUDA source gdnflow ships compiles with nvcc (CI has nvcc, not a GPU)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gdnflow

from gdnflow.backends.cuda.kernel_arguments import (check_declarations, ptx_entries,
                                                    scan_declarations)
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


def compiled_entries(path, tmp_path, defines=()):
    """nvcc's kernel entries ({name: parameters}) of ``path`` as the loader builds it
    (the header expanded), with ``-D`` ``defines`` ((name, value) pairs); fails the test on
    any warning."""
    folder = tmp_path / ("plain" if not defines else "variant")
    folder.mkdir()
    expanded = folder / path.name
    expanded.write_text(expand_source(path))
    result = subprocess.run(
        [NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Werror", "all-warnings",
         *[f"-D{name}={value}" for name, value in defines], "-c", str(expanded),
         "-o", str(folder / "out.o"), "--keep", "--keep-dir", str(folder)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"nvcc failed on {path} {defines}:\n{result.stderr}"
    return ptx_entries(expanded.with_suffix(".ptx").read_text())


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("path", source_files(), ids=lambda p: p.name)
def test_compiles_for_sm90_without_warnings(path, tmp_path, kernel_declarations):
    entries = compiled_entries(path, tmp_path)
    if path.name in VARIANT_SECTIONS:
        entries.update(compiled_entries(path, tmp_path, VARIANT_SECTIONS[path.name]))
    # The argument types gdnflow's Python declares for this file's kernels
    # (where they are string constants) against the parameters nvcc compiled.
    report = check_declarations(kernel_declarations, {path: entries}, complete=False)
    assert report.ok, "\n".join(report.problems)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("storage", ["STORAGE_BF16", "STORAGE_FP16"])
@pytest.mark.parametrize("name", ["elementwise.cu", "conv2d.cu", "pool.cu", "depthwise.cu", "gdn.cu",
                                  "subpixel.cu", "implicit_gemm.cu", "grouped.cu"])
def test_16_bit_storage_variants_compile_without_warnings(name, storage, tmp_path):
    # The module variants gdnflow.backends.cuda.storage_defines builds for 16-bit tensors.
    expanded = tmp_path / name
    expanded.write_text(expand_source(source_dir() / name))
    result = subprocess.run(
        [NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Werror", "all-warnings", f"-D{storage}=1",
         "-c", str(expanded), "-o", str(tmp_path / "out.o")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"nvcc failed on {name} with {storage}:\n{result.stderr}"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("storage", ["STORAGE_BF16", "STORAGE_FP16"])
@pytest.mark.parametrize("warp_m,shape", [(64, "m64n128k16"), (32, "m64n64k16")],
                         ids=["128-row tile", "64-row tile"])
def test_implicit_gemm_wgmma_variants_compile_for_sm90a(storage, warp_m, shape, tmp_path):
    # The Hopper builds (implicit_gemm.py's _defines with wgmma): nvcc_arch gives sm_90a;
    # ptxas runs too (--keep: the PTX and the cubin of one nvcc run).
    from gdnflow.backends.cuda.kernel_cache import ARCH_SPECIFIC_DEFINE, nvcc_arch
    defines = ((storage, 1), ("WGMMA", 1), (ARCH_SPECIFIC_DEFINE, 1), ("WARP_M", warp_m))
    assert nvcc_arch("sm_90", defines) == "sm_90a" and nvcc_arch("sm_90", ()) == "sm_90"
    assert nvcc_arch("sm_100f", defines) == "sm_100f"
    expanded = tmp_path / "implicit_gemm.cu"
    expanded.write_text(expand_source(source_dir() / "implicit_gemm.cu"))
    result = subprocess.run(
        [NVCC, f"-arch={nvcc_arch('sm_90', defines)}", "-O3", "-std=c++17", "-Werror",
         "all-warnings", *[f"-D{name}={value}" for name, value in defines], "--cubin",
         "--keep", "--keep-dir", str(tmp_path), str(expanded), "-o", str(tmp_path / "out.cubin")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"nvcc failed on the wgmma variant:\n{result.stderr}"
    ptx = expanded.with_suffix(".ptx").read_text()
    assert ptx.count("wgmma.mma_async") == 4 and ptx.count(shape) == 4


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("storage", [(), (("STORAGE_BF16", 1),)], ids=["float", "bf16"])
@pytest.mark.parametrize("window", [POOL_WINDOW, (("POOL_KH", 2), ("POOL_KW", 5), ("POOL_SH", 3),
                                                  ("POOL_SW", 2))], ids=["3x3s1", "2x5s3x2"])
@pytest.mark.parametrize("kind", [(), (("POOL_MAX", 1),)], ids=["average", "maximum"])
def test_fixed_window_pool_variants_compile_without_warnings(kind, window, storage, tmp_path):
    entries = compiled_entries(source_dir() / "pool.cu", tmp_path, window + kind + storage)
    assert "pool_forward_fixed" in entries


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
