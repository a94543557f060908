// Direct sparse convolution (Park et al. 2017; GPU: Chen et al. 2018), NCHW
// float32. Python side: gdnflow/sparse/conv.py (it also derives every -D below).
//
// One kernel shape serves the forward and, with a transposed filter, each
// stride phase of the backward-data pass:
//
//   out[n, o, out_row0 + u*out_sh, out_col0 + v*out_sw] = bias[o]
//       + sum_{k in row o} values[k] * in[n, c_k, u*SH + row0 + di_k, v*SW + col0 + dj_k]
//
// for u < U, v < V, zero outside the input. A block owns one TH x TW tile of
// (u, v) and WARPS*CPW output channels (CPW per warp); each lane computes ROWS
// vertically adjacent outputs of its column for each of its warp's channels.
// The block walks the input channels CC at a time: it stages the CC input
// planes its tile reads (IN_H x IN_W each, zero outside the image, so no
// padded copy of the input is ever made) into shared memory, then every warp
// runs the CSR entries of its channels that fall in those CC planes.
//
// Column indices are offsets into the staged tile:
//     offset = (c mod CC)*IN_H*PITCH + di*PITCH + dj
// and chunk_ptr[o*(n_chunks+1) + ch] is where row o's entries of channel
// chunk ch begin (rows are sorted by c, so each chunk is a contiguous range).
// The forward reads each entry as one float2 (value, offset bits), packed by
// pack_entries or gather_pack: an entry then costs each lane one broadcast
// 8-byte load and ROWS shared-memory loads + FMAs at immediate offsets. Those
// shared loads (4 bytes per FMA) are the bound: 32 FMAs per clock per SM, a
// quarter of the FP32 peak, since an unstructured pattern leaves no operand
// to keep in registers across entries.
//
// Compile-time: TW (tile width, 8/16/32: lanes across, 32/TW row groups down),
// ROWS (outputs per lane), CPW (channels per warp), CC (channels per stage),
// SH, SW (input step per output), SPAN_H, SPAN_W (input rows/cols one output
// reads: (kh-1)*dh + 1 for a forward), PITCH (shared row pitch >= IN_W, chosen
// by the host to spread the lanes over the 32 banks).
#include "gdnflow_common.cuh"

#ifndef TW
#define TW 32
#endif
#ifndef ROWS
#define ROWS 8
#endif
#ifndef CPW
#define CPW 4
#endif
#ifndef CC
#define CC 16
#endif
#ifndef SH
#define SH 1
#endif
#ifndef SW
#define SW 1
#endif
#ifndef SPAN_H
#define SPAN_H 3
#endif
#ifndef SPAN_W
#define SPAN_W 3
#endif

#define WARPS 8
#define THREADS (WARPS * 32)
// Blocks per SM the register allocation must allow (64 registers a thread):
// the staging batch below would otherwise take registers up to occupancy 2.
#define MIN_BLOCKS 4
#define LY (32 / TW)                       // row groups of lanes
#define TH (ROWS * LY)                     // tile height in outputs
#define IN_H ((TH - 1) * SH + SPAN_H)      // staged rows per plane
#define IN_W ((TW - 1) * SW + SPAN_W)      // staged columns per plane
#ifndef PITCH
#define PITCH IN_W
#endif
#define IN_PLANE (IN_H * PITCH)

static_assert(TW == 8 || TW == 16 || TW == 32, "TW must be 8, 16 or 32");
static_assert(PITCH >= IN_W, "PITCH must hold a staged row");
static_assert(CC * IN_PLANE * 4 <= 48 * 1024, "staged tile exceeds 48 KB of shared memory");

// The block's tile and channel group, from the flat block index: channel
// groups vary fastest, so the blocks that stage the same input tile run
// side by side and share it in L2.
struct TileIndex {
    int n, u0, v0, group;
};

__device__ __forceinline__ TileIndex tile_index(int groups, int tiles_u, int tiles_v) {
    TileIndex t;
    int b = blockIdx.x;
    t.group = b % groups;
    b /= groups;
    t.v0 = (b % tiles_v) * TW;
    b /= tiles_v;
    t.u0 = (b % tiles_u) * TH;
    t.n = b / tiles_u;
    return t;
}

// tile[cl][r][q] <- in_image[c0 + cl][row0 + r][col0 + q], zero outside the
// image and for channels >= C. The CC*IN_H*IN_W elements are numbered row by
// row (consecutive threads, consecutive columns: coalesced) and each thread
// issues STAGE_BATCH loads before it stores any: with one load in flight per
// thread, each staged row cost a full L2 round trip, and staging bounded the
// kernel on layers with short CSR rows (an RGB first layer).
#define STAGE_ELEMENTS (CC * IN_H * IN_W)
#define STAGE_PER_THREAD ((STAGE_ELEMENTS + THREADS - 1) / THREADS)
#define STAGE_BATCH 4
__device__ __forceinline__ void stage_tile(float* __restrict__ tile,
                                           const float* __restrict__ in_image, int C, int IH,
                                           int IW, int c0, int row0, int col0) {
#pragma unroll 1
    for (int b0 = 0; b0 < STAGE_PER_THREAD; b0 += STAGE_BATCH) {
        float value[STAGE_BATCH];
        int slot[STAGE_BATCH];
#pragma unroll
        for (int b = 0; b < STAGE_BATCH; ++b) {
            const int e = (b0 + b) * THREADS + threadIdx.x;
            slot[b] = -1;
            value[b] = 0.0f;
            if (b0 + b < STAGE_PER_THREAD && e < STAGE_ELEMENTS) {
                const int cl = e / (IN_H * IN_W), rest = e - cl * (IN_H * IN_W);
                const int r = rest / IN_W, q = rest - r * IN_W;
                const int c = c0 + cl, ih = row0 + r, iw = col0 + q;
                slot[b] = cl * IN_PLANE + r * PITCH + q;
                if (c < C && ih >= 0 && ih < IH && iw >= 0 && iw < IW)
                    value[b] = __ldg(in_image + ((size_t)c * IH + ih) * IW + iw);
            }
        }
#pragma unroll
        for (int b = 0; b < STAGE_BATCH; ++b)
            if (slot[b] >= 0) tile[slot[b]] = value[b];
    }
}

// out <- the sparse convolution above (bias may be null). Launch with
// THREADS threads and groups * tiles_u * tiles_v * N blocks, where
// groups = ceil(C_out / (WARPS*CPW)), tiles_u = ceil(U / TH), tiles_v = ceil(V / TW).
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) sparse_conv_forward(
        const float* __restrict__ in, const float2* __restrict__ entries,
        const int* __restrict__ chunk_ptr, const float* __restrict__ bias,
        float* __restrict__ out,
        int C_in, int IH, int IW, int C_out, int OH, int OW, int U, int V,
        int row0, int col0, int out_row0, int out_col0, int out_sh, int out_sw,
        int groups, int tiles_u, int tiles_v, int n_chunks) {
    __shared__ float tile[CC * IN_PLANE];
    const TileIndex t = tile_index(groups, tiles_u, tiles_v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int lx = lane % TW, ly = lane / TW;
    const float* in_image = in + (size_t)t.n * C_in * IH * IW;
    const float* tp = tile + ly * (ROWS * SH) * PITCH + lx * SW;
    const int o_first = (t.group * WARPS + warp) * CPW;

    float acc[CPW][ROWS];
#pragma unroll
    for (int m = 0; m < CPW; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.0f;

    for (int ch = 0; ch < n_chunks; ++ch) {
        stage_tile(tile, in_image, C_in, IH, IW, ch * CC, t.u0 * SH + row0, t.v0 * SW + col0);
        __syncthreads();
#pragma unroll
        for (int m = 0; m < CPW; ++m) {
            const int o = o_first + m;
            if (o < C_out) {                         // warp-uniform
                const int* cp = chunk_ptr + (size_t)o * (n_chunks + 1) + ch;
                const int k_end = __ldg(cp + 1);
#pragma unroll 2
                for (int k = __ldg(cp); k < k_end; ++k) {
                    const float2 e = __ldg(entries + k);
                    const float* src = tp + __float_as_int(e.y);
#pragma unroll
                    for (int r = 0; r < ROWS; ++r)
                        acc[m][r] = fmaf(e.x, src[r * SH * PITCH], acc[m][r]);
                }
            }
        }
        __syncthreads();
    }

    // The stores step a pointer by one output row (out_sh*OW) each: indexing
    // every row from the plane's start took ~15 instructions a store, about a
    // third of the kernel's issue slots on layers with short CSR rows.
    const int v = t.v0 + lx;
    const int u_first = t.u0 + ly * ROWS;
    if (v >= V || u_first >= U) return;
    const int rows_here = min(ROWS, U - u_first);
    const size_t row_step = (size_t)out_sh * OW;
#pragma unroll
    for (int m = 0; m < CPW; ++m) {
        const int o = o_first + m;
        if (o >= C_out) break;
        const float b = bias ? __ldg(bias + o) : 0.0f;
        float* yp = out + ((size_t)t.n * C_out + o) * OH * OW
                    + (size_t)(out_row0 + u_first * out_sh) * OW + out_col0 + (size_t)v * out_sw;
        if (rows_here == ROWS) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r, yp += row_step) *yp = acc[m][r] + b;
        } else {
#pragma unroll
            for (int r = 0; r < ROWS; ++r, yp += row_step)
                if (r < rows_here) *yp = acc[m][r] + b;
        }
    }
}

// gvalues[k] += sum_{n, u, v} gout[n, o_k, u, v] * (the input tap k reads at
// output (u, v)): the gradient of the forward's values, for the forward's
// geometry (out_row0 = out_col0 = 0, out_sh = out_sw = 1). gvalues must be
// zeroed first: each warp adds its tile's partial sum with one atomic.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) sparse_conv_values_grad(
        const float* __restrict__ in, const float* __restrict__ gout,
        const int* __restrict__ offsets, const int* __restrict__ chunk_ptr,
        float* __restrict__ gvalues,
        int C_in, int IH, int IW, int C_out, int OH, int OW,
        int row0, int col0, int groups, int tiles_u, int tiles_v, int n_chunks) {
    __shared__ float tile[CC * IN_PLANE];
    const TileIndex t = tile_index(groups, tiles_u, tiles_v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int lx = lane % TW, ly = lane / TW;
    const float* in_image = in + (size_t)t.n * C_in * IH * IW;
    const float* tp = tile + ly * (ROWS * SH) * PITCH + lx * SW;
    const int o_first = (t.group * WARPS + warp) * CPW;
    const int v = t.v0 + lx;

    // This lane's output gradients, zero where the tile overhangs the output.
    float g[CPW][ROWS];
#pragma unroll
    for (int m = 0; m < CPW; ++m) {
        const int o = o_first + m;
        const float* gp = gout + ((size_t)t.n * C_out + (o < C_out ? o : 0)) * OH * OW + v;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int u = t.u0 + ly * ROWS + r;
            g[m][r] = (o < C_out && u < OH && v < OW) ? __ldg(gp + (size_t)u * OW) : 0.0f;
        }
    }

    for (int ch = 0; ch < n_chunks; ++ch) {
        stage_tile(tile, in_image, C_in, IH, IW, ch * CC, t.u0 * SH + row0, t.v0 * SW + col0);
        __syncthreads();
#pragma unroll
        for (int m = 0; m < CPW; ++m) {
            const int o = o_first + m;
            if (o < C_out) {
                const int* cp = chunk_ptr + (size_t)o * (n_chunks + 1) + ch;
                const int k_end = __ldg(cp + 1);
                for (int k = __ldg(cp); k < k_end; ++k) {
                    const float* src = tp + __ldg(offsets + k);
                    float s = 0.0f;
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) s = fmaf(g[m][r], src[r * SH * PITCH], s);
                    s = warp_sum(s);
                    if (lane == 0) atomicAdd(gvalues + k, s);
                }
            }
        }
        __syncthreads();
    }
}

// entries[k] = (values[k], offsets[k] as float bits): the forward's operand.
extern "C" __global__ void pack_entries(const float* __restrict__ values,
                                        const int* __restrict__ offsets,
                                        float2* __restrict__ entries, int n) {
    GRID_STRIDE_LOOP(k, n) entries[k] = make_float2(__ldg(values + k),
                                                    __int_as_float(__ldg(offsets + k)));
}

// entries[k] = (values[index[k]], offsets[k] as float bits): the values in the
// order of the transposed filters of the backward-data phases.
extern "C" __global__ void gather_pack(const float* __restrict__ values,
                                       const int* __restrict__ index,
                                       const int* __restrict__ offsets,
                                       float2* __restrict__ entries, int n) {
    GRID_STRIDE_LOOP(k, n) entries[k] = make_float2(__ldg(values + __ldg(index + k)),
                                                    __int_as_float(__ldg(offsets + k)));
}

// a[i] *= b[i], in place: pruning masks applied to weights after an optimiser step.
extern "C" __global__ void multiply_in_place(float* __restrict__ a, const float* __restrict__ b,
                                             int n) {
    GRID_STRIDE_LOOP(i, n) a[i] *= __ldg(b + i);
}
