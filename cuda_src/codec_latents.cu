// The codec's latents quantised and dequantised on the GPU. Python side:
// gdnflow/codec/device_latents.py. Their NumPy twins are quantize_latents and
// the y_hat of decode_latents in gdnflow/codec/codec.py, and these kernels
// compute the same IEEE float32 operations: y - median rounded once, then
// rounded to an integer half to even (rintf); q converted to float (exact below
// 2^24) plus the median, rounded once. The per-element steps are
// __host__ __device__ for tests/codec/test_device_latents.py, which builds this
// file for the host.
#include <math.h>
#include "gdnflow_common.cuh"

// q's element i of channel i / plane: round(y - median) as an integer (as a float:
// the caller checks the range before converting).
__host__ __device__ inline float rounded_latent(int i, const float* y, const float* medians,
                                                int plane) {
#ifdef __CUDA_ARCH__
    return rintf(__fsub_rn(y[i], medians[i / plane]));
#else
    return rintf(y[i] - medians[i / plane]);
#endif
}

__host__ __device__ inline float dequantized_latent(int i, const int* q, const float* medians,
                                                    int plane) {
#ifdef __CUDA_ARCH__
    return __fadd_rn((float)q[i], medians[i / plane]);
#else
    return (float)q[i] + medians[i / plane];
#endif
}

// q[i] = round(y[i] - medians[channel]); a value at or beyond +-limit (or not finite)
// raises *out_of_range (and its q is 0).
extern "C" __global__ void quantize_latents(const float* __restrict__ y,
                                            const float* __restrict__ medians, int size,
                                            int plane, float limit, int* __restrict__ q,
                                            int* __restrict__ out_of_range) {
    GRID_STRIDE_LOOP(i, size) {
        const float v = rounded_latent(i, y, medians, plane);
        const bool inside = fabsf(v) < limit;       // false for NaN
        if (!inside) *out_of_range = 1;
        q[i] = inside ? (int)v : 0;
    }
}

// y_hat[i] = q[i] + medians[channel].
extern "C" __global__ void dequantize_latents(const int* __restrict__ q,
                                              const float* __restrict__ medians, int size,
                                              int plane, float* __restrict__ y_hat) {
    GRID_STRIDE_LOOP(i, size)
        y_hat[i] = dequantized_latent(i, q, medians, plane);
}
