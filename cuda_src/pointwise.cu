// 1x1 convolution (stride 1, no padding, groups 1), NCHW float32, as one
// direct kernel: Python side gdnflow/ops/pointwise.py.
//
//     y[n, m, p] = act(bias[m] + residual[n, m, p] + sum_k A[m, k] * x[n, k, p])
//
// for every image n and pixel p < HW. Forward: A = w [C_out, C_in] (M = C_out,
// K = C_in); backward-data: A = w^T (TRANS_A, M = C_in, K = C_out, x = gy).
// It is a matrix product whose columns are all N*HW pixels of the batch:
// column j is pixel p = j % HW of image n = j / HW, at x + n*K*HW + k*HW + p
// and y + n*M*HW + m*HW + p. Taking the columns across images (not one GEMM
// per image) keeps tiles full when HW is small (7x7, 14x14 planes).
//
// A block computes a BM x BN tile of y (BM = TM*TY rows of A, BN = TN*TX
// pixels), looping over K in steps of BK through STAGES shared-memory stages:
// while the tile of step k is multiplied, the copies (cp.async) of steps k+1
// .. k+STAGES-1 are in flight. The narrow layers (few output channels, so few
// blocks per SM) are bound by how many bytes of x each SM has in flight:
// deeper stages, not bigger tiles, keep HBM busy there; and few warps per
// SM leave the FMA pipe idle, so KSPLIT groups of TX*TY threads may share a
// tile, each multiplying BK/KSPLIT of every step's rows into its own sums,
// added up through shared memory before the store. Each thread of a group
// accumulates TM x TN outputs in registers: rows ty*TM .. ty*TM + TM-1 and,
// for h < TN/4, pixels h*4*TX + tx*4 .. +3 of the tile (so the 4-float reads
// of a warp from the x tile are consecutive).
// x is read once per block row of A (from L2 after the first, blocks of one
// pixel tile are adjacent in launch order), y written once, bias, residual
// and activation fused into the store.
//
// Compile-time (-D): TM, TN (thread tile; TM a multiple of 4, TN 4 or 8),
// TX, TY (threads per group), KSPLIT (groups), BK, STAGES (2-4), VEC_X (4:
// HW % 4 == 0 and 16-byte aligned x, y and residual, so 4 consecutive columns
// are 4 pixels of one image; else 1) and TRANS_A. The host keeps TX*TY*KSPLIT
// a multiple of BN / VEC_X, so each thread copies the same columns of x at
// every step of K.
//
// The per-thread steps are __host__ __device__: tests/ops/test_pointwise.py
// compiles this file for the host and runs every block and thread through
// them (HOST_CHECK counts misaligned or out-of-bounds reads there).
#include "gdnflow_common.cuh"

#ifndef TM
#define TM 8
#endif
#ifndef TN
#define TN 8
#endif
#ifndef TX
#define TX 16
#endif
#ifndef TY
#define TY 16
#endif
#ifndef BK
#define BK 8
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef KSPLIT
#define KSPLIT 1
#endif
#ifndef VEC_X
#define VEC_X 4
#endif
#ifndef TRANS_A
#define TRANS_A 0
#endif

#define TILE_THREADS (TX * TY)
#define PW_THREADS (TILE_THREADS * KSPLIT)
#define BK_GROUP (BK / KSPLIT)
#define BM (TM * TY)
#define BN (TN * TX)
#define NH (TN / 4)
// Vector slots of x per row of the tile, and rows of the tile a pass of all
// threads copies.
#define SLOTS (BN / VEC_X)
#define KSTEP (PW_THREADS / SLOTS)

static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are read 4 floats at a time");
static_assert(PW_THREADS % SLOTS == 0, "each thread copies fixed columns of x");
static_assert(VEC_X == 1 || VEC_X == 4, "x is copied 1 or 4 floats at a time");
static_assert(STAGES >= 2, "one stage is multiplied while the next ones are copied");
static_assert(BK % KSPLIT == 0, "each group multiplies the same number of rows per step");

#ifdef __CUDA_ARCH__
#define PW_LOAD(p) __ldg(p)
#else
#define PW_LOAD(p) (*(p))
#endif
#define PW_HD __host__ __device__ __forceinline__

// 4 floats between memory and registers in one 16-byte access.
PW_HD void load4(float* r, const float* p) {
    HOST_CHECK(reinterpret_cast<unsigned long long>(p) % 16 == 0);
    const float4 v = *reinterpret_cast<const float4*>(p);
    r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
}

PW_HD void store4(float* p, const float* r) {
    HOST_CHECK(reinterpret_cast<unsigned long long>(p) % 16 == 0);
    *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
}

struct Stages {
    float a[STAGES][BK][BM];  // A tile, k-major: a thread's TM rows are contiguous
    float b[STAGES][BK][BN];  // x tile
};

// The stages while multiplying; after the last step, the sums of groups
// 1 .. KSPLIT-1 ([group - 1][output][thread], thread fastest so that a
// warp's accesses are consecutive; a placeholder when KSPLIT is 1).
#define PARTIAL_FLOATS (KSPLIT > 1 ? (KSPLIT - 1) * TM * TN * TILE_THREADS : 1)
union __align__(16) PointwiseShared {
    Stages stage;
    float partial[PARTIAL_FLOATS];
};

PW_HD int partial_index(int group, int output, int u) {
    return ((group - 1) * TM * TN + output) * TILE_THREADS + u;
}

// The block's tile: rows [m0, m0 + BM) of A, columns [j0, j0 + BN). Row tiles
// of one column tile are adjacent blocks, so they share x through L2.
struct Tile {
    int m0, j0;
};

PW_HD Tile tile_of(int block, int m_tiles) {
    Tile tile;
    tile.m0 = (block % m_tiles) * BM;
    tile.j0 = (block / m_tiles) * BN;
    return tile;
}

// What thread t copies of x at every step: VEC_X columns from `col` of the
// tile, rows k_first, k_first + KSTEP, ... of the step; x_off is column j's
// offset in x without the row term, valid if j < NP.
struct Copier {
    size_t x_off;
    int col, k_first;
    bool valid;
};

PW_HD Copier copier_of(const Tile& tile, int t, int K, int HW, int NP) {
    Copier c;
    c.col = (t % SLOTS) * VEC_X;
    c.k_first = t / SLOTS;
    const int j = tile.j0 + c.col;
    c.valid = j < NP;
    c.x_off = c.valid ? (size_t)(j / HW) * K * HW + j % HW : 0;
    return c;
}

// Thread t's share of the copies of step k0 into stage st. Rows and columns
// past the matrices are written as zeros, so the product needs no bounds
// (x holds NP*K floats, A M*K: checked on the host).
PW_HD void load_step(const float* a, const float* x, PointwiseShared& sh, int st,
                     const Tile& tile, const Copier& c, int k0, int t, int M, int K, int HW,
                     int NP) {
    for (int kk = c.k_first; kk < BK; kk += KSTEP) {
        const int k = k0 + kk;
        float* dst = &sh.stage.b[st][kk][c.col];
        if (c.valid && k < K) {
            HOST_CHECK(c.x_off + (size_t)k * HW + VEC_X <= (size_t)NP * K);
            copy_to_shared<VEC_X>(dst, x + c.x_off + (size_t)k * HW);
        } else {
#pragma unroll
            for (int e = 0; e < VEC_X; ++e) dst[e] = 0.0f;
        }
    }
    for (int s = t; s < BM * BK; s += PW_THREADS) {
        // Consecutive threads take consecutive addresses of A.
        const int mm = TRANS_A ? s % BM : s / BK;
        const int kk = TRANS_A ? s / BM : s % BK;
        const int m = tile.m0 + mm, k = k0 + kk;
        float* dst = &sh.stage.a[st][kk][mm];
        if (m < M && k < K) {
            const size_t at = TRANS_A ? (size_t)k * M + m : (size_t)m * K + k;
            HOST_CHECK(at < (size_t)M * K);
            copy_to_shared<1>(dst, a + at);
        } else {
            *dst = 0.0f;
        }
    }
}

// acc += A tile x x tile of stage st for thread t's TM x TN outputs, over
// the rows of the step that t's group takes.
PW_HD void multiply_step(const PointwiseShared& sh, int st, int t, float (&acc)[TM][TN]) {
    const int u = t % TILE_THREADS, tx = u % TX, ty = u / TX;
    const int k_group = (t / TILE_THREADS) * BK_GROUP;
#pragma unroll
    for (int kk = k_group; kk < k_group + BK_GROUP; ++kk) {
        float av[TM], bv[TN];
#pragma unroll
        for (int i = 0; i < TM; i += 4) load4(av + i, &sh.stage.a[st][kk][ty * TM + i]);
#pragma unroll
        for (int h = 0; h < NH; ++h)
            load4(bv + 4 * h, &sh.stage.b[st][kk][h * 4 * TX + tx * 4]);
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int n = 0; n < TN; ++n) acc[i][n] = fmaf(av[i], bv[n], acc[i][n]);
    }
}

// Groups 1 .. KSPLIT-1 leave their sums in shared memory (after the last step).
PW_HD void save_partial(const float (&acc)[TM][TN], PointwiseShared& sh, int t) {
    const int group = t / TILE_THREADS, u = t % TILE_THREADS;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int n = 0; n < TN; ++n)
            sh.partial[partial_index(group, i * TN + n, u)] = acc[i][n];
}

// Group 0 adds the other groups' sums to its own, in group order.
PW_HD void add_partials(float (&acc)[TM][TN], const PointwiseShared& sh, int t) {
    for (int group = 1; group < KSPLIT; ++group)
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int n = 0; n < TN; ++n)
                acc[i][n] += sh.partial[partial_index(group, i * TN + n, t)];
}

// y = act(acc + bias + residual) for the outputs of thread t < TILE_THREADS
// inside the matrices.
PW_HD void store_outputs(const float (&acc)[TM][TN], const float* bias, const float* residual,
                         float* y, const Tile& tile, int t, int M, int HW, int NP, int act) {
    const int tx = t % TX, ty = t / TX;
#pragma unroll
    for (int h = 0; h < NH; ++h) {
        const int j = tile.j0 + h * 4 * TX + tx * 4;
        if (VEC_X == 4) {
            // HW % 4 == 0: the 4 columns are 4 pixels of one image.
            if (j >= NP) continue;
            const size_t base = (size_t)(j / HW) * M * HW + j % HW;
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const int m = tile.m0 + ty * TM + i;
                if (m >= M) break;
                const float b = bias ? PW_LOAD(bias + m) : 0.0f;
                float v[4], r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (residual) load4(r, residual + base + (size_t)m * HW);
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = activate(acc[i][4 * h + e] + b + r[e], act);
                store4(y + base + (size_t)m * HW, v);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int je = j + e;
                if (je >= NP) break;
                const size_t base = (size_t)(je / HW) * M * HW + je % HW;
#pragma unroll
                for (int i = 0; i < TM; ++i) {
                    const int m = tile.m0 + ty * TM + i;
                    if (m >= M) break;
                    const size_t at = base + (size_t)m * HW;
                    float v = acc[i][4 * h + e];
                    if (bias) v += PW_LOAD(bias + m);
                    if (residual) v += PW_LOAD(residual + at);
                    y[at] = activate(v, act);
                }
            }
        }
    }
}

// Grid: m_tiles * ceil(NP / BN) blocks of TX*TY threads; bias and residual may
// be null. NP = N*HW.
extern "C" __global__ void __launch_bounds__(PW_THREADS) pointwise_conv(
        const float* __restrict__ a, const float* __restrict__ x,
        const float* __restrict__ bias, const float* __restrict__ residual,
        float* __restrict__ y, int M, int K, int HW, int NP, int m_tiles, int act) {
    __shared__ PointwiseShared sh;
    const int t = threadIdx.x;
    const Tile tile = tile_of(blockIdx.x, m_tiles);
    const Copier c = copier_of(tile, t, K, HW, NP);
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int n = 0; n < TN; ++n) acc[i][n] = 0.0f;

    // One commit group per step, empty past the last, so that before step s
    // exactly STAGES - 2 younger groups may still be in flight.
    const int steps = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps) load_step(a, x, sh, s, tile, c, s * BK, t, M, K, HW, NP);
        copies_commit();
    }
    // Stage of `step`; the copies go to the one of step - 1.
    int stage = 0, free_stage = STAGES - 1;
    for (int step = 0; step < steps; ++step) {
        copies_wait<STAGES - 2>();      // this thread's copies of `step` have landed
        // Everyone's copies of `step` have landed, and everyone has multiplied
        // step - 1, whose stage the copies below overwrite.
        __syncthreads();
        const int next = step + STAGES - 1;
        if (next < steps) load_step(a, x, sh, free_stage, tile, c, next * BK, t, M, K, HW, NP);
        copies_commit();
        multiply_step(sh, stage, t, acc);
        free_stage = stage;
        stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
    if (KSPLIT > 1) {
        __syncthreads();                // every group is done with the stages
        if (t >= TILE_THREADS) save_partial(acc, sh, t);
        __syncthreads();
        if (t >= TILE_THREADS) return;
        add_partials(acc, sh, t);
    }
    store_outputs(acc, bias, residual, y, tile, t, M, HW, NP, act);
}
