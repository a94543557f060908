// rANS coding of the codec's latents, one lane (thread) per substream.
// Python side and the coder's definition: gdnflow/codec/rans.py, whose NumPy
// coder writes and reads the same 16-bit words (tests/codec/test_rans.py).
//
// A lane codes its runs in order; run r is run_count[r] values with table
// run_table[r], the value of its i-th symbol at latents[run_dest[r] + i] (a
// contiguous run) or, where run_dest[r] < 0, at latents[positions[-run_dest[r]
// - 1 + i]] (a gathered run). Table k: CDF cdf[table_offset[k] ...
// table_offset[k] + table_size[k]] rising from 0 to 2^PRECISION over its
// table_size[k] symbols, the last of them the escape; symbol s stands for the
// value table_low[k] + s.
//
// The state x is 32 bits, in [STATE_LOW, 2^32) between symbols; words are 16
// bits. Encoding runs backward from x = STATE_LOW: before coding s (frequency
// f, start c) a state of x >= f << (32 - PRECISION) gives out its low word;
// then x = (x / f << PRECISION) + x % f + c. The lane's stream is the final
// state (high word, low word) followed by the words given out, last first.
// Decoding reads it forward: s is the symbol whose CDF interval holds
// x mod 2^PRECISION, x = f (x >> PRECISION) + (x mod 2^PRECISION) - c, and a
// state below STATE_LOW takes in the next word.
//
// The per-lane steps are __host__ __device__ for the host-built tests.
#include "gdnflow_common.cuh"

#define PRECISION 16
#define STATE_LOW 65536u
#define ESCAPE_MARK (-2147483647 - 1)
// Table k's bucket[k << BUCKET_BITS | b]: the symbol holding slot b << (PRECISION - BUCKET_BITS).
#define BUCKET_BITS 8

// Lane status (rans.py LANE_* constants).
#define LANE_OK 0
#define LANE_TRUNCATED 1
#define LANE_BAD_END 2

// Where the i-th value of run r lives in latents.
__host__ __device__ inline long long run_position(int r, int i, const long long* run_dest,
                                                  const int* positions) {
    const long long dest = run_dest[r];
    return dest >= 0 ? dest + i : (long long)positions[-dest - 1 + i];
}

// The symbol whose CDF interval holds slot: from the symbol holding the start of
// slot's bucket (the slots of one BUCKET_BITS-bit prefix), onward.
__host__ __device__ inline int find_symbol(const int* cdf, const int* bucket, unsigned slot) {
    int s = bucket[slot >> (PRECISION - BUCKET_BITS)];
    while ((unsigned)cdf[s + 1] <= slot) ++s;
    return s;
}

// Encodes lane `lane`: its words go backward from words[end] (end = the lane's
// capacity's end); returns how many (the stream is words[end - count, end)), and
// where `escapes` is not null, how many values it coded as the escape.
__host__ __device__ inline int rans_encode_lane(
        int lane, const int* latents, const int* lane_runs, const int* run_table,
        const int* run_count, const long long* run_dest, const int* positions,
        const int* cdf, const int* table_offset, const int* table_size, const int* table_low,
        unsigned short* words, long long end, int* escapes = nullptr) {
    unsigned x = STATE_LOW;
    long long p = end;
    int escaped = 0;
    for (int r = lane_runs[lane + 1] - 1; r >= lane_runs[lane]; --r) {
        const int k = run_table[r], size = table_size[k], low = table_low[k];
        const int* table = cdf + table_offset[k];
        for (int i = run_count[r] - 1; i >= 0; --i) {
            // In 64 bits: a value near +-2^31 minus low overflows an int.
            const long long symbol = (long long)latents[run_position(r, i, run_dest, positions)]
                                     - low;
            const bool escape = symbol < 0 || symbol >= size - 1;
            const int s = escape ? size - 1 : (int)symbol;
            escaped += escape;
            const unsigned c = (unsigned)table[s], f = (unsigned)table[s + 1] - c;
            if (x >= (f << (32 - PRECISION))) {
                words[--p] = (unsigned short)(x & 0xffffu);
                x >>= 16;
            }
            x = ((x / f) << PRECISION) + x % f + c;
        }
    }
    words[--p] = (unsigned short)(x & 0xffffu);
    words[--p] = (unsigned short)(x >> 16);
    if (escapes) *escapes = escaped;
    return (int)(end - p);
}

// Decodes lane `lane` from words[begin, end) into latents (an escape as
// ESCAPE_MARK); returns the lane's status, and its escapes in *escapes.
__host__ __device__ inline int rans_decode_lane(
        int lane, const unsigned short* words, long long begin, long long end,
        const int* lane_runs, const int* run_table, const int* run_count,
        const long long* run_dest, const int* positions, const int* cdf,
        const int* table_offset, const int* table_size, const int* table_low,
        const int* buckets, int* latents, int* escapes) {
    int status = LANE_OK, escaped = 0;
    long long p = begin;
    unsigned x = 0;
    for (int half = 0; half < 2; ++half) {
        const unsigned w = p < end ? words[p] : 0u;
        if (p >= end) status = LANE_TRUNCATED;
        x = (x << 16) | w;
        ++p;
    }
    for (int r = lane_runs[lane]; r < lane_runs[lane + 1]; ++r) {
        const int k = run_table[r], size = table_size[k], low = table_low[k];
        const int* table = cdf + table_offset[k];
        const int* bucket = buckets + ((long long)k << BUCKET_BITS);
        for (int i = 0; i < run_count[r]; ++i) {
            const unsigned slot = x & ((1u << PRECISION) - 1u);
            const int s = find_symbol(table, bucket, slot);
            const unsigned c = (unsigned)table[s], f = (unsigned)table[s + 1] - c;
            x = f * (x >> PRECISION) + slot - c;
            if (x < STATE_LOW) {
                if (p < end) x = (x << 16) | words[p]; else { x <<= 16; status = LANE_TRUNCATED; }
                ++p;
            }
            const bool escape = s == size - 1;
            escaped += escape;
            latents[run_position(r, i, run_dest, positions)] = escape ? ESCAPE_MARK : s + low;
        }
    }
    // The encoder started from STATE_LOW; only a zero word (the padding to 32 bits) may follow.
    if (status == LANE_OK && (x != STATE_LOW || p < end - 1 || (p == end - 1 && words[p] != 0)))
        status = LANE_BAD_END;
    *escapes = escaped;
    return status;
}

extern "C" __global__ void rans_encode(
        const int* __restrict__ latents, const int* __restrict__ lane_runs,
        const int* __restrict__ run_table, const int* __restrict__ run_count,
        const long long* __restrict__ run_dest, const int* __restrict__ positions,
        const int* __restrict__ cdf, const int* __restrict__ table_offset,
        const int* __restrict__ table_size, const int* __restrict__ table_low,
        const long long* __restrict__ lane_end, int lanes, unsigned short* __restrict__ words,
        int* __restrict__ lane_words) {
    GRID_STRIDE_LOOP(lane, lanes)
        lane_words[lane] = rans_encode_lane(lane, latents, lane_runs, run_table, run_count,
                                            run_dest, positions, cdf, table_offset, table_size,
                                            table_low, words, lane_end[lane]);
}

extern "C" __global__ void rans_decode(
        const unsigned short* __restrict__ words, const long long* __restrict__ lane_begin,
        const int* __restrict__ lane_runs, const int* __restrict__ run_table,
        const int* __restrict__ run_count, const long long* __restrict__ run_dest,
        const int* __restrict__ positions, const int* __restrict__ cdf,
        const int* __restrict__ table_offset, const int* __restrict__ table_size,
        const int* __restrict__ table_low, const int* __restrict__ buckets, int lanes,
        int* __restrict__ latents, int* __restrict__ lane_status,
        int* __restrict__ lane_escapes) {
    GRID_STRIDE_LOOP(lane, lanes)
        lane_status[lane] = rans_decode_lane(lane, words, lane_begin[lane], lane_begin[lane + 1],
                                             lane_runs, run_table, run_count, run_dest,
                                             positions, cdf, table_offset, table_size,
                                             table_low, buckets, latents, lane_escapes + lane);
}

// Host entry points: every lane coded, lanes shared among `threads` OpenMP threads
// (lanes write disjoint words and latents; threads above the lane count would only
// wait), for gdnflow/codec/host_lanes.py, which builds
// this file for the host with nvcc -fopenmp. The device pass skips them: the GPU
// module holds kernels only.
#ifndef __CUDA_ARCH__
extern "C" void rans_encode_lanes_host(
        int lanes, int threads, const int* latents, const int* lane_runs, const int* run_table,
        const int* run_count, const long long* run_dest, const int* positions, const int* cdf,
        const int* table_offset, const int* table_size, const int* table_low,
        const long long* lane_end, unsigned short* words, int* lane_words, int* lane_escapes) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int lane = 0; lane < lanes; ++lane)
        lane_words[lane] = rans_encode_lane(lane, latents, lane_runs, run_table, run_count,
                                            run_dest, positions, cdf, table_offset, table_size,
                                            table_low, words, lane_end[lane],
                                            lane_escapes + lane);
}

extern "C" void rans_decode_lanes_host(
        int lanes, int threads, const unsigned short* words, const long long* lane_begin,
        const int* lane_runs, const int* run_table, const int* run_count,
        const long long* run_dest, const int* positions, const int* cdf,
        const int* table_offset, const int* table_size, const int* table_low,
        const int* buckets, int* latents, int* lane_status, int* lane_escapes) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int lane = 0; lane < lanes; ++lane)
        lane_status[lane] = rans_decode_lane(lane, words, lane_begin[lane], lane_begin[lane + 1],
                                             lane_runs, run_table, run_count, run_dest,
                                             positions, cdf, table_offset, table_size,
                                             table_low, buckets, latents, lane_escapes + lane);
}

// Where the escapes of each lane with escapes[lane] > 0 lie, in coding order: its
// values coded as the escape (`marked`: latents holding ESCAPE_MARK, as decoding left
// them; else values outside their table's symbols, as rans_encode_lane finds them),
// their offsets into latents and tables written from first[lane] on (at most
// escapes[lane] of them); found[lane]: how many there were. Lets the host read and
// write the escape codes without listing every position of the lane.
extern "C" void rans_lane_escapes_host(
        int lanes, int threads, int marked, const int* latents, const int* lane_runs,
        const int* run_table, const int* run_count, const long long* run_dest,
        const int* positions, const int* table_size, const int* table_low, const int* escapes,
        const long long* first, long long* escape_positions, int* escape_tables, int* found) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int lane = 0; lane < lanes; ++lane) {
        int count = 0;
        for (int r = lane_runs[lane]; escapes[lane] > 0 && r < lane_runs[lane + 1]; ++r) {
            const int k = run_table[r], size = table_size[k], low = table_low[k];
            for (int i = 0; i < run_count[r]; ++i) {
                const long long at = run_position(r, i, run_dest, positions);
                const int value = latents[at];
                const long long symbol = (long long)value - low;     // no int overflow
                const bool escape = marked ? value == ESCAPE_MARK
                                           : symbol < 0 || symbol >= size - 1;
                if (!escape) continue;
                if (count < escapes[lane]) {
                    escape_positions[first[lane] + count] = at;
                    escape_tables[first[lane] + count] = k;
                }
                ++count;
            }
        }
        found[lane] = count;
    }
}
#endif
