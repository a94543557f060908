// The hyperprior codec's grouping of y's elements by coding table, on the GPU.
// Python side: gdnflow/codec/device_groups.py. Each block of y (a substream:
// channels [c0, c0 + nc) x rows [r0, r0 + nr) x every column, its elements in
// raster order) is coded table by table, each table's elements in raster
// order; its "order" lists the block's element numbers so grouped (a stable
// counting sort by table), what hyperprior.table_groups computes on the host;
// "positions" lists the same elements as offsets into y (what the rANS lanes
// gather: rans_substreams.table_lanes).
//
// Two passes over tiles of TILE_ELEMENTS consecutive elements of a block, one
// thread per tile: table_tile_counts counts each table in each tile; the host
// turns the counts into each tile's first slot per table (prefix sums); then
// table_tile_order writes each element's number at its table's next slot.
// The per-tile steps are __host__ __device__ for tests/codec/test_device_groups.py,
// which builds this file for the host.
#include "gdnflow_common.cuh"

#define TABLE_COUNT 64

// Element e of block b as an offset into y's indexes (channels, height, width).
__host__ __device__ inline long long block_element_offset(
        int e, const int* block_channel, const int* block_row, const int* block_rows, int b,
        int height, int width) {
    const int per_channel = block_rows[b] * width;
    const int c = e / per_channel, rest = e - c * per_channel;
    const int r = rest / width, x = rest - r * width;
    return ((long long)(block_channel[b] + c) * height + block_row[b] + r) * width + x;
}

// out[k]: elements of table k in tile t (out: the tile's TABLE_COUNT counters).
__host__ __device__ inline void tile_counts(
        int t, const unsigned char* indexes, const int* tile_block, const int* tile_first,
        const int* tile_count, const int* block_channel, const int* block_row,
        const int* block_rows, int height, int width, int* out) {
    for (int k = 0; k < TABLE_COUNT; ++k) out[k] = 0;
    const int b = tile_block[t];
    for (int e = tile_first[t]; e < tile_first[t] + tile_count[t]; ++e)
        ++out[indexes[block_element_offset(e, block_channel, block_row, block_rows, b, height,
                                           width)]];
}

// order[slot] = e and positions[slot] = e's offset into y for each element e of
// tile t, slot = its table's next slot (next: the tile's TABLE_COUNT first slots,
// advanced here).
__host__ __device__ inline void tile_order(
        int t, const unsigned char* indexes, const int* tile_block, const int* tile_first,
        const int* tile_count, const int* block_channel, const int* block_row,
        const int* block_rows, int height, int width, int* next, int* order, int* positions) {
    const int b = tile_block[t];
    for (int e = tile_first[t]; e < tile_first[t] + tile_count[t]; ++e) {
        const long long offset = block_element_offset(e, block_channel, block_row, block_rows,
                                                      b, height, width);
        const int slot = next[indexes[offset]]++;
        order[slot] = e;
        positions[slot] = (int)offset;
    }
}

// A thread's counters live in shared memory, where an increment takes a few dozen
// cycles instead of a round trip to L2 (each element's increment waits on the one
// before). TILE_THREADS threads a block (device_groups.py launches them so); rows of
// TABLE_COUNT + 1 put the threads' counters of one table in different banks.
#define TILE_THREADS 64

extern "C" __global__ void table_tile_counts(
        const unsigned char* __restrict__ indexes, const int* __restrict__ tile_block,
        const int* __restrict__ tile_first, const int* __restrict__ tile_count,
        const int* __restrict__ block_channel, const int* __restrict__ block_row,
        const int* __restrict__ block_rows, int tiles, int height, int width,
        int* __restrict__ counts) {
    __shared__ int local[TILE_THREADS][TABLE_COUNT + 1];
    int* mine = local[threadIdx.x];
    GRID_STRIDE_LOOP(t, tiles) {
        tile_counts(t, indexes, tile_block, tile_first, tile_count, block_channel, block_row,
                    block_rows, height, width, mine);
        for (int k = 0; k < TABLE_COUNT; ++k) counts[(long long)t * TABLE_COUNT + k] = mine[k];
    }
}

extern "C" __global__ void table_tile_order(
        const unsigned char* __restrict__ indexes, const int* __restrict__ tile_block,
        const int* __restrict__ tile_first, const int* __restrict__ tile_count,
        const int* __restrict__ block_channel, const int* __restrict__ block_row,
        const int* __restrict__ block_rows, int tiles, int height, int width,
        const int* __restrict__ slots, int* __restrict__ order, int* __restrict__ positions) {
    __shared__ int local[TILE_THREADS][TABLE_COUNT + 1];
    int* next = local[threadIdx.x];
    GRID_STRIDE_LOOP(t, tiles) {
        for (int k = 0; k < TABLE_COUNT; ++k) next[k] = slots[(long long)t * TABLE_COUNT + k];
        tile_order(t, indexes, tile_block, tile_first, tile_count, block_channel, block_row,
                   block_rows, height, width, next, order, positions);
    }
}

// Host entry point: every block grouped, by `threads` OpenMP threads, for
// gdnflow/codec/device_groups.py's host grouping (this file built for the host with
// nvcc -fopenmp). Block b holds block_channels[b] channels from block_channel[b] and
// block_rows[b] rows from block_row[b], every column; its slots start at
// block_base[b]. Writes its counts per table to totals[b * TABLE_COUNT ...] and,
// table by table, its elements' numbers to order and offsets to positions: what
// the two kernels above give. Where `values` (y's integer latents, int32) is not
// null, the count pass also counts each table's non-zero values into
// nonzero[b * TABLE_COUNT ...] (which quiet tables an encoder must code).
//
// Each block is cut into `parts` runs of channels (a hyperprior's y has a few blocks
// and many more cores), so threads share a block: a pass counts each part's tables,
// the prefix sums give each part its first slot per table (a part's elements follow
// those of the block's earlier parts: the same stable order as one pass over the
// block), and a second pass places the elements. part_counts (and, with values,
// part_nonzero) hold blocks * parts * TABLE_COUNT ints of scratch.
#ifndef __CUDA_ARCH__
// Channels [first, last) of part p of block b.
static inline void part_channels(int b, int p, int parts, const int* block_channels,
                                 int* first, int* last) {
    const long long channels = block_channels[b];
    *first = (int)(channels * p / parts);
    *last = (int)(channels * (p + 1) / parts);
}

extern "C" void table_groups_host(
        int blocks, int threads, int parts, const unsigned char* indexes, const int* values,
        const int* block_channel, const int* block_channels, const int* block_row,
        const int* block_rows, const long long* block_base, int height, int width,
        int* part_counts, int* part_nonzero, int* totals, int* nonzero, int* order,
        int* positions) {
    const int units = blocks * parts;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < units; ++u) {
            const int b = u / parts, p = u % parts;
            int* counts = part_counts + (long long)u * TABLE_COUNT;
            int* nonzero_counts = values ? part_nonzero + (long long)u * TABLE_COUNT : nullptr;
            for (int k = 0; k < TABLE_COUNT; ++k) counts[k] = 0;
            if (values)
                for (int k = 0; k < TABLE_COUNT; ++k) nonzero_counts[k] = 0;
            int first, last;
            part_channels(b, p, parts, block_channels, &first, &last);
            for (int c = first; c < last; ++c)
                for (int r = 0; r < block_rows[b]; ++r) {
                    const long long start =
                        ((long long)(block_channel[b] + c) * height + block_row[b] + r) * width;
                    for (int x = 0; x < width; ++x) ++counts[indexes[start + x]];
                    if (values)
                        for (int x = 0; x < width; ++x)
                            nonzero_counts[indexes[start + x]] += values[start + x] != 0;
                }
        }
        // Each block's totals and non-zero counts; its parts' counts become their first
        // slots per table.
#pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < blocks; ++b) {
            int* block_totals = totals + (long long)b * TABLE_COUNT;
            for (int k = 0; k < TABLE_COUNT; ++k) {
                block_totals[k] = 0;
                for (int p = 0; p < parts; ++p)
                    block_totals[k] += part_counts[((long long)b * parts + p) * TABLE_COUNT + k];
            }
            long long slot = block_base[b];
            for (int k = 0; k < TABLE_COUNT; ++k)
                for (int p = 0; p < parts; ++p) {
                    int* count = part_counts + ((long long)b * parts + p) * TABLE_COUNT + k;
                    const int n = *count;
                    *count = (int)(slot - block_base[b]);   // block-relative: fits an int
                    slot += n;
                }
            if (values)
                for (int k = 0; k < TABLE_COUNT; ++k) {
                    int sum = 0;
                    for (int p = 0; p < parts; ++p)
                        sum += part_nonzero[((long long)b * parts + p) * TABLE_COUNT + k];
                    nonzero[(long long)b * TABLE_COUNT + k] = sum;
                }
        }
#pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < units; ++u) {
            const int b = u / parts, p = u % parts;
            int* next = part_counts + (long long)u * TABLE_COUNT;
            int first, last;
            part_channels(b, p, parts, block_channels, &first, &last);
            int e = first * block_rows[b] * width;
            for (int c = first; c < last; ++c)
                for (int r = 0; r < block_rows[b]; ++r) {
                    const long long start =
                        ((long long)(block_channel[b] + c) * height + block_row[b] + r) * width;
                    for (int x = 0; x < width; ++x, ++e) {
                        const long long at = block_base[b] + next[indexes[start + x]]++;
                        order[at] = e;
                        positions[at] = (int)(start + x);
                    }
                }
        }
    }
}
#endif
