// Data movement for the shape operators: transpose, slice, concat, pad.
// Python side: gdnflow/ops/shape.py.
//
// Both kernels walk the elements of a dense array of (up to) six merged
// dimensions d0 x ... x d5 and pair each with an element of a strided view
// of another array: element (i0, ..., i5) <-> base + sum_k ik * sk. A strided
// view covers transposes (permuted strides), slices (offset base, strides
// times the step, negative for reversed slices) and the place of one input
// inside a concatenation or a padded output.
#include "gdnflow_common.cuh"

#define VIEW_DIMS int d1, int d2, int d3, int d4, int d5
#define VIEW_STRIDES int s0, int s1, int s2, int s3, int s4, int s5

#define VIEW_STEP(D, S)                                                       \
    if (D > 1) { const int k = i % D; i /= D; offset += k * S; }

__device__ __forceinline__ int view_offset(int i, int base, VIEW_DIMS, VIEW_STRIDES) {
    int offset = base;
    VIEW_STEP(d5, s5)
    VIEW_STEP(d4, s4)
    VIEW_STEP(d3, s3)
    VIEW_STEP(d2, s2)
    VIEW_STEP(d1, s1)
    return offset + i * s0;
}

// out[i] = x[view(i)]: out is dense, x is read through the view.
extern "C" __global__ void strided_gather(
        const float* __restrict__ x, float* __restrict__ out, int n, int base,
        VIEW_DIMS, VIEW_STRIDES) {
    GRID_STRIDE_LOOP(i, n) out[i] = x[view_offset(i, base, d1, d2, d3, d4, d5, s0, s1, s2, s3, s4, s5)];
}

// out[view(i)] = x[i]: x is dense, out is written through the view.
extern "C" __global__ void strided_scatter(
        const float* __restrict__ x, float* __restrict__ out, int n, int base,
        VIEW_DIMS, VIEW_STRIDES) {
    GRID_STRIDE_LOOP(i, n) out[view_offset(i, base, d1, d2, d3, d4, d5, s0, s1, s2, s3, s4, s5)] = x[i];
}

// Concatenation, up to CONCAT_INPUTS inputs a launch: out is [outer, total,
// inner] (total: the concatenated axis), and input k fills its rows
// [start[k], start[k + 1]) of that axis, itself [outer, start[k + 1] -
// start[k], inner]. For each outer index, input k's rows are one contiguous
// segment of (start[k + 1] - start[k]) * inner values in both arrays; the
// launch cuts every segment into pieces of at most CONCAT_PIECE values (input
// k's pieces numbered from piece[k] within an outer index) and a block copies
// one piece at a time, 16 bytes a thread where both ends are 16-byte aligned.
// One launch for a DenseNet concatenation of up to 32 inputs, where one view
// copy per input took 597 launches per image. (A block per line of inner
// values left SqueezeNet's lines of 55 x 55 values unaligned, copied 4 bytes a
// thread: 2.5 TB/s on the H200.)
#define CONCAT_INPUTS 32
#define CONCAT_PIECE 4096

struct ConcatInputs {                       // passed by value (the host packs it)
    const float* x[CONCAT_INPUTS];
    int start[CONCAT_INPUTS + 1];
    int piece[CONCAT_INPUTS + 1];
};

extern "C" __global__ void concat_inputs(
        float* __restrict__ out, int outer, int total, int inner, int count,
        const __grid_constant__ ConcatInputs table) {
    // __grid_constant__: the loop indexes the table with run-time values in place
    // (constant bank loads); a copy into shared memory by one thread per block cost
    // each block a serial copy first.
    const int pieces = table.piece[count] - table.piece[0];
    for (int task = blockIdx.x; task < outer * pieces; task += gridDim.x) {
        const int o = task / pieces, p = table.piece[0] + task % pieces;
        int k = 0;
        while (p >= table.piece[k + 1]) ++k;
        const long long length = static_cast<long long>(table.start[k + 1] - table.start[k]) * inner;
        const long long at = static_cast<long long>(p - table.piece[k]) * CONCAT_PIECE;
        const int values = static_cast<int>(min(static_cast<long long>(CONCAT_PIECE), length - at));
        const float* source = table.x[k] + o * length + at;
        float* destination = out + (static_cast<long long>(o) * total + table.start[k]) * inner + at;
        int done = 0;
        if (((reinterpret_cast<unsigned long long>(source) |
              reinterpret_cast<unsigned long long>(destination)) & 15ull) == 0) {
            const int vectors = values / 4;
            for (int v = threadIdx.x; v < vectors; v += blockDim.x)
                reinterpret_cast<float4*>(destination)[v] = reinterpret_cast<const float4*>(source)[v];
            done = vectors * 4;
        }
        for (int c = done + threadIdx.x; c < values; c += blockDim.x) destination[c] = source[c];
    }
}
