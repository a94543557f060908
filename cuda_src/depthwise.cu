// Depthwise 2-D convolution (groups == C_in == C_out), NCHW float32: a direct
// convolution per (image, channel) plane. Python side: gdnflow/ops/depthwise.py.
//
// Why not im2col + GEMM: each output reads KH*KW inputs and multiplies them by
// KH*KW weights of its own channel, a "GEMM" of one row. The work is all
// memory traffic, so the kernels read each input once into shared memory and
// keep the weights in registers.
//
// The kernel geometry is compile-time (-D): KH, KW (taps), SH, SW (strides),
// DH, DW (dilations) and RPT (outputs per thread, stacked vertically), so every
// tap loop unrolls and the tap/row bookkeeping folds into constants. Tile
// sizes are runtime: a block is (BX, BY, BZ) threads, BZ planes side by side,
// each plane's tile BX outputs wide and BY*RPT tall; shared memory is sized by
// the host (gdnflow/ops/depthwise.py computes the same extents).
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

// Activation codes, as gdnflow/ops/conv.py's ACTIVATIONS maps them.
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_RELU6 2

__device__ __forceinline__ float activate(float v, int act) {
    if (act == ACT_RELU) return fmaxf(v, 0.0f);
    if (act == ACT_RELU6) return fminf(fmaxf(v, 0.0f), 6.0f);
    return v;
}

// floor(a / b) for b > 0 and any sign of a.
__device__ __forceinline__ int floor_div(int a, int b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// y[plane, oh, ow] = act(bias[c] + sum_{i,j} w[c, i, j] *
//                        x[plane, oh*SH - pad_top + i*DH, ow*SW - pad_left + j*DW])
// with plane = n*C + c and zero outside the input. bias may be null.
// Grid: (plane groups of BZ, tiles along OW, tiles along OH); planes go on x,
// the dimension without the 65535 limit.
extern "C" __global__ void depthwise_forward(
        const float* __restrict__ x, const float* __restrict__ w,
        const float* __restrict__ bias, float* __restrict__ y,
        int planes, int C, int H, int W, int OH, int OW,
        int pad_top, int pad_left, int act) {
    extern __shared__ float smem[];
    const int tile_w = blockDim.x, tile_h = blockDim.y * RPT;
    const int in_w = (tile_w - 1) * SW + (KW - 1) * DW + 1;
    const int in_h = (tile_h - 1) * SH + (KH - 1) * DH + 1;
    const int plane = blockIdx.x * blockDim.z + threadIdx.z;
    const int oh0 = blockIdx.z * tile_h, ow0 = blockIdx.y * tile_w;
    float* tile = smem + threadIdx.z * in_h * in_w;

    // Stage the input tile (with its halo, zero-padded) once: each input is
    // then read from shared memory by every output that needs it.
    if (plane < planes) {
        const float* xp = x + (size_t)plane * H * W;
        const int ih0 = oh0 * SH - pad_top, iw0 = ow0 * SW - pad_left;
        const int threads = blockDim.x * blockDim.y;
        for (int k = threadIdx.y * blockDim.x + threadIdx.x; k < in_h * in_w; k += threads) {
            const int r = k / in_w, q = k - r * in_w;
            const int ih = ih0 + r, iw = iw0 + q;
            tile[k] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? __ldg(xp + ih * W + iw) : 0.0f;
        }
    }
    __syncthreads();
    const int ox = threadIdx.x, oy = threadIdx.y * RPT;
    if (plane >= planes || ow0 + ox >= OW || oh0 + oy >= OH) return;

    const int c = plane % C;
    float wr[KH * KW];
#pragma unroll
    for (int t = 0; t < KH * KW; ++t) wr[t] = __ldg(w + c * (KH * KW) + t);
    const float b = bias ? __ldg(bias + c) : 0.0f;
    float acc[RPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) acc[r] = b;

    // The RPT outputs of a thread share input rows: walk the union of rows
    // once, load each row's KW taps once, and add them into every output that
    // uses that row (output r uses input row t through tap i = (t - r*SH)/DH).
    constexpr int ROWS = (RPT - 1) * SH + (KH - 1) * DH + 1;
    const float* base = tile + oy * SH * in_w + ox * SW;
#pragma unroll
    for (int t = 0; t < ROWS; ++t) {
        float v[KW];
#pragma unroll
        for (int j = 0; j < KW; ++j) v[j] = base[t * in_w + j * DW];
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
            const int d = t - r * SH;
            if (d >= 0 && d % DH == 0 && d / DH < KH) {
#pragma unroll
                for (int j = 0; j < KW; ++j) acc[r] = fmaf(wr[(d / DH) * KW + j], v[j], acc[r]);
            }
        }
    }
    float* yp = y + (size_t)plane * OH * OW + (size_t)(oh0 + oy) * OW + ow0 + ox;
#pragma unroll
    for (int r = 0; r < RPT; ++r)
        if (oh0 + oy + r < OH) yp[r * OW] = activate(acc[r], act);
}

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
// as a gather (one thread per gx element, no atomics). Tiling as in the
// forward, over gx: grid (plane groups, tiles along W, tiles along H).
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
