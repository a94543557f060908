// Operators of the entropy bottleneck (Ballé et al. 2018, appendix 6.1) and
// of training with additive uniform noise. Python side: gdnflow/ops/entropy.py.
#include "gdnflow_common.cuh"

// ---------------------------------------------------------------- unary ----
// NAME_forward (x, y, n):          y  = FORWARD(x)
// NAME_backward(x, y, gy, gx, n):  gx = BACKWARD(x, y, gy)
// A backward that reads only x or only y lets the compiler drop the other load.
#define ENTROPY_UNARY(NAME, FORWARD, BACKWARD)                                \
extern "C" __global__ void NAME##_forward(                                    \
        const float* __restrict__ x_, float* __restrict__ y_, int n) {        \
    GRID_STRIDE_LOOP(i, n) { const float x = x_[i]; y_[i] = (FORWARD); }      \
}                                                                             \
extern "C" __global__ void NAME##_backward(                                   \
        const float* __restrict__ x_, const float* __restrict__ y_,           \
        const float* __restrict__ gy_, float* __restrict__ gx_, int n) {      \
    GRID_STRIDE_LOOP(i, n) {                                                  \
        [[maybe_unused]] const float x = x_[i], y = y_[i], gy = gy_[i];       \
        gx_[i] = (BACKWARD);                                                  \
    }                                                                         \
}

// softplus(x) = log(1 + e^x). Past x = 20, e^-x < 2e-9 is below float32's
// resolution of x, so y = x (PyTorch's threshold); log1pf keeps the far
// negative side accurate. Its derivative is sigmoid(x).
ENTROPY_UNARY(softplus, x > 20.0f ? x : log1pf(expf(x)),  gy / (1.0f + expf(-x)))
ENTROPY_UNARY(tanh,     tanhf(x),                          gy * (1.0f - y * y))
// d|x|/dx = sign(x), 0 at 0 (the subgradient PyTorch uses too).
ENTROPY_UNARY(abs,      fabsf(x),                          x > 0.0f ? gy : (x < 0.0f ? -gy : 0.0f))
// Round half to even (rintf), as numpy.rint and torch.round; the backward is
// the identity (straight-through) and needs no kernel.
extern "C" __global__ void round_forward(const float* __restrict__ x, float* __restrict__ y,
                                         int n) {
    GRID_STRIDE_LOOP(i, n) y[i] = rintf(x[i]);
}

// ------------------------------------------------------- uniform noise ----
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011): a keyed bijection of a 128-bit counter, so element i of
// stream s under key k gets its own random word without any state. The same
// function is written in NumPy (gdnflow/ops/entropy.py, philox4x32), so
// both backends draw bit-identical noise, and a resumed run draws the noise
// of the uninterrupted one from (key, stream = step) alone.
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

__device__ __forceinline__ unsigned int philox_word0(unsigned int c0, unsigned int c1,
                                                     unsigned int c2, unsigned int c3,
                                                     unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const unsigned int hi0 = __umulhi(PHILOX_M0, c0), lo0 = PHILOX_M0 * c0;
        const unsigned int hi1 = __umulhi(PHILOX_M1, c2), lo1 = PHILOX_M1 * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    return c0;
}

// y[i] = x[i] + u_i, u_i = (word >> 8) * 2^-24 - 1/2 in [-1/2, 1/2): 24 random
// bits, every value exact in float32, so NumPy reproduces it bit for bit.
// Counter (offset + i, 0, stream_lo, stream_hi), key (key_lo, key_hi): offset is
// where x starts in the whole batch (a data-parallel process's slice of it).
__device__ __forceinline__ void add_uniform_noise(const float* __restrict__ x,
                                                  float* __restrict__ y, int n,
                                                  unsigned int offset,
                                                  unsigned int key_lo, unsigned int key_hi,
                                                  unsigned int stream_lo,
                                                  unsigned int stream_hi) {
    GRID_STRIDE_LOOP(i, n) {
        const unsigned int word = philox_word0(offset + (unsigned int)i, 0u, stream_lo,
                                               stream_hi, key_lo, key_hi);
        const float u = (float)(word >> 8) * 5.9604644775390625e-8f - 0.5f;   // 2^-24
        y[i] = x[i] + u;
    }
}

extern "C" __global__ void uniform_noise_forward(const float* __restrict__ x,
                                                 float* __restrict__ y, int n,
                                                 unsigned int offset,
                                                 unsigned int key_lo, unsigned int key_hi,
                                                 unsigned int stream_lo,
                                                 unsigned int stream_hi) {
    add_uniform_noise(x, y, n, offset, key_lo, key_hi, stream_lo, stream_hi);
}

// The same noise with the stream read from device memory (two words, low
// first) when the kernel runs: a captured training step replays this launch
// with the step number the host wrote there before each replay
// (gdnflow/step_context.py, StepCounter).
extern "C" __global__ void uniform_noise_forward_counted(const float* __restrict__ x,
                                                         float* __restrict__ y, int n,
                                                         unsigned int offset,
                                                         unsigned int key_lo,
                                                         unsigned int key_hi,
                                                         const unsigned int* __restrict__ stream) {
    add_uniform_noise(x, y, n, offset, key_lo, key_hi, stream[0], stream[1]);
}

// ------------------------------------------------- sigmoid difference ----
// y = |sigmoid(s u) - sigmoid(s l)| with s = -1 where l + u > 0, else +1:
// the probability mass between two logistic CDF logits l <= u, evaluated in
// the tail where sigmoid is near 0 (accurate in float32) instead of near 1
// (where 1 - 1e-9 rounds to 1). The gradient of |d| is taken as sign(d), and
// as s where d == 0 (underflow), the sign d has in exact arithmetic.
__device__ __forceinline__ float logistic(float v) { return 1.0f / (1.0f + expf(-v)); }

extern "C" __global__ void sigmoid_difference_forward(const float* __restrict__ lower,
                                                      const float* __restrict__ upper,
                                                      float* __restrict__ y, int n) {
    GRID_STRIDE_LOOP(i, n) {
        const float l = lower[i], u = upper[i];
        const float s = (l + u > 0.0f) ? -1.0f : 1.0f;
        y[i] = fabsf(logistic(s * u) - logistic(s * l));
    }
}

extern "C" __global__ void sigmoid_difference_backward(const float* __restrict__ lower,
                                                       const float* __restrict__ upper,
                                                       const float* __restrict__ gy,
                                                       float* __restrict__ g_lower,
                                                       float* __restrict__ g_upper, int n) {
    GRID_STRIDE_LOOP(i, n) {
        const float l = lower[i], u = upper[i];
        const float s = (l + u > 0.0f) ? -1.0f : 1.0f;
        const float a = logistic(s * u), b = logistic(s * l);
        const float d = a - b;
        const float sign = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : s);
        const float g = gy[i] * sign * s;
        g_upper[i] = g * a * (1.0f - a);
        g_lower[i] = -g * b * (1.0f - b);
    }
}
