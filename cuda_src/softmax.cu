// Softmax and log-softmax along one axis. Python side: gdnflow/ops/softmax.py.
//
// The input is seen as [outer, r, inner] and normalised along r. When
// inner == 1 (the last axis, the common case) each row is contiguous and one
// warp (short rows) or one block (long rows) handles it; otherwise one thread
// per (outer, inner) column walks its strided column.
//
// Numerically stable: with m = max_j x_j and s = sum_j exp(x_j - m),
//   softmax:      y_j = exp(x_j - m) / s
//   log_softmax:  y_j = x_j - m - log(s)
// Backward, from the saved output y:
//   softmax:      gx_j = y_j (gy_j - sum_k gy_k y_k)
//   log_softmax:  gx_j = gy_j - exp(y_j) sum_k gy_k
// ``log_mode`` (0 or 1) picks the variant; it is uniform across the launch.
#include "gdnflow_common.cuh"

#ifndef SOFTMAX_BLOCK
#define SOFTMAX_BLOCK 256
#endif

// Reductions whose result every lane (or thread) receives: the butterfly
// (xor) pattern leaves the total in all lanes, where the common header's
// warp_sum leaves it in lane 0 only.
__device__ __forceinline__ float warp_all_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ __forceinline__ float warp_all_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Over the block (blockDim.x = SOFTMAX_BLOCK, a multiple of 32): each warp
// reduces, then every warp reduces the warps' results, so all threads get
// the total without a broadcast step. Ends with a barrier so that it can be
// called again.
template <bool MAX>
__device__ __forceinline__ float block_all(float v) {
    __shared__ float warp_results[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = MAX ? warp_all_max(v) : warp_all_sum(v);
    if (lane == 0) warp_results[warp] = v;
    __syncthreads();
    const float identity = MAX ? -INFINITY : 0.0f;
    v = lane < (SOFTMAX_BLOCK >> 5) ? warp_results[lane] : identity;
    v = MAX ? warp_all_max(v) : warp_all_sum(v);
    __syncthreads();
    return v;
}

// ------------------------------------------------------------- forward ----
// One warp per row of x [rows, r].
extern "C" __global__ void softmax_rows_warp(const float* __restrict__ x, float* __restrict__ y,
                                             int rows, int r, int log_mode) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
        const float* xr = x + (size_t)row * r;
        float* yr = y + (size_t)row * r;
        float m = -INFINITY;
        for (int j = lane; j < r; j += 32) m = fmaxf(m, xr[j]);
        m = warp_all_max(m);
        float s = 0.0f;
        for (int j = lane; j < r; j += 32) s += expf(xr[j] - m);
        s = warp_all_sum(s);
        if (log_mode) {
            const float lse = m + logf(s);
            for (int j = lane; j < r; j += 32) yr[j] = xr[j] - lse;
        } else {
            const float inv = 1.0f / s;
            for (int j = lane; j < r; j += 32) yr[j] = expf(xr[j] - m) * inv;
        }
    }
}

// One block of SOFTMAX_BLOCK threads per row, for long rows.
extern "C" __global__ void __launch_bounds__(SOFTMAX_BLOCK)
softmax_rows_block(const float* __restrict__ x, float* __restrict__ y, int rows, int r,
                   int log_mode) {
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + (size_t)row * r;
        float* yr = y + (size_t)row * r;
        float m = -INFINITY;
        for (int j = threadIdx.x; j < r; j += SOFTMAX_BLOCK) m = fmaxf(m, xr[j]);
        m = block_all<true>(m);
        float s = 0.0f;
        for (int j = threadIdx.x; j < r; j += SOFTMAX_BLOCK) s += expf(xr[j] - m);
        s = block_all<false>(s);
        if (log_mode) {
            const float lse = m + logf(s);
            for (int j = threadIdx.x; j < r; j += SOFTMAX_BLOCK) yr[j] = xr[j] - lse;
        } else {
            const float inv = 1.0f / s;
            for (int j = threadIdx.x; j < r; j += SOFTMAX_BLOCK) yr[j] = expf(xr[j] - m) * inv;
        }
    }
}

// One thread per column of x [outer, r, inner]: neighbouring threads read
// neighbouring addresses at every step along r.
extern "C" __global__ void softmax_columns(const float* __restrict__ x, float* __restrict__ y,
                                           int outer, int r, int inner, int log_mode) {
    GRID_STRIDE_LOOP(k, outer * inner) {
        const int o = k / inner, i = k - o * inner;
        const size_t base = (size_t)o * r * inner + i;
        float m = -INFINITY;
        for (int j = 0; j < r; ++j) m = fmaxf(m, x[base + (size_t)j * inner]);
        float s = 0.0f;
        for (int j = 0; j < r; ++j) s += expf(x[base + (size_t)j * inner] - m);
        const float lse = m + logf(s), inv = 1.0f / s;
        for (int j = 0; j < r; ++j) {
            const size_t e = base + (size_t)j * inner;
            y[e] = log_mode ? x[e] - lse : expf(x[e] - m) * inv;
        }
    }
}

// ------------------------------------------------------------ backward ----
// The per-element term of the row sum, and the gradient given that sum.
__device__ __forceinline__ float backward_term(float y, float gy, int log_mode) {
    return log_mode ? gy : gy * y;
}

__device__ __forceinline__ float backward_value(float y, float gy, float total, int log_mode) {
    return log_mode ? gy - expf(y) * total : y * (gy - total);
}

extern "C" __global__ void softmax_backward_rows_warp(
        const float* __restrict__ y, const float* __restrict__ gy, float* __restrict__ gx,
        int rows, int r, int log_mode) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
        const size_t base = (size_t)row * r;
        float total = 0.0f;
        for (int j = lane; j < r; j += 32)
            total += backward_term(y[base + j], gy[base + j], log_mode);
        total = warp_all_sum(total);
        for (int j = lane; j < r; j += 32)
            gx[base + j] = backward_value(y[base + j], gy[base + j], total, log_mode);
    }
}

extern "C" __global__ void __launch_bounds__(SOFTMAX_BLOCK)
softmax_backward_rows_block(const float* __restrict__ y, const float* __restrict__ gy,
                            float* __restrict__ gx, int rows, int r, int log_mode) {
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const size_t base = (size_t)row * r;
        float total = 0.0f;
        for (int j = threadIdx.x; j < r; j += SOFTMAX_BLOCK)
            total += backward_term(y[base + j], gy[base + j], log_mode);
        total = block_all<false>(total);
        for (int j = threadIdx.x; j < r; j += SOFTMAX_BLOCK)
            gx[base + j] = backward_value(y[base + j], gy[base + j], total, log_mode);
    }
}

extern "C" __global__ void softmax_backward_columns(
        const float* __restrict__ y, const float* __restrict__ gy, float* __restrict__ gx,
        int outer, int r, int inner, int log_mode) {
    GRID_STRIDE_LOOP(k, outer * inner) {
        const int o = k / inner, i = k - o * inner;
        const size_t base = (size_t)o * r * inner + i;
        float total = 0.0f;
        for (int j = 0; j < r; ++j) {
            const size_t e = base + (size_t)j * inner;
            total += backward_term(y[e], gy[e], log_mode);
        }
        for (int j = 0; j < r; ++j) {
            const size_t e = base + (size_t)j * inner;
            gx[e] = backward_value(y[e], gy[e], total, log_mode);
        }
    }
}
