"""Running CUDA kernel code on the CPU, for tests that check a kernel's index
arithmetic without a GPU: the .cu file (with its header expanded, as the
loader does) plus a test's host shim is built by nvcc into a shared library,
and NumPy arrays stand where device arrays would.
"""
import ctypes
import shutil
import subprocess

import numpy as np
import pytest

NVCC = shutil.which("nvcc")

#: Put before a source whose per-thread steps use HOST_CHECK (gdnflow_common.cuh):
#: on the host pass each failed check counts in ``host_faults``, which the
#: test's shim returns.
HOST_CHECK_PRELUDE = """
#include <cmath>
#include <cstdlib>
#include <vector>
static int host_faults = 0;
#ifdef __CUDA_ARCH__
#define HOST_CHECK(condition)
#else
#define HOST_CHECK(condition) do { if (!(condition)) ++host_faults; } while (0)
#endif
"""


def host_builder(folder, source_file, prefix="", suffix="", opt="-O1"):
    """A function ``defines -> ctypes.CDLL`` building ``prefix + source_file + suffix``
    for the host, once per set of defines (``defines``: a tuple of (name, value))."""
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    from gdnflow.backends.cuda.sources import expand_source
    source = prefix + expand_source(source_file) + suffix
    stem = source_file.rsplit(".", 1)[0]
    built = {}

    def build(defines=()):
        if defines not in built:
            name = f"{stem}{len(built)}"
            (folder / f"{name}.cu").write_text(source)
            result = subprocess.run(
                [NVCC, "-arch=sm_90", opt, "-std=c++17", "-shared", "-Xcompiler", "-fPIC"]
                + [f"-D{k}={v}" for k, v in defines]
                + [str(folder / f"{name}.cu"), "-o", str(folder / f"lib{name}.so")],
                capture_output=True, text=True, timeout=600)
            assert result.returncode == 0, result.stderr
            built[defines] = ctypes.CDLL(str(folder / f"lib{name}.so"))
        return built[defines]
    return build


class LaunchRecord(list):
    """The defines of each launch of a host-built kernel, in order.

    Set ``backwards = True`` to run the blocks and threads in reverse order
    (an access that depends on the order then shows).
    """

    backwards = False


def host_kernel(launched, source, name, build, check=None, extra_ints=None):
    """The kernel class of a simulated device that runs ``host_<name>`` of ``build(defines)``.

    ``source`` and ``name`` are the only kernel it accepts. Each call runs
    ``check(defines, grid, block, shared_bytes)`` (assertions on the launch),
    appends the defines to ``launched`` (a :class:`LaunchRecord`) and calls
    the shim as ``(backwards, grid[0], block[0], *extra_ints(shared_bytes),
    *args)``; a fault counted by HOST_CHECK fails the test.
    """
    kinds = {"P": ctypes.c_void_p, "i": ctypes.c_int}

    class Kernel:
        def __init__(self, file, kernel_name, arg_types, defines=()):
            assert file == source and kernel_name == name
            self.function = getattr(build(tuple(sorted(defines))), f"host_{name}")
            self.arg_types = arg_types
            self.defines = dict(defines)

        def __call__(self, grid, block, *args, shared_bytes=0):
            if check is not None:
                check(self.defines, grid, block, shared_bytes)
            extra = extra_ints(shared_bytes) if extra_ints is not None else ()
            self.function.argtypes = ([ctypes.c_int] * (3 + len(extra))
                                      + [kinds[k] for k in self.arg_types])
            launched.append(self.defines)
            faults = self.function(int(launched.backwards), grid[0], block[0], *extra, *args)
            assert faults == 0, f"{faults} misaligned or out-of-bounds accesses"
    return Kernel


class HostArray:
    """A NumPy array in place of a CudaArray (shape, size, dtype, ptr, allocation).

    256-byte aligned plus ``offset`` values (to test unaligned views), and
    poisoned with NaN around and inside, so an unwritten element shows and a
    write outside the array is caught by :meth:`guards_untouched`. float32 by
    default, as most kernels built for the host are; ``dtype`` float16 for a
    host build with -DSTORAGE_FP16.
    """

    dtype = np.dtype(np.float32)

    def __init__(self, shape, values=None, offset=0, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self.shape, self.size = tuple(shape), int(np.prod(shape))
        raw = np.full(self.size + 128, np.nan, self.dtype)
        start = (-raw.ctypes.data % 256) // self.dtype.itemsize + offset
        self.array = raw[start:start + self.size]
        if values is not None:
            self.array[:] = np.asarray(values, self.dtype).ravel()
        self.allocation = raw
        self.ptr = self.array.ctypes.data

    def get(self):
        """The values as a new NumPy array of ``shape``."""
        return self.array.reshape(self.shape).copy()

    def guards_untouched(self):
        """Nothing was written just before or after the array."""
        start = (self.ptr - self.allocation.ctypes.data) // self.dtype.itemsize
        return (np.isnan(self.allocation[:start]).all()
                and np.isnan(self.allocation[start + self.size:]).all())


class HostMemory:
    """A NumPy array of any dtype standing for a device array (shape, size, dtype, ptr)."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.shape, self.size, self.dtype = self.array.shape, self.array.size, self.array.dtype
        self.ptr = self.array.ctypes.data


class ShimDevice:
    """For cuda.simulated: the kernels of ``source`` built for the host, HostMemory as memory.

    Each kernel ``name`` is the shim ``host_<name>`` of ``library`` (taking the
    kernel's arguments, looping over the elements itself); ``launched`` lists
    the kernels run, in order. Fresh arrays are filled with NaN (or all ones
    in their bits for integers), so an element no kernel wrote shows;
    ``empty(shape, dtype)``, if given, makes them instead.
    """

    ctypes_of = {"P": ctypes.c_void_p, "i": ctypes.c_int, "d": ctypes.c_double,
                 "f": ctypes.c_float}

    def __init__(self, library, source, empty=None):
        self.library, self.source = library, source
        self.launched = []
        if empty is not None:
            self.empty = empty

    def get_runtime(self):
        return self

    def from_numpy(self, array):
        return HostMemory(np.array(array))

    def empty(self, shape, dtype):
        dtype = np.dtype(dtype)
        fill = np.nan if dtype.kind == "f" else np.iinfo(dtype).max
        return HostMemory(np.full(shape, fill, dtype))

    def full(self, shape, value, dtype):
        return HostMemory(np.full(shape, value, dtype))

    def to_numpy(self, memory):
        return memory.array.copy()

    def kernel(self, file, name, arg_types, defines=()):
        assert file == self.source and not defines
        function = getattr(self.library, f"host_{name}")
        function.argtypes = [self.ctypes_of[k] for k in arg_types]
        launched = self.launched

        class Kernel:
            def launch(self, threads, *args, **launch_options):
                launched.append(name)
                function(*args)
        return Kernel()
