"""y's elements grouped by coding table on the GPU (``cuda_src/table_groups.cu``).

A hyperprior file codes each block of y (a substream) table by table, each
table's elements in raster order (:mod:`gdnflow.codec.hyperprior`); on the
host that grouping is a stable sort per block
(:func:`~gdnflow.codec.hyperprior.table_groups`), which at 2048x1536 costs
more than the range coding it serves. Here a GPU codec does it for every block
at once: a stable counting sort in two passes over tiles of
:data:`TILE_ELEMENTS` elements (counts per tile and table; then, from the
prefix sums of those counts, each element's slot). The (order, bounds) of each
block are exactly what ``table_groups`` gives for the block's indexes; the same
pass lists each grouped element's offset into y, which the rANS lanes gather
(:func:`~gdnflow.codec.rans_substreams.table_lanes`).

:func:`table_groups_on_host` gives the same from the file's host entry point
(the file built for the host with nvcc), OpenMP threads grouping the blocks,
each in two passes (count, place): where the lanes are coded on the host
(:mod:`gdnflow.codec.host_lanes`), it spares the GPU grouping's round trips.
"""
import ctypes
import functools

import numpy as np

from gdnflow.backends import cuda
from gdnflow.backends.cuda.kernel_cache import KernelCache
from gdnflow.codec.host_lanes import pointers, threads_for

SOURCE = "table_groups.cu"
#: Elements a thread of the kernels walks (consecutive elements of one block).
TILE_ELEMENTS = 1024
#: The kernels' table count (TABLE_COUNT in the .cu file): the Gaussian tables.
TABLE_COUNT = 64
#: Threads a block of the kernels (TILE_THREADS in the .cu file: their shared counters).
TILE_THREADS = 64
#: The host grouping gives each OpenMP thread at least this many elements (fewer would
#: spend more on starting threads than they save); a block's channels are cut into runs
#: so that threads share the few blocks of a hyperprior's y.
HOST_ELEMENTS_PER_THREAD = 1 << 14


def block_tiles(blocks, shape):
    """The kernels' tile and block arrays for ``blocks`` ((channel slice, row slice) pairs) of
    a (C, h, w) tensor: a dict of int32 arrays, and each block's element count."""
    width = shape[2]
    channels = np.array([c.start for c, _ in blocks], np.int32)
    rows = np.array([r.start for _, r in blocks], np.int32)
    row_counts = np.array([r.stop - r.start for _, r in blocks], np.int32)
    sizes = np.array([(c.stop - c.start) * (r.stop - r.start) * width for c, r in blocks],
                     np.int64)
    tiles_per_block = -(-sizes // TILE_ELEMENTS)
    tile_block = np.repeat(np.arange(len(blocks), dtype=np.int32), tiles_per_block)
    starts = np.concatenate([[0], np.cumsum(tiles_per_block)[:-1]])
    tile_first = ((np.arange(tile_block.size) - starts[tile_block]) * TILE_ELEMENTS)
    tile_count = np.minimum(TILE_ELEMENTS, sizes[tile_block] - tile_first)
    arrays = {"tile_block": tile_block, "tile_first": tile_first.astype(np.int32),
              "tile_count": tile_count.astype(np.int32), "block_channel": channels,
              "block_row": rows, "block_rows": row_counts}
    return arrays, sizes


def checked_indexes(indexes, name):
    """``indexes`` as contiguous uint8 (C, h, w) below TABLE_COUNT; ValueError naming
    ``name`` otherwise."""
    indexes = np.ascontiguousarray(indexes, np.uint8)
    if indexes.ndim != 3 or indexes.size and indexes.max() >= TABLE_COUNT:
        raise ValueError(f"{name}: expected (C, h, w) table indexes below {TABLE_COUNT}, got "
                         f"{indexes.shape}")
    return indexes


def check_sizes(sizes, name):
    """Blocks of ``sizes`` elements: each at least one, fewer than 2^31 in all (ValueError
    naming ``name`` otherwise)."""
    if not sizes.all() or sizes.sum() >= 2 ** 31:
        raise ValueError(f"{name}: blocks of {sizes.tolist()} elements: each must hold at "
                         "least one, all together fewer than 2^31")


def _block_groups(order, totals, bases, sizes):
    """[(order, bounds)] per block from the concatenated ``order`` and the blocks' counts per
    table ``totals`` (TABLE_COUNT, blocks)."""
    return [(order[base:base + size], np.concatenate([[0], np.cumsum(totals[:, b])]))
            for b, (base, size) in enumerate(zip(bases.tolist(), sizes.tolist()))]


def table_groups_by_block(indexes, blocks):
    """([(order, bounds)] per block, positions) of ``indexes`` (C, h, w) uint8, computed on
    the GPU: ``hyperprior.table_groups(indexes[block].ravel())`` of each block (order
    int32), and the blocks' grouped elements one block after another as flat offsets
    into ``indexes`` (int32)."""
    indexes = checked_indexes(indexes, "table_groups_by_block")
    arrays, sizes = block_tiles(blocks, indexes.shape)
    check_sizes(sizes, "table_groups_by_block")
    tiles = arrays["tile_block"].size
    runtime = cuda.get_runtime()
    device = {name: runtime.from_numpy(a) for name, a in arrays.items()}
    source = runtime.from_numpy(indexes)
    geometry = [device[name].ptr for name in ("tile_block", "tile_first", "tile_count",
                                              "block_channel", "block_row", "block_rows")]
    counts = runtime.empty((tiles, TABLE_COUNT), np.int32)
    cuda.kernel(SOURCE, "table_tile_counts", "PPPPPPPiiiP").launch(
        tiles, source.ptr, *geometry, tiles, indexes.shape[1], indexes.shape[2], counts.ptr,
        block=TILE_THREADS)
    # Table-major (TABLE_COUNT, tiles): the prefix sums below run along contiguous rows.
    tile_counts = np.ascontiguousarray(runtime.to_numpy(counts).T)
    # Slots: block b's table k starts at its base + the block's counts of tables < k; a tile's
    # elements of table k after those of the block's earlier tiles. (int32: a tensor the
    # kernels index has fewer than 2^31 elements.)
    block = arrays["tile_block"]
    first_tiles = np.searchsorted(block, np.arange(len(blocks)))     # blocks' tiles are runs
    totals = np.add.reduceat(tile_counts, first_tiles, axis=1)       # (TABLE_COUNT, blocks)
    bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
    table_starts = bases + np.cumsum(totals, axis=0, dtype=np.int32) - totals
    before = np.cumsum(tile_counts, axis=1, dtype=np.int32) - tile_counts   # all earlier tiles
    before += (table_starts - before[:, first_tiles])[:, block]     # ... of the block, + start
    slots = runtime.from_numpy(np.ascontiguousarray(before.T))
    total = int(sizes.sum())
    grouped = runtime.empty((2, total), np.int32)      # order, then positions: one download
    cuda.kernel(SOURCE, "table_tile_order", "PPPPPPPiiiPPP").launch(
        tiles, source.ptr, *geometry, tiles, indexes.shape[1], indexes.shape[2], slots.ptr,
        grouped.ptr, grouped.ptr + 4 * total, block=TILE_THREADS)
    order, positions = runtime.to_numpy(grouped)
    return _block_groups(order, totals, bases, sizes), positions


@functools.lru_cache(maxsize=1)
def _host_library():
    """table_groups.cu's host build (kernel cache), its entry point's argument types set."""
    library = KernelCache().host_library(SOURCE)
    pointer, number = ctypes.c_void_p, ctypes.c_int
    library.table_groups_host.argtypes = [number] * 3 + [pointer] * 7 + [number, number] + \
        [pointer] * 6
    return library


def table_groups_on_host(indexes, blocks, values=None, threads=None):
    """(groups, positions, nonzero): what :func:`table_groups_by_block` gives, computed by
    table_groups.cu's host entry point, each block cut into runs of channels shared among
    OpenMP threads (:data:`HOST_ELEMENTS_PER_THREAD` elements or more each); with y's
    integer ``values`` (the shape of ``indexes``), also each block's count of non-zero
    values per table (int32 (blocks, TABLE_COUNT)), else None. ``threads``: how many (None:
    one per :data:`HOST_ELEMENTS_PER_THREAD` elements, at most one per core)."""
    indexes = checked_indexes(indexes, "table_groups_on_host")
    sizes = np.array([(c.stop - c.start) * (r.stop - r.start) * indexes.shape[2]
                      for c, r in blocks], np.int64)
    check_sizes(sizes, "table_groups_on_host")
    if any(c.start < 0 or r.start < 0 or c.stop > indexes.shape[0] or r.stop > indexes.shape[1]
           for c, r in blocks):
        raise ValueError(f"table_groups_on_host: blocks {blocks} reach past indexes of "
                         f"{indexes.shape}")
    if values is not None:
        values = np.ascontiguousarray(values, np.int32)
        if values.shape != indexes.shape:
            raise ValueError(f"table_groups_on_host: values of {values.shape} for indexes of "
                             f"{indexes.shape}")
    geometry = [np.array(numbers, np.int32) for numbers in (
        [c.start for c, _ in blocks], [c.stop - c.start for c, _ in blocks],
        [r.start for _, r in blocks], [r.stop - r.start for _, r in blocks])]
    bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    totals = np.empty((len(blocks), TABLE_COUNT), np.int32)
    nonzero = None if values is None else np.empty((len(blocks), TABLE_COUNT), np.int32)
    grouped = np.empty((2, int(sizes.sum())), np.int32)
    if threads is None:
        threads = threads_for(max(len(blocks), int(sizes.sum()) // HOST_ELEMENTS_PER_THREAD))
    parts = -(-threads // len(blocks))
    part_counts = np.empty((len(blocks) * parts, TABLE_COUNT), np.int32)
    part_nonzero = None if values is None else np.empty_like(part_counts)
    _host_library().table_groups_host(
        len(blocks), threads, parts, indexes.ctypes.data,
        None if values is None else values.ctypes.data,
        *pointers(*geometry, bases), indexes.shape[1], indexes.shape[2],
        part_counts.ctypes.data, None if part_nonzero is None else part_nonzero.ctypes.data,
        totals.ctypes.data, None if nonzero is None else nonzero.ctypes.data,
        *pointers(grouped[0], grouped[1]))
    return _block_groups(grouped[0], totals.T, bases, sizes), grouped[1], nonzero
