"""Kernel loader: cubins of ``cuda_src/*.cu`` (and plugins' sources) from gdnflow's cache, launched.

A kernel is named by its file, its ``extern "C"`` name, the types of its
arguments (a ``struct`` format string such as ``"PPi"``: P pointer, i int32,
f float32, q int64) and the compile-time ``-D`` defines it is built with.
A module (file + defines) comes from the on-disk cubin cache
(:mod:`~gdnflow.backends.cuda.kernel_cache`), compiled there by a pool of
nvcc runs on a miss (:mod:`~gdnflow.backends.cuda.kernel_builds`), and is
loaded once per (file, defines) in this process (there is one context per
process); kernels are launched through PyCUDA's prepared calls on the
runtime's stream.
"""
import functools

import pycuda.driver as drv
from pycuda._pvt_struct import pack

from gdnflow.errors import KernelCompileError
from gdnflow.backends.cuda.kernel_builds import Builds
from gdnflow.backends.cuda.kernel_cache import KernelCache
from gdnflow.backends.cuda.limits import argument_overflow
from gdnflow.backends.cuda.runtime import get_runtime

#: Threads per block unless a kernel asks for another size.
DEFAULT_BLOCK = 256
#: Blocks per SM a grid-stride launch is capped at: enough waves to hide the
#: tail, few enough that huge tensors do not pay for scheduling millions of blocks.
DEFAULT_BLOCKS_PER_SM = 16


@functools.lru_cache(maxsize=None)
def builds():
    """The process's :class:`~gdnflow.backends.cuda.kernel_builds.Builds` for its GPU (its
    architecture and SM count: the variants journaled for them are compiled ahead)."""
    runtime = get_runtime()
    return Builds(KernelCache(), runtime.arch, sm_count=runtime.sm_count)


@functools.lru_cache(maxsize=None)
def load_module(file, defines=()):
    """The loaded module of ``file`` built with ``defines``: cached cubin, else compiled.

    ``defines`` is a tuple of (NAME, value) pairs, passed as ``-DNAME=value``.
    Raises :class:`~gdnflow.errors.KernelCompileError` naming the file (and
    the plugin owning it) where nvcc fails.
    """
    return drv.module_from_buffer(builds().cubin(file, defines))


def precompile(file, variants):
    """Compile ``file`` once per set of defines in ``variants``, in parallel (the nvcc pool).

    Fills the kernel cache, so that the later :func:`kernel` calls for these
    variants only load them: for sweeps over many compiled variants (each
    nvcc run takes seconds). Errors surface at that later load.
    """
    for _ in builds().build([(file, tuple(sorted(defines))) for defines in variants]):
        pass


class Kernel:
    """One compiled kernel, prepared for fast launches on gdnflow's stream."""

    __slots__ = ("name", "function", "stream", "arg_format")

    def __init__(self, file, name, arg_types, defines=()):
        module = load_module(file, tuple(sorted(defines)))
        try:
            self.function = module.get_function(name)
        except drv.LogicError:
            raise KernelCompileError(f"{file} has no kernel named {name!r}") from None
        self.function.prepare(arg_types)
        self.arg_format = self.function.arg_format
        self.name = name
        self.stream = get_runtime().stream

    def __call__(self, grid, block, *args, shared_bytes=0):
        """Launch on ``grid`` x ``block`` threads with ``args`` (see ``arg_types``)."""
        # What prepared_async_call does, minus its per-call import, keyword
        # handling and texture-reference loop (gdnflow uses no textures):
        # about 1 µs of a ~10 µs launch from Python.
        try:
            packed = pack(self.arg_format, *args)
        except Exception:     # _pvt_struct's error: an int past its C type, a wrong type
            overflow = argument_overflow(self.name, self.arg_format, args)
            if overflow is None:
                raise
            raise overflow from None
        self.function._launch_kernel(grid, block, packed, shared_bytes, self.stream)

    def allow_shared_bytes(self, size):
        """Let launches of this kernel ask for ``size`` bytes of dynamic shared memory
        (past 48 KB, CUDA wants this opt-in first)."""
        self.function.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, size)

    def launch(self, threads, *args, block=DEFAULT_BLOCK, blocks_per_sm=DEFAULT_BLOCKS_PER_SM):
        """Launch a grid-stride kernel meant to run ``threads`` threads in all."""
        self(launch_grid(threads, block, blocks_per_sm), (block, 1, 1), *args)


@functools.lru_cache(maxsize=None)
def kernel(file, name, arg_types, defines=()):
    """The cached :class:`Kernel` for these arguments (``defines`` as a tuple of pairs)."""
    return Kernel(file, name, arg_types, defines)


@functools.lru_cache(maxsize=4096)
def launch_grid(threads, block=DEFAULT_BLOCK, blocks_per_sm=DEFAULT_BLOCKS_PER_SM):
    """The grid for a grid-stride kernel: every launch configuration is computed here.

    One thread per work item up to ``blocks_per_sm`` blocks per SM; past that
    the grid-stride loop gives each thread several items.
    """
    blocks = (threads + block - 1) // block
    return (max(1, min(blocks, get_runtime().sm_count * blocks_per_sm)), 1, 1)
