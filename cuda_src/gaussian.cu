// The Gaussian conditional likelihood of the scale hyperprior (Ballé et al.
// 2018). Python side: gdnflow/ops/gaussian.py, whose docstring has the
// formulas; its NumPy backend, in float64, is the reference for these kernels.
#include "gdnflow_common.cuh"

// The per-element math is __host__ __device__ so that tests can run it on the
// CPU (tests/ops/test_gaussian.py builds this file for the host).

// Phi(-u / s) = erfc(u / (s sqrt 2)) / 2 for u = |v| -+ 1/2: for u > 0 erfcf
// keeps its relative precision down to Phi = 1e-45 (float32's smallest),
// where 1 - erfcf(...) would cancel. The tail amplifies the relative error of
// erfcf's argument z by 2 z^2 (130 at Phi = 1e-30): computed in float, z has
// up to four roundings (the likelihood measured 1.4e-5 off at 1e-30); in
// double, only the final one to float (8e-6 at 1e-30, 2^-24 * 2 z^2).
__host__ __device__ __forceinline__ float normal_cdf_below(double u, double inv_s_sqrt2) {
    return 0.5f * erfcf((float)(u * inv_s_sqrt2));
}

__host__ __device__ __forceinline__ float normal_pdf(float t) {
    return 0.39894228040143268f * expf(-0.5f * t * t);     // 1/sqrt(2 pi)
}

// Mass of [v - 1/2, v + 1/2] under N(0, s^2), s = max(scale, bound), taken at
// -|v| (the same mass by symmetry) so that both CDF values are small.
// bound = -inf: no bound.
__host__ __device__ __forceinline__ float gaussian_likelihood_at(float value, float scale,
                                                                 float bound) {
    const double v = fabsf(value), inv_s_sqrt2 = 0.70710678118654752 / fmaxf(scale, bound);
    return normal_cdf_below(v - 0.5, inv_s_sqrt2) - normal_cdf_below(v + 0.5, inv_s_sqrt2);
}

// gy times the gradients: wrt value, sign(value) (phi(b) - phi(a)) / s; wrt s,
// -(a phi(a) - b phi(b)) / s, passed to scale where scale >= bound or where it
// is negative (LowerBoundOp's rule, gdnflow/ops/bound.py); a, b as above.
__host__ __device__ __forceinline__ void gaussian_likelihood_grads_at(
        float value, float scale, float bound, float gy, float* g_value, float* g_scale) {
    const float s = fmaxf(scale, bound), v = fabsf(value);
    const float a = (0.5f - v) / s, b = (-0.5f - v) / s;
    const float phi_a = normal_pdf(a), phi_b = normal_pdf(b);
    const float sign = value > 0.0f ? 1.0f : (value < 0.0f ? -1.0f : 0.0f);
    *g_value = gy * sign * (phi_b - phi_a) / s;
    const float g_s = -gy * (a * phi_a - b * phi_b) / s;
    *g_scale = (scale >= bound || g_s < 0.0f) ? g_s : 0.0f;
}

extern "C" __global__ void gaussian_likelihood_forward(const float* __restrict__ values,
                                                       const float* __restrict__ scales,
                                                       float* __restrict__ likelihood, int n,
                                                       float bound) {
    GRID_STRIDE_LOOP(i, n) likelihood[i] = gaussian_likelihood_at(values[i], scales[i], bound);
}

// Both gradients in one pass over values, scales and gy.
extern "C" __global__ void gaussian_likelihood_backward(const float* __restrict__ values,
                                                        const float* __restrict__ scales,
                                                        const float* __restrict__ gy,
                                                        float* __restrict__ g_values,
                                                        float* __restrict__ g_scales, int n,
                                                        float bound) {
    GRID_STRIDE_LOOP(i, n)
        gaussian_likelihood_grads_at(values[i], scales[i], bound, gy[i], &g_values[i],
                                     &g_scales[i]);
}
