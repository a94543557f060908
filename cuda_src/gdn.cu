// Generalized divisive normalization: GDN, inverse GDN and their simplified
// forms. Python side, with the math and the order of the calls:
// gdnflow/ops/gdn.py. The channel sums are cuBLAS GEMMs issued from there;
// these kernels are the elementwise work around them, one pass each.
//
// Layouts. x, y and their gradients are NCHW. The GEMM operands (the pixel
// statistic S, the norm n and its cached power D, U = dL/dn and G = gamma^T U)
// are channel-major in chunks of K pixels: [P / K][C][K] for P = N*HW pixels
// taken in NCHW order (pixel q = n*HW + h*W + w), so that every product over
// channels is one (strided-batched) GEMM over the whole batch and the pixel
// sum of dL/dgamma splits into P / K independent products. K = P is plain
// CNHW, a row-major [C, P] matrix. S1 = [S; 1] holds a ones row per chunk:
// [P / K][C + 1][K]. Each kernel walks the NCHW elements in order and finds
// the element's twin with chunked_twin: both sides stay coalesced, since
// pixels are contiguous in both layouts.
//
// Width W: each thread moves W consecutive floats per step, 16-byte accesses
// for W = 4. The caller picks W = 4 only when HW % 4 == 0, K % 4 == 0 and the
// NCHW pointers are 16-byte aligned: W consecutive elements then share an
// image, a channel and a chunk, and their twins are consecutive too.
//
// Variants, with s(x) the pixel statistic and a the exponent in y = x * n^a:
//   gdn                 s = x^2   a = -1/2      D = n^a     n^(a-1) = D^3
//   igdn                s = x^2   a = +1/2                  n^(a-1) = 1/D
//   gdn_simplified      s = |x|   a = -1                    n^(a-1) = D^2
//   igdn_simplified     s = |x|   a = +1                    n^(a-1) = 1
// so that D = n^a is the only array the backward needs from the forward.
//
// Stored parameters. The GDN layer trains beta and gamma in a stored form p
// and uses v = max(p, bound)^2 - pedestal (gdnflow/ops/parametrize.py). The
// operator then takes the stored forms: gdn_effective_params turns them into
// effective values (one small launch in the forward, between the statistic
// and the norm GEMM), and gdn_reduce_param_grads_parametrized applies the
// chain rule to p as it writes the parameter gradients (no extra launch in
// the backward). The formulas (nonnegative_value and its gradient) are in
// gdnflow_common.cuh, shared with parametrize.cu.
#include "gdnflow_common.cuh"

template <bool INVERSE, bool SIMPLIFIED>
struct Variant {
    __device__ static __forceinline__ float statistic(float x) {
        return SIMPLIFIED ? fabsf(x) : x * x;
    }
    // ds/dx; the subgradient of |x| at 0 is taken as 0.
    __device__ static __forceinline__ float statistic_grad(float x) {
        if constexpr (SIMPLIFIED) return (float)((x > 0.0f) - (x < 0.0f));
        else return 2.0f * x;
    }
    // D = n^a.
    __device__ static __forceinline__ float power(float n) {
        if constexpr (SIMPLIFIED) return INVERSE ? n : 1.0f / n;
        else return INVERSE ? sqrtf(n) : rsqrtf(n);
    }
    // dL/dn = a * gy * x * n^(a-1), with n^(a-1) written through D.
    __device__ static __forceinline__ float grad_norm(float gy, float x, float d) {
        if constexpr (SIMPLIFIED) return INVERSE ? gy * x : -gy * x * d * d;
        else return INVERSE ? 0.5f * gy * x / d : -0.5f * gy * x * d * d * d;
    }
};

// W consecutive floats, loaded and stored in one access (16 bytes for W = 4).
template <int W>
struct alignas(4 * W) Floats {
    float v[W];
};

template <int W>
__device__ __forceinline__ Floats<W> load(const float* __restrict__ p) {
    return *reinterpret_cast<const Floats<W>*>(p);
}

template <int W>
__device__ __forceinline__ void store(float* __restrict__ p, const Floats<W>& f) {
    *reinterpret_cast<Floats<W>*>(p) = f;
}

// Where NCHW element i (image n, channel c, pixel p) sits in the chunked
// layouts: k in a [P/K][C][K] matrix, k1 in S1's [P/K][C + 1][K]. Unsigned:
// its division is a few instructions shorter than int's.
struct Twin {
    int c, k, k1;
};

__device__ __forceinline__ Twin chunked_twin(int i, int channels, int hw, int chunk) {
    const unsigned row = (unsigned)i / (unsigned)hw;            // n * C + c
    const unsigned p = (unsigned)i - row * (unsigned)hw;
    const unsigned n = row / (unsigned)channels;
    const unsigned c = row - n * (unsigned)channels;
    const unsigned q = n * (unsigned)hw + p;                     // pixel, in [0, P)
    const unsigned j = q / (unsigned)chunk;                      // its chunk
    const unsigned r = q - j * (unsigned)chunk;                  // its column there
    Twin t;
    t.c = (int)c;
    t.k = (int)((j * (unsigned)channels + c) * (unsigned)chunk + r);
    t.k1 = t.k + (int)(j * (unsigned)chunk);                     // (j (C + 1) + c) K + r
    return t;
}

// s[twin] = s(x[i]): the right-hand side of norm = gamma s.
template <class V, int W>
__device__ void statistic(const float* __restrict__ x, float* __restrict__ s,
                          int total, int channels, int hw, int chunk) {
    GRID_STRIDE_LOOP(group, total / W) {
        const int i = group * W;            // the group's first element
        const Twin t = chunked_twin(i, channels, hw, chunk);
        Floats<W> v = load<W>(x + i);
#pragma unroll
        for (int e = 0; e < W; ++e) v.v[e] = V::statistic(v.v[e]);
        store<W>(s + t.k, v);
    }
}

// norm_d holds gamma s on entry. y = x * D with D = (norm + beta)^a; D
// replaces the norm in place when the backward will need it (save_d != 0),
// so the cache costs no allocation of its own.
template <class V, int W>
__device__ void forward(const float* __restrict__ x, float* __restrict__ norm_d,
                        const float* __restrict__ beta, float* __restrict__ y,
                        int total, int channels, int hw, int chunk, int save_d) {
    GRID_STRIDE_LOOP(group, total / W) {
        const int i = group * W;
        const Twin t = chunked_twin(i, channels, hw, chunk);
        const float b = beta[t.c];
        const Floats<W> xv = load<W>(x + i);
        Floats<W> d = load<W>(norm_d + t.k), yv;
#pragma unroll
        for (int e = 0; e < W; ++e) {
            d.v[e] = V::power(d.v[e] + b);
            yv.v[e] = xv.v[e] * d.v[e];
        }
        store<W>(y + i, yv);
        if (save_d) store<W>(norm_d + t.k, d);
    }
}

// u = dL/dn. When the parameters need gradients, also dL/dbeta's pixel sum
// of u and, unless the forward kept it, s = s(x), the right-hand side of
// dL/dgamma's GEMM, in one of two ways:
// - beta_sums != nullptr: each warp adds its 32 W consecutive values of u
//   and writes the sum to beta_sums[group / 32] (lane 0's group). The caller
//   passes it only when H*W % (32 W) == 0: every warp then runs whole, on one
//   image and channel, and beta_sums holds H*W / (32 W) segment sums per NCHW
//   row, which gdn_reduce_param_grads adds up (fixed order: deterministic).
//   s (if not null) gets S, [P/K][C][K].
// - otherwise s is S1 = [s(x); 1] ([P/K][C + 1][K]): the ones row makes the
//   sum a column of the same GEMM (one column past C, so a costlier GEMM).
template <class V, int W>
__device__ void backward_norm(const float* __restrict__ x, const float* __restrict__ gy,
                              const float* __restrict__ d, float* __restrict__ u,
                              float* __restrict__ s, float* __restrict__ beta_sums,
                              int total, int channels, int hw, int chunk) {
    GRID_STRIDE_LOOP(group, total / W) {
        const int i = group * W;
        const Twin t = chunked_twin(i, channels, hw, chunk);
        const Floats<W> xv = load<W>(x + i), gv = load<W>(gy + i), dv = load<W>(d + t.k);
        Floats<W> uv;
#pragma unroll
        for (int e = 0; e < W; ++e) uv.v[e] = V::grad_norm(gv.v[e], xv.v[e], dv.v[e]);
        store<W>(u + t.k, uv);
        if (beta_sums != nullptr) {
            float sum = 0.0f;
#pragma unroll
            for (int e = 0; e < W; ++e) sum += uv.v[e];
            sum = warp_sum(sum);
            if ((threadIdx.x & 31) == 0) beta_sums[group / 32] = sum;
        }
        if (s == nullptr) continue;
        Floats<W> sv;
#pragma unroll
        for (int e = 0; e < W; ++e) sv.v[e] = V::statistic(xv.v[e]);
        if (beta_sums != nullptr) {
            store<W>(s + t.k, sv);
        } else {
            store<W>(s + t.k1, sv);
            // Channel 0's threads write the chunk's ones row, C rows further down.
            if (t.c == 0) {
#pragma unroll
                for (int e = 0; e < W; ++e) sv.v[e] = 1.0f;
                store<W>(s + t.k1 + channels * chunk, sv);
            }
        }
    }
}

// gx = gy * D + s'(x) * g, with g = gamma^T u.
template <class V, int W>
__device__ void backward_input(const float* __restrict__ x, const float* __restrict__ gy,
                               const float* __restrict__ d, const float* __restrict__ g,
                               float* __restrict__ gx,
                               int total, int channels, int hw, int chunk) {
    GRID_STRIDE_LOOP(group, total / W) {
        const int i = group * W;
        const Twin t = chunked_twin(i, channels, hw, chunk);
        const Floats<W> xv = load<W>(x + i), gv = load<W>(gy + i);
        const Floats<W> dv = load<W>(d + t.k), g_v = load<W>(g + t.k);
        Floats<W> out;
#pragma unroll
        for (int e = 0; e < W; ++e)
            out.v[e] = gv.v[e] * dv.v[e] + V::statistic_grad(xv.v[e]) * g_v.v[e];
        store<W>(gx + i, out);
    }
}

// One extern "C" kernel per (variant, stage, width), named
// <variant>_<stage> for W = 1 and <variant>_<stage>_vec4 for W = 4.
#define GDN_KERNELS(NAME, INVERSE, SIMPLIFIED, W)                                       \
extern "C" __global__ void NAME##_statistic(                                            \
        const float* __restrict__ x, float* __restrict__ s,                             \
        int total, int channels, int hw, int chunk) {                                   \
    statistic<Variant<INVERSE, SIMPLIFIED>, W>(x, s, total, channels, hw, chunk);       \
}                                                                                       \
extern "C" __global__ void NAME##_forward(                                              \
        const float* __restrict__ x, float* __restrict__ norm_d,                        \
        const float* __restrict__ beta, float* __restrict__ y,                          \
        int total, int channels, int hw, int chunk, int save_d) {                       \
    forward<Variant<INVERSE, SIMPLIFIED>, W>(x, norm_d, beta, y, total, channels, hw,   \
                                             chunk, save_d);                            \
}                                                                                       \
extern "C" __global__ void NAME##_backward_norm(                                        \
        const float* __restrict__ x, const float* __restrict__ gy,                      \
        const float* __restrict__ d, float* __restrict__ u, float* __restrict__ s,      \
        float* __restrict__ beta_sums, int total, int channels, int hw, int chunk) {    \
    backward_norm<Variant<INVERSE, SIMPLIFIED>, W>(x, gy, d, u, s, beta_sums, total,    \
                                                   channels, hw, chunk);                \
}                                                                                       \
extern "C" __global__ void NAME##_backward_input(                                       \
        const float* __restrict__ x, const float* __restrict__ gy,                      \
        const float* __restrict__ d, const float* __restrict__ g,                       \
        float* __restrict__ gx, int total, int channels, int hw, int chunk) {           \
    backward_input<Variant<INVERSE, SIMPLIFIED>, W>(x, gy, d, g, gx, total, channels,   \
                                                    hw, chunk);                         \
}

#define GDN_VARIANT(NAME, INVERSE, SIMPLIFIED)          \
    GDN_KERNELS(NAME, INVERSE, SIMPLIFIED, 1)           \
    GDN_KERNELS(NAME##_vec4, INVERSE, SIMPLIFIED, 4)

GDN_VARIANT(gdn,             false, false)
GDN_VARIANT(igdn,            true,  false)
GDN_VARIANT(gdn_simplified,  false, true)
GDN_VARIANT(igdn_simplified, true,  true)

// Effective beta (C) and gamma (C x C) from their stored forms, one thread per
// element of both.
extern "C" __global__ void gdn_effective_params(
        const float* __restrict__ beta, const float* __restrict__ gamma,
        float* __restrict__ beta_eff, float* __restrict__ gamma_eff,
        int channels, float beta_bound, float gamma_bound, float pedestal) {
    const int weights = channels * channels;
    GRID_STRIDE_LOOP(i, weights + channels) {
        if (i < weights) gamma_eff[i] = nonnegative_value(gamma[i], gamma_bound, pedestal);
        else beta_eff[i - weights] = nonnegative_value(beta[i - weights], beta_bound, pedestal);
    }
}

// The parameter gradients from the per-chunk products, partial =
// [chunks][C][columns], summed over the chunks:
// - columns = C + 1 (the ones-row GEMM): [dL/dgamma | dL/dbeta], split on
//   the way out;
// - columns = C: dL/dgamma only; dL/dbeta[c] is then the sum of beta_sums'
//   `segments` values per NCHW row (n, c) over the images.
// Launched with blockDim = (32, GDN_REDUCE_ROWS). The first
// ceil(C * columns / 32) blocks take 32 consecutive elements of the products
// each: a warp's lanes read 32 consecutive elements of one chunk (coalesced),
// the block's warps every GDN_REDUCE_ROWS-th chunk. With columns = C, C more
// blocks follow, one per channel, whose threads stride over that channel's
// segment sums (consecutive within a row). Shared memory adds the warps'
// sums. PARAMETRIZED: beta and gamma are the stored forms (otherwise unused,
// may be null), and the gradients written are with respect to them.
#define GDN_REDUCE_ROWS 8
template <bool PARAMETRIZED>
__device__ __forceinline__ void reduce_param_grads(
        const float* __restrict__ partial, const float* __restrict__ beta_sums,
        float* __restrict__ ggamma, float* __restrict__ gbeta,
        const float* __restrict__ beta, const float* __restrict__ gamma, int channels,
        int columns, int chunks, int images, int segments, float beta_bound,
        float gamma_bound) {
    __shared__ float sums[GDN_REDUCE_ROWS][33];
    const int size = channels * columns;
    const int product_blocks = (size + 31) / 32;
    const bool beta_block = (int)blockIdx.x >= product_blocks;
    const int k = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (beta_block) {
        const int c = blockIdx.x - product_blocks;
        for (int r = threadIdx.y * 32 + threadIdx.x; r < images * segments;
             r += 32 * GDN_REDUCE_ROWS) {
            const int n = r / segments;
            sum += beta_sums[(n * channels + c) * segments + (r - n * segments)];
        }
    } else if (k < size) {
#pragma unroll 4
        for (int j = threadIdx.y; j < chunks; j += GDN_REDUCE_ROWS) sum += partial[j * size + k];
    }
    sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || (!beta_block && k >= size)) return;
#pragma unroll
    for (int row = 1; row < GDN_REDUCE_ROWS; ++row) sum += sums[row][threadIdx.x];
    int i, j;
    if (beta_block) {
        sum = warp_sum(sum);
        if (threadIdx.x != 0) return;
        i = blockIdx.x - product_blocks;
        j = channels;
    } else {
        i = k / columns;
        j = k - i * columns;
    }
    if (j < channels) {
        const int e = i * channels + j;
        if constexpr (PARAMETRIZED) sum = nonnegative_value_grad(gamma[e], sum, gamma_bound);
        ggamma[e] = sum;
    } else {
        if constexpr (PARAMETRIZED) sum = nonnegative_value_grad(beta[i], sum, beta_bound);
        gbeta[i] = sum;
    }
}

extern "C" __global__ void __launch_bounds__(32 * GDN_REDUCE_ROWS)
gdn_reduce_param_grads(const float* __restrict__ partial, const float* __restrict__ beta_sums,
                       float* __restrict__ ggamma, float* __restrict__ gbeta, int channels,
                       int columns, int chunks, int images, int segments) {
    reduce_param_grads<false>(partial, beta_sums, ggamma, gbeta, nullptr, nullptr, channels,
                              columns, chunks, images, segments, 0.0f, 0.0f);
}

extern "C" __global__ void __launch_bounds__(32 * GDN_REDUCE_ROWS)
gdn_reduce_param_grads_parametrized(const float* __restrict__ partial,
                                    const float* __restrict__ beta_sums,
                                    float* __restrict__ ggamma, float* __restrict__ gbeta,
                                    const float* __restrict__ beta,
                                    const float* __restrict__ gamma, int channels, int columns,
                                    int chunks, int images, int segments, float beta_bound,
                                    float gamma_bound) {
    reduce_param_grads<true>(partial, beta_sums, ggamma, gbeta, beta, gamma, channels, columns,
                             chunks, images, segments, beta_bound, gamma_bound);
}
