// Elementwise operators: unary maps with up to two scalar parameters, and
// binary arithmetic with broadcasting. Python side: gdnflow/ops/elementwise.py.
// Built for float tensors, and with -DSTORAGE_BF16 / -DSTORAGE_FP16 for
// 16-bit ones (storage_t, load_value and store_value: gdnflow_common.cuh).
#include "gdnflow_common.cuh"

// Vectors: where every array of a launch is 16-byte aligned (pooled arrays
// are; views at an offset may not be), each thread moves 16 bytes per load
// and store (4 floats, 8 16-bit values), then the elements past the last
// whole vector go one at a time. On the H200 this took 16-bit ReLU over 2^26
// values from 1770 to 3106 GB/s (benchmarks/results/precision/half.md).
constexpr int VECTOR_ELEMENTS = 16 / sizeof(storage_t);
struct alignas(16) StorageVector { storage_t v[VECTOR_ELEMENTS]; };

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// out[i] = f(in0[i], ..., in{K-1}[i]) over [0, n), computed in float: the
// loop every same-shape elementwise kernel runs. An input f ignores costs no
// load (the compiler drops it).
template <int K, typename F>
__device__ __forceinline__ void map_elements(const storage_t* const (&in)[K],
                                             storage_t* __restrict__ out, int n, F f) {
    const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    bool aligned = aligned16(out);
    for (int k = 0; k < K; ++k) aligned = aligned && aligned16(in[k]);
    int done = 0;
    if (aligned) {
        const int vectors = n / VECTOR_ELEMENTS;
        for (int v = first; v < vectors; v += stride) {
            StorageVector loaded[K], result;
            for (int k = 0; k < K; ++k) loaded[k] = reinterpret_cast<const StorageVector*>(in[k])[v];
#pragma unroll
            for (int j = 0; j < VECTOR_ELEMENTS; ++j) {
                float values[K];
                for (int k = 0; k < K; ++k) values[k] = load_value(loaded[k].v[j]);
                result.v[j] = store_value(f(values));
            }
            reinterpret_cast<StorageVector*>(out)[v] = result;
        }
        done = vectors * VECTOR_ELEMENTS;
    }
    for (int i = done + first; i < n; i += stride) {
        float values[K];
        for (int k = 0; k < K; ++k) values[k] = load_value(in[k][i]);
        out[i] = store_value(f(values));
    }
}

// ---------------------------------------------------------------- unary ----
// Every unary operator NAME gets two kernels with one signature each:
//   NAME_forward (x, y, n, p0, p1):            y  = FORWARD(x)
//   NAME_backward(x, y, gy, gx, n, p0, p1):    gx = BACKWARD(x, y, gy)
// where p0, p1 are the operator's scalar parameters (exponent, bounds...).
// A backward that needs only x or only y lets the compiler drop the other load.
#define UNARY_OPERATOR(NAME, FORWARD, BACKWARD)                               \
extern "C" __global__ void NAME##_forward(                                    \
        const storage_t* __restrict__ x_, storage_t* __restrict__ y_, int n,  \
        float p0, float p1) {                                                 \
    const storage_t* const in[1] = {x_};                                      \
    map_elements<1>(in, y_, n, [=](const float (&v)[1]) {                     \
        const float x = v[0];                                                 \
        return (FORWARD);                                                     \
    });                                                                       \
}                                                                             \
extern "C" __global__ void NAME##_backward(                                   \
        const storage_t* __restrict__ x_, const storage_t* __restrict__ y_,   \
        const storage_t* __restrict__ gy_, storage_t* __restrict__ gx_, int n,\
        float p0, float p1) {                                                 \
    const storage_t* const in[3] = {x_, y_, gy_};                             \
    map_elements<3>(in, gx_, n, [=](const float (&v)[3]) {                    \
        [[maybe_unused]] const float x = v[0], y = v[1];                      \
        const float gy = v[2];                                                \
        return (BACKWARD);                                                    \
    });                                                                       \
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
// The error function and the trigonometric and hyperbolic maps (Python side:
// gdnflow/ops/special.py); 1.1283791671f is 2/sqrt(pi).
UNARY_OPERATOR(erf,     erff(x),                     gy * 1.1283791671f * expf(-x * x))
UNARY_OPERATOR(sin,     sinf(x),                     gy * cosf(x))
UNARY_OPERATOR(cos,     cosf(x),                     -gy * sinf(x))
UNARY_OPERATOR(tan,     tanf(x),                     gy * (1.0f + y * y))
UNARY_OPERATOR(asin,    asinf(x),                    gy * rsqrtf(1.0f - x * x))
UNARY_OPERATOR(acos,    acosf(x),                    -gy * rsqrtf(1.0f - x * x))
UNARY_OPERATOR(atan,    atanf(x),                    gy / (1.0f + x * x))
UNARY_OPERATOR(sinh,    sinhf(x),                    gy * coshf(x))
UNARY_OPERATOR(cosh,    coshf(x),                    gy * sinhf(x))
UNARY_OPERATOR(asinh,   asinhf(x),                   gy * rsqrtf(x * x + 1.0f))
UNARY_OPERATOR(acosh,   acoshf(x),                   gy * rsqrtf((x - 1.0f) * (x + 1.0f)))
UNARY_OPERATOR(atanh,   atanhf(x),                   gy / (1.0f - x * x))

// --------------------------------------------------------------- binary ----
// out = a OP b. NAME_same: a, b and out have one shape. NAME_broadcast: out
// has (up to) six dimensions d0 x d1 x ... x d5 (the host merges adjacent
// dimensions and pads with leading 1s); an operand's element for out index
// (i0, ..., i5) is at sum_k ik * sk, a stride being 0 along a broadcast
// dimension. Dimensions of size 1 are skipped (a uniform branch), so the
// common merged layouts pay one or two divisions, not five.
#define BROADCAST_DIMS int d1, int d2, int d3, int d4, int d5
#define BROADCAST_STRIDES(s) int s##0, int s##1, int s##2, int s##3, int s##4, int s##5

#define BROADCAST_STEP(D, SA, SB)                                             \
    if (D > 1) { const int k = i % D; i /= D; oa += k * SA; ob += k * SB; }

__device__ __forceinline__ void broadcast_offsets(
        int i, BROADCAST_DIMS, BROADCAST_STRIDES(as), BROADCAST_STRIDES(bs),
        int& oa, int& ob) {
    oa = 0; ob = 0;
    BROADCAST_STEP(d5, as5, bs5)
    BROADCAST_STEP(d4, as4, bs4)
    BROADCAST_STEP(d3, as3, bs3)
    BROADCAST_STEP(d2, as2, bs2)
    BROADCAST_STEP(d1, as1, bs1)
    oa += i * as0; ob += i * bs0;
}

#define BINARY_OPERATOR(NAME, EXPR)                                           \
extern "C" __global__ void NAME##_same(                                       \
        const storage_t* __restrict__ a_, const storage_t* __restrict__ b_,   \
        storage_t* __restrict__ out, int n) {                                 \
    const storage_t* const in[2] = {a_, b_};                                  \
    map_elements<2>(in, out, n, [](const float (&v)[2]) {                     \
        const float a = v[0], b = v[1];                                       \
        return (EXPR);                                                        \
    });                                                                       \
}                                                                             \
extern "C" __global__ void NAME##_broadcast(                                  \
        const storage_t* __restrict__ a_, const storage_t* __restrict__ b_,   \
        storage_t* __restrict__ out, int n, BROADCAST_DIMS,                   \
        BROADCAST_STRIDES(as), BROADCAST_STRIDES(bs)) {                       \
    GRID_STRIDE_LOOP(i, n) {                                                  \
        int oa, ob;                                                           \
        broadcast_offsets(i, d1, d2, d3, d4, d5, as0, as1, as2, as3, as4, as5, \
                          bs0, bs1, bs2, bs3, bs4, bs5, oa, ob);              \
        const float a = load_value(a_[oa]), b = load_value(b_[ob]);           \
        out[i] = store_value(EXPR);                                           \
    }                                                                         \
}

BINARY_OPERATOR(add, a + b)
BINARY_OPERATOR(sub, a - b)
BINARY_OPERATOR(mul, a * b)
BINARY_OPERATOR(div, a / b)

// out = x broadcast to out's shape (the backward of a reduction).
extern "C" __global__ void broadcast_copy(
        const storage_t* __restrict__ x, storage_t* __restrict__ out, int n,
        BROADCAST_DIMS, BROADCAST_STRIDES(s)) {
    GRID_STRIDE_LOOP(i, n) {
        int ox, unused;
        broadcast_offsets(i, d1, d2, d3, d4, d5, s0, s1, s2, s3, s4, s5,
                          0, 0, 0, 0, 0, 0, ox, unused);
        out[i] = x[ox];
    }
}
