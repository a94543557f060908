// Shared helpers for gdnflow kernels. The loader pastes this header into each
// source in place of its #include (see gdnflow/backends/cuda/kernels.py), so
// keep it small: it is compiled once per module.
// Include guards, not #pragma once: the loader pastes this text into the
// main file, where #pragma once draws a warning.
#ifndef GDNFLOW_COMMON_CUH
#define GDNFLOW_COMMON_CUH

// Grid-stride loop over [0, n): every elementwise kernel uses it, so a launch
// may use fewer blocks than elements.
#define GRID_STRIDE_LOOP(i, n)                                                \
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += gridDim.x * blockDim.x)

// Sum of v over the 32 lanes of a warp; lane 0 holds the result.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

// Sum of v over the block; thread 0 holds the result. blockDim.x must be a
// multiple of 32 and at most 1024. Ends with a barrier so that it can be
// called again in the same kernel.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float warp_totals[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) warp_totals[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = (threadIdx.x < warps) ? warp_totals[threadIdx.x] : 0.0f;
    if (warp == 0) v = warp_sum(v);
    __syncthreads();
    return v;
}

// Activation codes of the fused convolution epilogues (conv2d, depthwise,
// pointwise and Winograd kernels), as gdnflow/ops/conv.py's ACTIVATIONS maps
// them. Host and device: kernels' tests compile their bodies for the CPU too.
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_RELU6 2

__host__ __device__ __forceinline__ float activate(float v, int act) {
    if (act == ACT_RELU) return fmaxf(v, 0.0f);
    if (act == ACT_RELU6) return fminf(fmaxf(v, 0.0f), 6.0f);
    return v;
}

// GDN's non-negative reparameterisation (gdnflow/ops/parametrize.py): the
// effective value v = max(p, bound)^2 - pedestal of a stored parameter p, and
// dL/dp from gv = dL/dv: 2 max(p, bound) gv where the bound lets the gradient
// pass (p >= bound, or gv < 0 so that descent raises p toward the bound).
// Used by parametrize.cu and, fused into the GDN layer, gdn.cu.
__device__ __forceinline__ float nonnegative_value(float p, float bound, float pedestal) {
    const float m = fmaxf(p, bound);
    return m * m - pedestal;
}

__device__ __forceinline__ float nonnegative_value_grad(float p, float gv, float bound) {
    return (p >= bound || gv < 0.0f) ? 2.0f * fmaxf(p, bound) * gv : 0.0f;
}

#endif  // GDNFLOW_COMMON_CUH
