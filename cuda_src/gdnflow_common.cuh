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

// n / d for 0 <= n < 2^31 by a multiply and a shift, where a division by a run-time
// value costs a few dozen instructions: (magic, shift) of d from the host
// (gdnflow.backends.cuda.limits.division_constants).
__device__ __forceinline__ unsigned quotient_of(unsigned n, unsigned magic, unsigned shift) {
    return (__umulhi(n, magic) + n) >> shift;
}

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

// Storage type of the elementwise kernels' tensors: float, or a 16-bit float
// when the module is built with -DSTORAGE_BF16 or -DSTORAGE_FP16 (the host
// picks the defines by dtype: gdnflow.backends.cuda.storage_defines). Kernels load each value
// into a float, compute in float32 and round once on store (to nearest, ties
// to even), as gdnflow.precision.emulate does on NumPy.
#if defined(STORAGE_BF16)
#include <cuda_bf16.h>
typedef __nv_bfloat16 storage_t;
__host__ __device__ __forceinline__ float load_value(storage_t v) { return __bfloat162float(v); }
__host__ __device__ __forceinline__ storage_t store_value(float v) { return __float2bfloat16_rn(v); }
#elif defined(STORAGE_FP16)
#include <cuda_fp16.h>
typedef __half storage_t;
__host__ __device__ __forceinline__ float load_value(storage_t v) { return __half2float(v); }
__host__ __device__ __forceinline__ storage_t store_value(float v) { return __float2half_rn(v); }
#else
typedef float storage_t;
__host__ __device__ __forceinline__ float load_value(float v) { return v; }
__host__ __device__ __forceinline__ float store_value(float v) { return v; }
#endif

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

// Host checks. Tests that compile a kernel's per-thread steps for the host
// (tests/host_kernels.py) define HOST_CHECK(condition) before the source, to
// count misaligned or out-of-bounds accesses there; elsewhere it is empty.
#ifndef HOST_CHECK
#define HOST_CHECK(condition)
#endif

// cp.async (sm_80+): a global -> shared copy of N floats without a register
// round trip (16-byte copies bypass L1), and its bookkeeping. On the host and
// older GPUs: a plain copy, and nothing to wait for.
template <int N>
__host__ __device__ __forceinline__ void copy_to_shared(float* dst, const float* src) {
    HOST_CHECK(reinterpret_cast<unsigned long long>(dst) % (4 * N) == 0);
    HOST_CHECK(reinterpret_cast<unsigned long long>(src) % (4 * N) == 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    if constexpr (N == 4)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n"
                     :: "r"(s), "l"(src), "n"(4 * N) : "memory");
#else
    for (int i = 0; i < N; ++i) dst[i] = src[i];
#endif
}

// Closes this thread's group of copies.
__device__ __forceinline__ void copies_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's groups of copies are in flight.
template <int N>
__device__ __forceinline__ void copies_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#endif
}

// Waits for all of this thread's copies (the barrier after it publishes them).
__device__ __forceinline__ void copies_done() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
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
