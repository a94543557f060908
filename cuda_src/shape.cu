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
