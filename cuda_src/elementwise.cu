// Elementwise operators: unary maps with up to two scalar parameters, and
// binary arithmetic with broadcasting. Python side: gdnflow/ops/elementwise.py.
#include "gdnflow_common.cuh"

// ---------------------------------------------------------------- unary ----
// Every unary operator NAME gets two kernels with one signature each:
//   NAME_forward (x, y, n, p0, p1):            y  = FORWARD(x)
//   NAME_backward(x, y, gy, gx, n, p0, p1):    gx = BACKWARD(x, y, gy)
// where p0, p1 are the operator's scalar parameters (exponent, bounds...).
// A backward that needs only x or only y lets the compiler drop the other load.
#define UNARY_OPERATOR(NAME, FORWARD, BACKWARD)                               \
extern "C" __global__ void NAME##_forward(                                    \
        const float* __restrict__ x_, float* __restrict__ y_, int n,          \
        float p0, float p1) {                                                 \
    GRID_STRIDE_LOOP(i, n) { const float x = x_[i]; y_[i] = (FORWARD); }      \
}                                                                             \
extern "C" __global__ void NAME##_backward(                                   \
        const float* __restrict__ x_, const float* __restrict__ y_,           \
        const float* __restrict__ gy_, float* __restrict__ gx_, int n,        \
        float p0, float p1) {                                                 \
    GRID_STRIDE_LOOP(i, n) {                                                  \
        [[maybe_unused]] const float x = x_[i], y = y_[i], gy = gy_[i];       \
        gx_[i] = (BACKWARD);                                                  \
    }                                                                         \
}

UNARY_OPERATOR(neg,     -x,                          -gy)
UNARY_OPERATOR(exp,     expf(x),                     gy * y)
UNARY_OPERATOR(log,     logf(x),                     gy / x)
UNARY_OPERATOR(sqrt,    sqrtf(x),                    gy * 0.5f / y)
UNARY_OPERATOR(pow,     powf(x, p0),                 gy * p0 * powf(x, p0 - 1.0f))
UNARY_OPERATOR(relu,    fmaxf(x, 0.0f),              x > 0.0f ? gy : 0.0f)
UNARY_OPERATOR(relu6,   fminf(fmaxf(x, 0.0f), 6.0f), (x > 0.0f && x < 6.0f) ? gy : 0.0f)
UNARY_OPERATOR(sigmoid, 1.0f / (1.0f + expf(-x)),    gy * y * (1.0f - y))
UNARY_OPERATOR(clamp,   fminf(fmaxf(x, p0), p1),     (x >= p0 && x <= p1) ? gy : 0.0f)
UNARY_OPERATOR(affine,  p0 * x + p1,                 p0 * gy)

// --------------------------------------------------------------- binary ----
// out = a OP b. NAME_same: a, b and out have one shape. NAME_broadcast: out
// has (up to) four dimensions d0 x d1 x d2 x d3 (the host merges adjacent
// dimensions to get there); an operand's element for out index (i0,i1,i2,i3)
// is at i0*s0 + i1*s1 + i2*s2 + i3*s3, a stride being 0 along a broadcast
// dimension.
__device__ __forceinline__ int broadcast_offset(
        int i, int d1, int d2, int d3, int s0, int s1, int s2, int s3) {
    const int i3 = i % d3;  i /= d3;
    const int i2 = i % d2;  i /= d2;
    const int i1 = i % d1;
    const int i0 = i / d1;
    return i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3;
}

#define BINARY_OPERATOR(NAME, EXPR)                                           \
extern "C" __global__ void NAME##_same(                                       \
        const float* __restrict__ a_, const float* __restrict__ b_,           \
        float* __restrict__ out, int n) {                                     \
    GRID_STRIDE_LOOP(i, n) { const float a = a_[i], b = b_[i]; out[i] = (EXPR); } \
}                                                                             \
extern "C" __global__ void NAME##_broadcast(                                  \
        const float* __restrict__ a_, const float* __restrict__ b_,           \
        float* __restrict__ out, int n, int d1, int d2, int d3,               \
        int as0, int as1, int as2, int as3,                                   \
        int bs0, int bs1, int bs2, int bs3) {                                 \
    GRID_STRIDE_LOOP(i, n) {                                                  \
        const float a = a_[broadcast_offset(i, d1, d2, d3, as0, as1, as2, as3)]; \
        const float b = b_[broadcast_offset(i, d1, d2, d3, bs0, bs1, bs2, bs3)]; \
        out[i] = (EXPR);                                                      \
    }                                                                         \
}

BINARY_OPERATOR(add, a + b)
BINARY_OPERATOR(sub, a - b)
BINARY_OPERATOR(mul, a * b)
BINARY_OPERATOR(div, a / b)

// out = x broadcast to out's shape (the backward of a reduction).
extern "C" __global__ void broadcast_copy(
        const float* __restrict__ x, float* __restrict__ out, int n,
        int d1, int d2, int d3, int s0, int s1, int s2, int s3) {
    GRID_STRIDE_LOOP(i, n) out[i] = x[broadcast_offset(i, d1, d2, d3, s0, s1, s2, s3)];
}
