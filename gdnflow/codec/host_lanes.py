"""rANS lanes coded on the host's cores: ``cuda_src/rans.cu``'s lane steps built for the host.

A GPU walks a lane's symbols one thread at a time, about 200 ns a symbol
(``benchmarks/results/rans_lanes.md``), so it wins only with many lanes; a
hyperprior's small files have a few (the split's rate cost bounds them). The
same per-lane steps (``__host__ __device__`` in rans.cu) built for the host
with nvcc code a symbol in a few nanoseconds, and lanes are independent: the
host entry points share them among OpenMP threads (one call, the GIL let go
while it runs). The words and values are the GPU kernels' and the NumPy
coder's (:mod:`gdnflow.codec.rans`), so any of the three reads what another
wrote.

:func:`available` says whether the library can be built here (nvcc, which
the cuda backend needs anyway); :func:`encode_host` and :func:`decode_host`
take and give what :func:`~gdnflow.codec.rans.encode_numpy` and
:func:`~gdnflow.codec.rans.decode_cuda` do, on NumPy arrays.
"""
import ctypes
import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gdnflow.backends.cuda.kernel_cache import HOST_LIBRARY_SOURCES, KernelCache
from gdnflow.codec.rans import SOURCE, padded_words
from gdnflow.errors import BackendUnavailableError, KernelCompileError


@functools.lru_cache(maxsize=1)
def _library():
    """rans.cu's host build (kernel cache), its entry points' argument types set."""
    library = KernelCache().host_library(SOURCE)
    pointer, number = ctypes.c_void_p, ctypes.c_int
    library.rans_encode_lanes_host.argtypes = [number, number] + [pointer] * 14
    library.rans_decode_lanes_host.argtypes = [number, number] + [pointer] * 15
    library.rans_lane_escapes_host.argtypes = [number] * 3 + [pointer] * 13
    return library


@functools.lru_cache(maxsize=1)
def available():
    """Whether the host builds this codec uses (the lane coder, and the grouping of
    gdnflow/codec/device_groups.py) can be made here: nvcc (with OpenMP) is needed, and a
    kept build is found by nvcc's identity."""
    try:
        # Both built at once on a first run (nvcc takes about 2 s each).
        with ThreadPoolExecutor(len(HOST_LIBRARY_SOURCES)) as pool:
            list(pool.map(KernelCache().host_library, HOST_LIBRARY_SOURCES))
        _library()
    except (BackendUnavailableError, KernelCompileError, OSError):
        return False
    return True


def threads_for(items):
    """The OpenMP threads for ``items`` independent lanes or blocks: one each, at most one per
    core this process may use (more would only wait, and contend with other threaded
    libraries for the cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(int(items), cores or 1))


def pointers(*arrays):
    """The addresses of NumPy ``arrays``' data, for a host library's arguments."""
    return [a.ctypes.data for a in arrays]


def _lane_arrays(lanes, tables):
    return (lanes.runs, lanes.table, lanes.count, lanes.dest, lanes.positions, tables.cdf,
            tables.offset, tables.size, tables.low)


def encode_host(lanes, tables, latents):
    """(streams, escapes): each lane's stream (uint16 words, padded) of the flat int32
    ``latents``, as :func:`~gdnflow.codec.rans.encode_numpy` gives, and how many of its
    values it coded as the escape (int32 per lane)."""
    if lanes.lanes == 0:
        return [], np.zeros(0, np.int32)
    latents = np.ascontiguousarray(latents, np.int32)
    ends = np.cumsum(lanes.symbols() + 2).astype(np.int64)
    words = np.empty(int(ends[-1]), np.uint16)
    used = np.empty(lanes.lanes, np.int32)
    escapes = np.empty(lanes.lanes, np.int32)
    arrays = _lane_arrays(lanes, tables)
    _library().rans_encode_lanes_host(lanes.lanes, threads_for(lanes.lanes),
                                      *pointers(latents, *arrays, ends, words, used, escapes))
    streams = [padded_words(words[end - n:end]) for end, n in zip(ends.tolist(), used.tolist())]
    return streams, escapes


def decode_host(lanes, tables, streams, latents):
    """Decode each lane's stream into the flat int32 NumPy array ``latents`` (escapes as
    :data:`~gdnflow.codec.rans.ESCAPE_MARK`); each lane's status and escape count (int32),
    as :func:`~gdnflow.codec.rans.decode_cuda` gives."""
    if lanes.lanes == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    if not (latents.flags.c_contiguous and latents.dtype == np.int32):
        raise ValueError("decode_host: latents must be a contiguous int32 array")
    begins = np.concatenate([[0], np.cumsum([len(s) for s in streams])]).astype(np.int64)
    words = np.concatenate(streams).astype(np.uint16) if streams else np.zeros(1, np.uint16)
    status = np.empty(lanes.lanes, np.int32)
    escapes = np.empty(lanes.lanes, np.int32)
    arrays = _lane_arrays(lanes, tables) + (tables.buckets,)
    _library().rans_decode_lanes_host(lanes.lanes, threads_for(lanes.lanes),
                                      *pointers(words, begins, *arrays, latents, status, escapes))
    return status, escapes


def lane_escapes(lanes, tables, latents, counts, marked):
    """[(offsets int64, table ids int32)] per lane: where the values that lane coded as the
    escape lie in the flat int32 ``latents``, in coding order, with their tables; ``counts``
    (per lane, as :func:`encode_host` and :func:`decode_host` give) says how many, and a
    lane without any is not looked through. ``marked``: decoded latents, whose escapes
    hold :data:`~gdnflow.codec.rans.ESCAPE_MARK`; else values to encode, whose escapes lie
    outside their table's symbols. One call over the lanes, by the host build's threads
    (listing every position of a lane in NumPy to find a few took 0.5 ms a lane)."""
    latents = np.ascontiguousarray(latents, np.int32)
    counts = np.ascontiguousarray(counts, np.int32)
    if len(counts) != lanes.lanes:
        raise ValueError(f"lane_escapes: {len(counts)} escape counts for {lanes.lanes} lanes")
    first = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    offsets = np.empty(max(1, int(first[-1])), np.int64)
    ids = np.empty(len(offsets), np.int32)
    found = np.empty(lanes.lanes, np.int32)
    _library().rans_lane_escapes_host(
        lanes.lanes, threads_for(np.count_nonzero(counts)), int(bool(marked)),
        *pointers(latents, lanes.runs, lanes.table, lanes.count, lanes.dest, lanes.positions,
                  tables.size, tables.low, counts, first, offsets, ids, found))
    if not np.array_equal(found, counts):
        raise ValueError(f"lane_escapes: the lanes hold {found.tolist()} escapes where "
                         f"{counts.tolist()} were coded")
    return [(offsets[a:b], ids[a:b]) for a, b in zip(first[:-1].tolist(), first[1:].tolist())]
