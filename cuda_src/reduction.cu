// Sum reductions. Python side: gdnflow/ops/reduction.py.
//
// Whole-tensor sum, after Harris, "Optimizing Parallel Reduction in CUDA":
// sum_partial reads the input once with a grid-stride loop (float4 loads,
// SUM_UNROLL of them in flight per thread, the first adds done while
// loading), finishes each block with warp shuffles, and writes one partial
// per block; sum_final adds the partials in one block. Two passes, no atomics,
// so the result does not depend on scheduling.
//
// Axis sums see the input as [outer, r, inner] (the host merges dimensions)
// and add over r: sum_rows_* when inner == 1, sum_middle otherwise.
#include "gdnflow_common.cuh"

#ifndef SUM_BLOCK
#define SUM_BLOCK 256
#endif
#ifndef SUM_UNROLL
#define SUM_UNROLL 8
#endif

// x must be 16-byte aligned (every pooled allocation is).
extern "C" __global__ void __launch_bounds__(SUM_BLOCK)
sum_partial(const float* __restrict__ x, float* __restrict__ partial, int n) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int n4 = n >> 2;
    const int stride = gridDim.x * SUM_BLOCK;
    int i = blockIdx.x * SUM_BLOCK + threadIdx.x;
    float acc = 0.0f;
    for (; i + (SUM_UNROLL - 1) * stride < n4; i += SUM_UNROLL * stride) {
        float4 v[SUM_UNROLL];
#pragma unroll
        for (int u = 0; u < SUM_UNROLL; ++u) v[u] = __ldcs(x4 + i + u * stride);
#pragma unroll
        for (int u = 0; u < SUM_UNROLL; ++u) acc += (v[u].x + v[u].y) + (v[u].z + v[u].w);
    }
    for (; i < n4; i += stride) {
        const float4 v = __ldcs(x4 + i);
        acc += (v.x + v.y) + (v.z + v.w);
    }
    // The last n % 4 elements, one per thread of block 0.
    if (blockIdx.x == 0 && threadIdx.x < (n & 3)) acc += x[(n4 << 2) + threadIdx.x];
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out[0] = scale * sum(partial[0:n]); launched as a single block.
extern "C" __global__ void sum_final(const float* __restrict__ partial,
                                     float* __restrict__ out, int n, float scale) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[0] = acc * scale;
}

// x is [rows, r]: out[row] = scale * sum_j x[row, j]. One warp per row, for
// short rows.
extern "C" __global__ void sum_rows_warp(const float* __restrict__ x, float* __restrict__ out,
                                         int rows, int r, float scale) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
        const float* p = x + (size_t)row * r;
        float acc = 0.0f;
        for (int j = lane; j < r; j += 32) acc += p[j];
        acc = warp_sum(acc);
        if (lane == 0) out[row] = acc * scale;
    }
}

// As sum_rows_warp, one block per row, for long rows. When r is a multiple
// of 4 every row starts 16-byte aligned, and the row is read as float4.
extern "C" __global__ void sum_rows_block(const float* __restrict__ x, float* __restrict__ out,
                                          int rows, int r, float scale) {
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* p = x + (size_t)row * r;
        float acc = 0.0f;
        if ((r & 3) == 0) {
            const float4* p4 = reinterpret_cast<const float4*>(p);
            for (int j = threadIdx.x; j < (r >> 2); j += blockDim.x) {
                const float4 v = __ldcs(p4 + j);
                acc += (v.x + v.y) + (v.z + v.w);
            }
        } else {
            for (int j = threadIdx.x; j < r; j += blockDim.x) acc += p[j];
        }
        acc = block_sum(acc);
        if (threadIdx.x == 0) out[row] = acc * scale;
    }
}

// x is [outer, r, inner]: out[o, i] = scale * sum_j x[o, j, i]. One thread
// per output; neighbouring threads read neighbouring addresses.
extern "C" __global__ void sum_middle(const float* __restrict__ x, float* __restrict__ out,
                                      int outer, int r, int inner, float scale) {
    GRID_STRIDE_LOOP(k, outer * inner) {
        const int o = k / inner, i = k - o * inner;
        const float* p = x + (size_t)o * r * inner + i;
        float acc = 0.0f;
        for (int j = 0; j < r; ++j) acc += p[(size_t)j * inner];
        out[k] = acc * scale;
    }
}
