// Generalized divisive normalization: GDN, inverse GDN and their simplified
// forms. Python side, with the math and the order of the calls:
// gdnflow/ops/gdn.py. Two ways: the channel sums as cuBLAS GEMMs issued
// from there, with the first kernels below as the elementwise work around
// them, one pass each; or (C = 64, 128, 192) the fused GEMM kernels at the
// end of this file, which do the sums themselves with that work folded in.
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
// element of both; gamma's transpose too into gamma_t unless it is null (the
// fused forward's operand).
extern "C" __global__ void gdn_effective_params(
        const float* __restrict__ beta, const float* __restrict__ gamma,
        float* __restrict__ beta_eff, float* __restrict__ gamma_eff,
        float* __restrict__ gamma_t, int channels, float beta_bound, float gamma_bound,
        float pedestal) {
    const int weights = channels * channels;
    GRID_STRIDE_LOOP(i, weights + channels) {
        if (i < weights) {
            const float v = nonnegative_value(gamma[i], gamma_bound, pedestal);
            gamma_eff[i] = v;
            if (gamma_t != nullptr) gamma_t[(i % channels) * channels + i / channels] = v;
        } else {
            beta_eff[i - weights] = nonnegative_value(beta[i - weights], beta_bound, pedestal);
        }
    }
}

// gamma_t[j][i] = gamma[i][j]: the fused forward's operand, where gamma is
// given as is (no stored form to transform).
extern "C" __global__ void gdn_transpose_gamma(const float* __restrict__ gamma,
                                               float* __restrict__ gamma_t, int channels) {
    GRID_STRIDE_LOOP(i, channels * channels)
        gamma_t[(i % channels) * channels + i / channels] = gamma[i];
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

// ---------------------------------------------------------------------------
// Fused GEMM kernels: the product over channels computed here instead of by
// cuBLAS, with the elementwise work around it folded into its operand loads
// and its epilogue, so that no intermediate makes a round trip through
// memory:
//   <variant>_fused_forward    NORM = gamma @ s(x), then y = x D, D = (NORM + beta)^a
//                              (replaces statistic + norm GEMM + forward)
//   <variant>_fused_backward   G = gamma^T @ U, U = dL/dn from (gy, x, D) as
//                              loaded, then gx = gy D + s'(x) G
//                              (replaces backward_norm + input GEMM + backward_input)
// One block computes all C output channels of FUSED_PIXELS consecutive
// pixels of one image, so every element of the right-hand operand is loaded
// (and transformed) exactly once: the kernels can write S = s(x), U and U's
// segment sums (for the parameter-gradient product, still a cuBLAS GEMM)
// on the way, at no extra read. C = GDN_CHANNELS is fixed at compile time
// (64, 128 or 192: the thread tile is C/16 rows by 4 pixels); the loader
// builds one module per C. Requirements checked by the caller: H*W % 4 == 0,
// chunk % 4 == 0, 16-byte aligned pointers.
//
// Thread tile: the 256 threads form 16 row groups (ty) by 16 column groups
// (tx); thread (ty, tx) owns rows ty*ROWS .. ty*ROWS + ROWS - 1 and pixels
// tx*4 .. tx*4 + 3 of the tile. The channel sum runs in steps of FUSED_K
// channels. Operands travel global -> shared by cp.async, two buffers deep:
// the copies for step s + 1 are issued before step s's FMAs and have a whole
// step to land. (Loads into registers were moved by the compiler to the end
// of the FMAs, next to their use, exposing their latency; see
// docs/performance.md.) Before a step's FMAs each thread transforms its own
// copies in shared memory: the forward turns x into s(x), the backward
// (gy, x, D) into U. Layouts as above: x, gy, y, gx NCHW; D, S, U chunked
// [P/K][C][K]. The forward reads gamma transposed (gamma_t[k][i] =
// gamma[i][k], written by gdn_effective_params or gdn_transpose_gamma), the
// backward as it is.
#ifndef GDN_CHANNELS
#define GDN_CHANNELS 192
#endif
#define FUSED_PIXELS 64
#define FUSED_THREADS 256
#define FUSED_K 16
#define FUSED_ROWS (GDN_CHANNELS / 16)
#define FUSED_STEPS (GDN_CHANNELS / FUSED_K)
#define FUSED_GAMMA_COPIES (GDN_CHANNELS / 64)   // float4s of gamma per thread and step
#define FUSED_ROW_LANES (FUSED_PIXELS / 4)       // threads copying one operand row
static_assert(GDN_CHANNELS % 64 == 0 && GDN_CHANNELS <= 192,
              "the fused GDN kernels take C = 64, 128 or 192");
static_assert(FUSED_K * FUSED_PIXELS / 4 == FUSED_THREADS,
              "one float4 of each operand per thread and step");

__device__ __forceinline__ float4 load4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ void store4(float* p, float4 v) {
    *reinterpret_cast<float4*>(p) = v;
}

// Offset of (channel 0, pixel p of image n) in a chunked [P/K][C][K] array;
// channel c is c * chunk further.
__device__ __forceinline__ int chunked_pixel(int n, int p, int hw, int chunk) {
    const unsigned q = (unsigned)n * (unsigned)hw + (unsigned)p;
    const unsigned j = q / (unsigned)chunk;
    return (int)(j * GDN_CHANNELS * (unsigned)chunk + (q - j * (unsigned)chunk));
}

// This thread's operand float4 in every step: row `row` of the step, pixels
// 4 q .. 4 q + 3 of the tile. Past the image's end it copies the image's last
// 4 pixels instead (valid = false: their results are never stored).
struct OperandSlot {
    int row, q;
    int p;          // pixel in the image (clamped to the last 4)
    int chunked;    // chunked_pixel of p
    bool valid;
};

__device__ __forceinline__ OperandSlot operand_slot(int n, int p0, int hw, int chunk) {
    OperandSlot s;
    s.row = threadIdx.x / FUSED_ROW_LANES;
    s.q = threadIdx.x % FUSED_ROW_LANES;
    s.p = p0 + 4 * s.q;
    s.valid = s.p < hw;
    s.p = min(s.p, hw - 4);
    s.chunked = chunked_pixel(n, s.p, hw, chunk);
    return s;
}

// The backward reads x, gy and D twice: in its channel sum and, tens of
// microseconds later, in its epilogue. The first copies ask L2 to keep the
// lines (evict_last); the epilogue's loads, their last use, let them go
// (ld.global.cs).
__device__ __forceinline__ unsigned long long l2_keep_policy() {
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

__device__ __forceinline__ void copy4_keep_in_l2(float* dst, const float* src,
                                                 unsigned long long policy) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n"
                 :: "r"(s), "l"(src), "l"(policy) : "memory");
}

__device__ __forceinline__ float4 load4_last_use(const float* p) {
    return __ldcs(reinterpret_cast<const float4*>(p));
}

// Rows k0 .. k0 + FUSED_K - 1 of a C x C matrix (C / 4 float4s per row)
// into shared memory as they lie.
__device__ __forceinline__ void copy_gamma_rows(float (*dst)[GDN_CHANNELS],
                                                const float* __restrict__ src, int k0) {
#pragma unroll
    for (int l = 0; l < FUSED_GAMMA_COPIES; ++l) {
        const int f = threadIdx.x + l * FUSED_THREADS;
        const int k = f / (GDN_CHANNELS / 4), i = 4 * (f % (GDN_CHANNELS / 4));
        copy_to_shared<4>(&dst[k][i], src + (k0 + k) * GDN_CHANNELS + i);
    }
}

// The sum of v over the FUSED_ROW_LANES threads that copy one row; the row's
// first thread holds it.
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
    for (int offset = FUSED_ROW_LANES / 2; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <class V>
__device__ __forceinline__ float4 statistic4(float4 v) {
    return make_float4(V::statistic(v.x), V::statistic(v.y), V::statistic(v.z),
                       V::statistic(v.w));
}

// acc[r][e] += sum over the step's k of a[k][row r] * b[k][pixel e].
__device__ __forceinline__ void multiply_step(const float (*a)[GDN_CHANNELS],
                                              const float (*b)[FUSED_PIXELS],
                                              float (&acc)[FUSED_ROWS][4]) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int k = 0; k < FUSED_K; ++k) {
        float av[FUSED_ROWS];
#pragma unroll
        for (int q = 0; q < FUSED_ROWS / 4; ++q) {
            const float4 v = load4(&a[k][ty * FUSED_ROWS + 4 * q]);
            av[4 * q] = v.x;
            av[4 * q + 1] = v.y;
            av[4 * q + 2] = v.z;
            av[4 * q + 3] = v.w;
        }
        const float4 v = load4(&b[k][4 * tx]);
        const float bv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int r = 0; r < FUSED_ROWS; ++r)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][e] = fmaf(av[r], bv[e], acc[r][e]);
    }
}

// The channel sum, FUSED_STEPS steps: copy_step(s) issues step s's copies
// (one commit group); prepare(s) runs once this thread's own copies of step
// s have landed, before the barrier that publishes them to the block;
// multiply(s) does step s's FMAs. Step s + 1's copies fly during step s.
template <class Copy, class Prepare, class Multiply>
__device__ __forceinline__ void channel_sum(Copy copy_step, Prepare prepare, Multiply multiply) {
    copy_step(0);
#pragma unroll 1
    for (int step = 0; step < FUSED_STEPS; ++step) {
        if (step + 1 < FUSED_STEPS) {
            copy_step(step + 1);
            copies_wait<1>();
        } else {
            copies_wait<0>();
        }
        prepare(step);
        __syncthreads();
        multiply(step);
        __syncthreads();    // before the next step's copies overwrite this buffer
    }
}

// Where this thread's outputs lie: rows ty * FUSED_ROWS .. of the block's
// channels, pixels p .. p + 3 (inside = p < H*W), at `chunked` in the
// chunked layouts.
struct OutputSlot {
    int row0, p, chunked;
    bool inside;
};

__device__ __forceinline__ OutputSlot output_slot(int n, int p0, int hw, int chunk) {
    OutputSlot o;
    o.row0 = threadIdx.x / 16 * FUSED_ROWS;
    o.p = p0 + 4 * (threadIdx.x % 16);
    o.inside = o.p < hw;
    o.chunked = o.inside ? chunked_pixel(n, o.p, hw, chunk) : 0;
    return o;
}

struct FusedForwardShared {
    float gamma_t[2][FUSED_K][GDN_CHANNELS];  // [buffer][k][output channel]
    float x[2][FUSED_K][FUSED_PIXELS];        // [buffer][k][pixel]; s(x) replaces x
};

// y = x * D and (d_out) D for this block's outputs, from acc = gamma s.
// s_out (unless null) gets S = s(x).
template <class V>
__device__ void fused_forward(const float* __restrict__ x, const float* __restrict__ gamma_t,
                              const float* __restrict__ beta, float* __restrict__ y,
                              float* __restrict__ d_out, float* __restrict__ s_out,
                              int hw, int chunk) {
    __shared__ __align__(16) FusedForwardShared sh;
    const int n = blockIdx.y, p0 = blockIdx.x * FUSED_PIXELS;
    const size_t image_offset = (size_t)n * GDN_CHANNELS * hw;
    const float* image = x + image_offset;
    const OperandSlot slot = operand_slot(n, p0, hw, chunk);

    auto copy_step = [&](int step) {
        const int k0 = step * FUSED_K, buffer = step & 1;
        copy_gamma_rows(sh.gamma_t[buffer], gamma_t, k0);
        copy_to_shared<4>(&sh.x[buffer][slot.row][4 * slot.q],
                          image + (k0 + slot.row) * hw + slot.p);
        copies_commit();
    };

    float acc[FUSED_ROWS][4] = {};
    channel_sum(copy_step, [&](int step) {
        // s(x) over this thread's own copy, once, not in every thread's FMAs.
        float* own = &sh.x[step & 1][slot.row][4 * slot.q];
        const float4 s = statistic4<V>(load4(own));
        store4(own, s);
        if (s_out != nullptr && slot.valid)
            store4(s_out + slot.chunked + (step * FUSED_K + slot.row) * chunk, s);
    }, [&](int step) {
        multiply_step(sh.gamma_t[step & 1], sh.x[step & 1], acc);
    });

    const OutputSlot out = output_slot(n, p0, hw, chunk);
    if (!out.inside) return;
#pragma unroll
    for (int r = 0; r < FUSED_ROWS; ++r) {
        const int c = out.row0 + r, p = out.p;
        const float b = beta[c];
        const float4 xv = load4(image + c * hw + p);
        float4 d;
        d.x = V::power(acc[r][0] + b);
        d.y = V::power(acc[r][1] + b);
        d.z = V::power(acc[r][2] + b);
        d.w = V::power(acc[r][3] + b);
        store4(y + image_offset + c * hw + p,
               make_float4(xv.x * d.x, xv.y * d.y, xv.z * d.z, xv.w * d.w));
        if (d_out != nullptr) store4(d_out + out.chunked + c * chunk, d);
    }
}

struct FusedBackwardShared {
    float gamma[2][FUSED_K][GDN_CHANNELS];    // [buffer][k][input channel]
    float x[2][FUSED_K][FUSED_PIXELS];
    float gy[2][FUSED_K][FUSED_PIXELS];       // U replaces gy before the FMAs read it
    float d[2][FUSED_K][FUSED_PIXELS];
};

// gx = gy * D + s'(x) * (gamma^T U) for this block's outputs, U = dL/dn
// computed from (gy, x, D) in shared memory, step by step. When not null,
// u_out gets U, s_out gets S = s(x), and beta_sums gets U's sum over each
// block's pixels per channel: beta_sums[(n * C + c) * gridDim.x + block],
// for gdn_reduce_param_grads with gridDim.x segments per row.
template <class V>
__device__ void fused_backward(const float* __restrict__ x, const float* __restrict__ gy,
                               const float* __restrict__ d, const float* __restrict__ gamma,
                               float* __restrict__ u_out, float* __restrict__ s_out,
                               float* __restrict__ beta_sums, float* __restrict__ gx,
                               int hw, int chunk) {
    __shared__ __align__(16) FusedBackwardShared sh;
    const int n = blockIdx.y, p0 = blockIdx.x * FUSED_PIXELS;
    const size_t image_offset = (size_t)n * GDN_CHANNELS * hw;
    const float* x_image = x + image_offset;
    const float* gy_image = gy + image_offset;
    const OperandSlot slot = operand_slot(n, p0, hw, chunk);
    const int column = 4 * slot.q;

    const unsigned long long keep = l2_keep_policy();
    auto copy_step = [&](int step) {
        const int k0 = step * FUSED_K, buffer = step & 1, row = k0 + slot.row;
        copy_gamma_rows(sh.gamma[buffer], gamma, k0);
        copy4_keep_in_l2(&sh.x[buffer][slot.row][column], x_image + row * hw + slot.p, keep);
        copy4_keep_in_l2(&sh.gy[buffer][slot.row][column], gy_image + row * hw + slot.p, keep);
        copy4_keep_in_l2(&sh.d[buffer][slot.row][column], d + slot.chunked + row * chunk, keep);
        copies_commit();
    };

    float acc[FUSED_ROWS][4] = {};
    channel_sum(copy_step, [&](int step) {
        // U from this thread's own copies, over gy; zero past the image's
        // end, where the inverse variants' U would be 0/0.
        const int buffer = step & 1, row = step * FUSED_K + slot.row;
        const float4 xv = load4(&sh.x[buffer][slot.row][column]);
        const float4 gv = load4(&sh.gy[buffer][slot.row][column]);
        const float4 dv = load4(&sh.d[buffer][slot.row][column]);
        const float4 u = slot.valid ? make_float4(
            V::grad_norm(gv.x, xv.x, dv.x), V::grad_norm(gv.y, xv.y, dv.y),
            V::grad_norm(gv.z, xv.z, dv.z), V::grad_norm(gv.w, xv.w, dv.w))
            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        store4(&sh.gy[buffer][slot.row][column], u);
        if (slot.valid) {
            if (u_out != nullptr) store4(u_out + slot.chunked + row * chunk, u);
            if (s_out != nullptr) store4(s_out + slot.chunked + row * chunk, statistic4<V>(xv));
        }
        if (beta_sums != nullptr) {
            const float sum = row_sum(u.x + u.y + u.z + u.w);
            if (slot.q == 0)
                beta_sums[((size_t)n * GDN_CHANNELS + row) * gridDim.x + blockIdx.x] = sum;
        }
    }, [&](int step) {
        multiply_step(sh.gamma[step & 1], sh.gy[step & 1], acc);
    });

    const OutputSlot out = output_slot(n, p0, hw, chunk);
    if (!out.inside) return;
#pragma unroll
    for (int r = 0; r < FUSED_ROWS; ++r) {
        const int c = out.row0 + r, p = out.p;
        const float4 xv = load4_last_use(x_image + c * hw + p);
        const float4 gv = load4_last_use(gy_image + c * hw + p);
        const float4 dv = load4_last_use(d + out.chunked + c * chunk);
        store4(gx + image_offset + c * hw + p,
               make_float4(gv.x * dv.x + V::statistic_grad(xv.x) * acc[r][0],
                           gv.y * dv.y + V::statistic_grad(xv.y) * acc[r][1],
                           gv.z * dv.z + V::statistic_grad(xv.z) * acc[r][2],
                           gv.w * dv.w + V::statistic_grad(xv.w) * acc[r][3]));
    }
}

#define GDN_FUSED_KERNELS(NAME, INVERSE, SIMPLIFIED)                                      \
extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2) NAME##_fused_forward(      \
        const float* __restrict__ x, const float* __restrict__ gamma_t,                   \
        const float* __restrict__ beta, float* __restrict__ y, float* __restrict__ d_out, \
        float* __restrict__ s_out, int hw, int chunk) {                                   \
    fused_forward<Variant<INVERSE, SIMPLIFIED>>(x, gamma_t, beta, y, d_out, s_out, hw,   \
                                                chunk);                                   \
}                                                                                         \
extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2) NAME##_fused_backward(     \
        const float* __restrict__ x, const float* __restrict__ gy,                        \
        const float* __restrict__ d, const float* __restrict__ gamma,                     \
        float* __restrict__ u_out, float* __restrict__ s_out,                             \
        float* __restrict__ beta_sums, float* __restrict__ gx, int hw, int chunk) {       \
    fused_backward<Variant<INVERSE, SIMPLIFIED>>(x, gy, d, gamma, u_out, s_out,          \
                                                 beta_sums, gx, hw, chunk);               \
}

GDN_FUSED_KERNELS(gdn,             false, false)
GDN_FUSED_KERNELS(igdn,            true,  false)
GDN_FUSED_KERNELS(gdn_simplified,  false, true)
GDN_FUSED_KERNELS(igdn_simplified, true,  true)

// ---------------------------------------------------------------------------
// 16-bit GDN on the tensor cores, in the modules built with -DSTORAGE_BF16 or
// -DSTORAGE_FP16 (and GDN_CHANNELS = 64, 128 or 192):
//   <variant>_half_forward    y = x D, D = (gamma @ s(x) + beta)^a
//   <variant>_half_backward   gx = gy D + s'(x) (gamma^T @ U), U = dL/dn
//   gdn_half_params           gamma rounded to bfloat16 (and effective beta)
// x, y, gy, gx (NCHW) and the cached D (chunked [P/K][C][K]) are storage_t;
// everything is computed in float32 but the channel products, whose operands
// are rounded to bfloat16 (gamma, s(x), U; bfloat16 for fp16 storage too: x^2
// of an fp16 value can pass fp16's largest, bfloat16 has float32's range) and
// accumulated in float32 on the tensor cores (WMMA 16x16x16). S = s(x) and U
// go out as bfloat16 too, chunked, for dL/dgamma's product (cuBLAS, bfloat16
// operands, float32 sums). gdnflow/ops/gdn/operator.py's NumPy path rounds
// the same values the same way (its 16-bit branch), so it is these kernels'
// oracle.
//
// One block (8 warps) holds bfloat16 gamma in shared memory and walks over
// tiles of 64 pixels of one image (all C channels): the threads turn the
// tile's inputs into the bfloat16 operand [C][64] (8 values per 16-byte
// access, 8 threads per channel row), then warp w multiplies pixel columns
// 16 (w % 4) .. + 15 of it by row tiles w / 4, w / 4 + 2, ... of gamma (or
// gamma^T), and stages each 16x16 result through its own shared slice to
// the epilogue, where each lane finishes 8 pixels of one channel. The
// epilogue reads its inputs again from global memory (L2 hits: the tile was
// read microseconds before). Requirements checked by the caller:
// H*W % 8 == 0, K % 8 == 0, 16-byte aligned arrays.
#if defined(STORAGE_BF16) || defined(STORAGE_FP16)
#include <cuda_bf16.h>
#include <mma.h>
#include <type_traits>

#define HALF_PIXELS 64
#define HALF_THREADS 256
#define HALF_WARPS (HALF_THREADS / 32)
#define HALF_VECTOR 8                                    // values per 16-byte access
#define HALF_ROW_LANES (HALF_PIXELS / HALF_VECTOR)       // threads per operand row
#define HALF_PASSES (GDN_CHANNELS * HALF_ROW_LANES / HALF_THREADS)
#define HALF_WARP_TILES (GDN_CHANNELS / 32)              // row tiles per warp
#define HALF_GAMMA_LD (GDN_CHANNELS + 8)                 // padded rows: fewer bank conflicts
#define HALF_OPERAND_LD (HALF_PIXELS + 8)
#define HALF_STAGE_LD 20
static_assert(HALF_THREADS / HALF_ROW_LANES * HALF_PASSES == GDN_CHANNELS,
              "the operand rows split evenly over the passes");

typedef __nv_bfloat16 operand_t;

struct alignas(16) StorageVector {
    storage_t v[HALF_VECTOR];
};

struct alignas(16) OperandVector {
    operand_t v[HALF_VECTOR];
};

// Shared memory of the 16-bit kernels (dynamic: over 48 KB at C = 192).
struct HalfShared {
    operand_t gamma[GDN_CHANNELS][HALF_GAMMA_LD];        // [row k][column i] = gamma[k][i]
    operand_t operand[GDN_CHANNELS][HALF_OPERAND_LD];    // [channel][pixel]: s(x) or U
    float stage[HALF_WARPS][16][HALF_STAGE_LD];          // each warp's 16x16 result
};

__device__ __forceinline__ StorageVector load_vector(const storage_t* p) {
    return *reinterpret_cast<const StorageVector*>(p);
}

__device__ __forceinline__ StorageVector zero_vector() {
    StorageVector z;
#pragma unroll
    for (int e = 0; e < HALF_VECTOR; ++e) z.v[e] = store_value(0.0f);
    return z;
}

// bfloat16 gamma [C][C] from global into sh.gamma, 16 bytes per copy.
__device__ __forceinline__ void load_gamma(HalfShared& sh, const operand_t* __restrict__ gamma) {
    constexpr int row_vectors = GDN_CHANNELS / HALF_VECTOR;
    for (int i = threadIdx.x; i < GDN_CHANNELS * row_vectors; i += HALF_THREADS) {
        const int k = i / row_vectors, c = (i - k * row_vectors) * HALF_VECTOR;
        *reinterpret_cast<OperandVector*>(&sh.gamma[k][c]) =
            reinterpret_cast<const OperandVector*>(gamma)[i];
    }
}

// Where a thread's 8 pixels of a tile lie: image n, pixels p .. p + 7 (valid:
// inside the image, which H*W % 8 == 0 makes all-or-none), the operand row
// lane (row0 + HALF_THREADS / HALF_ROW_LANES * pass), and the chunked offset of
// (channel 0, pixel p).
struct HalfSlot {
    int n, p, row0, column, chunked;
    bool valid;
};

__device__ __forceinline__ HalfSlot half_slot(int n, int p0, int hw, int chunk) {
    HalfSlot s;
    s.n = n;
    s.row0 = threadIdx.x / HALF_ROW_LANES;
    s.column = (threadIdx.x % HALF_ROW_LANES) * HALF_VECTOR;
    s.p = p0 + s.column;
    s.valid = s.p < hw;
    s.chunked = s.valid ? chunked_pixel(n, s.p, hw, chunk) : 0;
    return s;
}

// The channel product of one tile: acc[t] = A @ operand for this warp's row
// tiles (w / 4 + 2 t) and pixel columns (16 (w % 4)), with A = gamma
// (GAMMA_T false: the forward's norm) or gamma^T (the backward's G).
template <bool GAMMA_T, class Accumulators>
__device__ __forceinline__ void tile_product(const HalfShared& sh, Accumulators& acc) {
    using namespace nvcuda;
    typedef typename std::conditional<GAMMA_T, wmma::col_major, wmma::row_major>::type ALayout;
    const int warp = threadIdx.x / 32;
    const int column = 16 * (warp % 4), row_group = warp / 4;
#pragma unroll
    for (int t = 0; t < HALF_WARP_TILES; ++t) wmma::fill_fragment(acc[t], 0.0f);
#pragma unroll 2
    for (int k = 0; k < GDN_CHANNELS; k += 16) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, operand_t, wmma::row_major> b;
        wmma::load_matrix_sync(b, &sh.operand[k][column], HALF_OPERAND_LD);
#pragma unroll
        for (int t = 0; t < HALF_WARP_TILES; ++t) {
            const int row = 16 * (row_group + 2 * t);
            wmma::fragment<wmma::matrix_a, 16, 16, 16, operand_t, ALayout> a;
            // gamma^T's tile (row, k) is gamma's (k, row), read column-major.
            wmma::load_matrix_sync(a, GAMMA_T ? &sh.gamma[k][row] : &sh.gamma[row][k],
                                   HALF_GAMMA_LD);
            wmma::mma_sync(acc[t], a, b, acc[t]);
        }
    }
}

// Hands each 16x16 result of the warp to epilogue(channel, pixel, values):
// lane l gets channel row l / 2 of the tile, 8 consecutive pixels, as floats.
template <class Accumulators, class Epilogue>
__device__ __forceinline__ void tile_epilogue(HalfShared& sh, const Accumulators& acc, int p0,
                                              Epilogue epilogue) {
    using namespace nvcuda;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_group = warp / 4;
    const int pixel = p0 + 16 * (warp % 4) + HALF_VECTOR * (lane % 2);
    float* stage = &sh.stage[warp][0][0];
#pragma unroll
    for (int t = 0; t < HALF_WARP_TILES; ++t) {
        wmma::store_matrix_sync(stage, acc[t], HALF_STAGE_LD, wmma::mem_row_major);
        __syncwarp();
        const float* row = &sh.stage[warp][lane / 2][HALF_VECTOR * (lane % 2)];
        float values[HALF_VECTOR];
        const float4 lo = *reinterpret_cast<const float4*>(row);
        const float4 hi = *reinterpret_cast<const float4*>(row + 4);
        values[0] = lo.x; values[1] = lo.y; values[2] = lo.z; values[3] = lo.w;
        values[4] = hi.x; values[5] = hi.y; values[6] = hi.z; values[7] = hi.w;
        epilogue(16 * (row_group + 2 * t) + lane / 2, pixel, values);
        __syncwarp();   // before the next store_matrix_sync overwrites the stage
    }
}

typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> HalfAccumulator;

template <class V>
__device__ void half_forward(const storage_t* __restrict__ x,
                             const operand_t* __restrict__ gamma,
                             const float* __restrict__ beta, storage_t* __restrict__ y,
                             storage_t* __restrict__ d_out, int images, int hw, int chunk) {
    extern __shared__ __align__(128) unsigned char half_shared[];
    HalfShared& sh = *reinterpret_cast<HalfShared*>(half_shared);
    load_gamma(sh, gamma);
    const int tiles_per_image = (hw + HALF_PIXELS - 1) / HALF_PIXELS;
    for (int tile = blockIdx.x; tile < images * tiles_per_image; tile += gridDim.x) {
        const int n = tile / tiles_per_image;
        const int p0 = (tile - n * tiles_per_image) * HALF_PIXELS;
        const size_t image = (size_t)n * GDN_CHANNELS * hw;
        const HalfSlot slot = half_slot(n, p0, hw, chunk);
        // The operand: s(x) in bfloat16; zeros past the image's end.
        StorageVector xv[HALF_PASSES];
#pragma unroll
        for (int i = 0; i < HALF_PASSES; ++i) {
            const int c = slot.row0 + i * (HALF_THREADS / HALF_ROW_LANES);
            xv[i] = slot.valid ? load_vector(x + image + (size_t)c * hw + slot.p) : zero_vector();
        }
#pragma unroll
        for (int i = 0; i < HALF_PASSES; ++i) {
            const int c = slot.row0 + i * (HALF_THREADS / HALF_ROW_LANES);
            OperandVector s;
#pragma unroll
            for (int e = 0; e < HALF_VECTOR; ++e)
                s.v[e] = __float2bfloat16_rn(V::statistic(load_value(xv[i].v[e])));
            *reinterpret_cast<OperandVector*>(&sh.operand[c][slot.column]) = s;
        }
        __syncthreads();
        HalfAccumulator acc[HALF_WARP_TILES];
        tile_product<false>(sh, acc);
        __syncthreads();    // every warp is done with the operand: the next tile may write it
        tile_epilogue(sh, acc, p0, [&](int c, int p, const float (&norm)[HALF_VECTOR]) {
            if (p >= hw) return;
            const float b = beta[c];
            const size_t at = image + (size_t)c * hw + p;
            const StorageVector xs = load_vector(x + at);
            StorageVector ys, ds;
#pragma unroll
            for (int e = 0; e < HALF_VECTOR; ++e) {
                const float d = V::power(norm[e] + b);
                ys.v[e] = store_value(load_value(xs.v[e]) * d);
                ds.v[e] = store_value(d);
            }
            *reinterpret_cast<StorageVector*>(y + at) = ys;
            if (d_out != nullptr)
                *reinterpret_cast<StorageVector*>(
                    d_out + chunked_pixel(n, p, hw, chunk) + (size_t)c * chunk) = ds;
        });
    }
}

// U (float32) from this thread's 8 pixels of channel c: a gy x D^((a-1)/a).
template <class V>
__device__ __forceinline__ void grad_norm8(const StorageVector& gv, const StorageVector& xv,
                                           const StorageVector& dv, float (&u)[HALF_VECTOR]) {
#pragma unroll
    for (int e = 0; e < HALF_VECTOR; ++e)
        u[e] = V::grad_norm(load_value(gv.v[e]), load_value(xv.v[e]), load_value(dv.v[e]));
}

// gx = gy D + s'(x) G for this block's tiles. Unless null: u_out and s_out get
// U and S = s(x) in bfloat16, chunked; beta_sums gets U's float32 sum over
// each tile's pixels per channel, beta_sums[(n C + c) tiles_per_image + tile].
// gx == nullptr skips the product (parameter gradients only).
template <class V>
__device__ void half_backward(const storage_t* __restrict__ x, const storage_t* __restrict__ gy,
                              const storage_t* __restrict__ d,
                              const operand_t* __restrict__ gamma,
                              operand_t* __restrict__ u_out, operand_t* __restrict__ s_out,
                              float* __restrict__ beta_sums, storage_t* __restrict__ gx,
                              int images, int hw, int chunk) {
    extern __shared__ __align__(128) unsigned char half_shared[];
    HalfShared& sh = *reinterpret_cast<HalfShared*>(half_shared);
    if (gx != nullptr) load_gamma(sh, gamma);
    const int tiles_per_image = (hw + HALF_PIXELS - 1) / HALF_PIXELS;
    for (int tile = blockIdx.x; tile < images * tiles_per_image; tile += gridDim.x) {
        const int n = tile / tiles_per_image, segment = tile - n * tiles_per_image;
        const int p0 = segment * HALF_PIXELS;
        const size_t image = (size_t)n * GDN_CHANNELS * hw;
        const HalfSlot slot = half_slot(n, p0, hw, chunk);
        StorageVector xv[HALF_PASSES], gv[HALF_PASSES], dv[HALF_PASSES];
#pragma unroll
        for (int i = 0; i < HALF_PASSES; ++i) {
            const int c = slot.row0 + i * (HALF_THREADS / HALF_ROW_LANES);
            const bool v = slot.valid;
            xv[i] = v ? load_vector(x + image + (size_t)c * hw + slot.p) : zero_vector();
            gv[i] = v ? load_vector(gy + image + (size_t)c * hw + slot.p) : zero_vector();
            dv[i] = v ? load_vector(d + slot.chunked + (size_t)c * chunk) : zero_vector();
        }
#pragma unroll
        for (int i = 0; i < HALF_PASSES; ++i) {
            const int c = slot.row0 + i * (HALF_THREADS / HALF_ROW_LANES);
            float u[HALF_VECTOR];
            grad_norm8<V>(gv[i], xv[i], dv[i], u);
            OperandVector ub, sb;
            float sum = 0.0f;
#pragma unroll
            for (int e = 0; e < HALF_VECTOR; ++e) {
                if (!slot.valid) u[e] = 0.0f;   // the inverse variants' U is 0/0 there
                ub.v[e] = __float2bfloat16_rn(u[e]);
                sb.v[e] = __float2bfloat16_rn(V::statistic(load_value(xv[i].v[e])));
                sum += u[e];
            }
            *reinterpret_cast<OperandVector*>(&sh.operand[c][slot.column]) = ub;
            if (slot.valid) {
                const size_t at = slot.chunked + (size_t)c * chunk;
                if (u_out != nullptr) *reinterpret_cast<OperandVector*>(u_out + at) = ub;
                if (s_out != nullptr) *reinterpret_cast<OperandVector*>(s_out + at) = sb;
            }
            if (beta_sums != nullptr) {
                // The row's HALF_ROW_LANES threads are consecutive lanes of one warp.
#pragma unroll
                for (int offset = HALF_ROW_LANES / 2; offset > 0; offset >>= 1)
                    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
                if (slot.column == 0)
                    beta_sums[((size_t)n * GDN_CHANNELS + c) * tiles_per_image + segment] = sum;
            }
        }
        if (gx == nullptr) continue;
        __syncthreads();
        HalfAccumulator acc[HALF_WARP_TILES];
        tile_product<true>(sh, acc);
        __syncthreads();
        tile_epilogue(sh, acc, p0, [&](int c, int p, const float (&g)[HALF_VECTOR]) {
            if (p >= hw) return;
            const size_t at = image + (size_t)c * hw + p;
            const StorageVector xs = load_vector(x + at), gs = load_vector(gy + at);
            const StorageVector ds = load_vector(d + chunked_pixel(n, p, hw, chunk) +
                                                 (size_t)c * chunk);
            StorageVector out;
#pragma unroll
            for (int e = 0; e < HALF_VECTOR; ++e)
                out.v[e] = store_value(load_value(gs.v[e]) * load_value(ds.v[e]) +
                                       V::statistic_grad(load_value(xs.v[e])) * g[e]);
            *reinterpret_cast<StorageVector*>(gx + at) = out;
        });
    }
}

// gamma (C x C, float32) rounded to bfloat16 into gamma_half, one thread per
// element; with PARAMETRIZED, gamma and beta are stored forms: gamma_half
// gets the effective gamma and beta_eff the effective beta.
extern "C" __global__ void gdn_half_params(const float* __restrict__ beta,
                                           const float* __restrict__ gamma,
                                           float* __restrict__ beta_eff,
                                           operand_t* __restrict__ gamma_half, int channels,
                                           int parametrized, float beta_bound,
                                           float gamma_bound, float pedestal) {
    const int weights = channels * channels;
    GRID_STRIDE_LOOP(i, weights + channels) {
        if (i < weights) {
            const float v = parametrized ? nonnegative_value(gamma[i], gamma_bound, pedestal)
                                         : gamma[i];
            gamma_half[i] = __float2bfloat16_rn(v);
        } else if (parametrized) {
            beta_eff[i - weights] = nonnegative_value(beta[i - weights], beta_bound, pedestal);
        }
    }
}

#define GDN_HALF_KERNELS(NAME, INVERSE, SIMPLIFIED)                                       \
extern "C" __global__ void __launch_bounds__(HALF_THREADS, 2) NAME##_half_forward(        \
        const storage_t* __restrict__ x, const operand_t* __restrict__ gamma,             \
        const float* __restrict__ beta, storage_t* __restrict__ y,                        \
        storage_t* __restrict__ d_out, int images, int hw, int chunk) {                   \
    half_forward<Variant<INVERSE, SIMPLIFIED>>(x, gamma, beta, y, d_out, images, hw,     \
                                               chunk);                                    \
}                                                                                         \
extern "C" __global__ void __launch_bounds__(HALF_THREADS, 2) NAME##_half_backward(       \
        const storage_t* __restrict__ x, const storage_t* __restrict__ gy,                \
        const storage_t* __restrict__ d, const operand_t* __restrict__ gamma,             \
        operand_t* __restrict__ u_out, operand_t* __restrict__ s_out,                     \
        float* __restrict__ beta_sums, storage_t* __restrict__ gx, int images, int hw,    \
        int chunk) {                                                                      \
    half_backward<Variant<INVERSE, SIMPLIFIED>>(x, gy, d, gamma, u_out, s_out, beta_sums, \
                                                gx, images, hw, chunk);                   \
}

GDN_HALF_KERNELS(gdn,             false, false)
GDN_HALF_KERNELS(igdn,            true,  false)
GDN_HALF_KERNELS(gdn_simplified,  false, true)
GDN_HALF_KERNELS(igdn_simplified, true,  true)
#endif  // STORAGE_BF16 || STORAGE_FP16
