// Learned soft-thresholding: y = sign(x) * max(|x| - theta[c], 0), with one
// threshold per channel. x is [batch, channels, inner] (inner = H * W, or the
// product of whatever dimensions follow the channel). Python side:
// gdnflow_softshrink/operator.py.
#include "gdnflow_common.cuh"

extern "C" __global__ void softshrink_forward(
        const float* __restrict__ x, const float* __restrict__ theta,
        float* __restrict__ y, int n, int channels, int inner) {
    GRID_STRIDE_LOOP(i, n) {
        const float v = x[i], t = theta[(i / inner) % channels];
        y[i] = copysignf(fmaxf(fabsf(v) - t, 0.0f), v);
    }
}

// One block per channel: each writes gx for its channel's elements and sums
// gtheta[c] = -sum gy * sign(x) over the elements where |x| > theta[c]; the
// channel's sum stays in one block, so no atomics and a deterministic result.
extern "C" __global__ void softshrink_backward(
        const float* __restrict__ x, const float* __restrict__ theta,
        const float* __restrict__ gy, float* __restrict__ gx,
        float* __restrict__ gtheta, int batch, int channels, int inner) {
    const int c = blockIdx.x;
    const float t = theta[c];
    float partial = 0.0f;
    for (int b = 0; b < batch; ++b) {
        const int base = (b * channels + c) * inner;
        for (int j = threadIdx.x; j < inner; j += blockDim.x) {
            const float v = x[base + j], g = gy[base + j];
            const bool active = fabsf(v) > t;
            gx[base + j] = active ? g : 0.0f;
            if (active) partial -= copysignf(1.0f, v) * g;
        }
    }
    partial = block_sum(partial);
    if (threadIdx.x == 0) gtheta[c] = partial;
}
