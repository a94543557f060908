// Depthwise 2-D convolution (groups == C_in == C_out), NCHW: a direct
// convolution per (image, channel) plane. Python side: gdnflow/ops/conv/algorithms/depthwise.py.
// Built with -DSTORAGE_BF16 / -DSTORAGE_FP16, the forward reads and writes
// 16-bit x, w, bias and y (storage_t, gdnflow_common.cuh): the staged tile
// holds 16-bit values too (cp.async, as for floats), the compute step widens
// them to float as it reads them and the store rounds once. (Staging through
// plain loads that widened on their way into shared memory ran at about a
// third of the H200's memory bandwidth.)
//
// Why not im2col + GEMM: each output reads KH*KW inputs and multiplies them by
// KH*KW weights of its own channel, a "GEMM" of one row. The work is all
// memory traffic: the forward moves each input and each output through device
// memory once, in full 16-byte accesses where the layout allows.
//
// Forward (depthwise_forward; also backward-data at stride 1, see below).
// A block takes `planes_per_block` consecutive planes and a strip of
// `strip_rows` output rows of each (the whole plane when strips == 1). It
//  1. stages the input rows the strip reads, [a, b) clipped to the image,
//     whole rows, into shared memory with cp.async: rows of consecutive
//     planes are consecutive in memory, so the copy is one or a few
//     contiguous runs, VEC_COPY floats per copy (16 bytes when aligned);
//  2. computes: each thread takes RPT output rows x OUT_COLS output columns
//     of one plane. It walks the ROWS_IN input rows those outputs read, reads
//     from each the OUT_COLS*SW "own" columns (VEC_IN floats at a time) plus
//     the few halo columns around them, and adds each row into every output
//     row that reads it, so an input row is read once per thread, not once
//     per tap row;
//  3. adds the bias, applies the activation and stores VEC_OUT floats at a
//     time. Columns and rows outside the image read as zero (predicates, not
//     padding in shared memory), so the staged tile is the input as it lies.
// The host (gdnflow/ops/depthwise.py, forward_plan) picks the tiling and the
// vector widths; they divide the row lengths and the pointers' alignment.
//
// Compile-time (-D): KH, KW (taps), SH, SW (strides), DH, DW (dilations),
// RPT (output rows per thread), OUT_COLS (output columns per thread),
// PAD_LEFT (may be negative: backward-data's padding (KW-1)*DW - left),
// VEC_COPY, VEC_IN, VEC_OUT (1, 2 or 4) and FLIP (1: the filter rotated by 180
// degrees, for backward-data). Every loop over taps, rows and columns
// unrolls, so a thread's inputs and sums stay in registers.
//
// The staging and compute steps are __host__ __device__ functions:
// tests/ops/test_conv.py compiles this file for the host and runs
// every block and thread through them, so the index arithmetic, the vector
// alignment and the shared-memory bounds are checked without a GPU
// (HOST_CHECK counts violations there; it is empty on the device).
#include "gdnflow_common.cuh"

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
#ifndef RPT
#define RPT 4
#endif
#ifndef OUT_COLS
#define OUT_COLS 4
#endif
#ifndef PAD_LEFT
#define PAD_LEFT 1
#endif
#ifndef VEC_COPY
#define VEC_COPY 1
#endif
#ifndef VEC_IN
#define VEC_IN 1
#endif
#ifndef VEC_OUT
#define VEC_OUT 1
#endif
#ifndef FLIP
#define FLIP 0
#endif

// Threads per block the forward is compiled for (the host never asks for more).
#define DW_MAX_THREADS 256

#ifdef __CUDA_ARCH__
#define DW_LOAD(p) __ldg(p)
#else
#define DW_LOAD(p) (*(p))
#endif
#define DW_HD __host__ __device__ __forceinline__

// floor(a / b) for b > 0 and any sign of a.
__device__ __forceinline__ int floor_div(int a, int b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// N floats (N = 1, 2, 4) between memory and registers in one access; the
// address must be aligned to 4*N bytes (checked on the host).
template <int N>
DW_HD void load_floats(float* r, const float* p) {
    HOST_CHECK(reinterpret_cast<unsigned long long>(p) % (4 * N) == 0);
    if constexpr (N == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
    } else if constexpr (N == 2) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        r[0] = v.x; r[1] = v.y;
    } else {
        r[0] = *p;
    }
}

// N 16-bit values in one access (2*N bytes, aligned as N floats' offsets are).
template <int N>
struct alignas(2 * N) HalfPack { storage_t v[N]; };

// N values of the tensor's storage type <-> N floats: float storage is
// load_floats / store_floats; 16-bit storage converts in registers.
template <int N>
DW_HD void load_values(float* r, const storage_t* p) {
    if constexpr (sizeof(storage_t) == sizeof(float)) {
        load_floats<N>(r, reinterpret_cast<const float*>(p));
    } else {
        HOST_CHECK(reinterpret_cast<unsigned long long>(p) % (2 * N) == 0);
        const HalfPack<N> v = *reinterpret_cast<const HalfPack<N>*>(p);
        for (int e = 0; e < N; ++e) r[e] = load_value(v.v[e]);
    }
}

template <int N>
DW_HD void store_floats(float* p, const float* r);

template <int N>
DW_HD void store_values(storage_t* p, const float* r) {
    if constexpr (sizeof(storage_t) == sizeof(float)) {
        store_floats<N>(reinterpret_cast<float*>(p), r);
    } else {
        HOST_CHECK(reinterpret_cast<unsigned long long>(p) % (2 * N) == 0);
        HalfPack<N> v;
        for (int e = 0; e < N; ++e) v.v[e] = store_value(r[e]);
        *reinterpret_cast<HalfPack<N>*>(p) = v;
    }
}

template <int N>
DW_HD void store_floats(float* p, const float* r) {
    HOST_CHECK(reinterpret_cast<unsigned long long>(p) % (4 * N) == 0);
    if constexpr (N == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
    } else if constexpr (N == 2) {
        *reinterpret_cast<float2*>(p) = make_float2(r[0], r[1]);
    } else {
        *p = r[0];
    }
}

// One block's share of the forward: planes [p0, p0 + np), output rows
// [r0, r1) of each, input rows [a, b) staged (b <= a when none is inside).
struct Strip {
    int p0, np, r0, r1, a, b;
};

DW_HD Strip strip_of(int block, int planes, int H, int OH, int pad_top, int planes_per_block,
                     int strip_rows, int strips) {
    Strip s;
    const int group = block / strips;
    s.p0 = group * planes_per_block;
    s.np = planes - s.p0 < planes_per_block ? planes - s.p0 : planes_per_block;
    s.r0 = (block - group * strips) * strip_rows;
    s.r1 = s.r0 + strip_rows < OH ? s.r0 + strip_rows : OH;
    const int first = s.r0 * SH - pad_top;
    const int last = (s.r1 - 1) * SH - pad_top + (KH - 1) * DH;     // inclusive
    s.a = first > 0 ? first : 0;
    s.b = last + 1 < H ? last + 1 : H;
    return s;
}

// VEC_COPY values global -> shared: one cp.async of their bytes (4, 8 or 16),
// or a plain copy of one 16-bit value (cp.async moves at least 4 bytes).
DW_HD void stage_values(storage_t* dst, const storage_t* src) {
    constexpr int WORDS = VEC_COPY * (int)sizeof(storage_t) / 4;
    if constexpr (WORDS >= 1) {
        copy_to_shared<(WORDS >= 1 ? WORDS : 1)>(reinterpret_cast<float*>(dst),
                                                 reinterpret_cast<const float*>(src));
    } else {
        *dst = *src;
    }
}

// Step 1 for thread t of `threads`: copy its share of rows [a, b) of every
// plane of the strip to tile + q * tile_floats (q = plane - p0). The host
// makes VEC_COPY divide W (or H*W when every strip stages whole planes).
DW_HD void stage_strip(const storage_t* x, storage_t* tile, const Strip& s, int t, int threads,
                       int H, int W, int tile_floats) {
    const int rows = s.b - s.a;
    if (rows <= 0) return;
    HOST_CHECK(rows * W % VEC_COPY == 0 && rows * W <= tile_floats);
    const int per_plane = rows * W / VEC_COPY;
    const int total = s.np * per_plane;
    const storage_t* src = x + ((size_t)s.p0 * H + s.a) * W;
    for (int e = t; e < total; e += threads) {
        const int q = e / per_plane;
        const int off = (e - q * per_plane) * VEC_COPY;
        stage_values(tile + q * tile_floats + off, src + (size_t)q * H * W + off);
    }
}

// The input rows a thread walks and the columns it reads, relative to the
// start of its own columns (cs = first output column * SW): outputs v of the
// thread read columns v*SW - PAD_LEFT + j*DW; [0, CHUNK) are its own.
constexpr int ROWS_IN = (RPT - 1) * SH + (KH - 1) * DH + 1;
constexpr int CHUNK = OUT_COLS * SW;
constexpr int REL_LO = -PAD_LEFT < 0 ? -PAD_LEFT : 0;
constexpr int REL_HI_TAPS = (OUT_COLS - 1) * SW - PAD_LEFT + (KW - 1) * DW;
constexpr int REL_HI = REL_HI_TAPS > CHUNK - 1 ? REL_HI_TAPS : CHUNK - 1;
constexpr int REL_COUNT = REL_HI - REL_LO + 1;
static_assert(CHUNK % VEC_IN == 0 && OUT_COLS % VEC_OUT == 0, "vector widths must divide");

// Steps 2 and 3 for thread t: RPT x OUT_COLS outputs of one plane of the strip.
DW_HD void compute_strip(const storage_t* tile, const storage_t* w, const storage_t* bias, storage_t* y,
                         const Strip& s, int t, int C, int H, int W, int OH, int OW,
                         int pad_top, int act, int tile_floats, int row_groups, int col_groups) {
    const int cg = t % col_groups;
    const int rest = t / col_groups;
    const int rg = rest % row_groups;
    const int q = rest / row_groups;
    const int oh0 = s.r0 + rg * RPT;
    if (q >= s.np || oh0 >= s.r1) return;
    const int plane = s.p0 + q;
    const int c = plane % C;
    const int ow0 = cg * OUT_COLS;
    const int cs = ow0 * SW;

    float wr[KH * KW];
#pragma unroll
    for (int k = 0; k < KH * KW; ++k)
        wr[k] = load_value(DW_LOAD(w + c * (KH * KW) + (FLIP ? KH * KW - 1 - k : k)));
    const float b0 = bias ? load_value(DW_LOAD(bias + c)) : 0.0f;
    float acc[RPT][OUT_COLS];
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int v = 0; v < OUT_COLS; ++v) acc[r][v] = b0;

    const storage_t* plane_tile = tile + q * tile_floats;
#pragma unroll
    for (int t_row = 0; t_row < ROWS_IN; ++t_row) {
        const int ih = oh0 * SH - pad_top + t_row;
        // Staged rows are [a, b); rows past b feed only outputs past r1.
        const bool row_ok = ih >= 0 && ih < s.b;
        const storage_t* row = plane_tile + (ih - s.a) * W;
        float in[REL_COUNT];
#pragma unroll
        for (int m = 0; m < CHUNK; m += VEC_IN) {
            if (row_ok && cs + m < W) {
                HOST_CHECK((ih - s.a) * W + cs + m + VEC_IN <= tile_floats);
                load_values<VEC_IN>(in + (m - REL_LO), row + cs + m);
            } else {
#pragma unroll
                for (int e = 0; e < VEC_IN; ++e) in[m - REL_LO + e] = 0.0f;
            }
        }
#pragma unroll
        for (int rel = REL_LO; rel <= REL_HI; ++rel) {
            if (rel >= 0 && rel < CHUNK) continue;             // an own column, read above
            const int col = cs + rel;
            const bool inside = row_ok && col >= 0 && col < W;
            HOST_CHECK(!inside || (ih - s.a) * W + col < tile_floats);
            in[rel - REL_LO] = inside ? load_value(row[col]) : 0.0f;
        }
        // Output row r reads this input row through tap i = (t_row - r*SH) / DH.
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
            const int d = t_row - r * SH;
            if (d >= 0 && d % DH == 0 && d / DH < KH) {
                const int i = d / DH;
#pragma unroll
                for (int v = 0; v < OUT_COLS; ++v)
#pragma unroll
                    for (int j = 0; j < KW; ++j)
                        acc[r][v] = fmaf(wr[i * KW + j], in[v * SW - PAD_LEFT + j * DW - REL_LO],
                                         acc[r][v]);
            }
        }
    }

    storage_t* yp = y + (size_t)plane * OH * OW;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        const int oh = oh0 + r;
        if (oh >= s.r1) break;
#pragma unroll
        for (int m = 0; m < OUT_COLS; m += VEC_OUT) {
            if (ow0 + m >= OW) break;
            float out[VEC_OUT];
#pragma unroll
            for (int e = 0; e < VEC_OUT; ++e) out[e] = activate(acc[r][m + e], act);
            store_values<VEC_OUT>(yp + (size_t)oh * OW + ow0 + m, out);
        }
    }
}

// y[plane, oh, ow] = act(bias[c] + sum_{i,j} w[c, i, j] *
//                        x[plane, oh*SH - pad_top + i*DH, ow*SW - PAD_LEFT + j*DW])
// with plane = n*C + c and zero outside the input; bias may be null. With
// FLIP the taps run backwards (w[c, KH-1-i, KW-1-j]). Grid: one block per
// (group of planes_per_block planes, strip) = ceil(planes / planes_per_block)
// * strips blocks, strips of a plane group adjacent; dynamic shared memory
// planes_per_block * tile_floats values (storage_t).
extern "C" __global__ void __launch_bounds__(DW_MAX_THREADS) depthwise_forward(
        const storage_t* __restrict__ x, const storage_t* __restrict__ w,
        const storage_t* __restrict__ bias, storage_t* __restrict__ y,
        int planes, int C, int H, int W, int OH, int OW, int pad_top, int act,
        int planes_per_block, int strip_rows, int strips, int tile_floats,
        int row_groups, int col_groups) {
    extern __shared__ __align__(16) float staged[];
    storage_t* tile = reinterpret_cast<storage_t*>(staged);
    const Strip s = strip_of(blockIdx.x, planes, H, OH, pad_top, planes_per_block, strip_rows,
                             strips);
    stage_strip(x, tile, s, threadIdx.x, blockDim.x, H, W, tile_floats);
    copies_done();
    __syncthreads();
    compute_strip(tile, w, bias, y, s, threadIdx.x, C, H, W, OH, OW, pad_top, act, tile_floats,
                  row_groups, col_groups);
}

// ------------------------------------------------------------- backward --
// Backward-data at stride 1 runs depthwise_forward (see depthwise.py); the
// kernel below serves strided geometries. A block is (BX, BY, BZ) threads:
// BZ planes, a tile of BX x BY*RPT gx entries of each, staged gy in shared
// memory sized by the host (depthwise.py: tiles, _backward_shared_bytes).

// Rows (or columns) of gy that a tile of `extent` gx rows starting at h0 reads:
// gy row oh feeds gx row h = oh*S - pad + i*D, so oh runs from
// floor((h0 + pad - (K-1)*D) / S) to floor((h0 + extent - 1 + pad) / S).
// The count is at most this bound; the host sizes shared memory with it.
__host__ __device__ constexpr int gy_extent(int extent, int k, int s, int d) {
    return (extent - 1 + (k - 1) * d + s - 1) / s + 1;
}

// gx[plane, h, w] = sum over taps (i, j) and outputs (oh, ow) with
// h = oh*SH - pad_top + i*DH, w = ow*SW - pad_left + j*DW of
// w[c, i, j] * gy[plane, oh, ow]: the adjoint of depthwise_forward, computed
// as a gather (one thread per gx element, no atomics). Grid: (plane groups,
// tiles along W, tiles along H).
extern "C" __global__ void depthwise_backward_data(
        const float* __restrict__ gy, const float* __restrict__ w, float* __restrict__ gx,
        int planes, int C, int H, int W, int OH, int OW, int pad_top, int pad_left) {
    extern __shared__ float smem[];
    const int tile_w = blockDim.x, tile_h = blockDim.y * RPT;
    const int g_w = gy_extent(tile_w, KW, SW, DW);
    const int g_h = gy_extent(tile_h, KH, SH, DH);
    const int plane = blockIdx.x * blockDim.z + threadIdx.z;
    const int h0 = blockIdx.z * tile_h, w0 = blockIdx.y * tile_w;
    const int oh_lo = floor_div(h0 + pad_top - (KH - 1) * DH, SH);
    const int ow_lo = floor_div(w0 + pad_left - (KW - 1) * DW, SW);
    float* tile = smem + threadIdx.z * g_h * g_w;

    if (plane < planes) {
        const float* gp = gy + (size_t)plane * OH * OW;
        const int threads = blockDim.x * blockDim.y;
        for (int k = threadIdx.y * blockDim.x + threadIdx.x; k < g_h * g_w; k += threads) {
            const int r = k / g_w, q = k - r * g_w;
            const int oh = oh_lo + r, ow = ow_lo + q;
            tile[k] = (oh >= 0 && oh < OH && ow >= 0 && ow < OW) ? __ldg(gp + oh * OW + ow) : 0.0f;
        }
    }
    __syncthreads();
    const int ox = threadIdx.x, oy = threadIdx.y * RPT;
    if (plane >= planes || w0 + ox >= W || h0 + oy >= H) return;

    const int c = plane % C;
    float wr[KH * KW];
#pragma unroll
    for (int t = 0; t < KH * KW; ++t) wr[t] = __ldg(w + c * (KH * KW) + t);

    // Offsets of this thread's gx column within the staged gy tile, in units
    // of gy columns times SW; non-negative by the choice of ow_lo.
    const int cw = w0 + ox + pad_left - ow_lo * SW;
    float* gxp = gx + (size_t)plane * H * W + (size_t)(h0 + oy) * W + w0 + ox;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        const int ch = h0 + oy + r + pad_top - oh_lo * SH;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < KH; ++i) {
            const int th = ch - i * DH;
            // With a stride, only taps landing on a multiple of it read an
            // output; the others contribute zero (a select, not a branch, so
            // a warp whose lanes differ in parity does not diverge).
            const bool on_row = (SH == 1) || (th % SH == 0);
#pragma unroll
            for (int j = 0; j < KW; ++j) {
                const int tw = cw - j * DW;
                const bool on = on_row && ((SW == 1) || (tw % SW == 0));
                const float v = tile[(th / SH) * g_w + tw / SW];
                acc = fmaf(wr[i * KW + j], on ? v : 0.0f, acc);
            }
        }
        if (h0 + oy + r < H) gxp[r * W] = acc;
    }
}

// Weight gradient, first pass: partial[split, c, i*KW + j] = sum over the
// output rows (n, oh) of this split and all ow of
//     gy[n, c, oh, ow] * x[n, c, oh*SH - pad_top + i*DH, ow*SW - pad_left + j*DW].
// Grid (C, splits), one block of DW_BWD_BLOCK threads per (channel, split);
// each thread keeps the KH*KW sums in registers, then the block adds them up.
// The host sums the partials over splits (a second, deterministic pass).
#ifndef DW_BWD_BLOCK
#define DW_BWD_BLOCK 256
#endif
extern "C" __global__ void __launch_bounds__(DW_BWD_BLOCK) depthwise_backward_weight(
        const float* __restrict__ x, const float* __restrict__ gy, float* __restrict__ partial,
        int N, int C, int H, int W, int OH, int OW, int pad_top, int pad_left,
        int rows_per_split) {
    const int c = blockIdx.x, split = blockIdx.y;
    const int row0 = split * rows_per_split;
    const int row1 = min(N * OH, row0 + rows_per_split);
    float acc[KH * KW];
#pragma unroll
    for (int t = 0; t < KH * KW; ++t) acc[t] = 0.0f;

    const int items = (row1 - row0) * OW;
    for (int k = threadIdx.x; k < items; k += DW_BWD_BLOCK) {
        const int row = row0 + k / OW, ow = k % OW;
        const int n = row / OH, oh = row - n * OH;
        const size_t plane = (size_t)n * C + c;
        const float g = __ldg(gy + plane * OH * OW + oh * OW + ow);
        const float* xp = x + plane * H * W;
        const int ih0 = oh * SH - pad_top, iw0 = ow * SW - pad_left;
#pragma unroll
        for (int i = 0; i < KH; ++i) {
            const int ih = ih0 + i * DH;
            const bool row_inside = ih >= 0 && ih < H;
#pragma unroll
            for (int j = 0; j < KW; ++j) {
                const int iw = iw0 + j * DW;
                const float v = (row_inside && iw >= 0 && iw < W) ? __ldg(xp + ih * W + iw) : 0.0f;
                acc[i * KW + j] = fmaf(g, v, acc[i * KW + j]);
            }
        }
    }

    __shared__ float warp_sums[DW_BWD_BLOCK / 32][KH * KW];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < KH * KW; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) warp_sums[warp][t] = v;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < KH * KW; t += DW_BWD_BLOCK) {
        float s = 0.0f;
        for (int k = 0; k < DW_BWD_BLOCK / 32; ++k) s += warp_sums[k][t];
        partial[((size_t)split * C + c) * (KH * KW) + t] = s;
    }
}
