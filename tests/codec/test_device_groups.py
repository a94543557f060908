"""y's elements grouped by coding table on the GPU (cuda_src/table_groups.cu) against the
host's stable sort, block by block: built for the host and on the GPU, at odd sizes,
splits and tiles that straddle nothing and everything; and the file's host entry point on
the host's threads (device_groups.table_groups_on_host)."""
import functools
import shutil

import numpy as np
import pytest

from gdnflow.backends import cuda
from gdnflow.codec import device_groups
from gdnflow.codec.device_groups import (TABLE_COUNT, TILE_ELEMENTS, table_groups_by_block,
                                         table_groups_on_host)
from gdnflow.codec.format import Split
from gdnflow.codec.gaussian_tables import SCALE_COUNT
from gdnflow.codec.hyperprior import table_groups

from host_kernels import ShimDevice, host_builder

GEOMETRY = ("const int* tile_block, const int* tile_first, const int* tile_count, "
            "const int* block_channel, const int* block_row, const int* block_rows, int tiles, "
            "int height, int width")
ARGUMENTS = ("tile_block, tile_first, tile_count, block_channel, block_row, block_rows, height, "
             "width")
HOST_SHIM = f"""
extern "C" void host_table_tile_counts(const unsigned char* indexes, {GEOMETRY}, int* counts) {{
    for (int t = 0; t < tiles; ++t)
        tile_counts(t, indexes, {ARGUMENTS}, counts + (long long)t * TABLE_COUNT);
}}
extern "C" void host_table_tile_order(const unsigned char* indexes, {GEOMETRY}, int* slots,
                                      int* order, int* positions) {{
    for (int t = tiles - 1; t >= 0; --t)
        tile_order(t, indexes, {ARGUMENTS}, slots + (long long)t * TABLE_COUNT, order,
                   positions);
}}
"""


@pytest.fixture(scope="module")
def host_device(tmp_path_factory):
    build = host_builder(tmp_path_factory.mktemp("table_groups_host"), "table_groups.cu",
                         suffix=HOST_SHIM)
    return ShimDevice(build(), device_groups.SOURCE)


CASES = [((12, 5, 7), Split(1, 1)), ((12, 5, 7), Split(5, 2)), ((192, 32, 48), Split(7, 3)),
         ((3, 1, 1), Split(3, 1)), ((8, 40, 33), Split(2, 40))]


def random_indexes(rng, shape):
    """Table indexes like a photo's: most at the smallest scales, all 64 used."""
    small = rng.integers(0, 4, shape)
    return np.where(rng.random(shape) < 0.7, small, rng.integers(0, 64, shape)).astype(np.uint8)


def check_against_the_host(shape, split, rng, group=table_groups_by_block):
    indexes = random_indexes(rng, shape)
    blocks = split.blocks(shape)
    groups, positions = group(indexes, blocks)[:2]
    assert len(groups) == len(blocks)
    flat = np.arange(indexes.size).reshape(shape)
    offset = 0
    for (channels, rows), (order, bounds) in zip(blocks, groups):
        want_order, want_bounds = table_groups(indexes[channels, rows].ravel())
        np.testing.assert_array_equal(bounds, want_bounds)
        np.testing.assert_array_equal(order, want_order)
        # the offsets into the whole of y of those elements, in that order
        np.testing.assert_array_equal(positions[offset:offset + len(order)],
                                      flat[channels, rows].ravel()[want_order])
        offset += len(order)
    assert offset == len(positions)


def test_the_kernels_know_every_gaussian_table():
    assert TABLE_COUNT == SCALE_COUNT


@pytest.mark.parametrize("shape, split", CASES)
def test_host_built_kernels_group_as_the_host_sorts(host_device, shape, split, rng):
    """The order pass runs the tiles from last to first: no tile may depend on another."""
    with cuda.simulated(host_device):
        check_against_the_host(shape, split, rng)
    assert host_device.launched[-2:] == ["table_tile_counts", "table_tile_order"]


def test_tiles_straddle_no_block():
    shape = (5, 12, 100)                # blocks of 2400 and 3600 elements: partial tiles
    arrays, sizes = device_groups.block_tiles(Split(2, 1).blocks(shape), shape)
    assert TILE_ELEMENTS == 1024 and sizes.tolist() == [2400, 3600]
    assert arrays["tile_block"].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert arrays["tile_count"].tolist() == [1024, 1024, 352, 1024, 1024, 1024, 528]
    assert arrays["tile_first"].tolist() == [0, 1024, 2048, 0, 1024, 2048, 3072]


def test_indexes_past_the_tables_are_refused(host_device):
    with cuda.simulated(host_device), pytest.raises(ValueError, match="below 64"):
        table_groups_by_block(np.full((2, 2, 2), 64, np.uint8), Split(1, 1).blocks((2, 2, 2)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape, split", CASES + [((192, 96, 128), Split(12, 4))])
def test_gpu_kernels_group_as_the_host_sorts(shape, split, rng):
    check_against_the_host(shape, split, rng)


@pytest.mark.parametrize("quiet", [False, True])
def test_coders_given_the_device_groups_write_and_read_the_same_bytes(host_device, quiet, rng):
    """encode_by_table / decode_by_table with the groups made by the (host-built) kernels:
    the same substream bytes as grouping on the host, and the same values back."""
    from gdnflow.codec.hyperprior import decode_by_table, encode_by_table
    from gdnflow.codec.substreams import decode_substream, encode_substream
    shape, split = (12, 9, 13), Split(3, 2)
    indexes = random_indexes(rng, shape)
    q = np.where(rng.random(shape) < 0.3, rng.integers(-3, 4, shape), 0).astype(np.int32)
    q[indexes < 2] = 0                           # quiet tables all zero here, not elsewhere
    blocks = split.blocks(shape)
    with cuda.simulated(host_device):
        groups, _ = table_groups_by_block(indexes, blocks)
    for (channels, rows), group in zip(blocks, groups):
        block = (q[channels, rows], indexes[channels, rows], quiet)
        data = encode_substream(encode_by_table, block + (group,))
        assert data == encode_substream(encode_by_table, block + (None,))
        values = decode_substream(decode_by_table, data, (block[1], quiet, group), "f.gdn")
        np.testing.assert_array_equal(values, q[channels, rows])


def test_empty_blocks_are_refused(host_device):
    blocks = [(slice(0, 2), slice(0, 2)), (slice(2, 2), slice(0, 2))]
    with cuda.simulated(host_device), pytest.raises(ValueError, match="at least one"):
        table_groups_by_block(np.zeros((2, 2, 2), np.uint8), blocks)


NEEDS_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@NEEDS_NVCC
@pytest.mark.parametrize("shape, split", CASES + [((192, 96, 128), Split(12, 4))])
def test_host_threads_group_as_the_host_sorts(shape, split, rng):
    """The last case: 2.4 M elements in 48 blocks, shared among the OpenMP threads."""
    check_against_the_host(shape, split, rng, table_groups_on_host)


@NEEDS_NVCC
@pytest.mark.parametrize("shape, split, threads", [
    ((192, 32, 48), Split(1, 1), 8),        # one block in 8 runs of 24 channels
    ((192, 32, 48), Split(2, 1), 16),       # a hyperprior's y at 768x512: 2 blocks, 8 runs each
    ((3, 5, 7), Split(1, 1), 8),            # more runs than channels: 5 runs are empty
    ((12, 5, 7), Split(5, 2), 24)])         # 10 blocks of 2-3 channels in 3 runs of 0-1
def test_threads_share_a_block_and_keep_its_order(shape, split, threads, rng):
    """A block cut into runs of channels, each counted and placed by its own thread, gives
    the one-pass order and the same non-zero counts (on any core count: the threads are
    asked for)."""
    check_against_the_host(shape, split, rng, functools.partial(table_groups_on_host,
                                                                threads=threads))
    indexes = random_indexes(rng, shape)
    values = rng.integers(-2, 3, shape).astype(np.int32)
    blocks = split.blocks(shape)
    one = table_groups_on_host(indexes, blocks, values, threads=1)
    many = table_groups_on_host(indexes, blocks, values, threads=threads)
    np.testing.assert_array_equal(many[1], one[1])
    np.testing.assert_array_equal(many[2], one[2])


@NEEDS_NVCC
def test_the_host_grouping_refuses_what_the_kernels_refuse():
    with pytest.raises(ValueError, match="table_groups_on_host: expected .* below 64"):
        table_groups_on_host(np.full((2, 2, 2), 64, np.uint8), Split(1, 1).blocks((2, 2, 2)))
    blocks = [(slice(0, 2), slice(0, 2)), (slice(2, 2), slice(0, 2))]
    with pytest.raises(ValueError, match="table_groups_on_host: .* at least one"):
        table_groups_on_host(np.zeros((2, 2, 2), np.uint8), blocks)
    with pytest.raises(ValueError, match="table_groups_on_host: blocks .* reach past indexes"):
        table_groups_on_host(np.zeros((2, 2, 2), np.uint8), [(slice(0, 2), slice(1, 3))])


@NEEDS_NVCC
def test_the_host_grouping_counts_each_tables_nonzero_values_per_block(rng):
    shape, split = (40, 9, 13), Split(5, 2)
    indexes = random_indexes(rng, shape)
    values = np.where(rng.random(shape) < 0.2, rng.integers(-3, 4, shape), 0).astype(np.int32)
    blocks = split.blocks(shape)
    groups, positions, nonzero = table_groups_on_host(indexes, blocks, values)
    assert nonzero.shape == (len(blocks), TABLE_COUNT)
    for b, (channels, rows) in enumerate(blocks):
        block_values, block_indexes = values[channels, rows], indexes[channels, rows]
        want = np.bincount(block_indexes[block_values != 0], minlength=TABLE_COUNT)
        np.testing.assert_array_equal(nonzero[b], want)
    assert table_groups_on_host(indexes, blocks)[2] is None
    with pytest.raises(ValueError, match="values of \\(40, 9, 12\\) for indexes of"):
        table_groups_on_host(indexes, blocks, values[..., :12])
