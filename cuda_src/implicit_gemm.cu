// Convolution forward on the tensor cores: 16-bit x and w, float32 sums, one
// kernel from x to y with the epilogue fused. Python side:
// gdnflow/ops/conv/algorithms/implicit_gemm.py.
//
//     y[n, m, p] = act(bias[m] + residual[n, m, p] + sum_k A[m, k] * X[k, (n, p)])
//
// An implicit GEMM: A is the weight, rearranged once (conv_weight_matrix below)
// to [M_pad, K_pad] with k = (tap, c) = ((ky, kx), c), the channels of a tap
// padded with zeros to C_pad, a multiple of BK, and the rows to a multiple of
// BM; X is im2col(x), never written out: a block copies the BK x BN piece of
// it that it multiplies straight from x. x is first rearranged to channels
// last (nchw_to_nhwc below: [N, H, W, C8], C8 = C_in padded to a multiple of
// 8), so that a step of BK rows of K, which lies within one tap (C_pad is a
// multiple of BK), is BK consecutive channels of one input pixel per column:
// BK / 8 16-byte copies, zero-filled where the pixel is padding. The columns
// are all N*OH*OW output pixels of the batch (column j: image j / (OH*OW)),
// so small planes still fill the tiles.
//
// A block of 2 x (BN / WARP_N) warps computes a BM x BN tile, BM = 2 * WARP_M
// (WARP_M 32 or 64), BN = 128; each warp a WARP_M x WARP_N
// piece (WARP_N 32 or 64) as (WARP_M / 16) x (WARP_N / 8) mma.sync m16n8k16
// tiles, float32 accumulators in registers. K runs in steps of BK (32 or 64)
// through STAGES shared-memory stages filled by cp.async: while step s is
// multiplied, steps s+1 .. s+STAGES-1 are in flight. Both tiles are stored row
// by row with k contiguous (A's rows are output channels, X's are columns),
// read into the tensor cores by ldmatrix; rows are padded by 8 values so those
// reads are free of bank conflicts. The outputs go out through shared memory
// too, so that y's stores (NCHW) are consecutive pixels.
//
// With -DWGMMA (Hopper, built for sm_90a) the two warp rows are two
// warpgroups that multiply by wgmma straight from shared memory instead
// (wgmma_multiply_add below: of a 128-row tile each its own 64 rows by all 128
// columns, of a 64-row tile all rows by its own 64 columns); the stages' rows
// are then 128 bytes in wgmma's 128-byte swizzle (tile_offset), BK is 64.
//
// Compile-time (-D): STORAGE_FP16 or STORAGE_BF16 (the element type; without
// either this file has no kernels), KH, KW, SH, SW, DH, DW (the window,
// stride and dilation), WARP_M, WARP_N, BN, STAGES and BK; WGMMA (with the
// host's ARCH_SPECIFIC, which selects the sm_90a target).
#include "gdnflow_common.cuh"

#if defined(STORAGE_FP16) || defined(STORAGE_BF16)

#ifndef KH
#define KH 3
#endif
#ifndef KW
#define KW 3
#endif
#ifndef SH
#define SH 1
#endif
#ifndef SW
#define SW 1
#endif
#ifndef DH
#define DH 1
#endif
#ifndef DW
#define DW 1
#endif
// The defaults are the variant gdnflow builds most (Python passes every one).
#ifndef WARP_M
#define WARP_M 64
#endif
#ifndef WARP_N
#define WARP_N 32
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef BK
#define BK 64
#endif
#ifndef BN
#define BN 128
#endif

#define IG_BK BK
#define IG_BN BN
#define IG_WARPS_M 2
#define IG_WARPS_N (IG_BN / WARP_N)
#define IG_THREADS (32 * IG_WARPS_M * IG_WARPS_N)
#define IG_BM (IG_WARPS_M * WARP_M)
#define IG_MT (WARP_M / 16)                 // m16 tiles of a warp
#define IG_NT (WARP_N / 8)                  // n8 tiles of a warp
#define IG_PITCH (IG_BK + 8)                // 16-bit values per row of a tile (mma.sync)
#define IG_CHUNKS_PER_ROW (IG_BK / 8)       // 16-byte copies per row of a tile
#define IG_A_COPIES (IG_BM * IG_CHUNKS_PER_ROW / IG_THREADS)  // per thread and step
#define IG_X_COPIES (IG_BN * IG_CHUNKS_PER_ROW / IG_THREADS)
#if defined(WGMMA)
#define IG_ROW_VALUES IG_BK                 // rows of 128 bytes, swizzled (below)
#else
#define IG_ROW_VALUES IG_PITCH
#endif
#define IG_STAGE_VALUES ((IG_BM + IG_BN) * IG_ROW_VALUES)
#define IG_OUT_PITCH (IG_BN + 4)            // floats per row of the staged output

static_assert(WARP_M == 32 || WARP_M == 64, "a warp covers 32 or 64 output channels");
static_assert(STAGES >= 2, "one stage is multiplied while the next ones are copied");
static_assert(BK == 32 || BK == 64, "K steps of 32 or 64 channels");
static_assert(BN == 128, "128 columns a block (the warps' layout along N assumes it)");
static_assert(WARP_N == 32 || WARP_N == 64, "a warp covers 32 or 64 columns");
static_assert(IG_A_COPIES >= 1 && IG_X_COPIES >= 1, "every thread copies part of each tile");
static_assert(IG_THREADS % IG_BN == 0, "the epilogue gives each thread one column");
#if defined(WGMMA)
static_assert(BK == 64 && IG_THREADS == 256 && (IG_BM == 128 || IG_BM == 64),
              "wgmma: K steps of one 128-byte row, two warpgroups");
// Each warpgroup multiplies 64 rows: of a 128-row tile, its own 64 rows by all
// 128 columns; of a 64-row tile, all rows by its own 64 columns.
#define IG_WG_N (IG_BM == 128 ? IG_BN : IG_BN / 2)     // columns of a warpgroup
#define IG_WG_SUMS (IG_WG_N / 2)                       // float32 sums per thread
// The epilogue stages 64 rows at a time: each warpgroup's in turn (128-row tile),
// or both warpgroups' columns at once (64-row tile).
#define IG_EPILOGUE_ROWS 64
#define IG_EPILOGUE_PASSES (IG_BM / 64)
#else
#define IG_EPILOGUE_ROWS WARP_M
#define IG_EPILOGUE_PASSES IG_WARPS_M
#endif
static_assert(IG_EPILOGUE_ROWS * IG_OUT_PITCH * 4 <= STAGES * IG_STAGE_VALUES * 2,
              "the outputs staged at once fit in the stages' shared memory");

#if defined(STORAGE_BF16)
#define IG_MMA "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#else
#define IG_MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#endif

typedef unsigned short bits16;              // a 16-bit value moved, not computed with

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared by cp.async; zeros instead where ``inside`` is false.
__device__ __forceinline__ void copy16_or_zero(bits16* dst, const bits16* src, bool inside) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(shared_address(dst)), "l"(src), "r"(inside ? 16 : 0) : "memory");
}

// Four 8x8 matrices of 16-bit values from shared memory; lane l gives the
// address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void load_matrices(unsigned* r, const bits16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(p)));
}

// c += a (16x16, row-major fragments) * b (16x8, column-major), float32 sums.
__device__ __forceinline__ void multiply_add(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(IG_MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Where value `col` of row `row` of a stage's tile lies, in 16-bit values from the
// tile's start. mma.sync: rows padded by 8 values (conflict-free ldmatrix).
// wgmma: rows of exactly 128 bytes in the 128-byte swizzle wgmma's descriptors
// name: 16-byte piece c of row r at piece c ^ (r % 8), each 8 rows a 1024-byte
// atom (the tile starts on a 1024-byte boundary).
__device__ __forceinline__ int tile_offset(int row, int col) {
#if defined(WGMMA)
    return row * IG_BK + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
#else
    return row * IG_PITCH + col;
#endif
}

#if defined(WGMMA)
// Hopper's warpgroup MMA (sm_90a; Python builds this section only there, with
// -DWGMMA and the arch-specific target): the 4 warps of a warpgroup multiply a
// 64 x 16 piece of A by a 16 x IG_WG_N piece of X, both read from shared memory
// through descriptors, into IG_WG_SUMS float32 sums per thread, asynchronously.
#if defined(STORAGE_BF16)
#define IG_WGMMA_TYPES ".f32.bf16.bf16"
#else
#define IG_WGMMA_TYPES ".f32.f16.f16"
#endif

// The descriptor of a K-major tile in the 128-byte swizzle: start address (16-byte
// units), leading byte offset 1 (unused by this layout), stride byte offset 1024
// (from one 8-row atom to the next), swizzle mode 1 (128 bytes).
__device__ __forceinline__ unsigned long long wgmma_descriptor(const bits16* tile) {
    return (unsigned long long)((shared_address(tile) >> 4) & 0x3FFF) | (1ull << 16) |
           (64ull << 32) | (1ull << 62);
}

// d (this thread's sums) += A (64 x 16, descriptor a) * X^T (16 x IG_WG_N, descriptor x).
__device__ __forceinline__ void wgmma_multiply_add(float* d, unsigned long long a,
                                                   unsigned long long x) {
#if IG_BM == 128
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16" IG_WGMMA_TYPES
                 " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(x));
#else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16" IG_WGMMA_TYPES
                 " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(x));
#endif
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy, wgmma reads it
// through the async proxy: each thread fences its copies before the barrier.
__device__ __forceinline__ void fence_copies_for_wgmma() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif

// The convolution. xt [N, H, W, C8] (nchw_to_nhwc's); a [m_tiles * BM, K_pad]
// from conv_weight_matrix (K_pad = KH * KW * c_steps * BK); bias [C_out] and
// residual (y's shape) may be null; y [N, C_out, OH, OW]. Grid: m_tiles x
// ceil(N*OH*OW / BN) blocks, the M tiles of one column tile adjacent (they
// read the same x, from L2 after the first); STAGES * IG_STAGE_VALUES 16-bit
// values of dynamic shared memory (with WGMMA, 1024 bytes more: the tiles are
// moved up to the next 1024-byte boundary).
extern "C" __global__ void __launch_bounds__(IG_THREADS, 2) conv_implicit_gemm(
        const storage_t* __restrict__ xt, const storage_t* __restrict__ a,
        const storage_t* __restrict__ bias, const storage_t* __restrict__ residual,
        storage_t* __restrict__ y, int n, int c8, int h, int w, int c_out, int oh, int ow,
        int pad_top, int pad_left, int c_steps, int m_tiles, int act) {
    extern __shared__ __align__(16) bits16 ig_shared_bytes[];
#if defined(WGMMA)
    // Swizzled tiles start on 1024-byte boundaries: the host adds 1024 bytes.
    bits16* ig_shared =
        ig_shared_bytes + ((1024 - (shared_address(ig_shared_bytes) & 1023)) & 1023) / 2;
#else
    bits16* ig_shared = ig_shared_bytes;
#endif
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    // The warp row (wgmma: the warpgroup) and, for mma.sync, the warp column.
    const int warp_m = warp / IG_WARPS_N;
#if !defined(WGMMA)
    const int warp_n = warp % IG_WARPS_N;
#endif
    const int m_tile = blockIdx.x % m_tiles, column_tile = blockIdx.x / m_tiles;
    const int ohw = oh * ow, columns = n * ohw;
    const int k_pad = KH * KW * c_steps * IG_BK, steps = KH * KW * c_steps;
    const bits16* x_bits = reinterpret_cast<const bits16*>(xt);
    const bits16* a_rows = reinterpret_cast<const bits16*>(a) + (size_t)m_tile * IG_BM * k_pad;

    // The tile rows (columns of X) this thread copies, IG_THREADS / IG_CHUNKS_PER_ROW
    // apart, all at the same 8 channels of a step (``part``).
    const int part = (tid % IG_CHUNKS_PER_ROW) * 8;
    int x_base[IG_X_COPIES], iy0[IG_X_COPIES], ix0[IG_X_COPIES];
#pragma unroll
    for (int i = 0; i < IG_X_COPIES; ++i) {
        const int column = column_tile * IG_BN + tid / IG_CHUNKS_PER_ROW +
                           i * (IG_THREADS / IG_CHUNKS_PER_ROW);
        const int image = column / ohw, pixel = column - image * ohw;
        const int oy = pixel / ow;
        // A column past the last is kept out through its row: iy0 far outside.
        iy0[i] = column < columns ? oy * SH - pad_top : -(1 << 29);
        ix0[i] = (pixel - oy * ow) * SW - pad_left;
        x_base[i] = image * h * w * c8 + part;
    }

    auto stage_a = [&](int stage) { return ig_shared + stage * IG_STAGE_VALUES; };
    auto stage_x = [&](int stage) {
        return ig_shared + stage * IG_STAGE_VALUES + IG_BM * IG_ROW_VALUES;
    };
    // copy_step is called for steps 0, 1, 2, ... in order: it walks (tap, channel
    // step) along instead of dividing the step by the runtime c_steps.
    int copy_tap = 0, copy_c_step = 0;
    auto copy_step = [&](int step, int stage) {
        bits16* as = stage_a(stage);
#pragma unroll
        for (int i = 0; i < IG_A_COPIES; ++i) {
            const int chunk = tid + i * IG_THREADS, row = chunk / IG_CHUNKS_PER_ROW;
            const int col = (chunk % IG_CHUNKS_PER_ROW) * 8;
            copy16_or_zero(as + tile_offset(row, col),
                           a_rows + (size_t)row * k_pad + step * IG_BK + col, true);
        }
        const int c0 = copy_c_step * IG_BK;
        const int ky = copy_tap / KW, kx = copy_tap - (copy_tap / KW) * KW;
        if (++copy_c_step == c_steps) {
            copy_c_step = 0;
            ++copy_tap;
        }
        bits16* xs = stage_x(stage);
#pragma unroll
        for (int i = 0; i < IG_X_COPIES; ++i) {
            const int iy = iy0[i] + ky * DH, ix = ix0[i] + kx * DW;
            const bool inside = (unsigned)iy < (unsigned)h && (unsigned)ix < (unsigned)w &&
                                c0 + part < c8;
            const int row = tid / IG_CHUNKS_PER_ROW + i * (IG_THREADS / IG_CHUNKS_PER_ROW);
            copy16_or_zero(xs + tile_offset(row, part),
                           inside ? x_bits + x_base[i] + (iy * w + ix) * c8 + c0 : x_bits,
                           inside);
        }
    };

#if defined(WGMMA)
    float sums[IG_WG_SUMS];     // this thread's share of its warpgroup's outputs
#pragma unroll
    for (int i = 0; i < IG_WG_SUMS; ++i) sums[i] = 0.0f;
#else
    float sums[IG_MT][IG_NT][4];
#pragma unroll
    for (int i = 0; i < IG_MT; ++i)
#pragma unroll
        for (int j = 0; j < IG_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sums[i][j][e] = 0.0f;
#endif

    // STAGES - 1 steps in flight before the first product; then one more
    // issued per step (an empty group past the last keeps the count uniform).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps) copy_step(s, s);
        copies_commit();
    }
#if defined(WGMMA)
    // Step s's products are issued, then the thread waits for step s - 1's (one
    // group stays in flight); once every warpgroup has, step s - 1's stage takes
    // the copies of step s + STAGES - 1.
    for (int step = 0; step < steps; ++step) {
        copies_wait<STAGES - 2>();
        fence_copies_for_wgmma();
        __syncthreads();    // step's tiles are in, for every thread
        // warp_m is the warpgroup: its rows (128-row tile) or its columns (64-row).
        const int own_rows = IG_BM == 128 ? warp_m * 64 : 0;
        const int own_columns = IG_BM == 128 ? 0 : warp_m * IG_WG_N;
        const unsigned long long a_desc =
            wgmma_descriptor(stage_a(step % STAGES) + own_rows * IG_BK);
        const unsigned long long x_desc =
            wgmma_descriptor(stage_x(step % STAGES) + own_columns * IG_BK);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < IG_BK / 16; ++kk)     // 16 values = 32 bytes = 2 units
            wgmma_multiply_add(sums, a_desc + 2 * kk, x_desc + 2 * kk);
        wgmma_commit();
        wgmma_wait<1>();
        __syncthreads();    // every warpgroup is done with step - 1's stage
        const int next = step + STAGES - 1;
        if (next < steps) copy_step(next, next % STAGES);
        copies_commit();
    }
    wgmma_wait<0>();
#else
    for (int step = 0; step < steps; ++step) {
        copies_wait<STAGES - 2>();
        __syncthreads();    // step's tiles are in; every warp is done with step - 1's stage
        const int next = step + STAGES - 1;
        if (next < steps) copy_step(next, next % STAGES);
        copies_commit();
        const bits16* as = stage_a(step % STAGES);
        const bits16* xs = stage_x(step % STAGES);
#pragma unroll
        for (int kk = 0; kk < IG_BK; kk += 16) {
            unsigned a_frag[IG_MT][4], b_frag[IG_NT][2];
#pragma unroll
            for (int i = 0; i < IG_MT; ++i)
                load_matrices(a_frag[i], as + tile_offset(warp_m * WARP_M + i * 16 + lane % 16,
                                                          kk + (lane / 16) * 8));
#pragma unroll
            for (int j = 0; j < IG_NT; j += 2) {
                // Matrices: columns j*8.. at k, k + 8, then columns j*8 + 8.. likewise.
                unsigned r[4];
                const int row = warp_n * WARP_N + j * 8 + lane % 8 + (lane / 16) * 8;
                load_matrices(r, xs + tile_offset(row, kk + ((lane / 8) % 2) * 8));
                b_frag[j][0] = r[0]; b_frag[j][1] = r[1];
                b_frag[j + 1][0] = r[2]; b_frag[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < IG_MT; ++i)
#pragma unroll
                for (int j = 0; j < IG_NT; ++j) multiply_add(sums[i][j], a_frag[i], b_frag[j]);
        }
    }
#endif
    copies_done();
    __syncthreads();    // the stages are free: the outputs go through them

    // Epilogue, IG_EPILOGUE_ROWS rows at a time (mma.sync: one warp row; wgmma:
    // one warpgroup's 64 rows, or both warpgroups' columns of a 64-row tile): the
    // warps of those rows put their sums in shared memory (mma.sync: accumulator
    // e of tile (i, j) is row lane / 4 (+8 for e >= 2), column 2 * (lane % 4) +
    // (e & 1) of that tile); then each thread takes one column and every
    // (IG_THREADS / IG_BN)-th row, so that a warp's stores of a row are
    // consecutive pixels of y.
    float* staged = reinterpret_cast<float*>(ig_shared);
    const int out_column = tid % IG_BN, out_row0 = tid / IG_BN;
    const int column = column_tile * IG_BN + out_column;
    const bool column_ok = column < columns;
    const int image = column_ok ? column / ohw : 0;
    const int out_base = image * c_out * ohw + (column - image * ohw);
#pragma unroll
    for (int pass = 0; pass < IG_EPILOGUE_PASSES; ++pass) {
#if defined(WGMMA)
        if (IG_BM == 64 || warp_m == pass) {
            // Sum 4j + e of a thread: row 16 * (warp % 4) + lane / 4 (+8 for e >= 2),
            // column 8j + 2 * (lane % 4) + (e & 1) of its warpgroup's 64 x IG_WG_N.
            const int first_column = IG_BM == 128 ? 0 : warp_m * IG_WG_N;
#pragma unroll
            for (int j = 0; j < IG_WG_N / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    staged[((warp % 4) * 16 + lane / 4 + (e / 2) * 8) * IG_OUT_PITCH +
                           first_column + j * 8 + 2 * (lane % 4) + e % 2] = sums[4 * j + e];
#else
        if (warp_m == pass) {
#pragma unroll
            for (int i = 0; i < IG_MT; ++i)
#pragma unroll
                for (int j = 0; j < IG_NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        staged[(i * 16 + lane / 4 + (e / 2) * 8) * IG_OUT_PITCH +
                               warp_n * WARP_N + j * 8 + 2 * (lane % 4) + e % 2] = sums[i][j][e];
#endif
        }
        __syncthreads();
        for (int r = out_row0; r < IG_EPILOGUE_ROWS; r += IG_THREADS / IG_BN) {
            const int m = m_tile * IG_BM + pass * IG_EPILOGUE_ROWS + r;
            if (m < c_out && column_ok) {
                const int at = out_base + m * ohw;
                float v = staged[r * IG_OUT_PITCH + out_column] +
                          (bias ? load_value(bias[m]) : 0.0f);
                if (residual) v += load_value(residual[at]);
                y[at] = store_value(activate(v, act));
            }
        }
        __syncthreads();
    }
}

// xt [N, H, W, C8] <- x [N, C, H, W], channels C .. C8-1 zero, through 64 x 64
// tiles of (channel, pixel) in shared memory. A thread reads 8 consecutive pixels
// of a channel and writes 8 consecutive channels of a pixel: 16 bytes each (reads
// value by value unless ``vector_reads``: HW a multiple of 8 and x 16-byte
// aligned). With one 2-byte value per access the copy ran at about a third of
// the H200's memory bandwidth. In the write phase the 8 threads of a pixel write
// its 64 channels' 128 consecutive bytes; for their shared-memory reads (8 rows
// apart) not to fall in one bank, channel row r keeps pixel p at column
// p ^ (8 * (r / 8 % 8)) (nhwc_column). Block NHWC_THREADS threads; grid
// (ceil(H*W / 64), ceil(C8 / 64), min(N, 65535)), each block looping over the
// images its z index reaches in steps of gridDim.z.
#define NHWC_TILE 64
#define NHWC_THREADS 256
#define NHWC_CHUNKS (NHWC_TILE * NHWC_TILE / 8)     // 16-byte pieces of a tile
__device__ __forceinline__ int nhwc_column(int row, int pixel) {
    return pixel ^ ((row >> 3) & 7) << 3;
}
extern "C" __global__ void __launch_bounds__(NHWC_THREADS) nchw_to_nhwc(
        const storage_t* __restrict__ x, storage_t* __restrict__ xt, int n, int c, int c8,
        int hw, int vector_reads) {
    // [channel][pixel]. The rows' 8 values of padding are not what keeps the write
    // phase's reads conflict-free (the swizzle is): they are left from before it.
    __shared__ __align__(16) bits16 tile[NHWC_TILE][NHWC_TILE + 8];
    const int p0 = blockIdx.x * NHWC_TILE, c0 = blockIdx.y * NHWC_TILE;
    for (int image = blockIdx.z; image < n; image += gridDim.z) {
        const bits16* src = reinterpret_cast<const bits16*>(x) + (size_t)image * c * hw;
        bits16* dst = reinterpret_cast<bits16*>(xt) + (size_t)image * c8 * hw;
        for (int chunk = threadIdx.x; chunk < NHWC_CHUNKS; chunk += NHWC_THREADS) {
            const int row = chunk / 8, first = (chunk % 8) * 8;
            const int ch = c0 + row, p = p0 + first;
            uint4 bits = make_uint4(0, 0, 0, 0);
            if (ch < c && p < hw) {
                const bits16* from = src + (size_t)ch * hw + p;
                if (vector_reads) {
                    bits = *reinterpret_cast<const uint4*>(from);
                } else {
                    bits16* values = reinterpret_cast<bits16*>(&bits);
#pragma unroll
                    for (int k = 0; k < 8; ++k)
                        if (p + k < hw) values[k] = from[k];
                }
            }
            // first is a multiple of 8: its 8 pixels stay together, 16-byte aligned.
            *reinterpret_cast<uint4*>(&tile[row][nhwc_column(row, first)]) = bits;
        }
        __syncthreads();
        for (int chunk = threadIdx.x; chunk < NHWC_CHUNKS; chunk += NHWC_THREADS) {
            const int column = chunk / 8, first = (chunk % 8) * 8;
            const int p = p0 + column, ch = c0 + first;
            if (p < hw && ch < c8) {
                uint4 bits;
                bits16* values = reinterpret_cast<bits16*>(&bits);
#pragma unroll
                for (int k = 0; k < 8; ++k)
                    values[k] = tile[first + k][nhwc_column(first + k, column)];
                *reinterpret_cast<uint4*>(dst + (size_t)p * c8 + ch) = bits;
            }
        }
        __syncthreads();    // the tile is read before the next image overwrites it
    }
}

// a [m_tiles * BM, K_pad] <- w [C_out, C_in, KH, KW]: row m, column
// (tap * c_steps * BK + c) holds w[m, c, tap / KW, tap % KW], zero where
// m >= C_out or c >= C_in. Grid-stride over the matrix.
extern "C" __global__ void conv_weight_matrix(const storage_t* __restrict__ w,
                                              storage_t* __restrict__ a, int c_out, int c_in,
                                              int c_steps, int rows) {
    const int c_pad = c_steps * IG_BK, k_pad = KH * KW * c_pad;
    const int total = rows * k_pad;
    GRID_STRIDE_LOOP(idx, total) {
        const int m = idx / k_pad, k = idx - m * k_pad;
        const int tap = k / c_pad, c = k - tap * c_pad;
        a[idx] = m < c_out && c < c_in ? w[((size_t)m * c_in + c) * (KH * KW) + tap]
                                       : store_value(0.0f);
    }
}

#endif  // STORAGE_FP16 || STORAGE_BF16
