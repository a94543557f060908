// Strided convolutions as stride-1 convolutions on a sub-pixel grid: the
// weight rearrangement and the two layout changes around the inner
// convolution. Python side, with the index arithmetic derived:
// gdnflow/ops/subpixel.py.
//
// Names follow the strided convolution C: x [N, CX, H, W] is its input,
// w [CY, CX, KH, KW] its weight. x' = x split by phase is [N, SH*SW*CX, QH, QW]:
// channel (rh * SW + rw) * CX + c, cell (qh, qw) holds x[n, c, qh*SH + rh,
// qw*SW + rw] (zero past the edge). The inner weight w' is
// [SH*SW*CX, CY, TH, TW]. Arrays are storage_t: float, or a 16-bit float in
// the modules built with -DSTORAGE_BF16 / -DSTORAGE_FP16 (the kernels only
// move values, so a 16-bit module changes none).
#include "gdnflow_common.cuh"

// The kernel tap that inner tap t of phase r carries along one axis, or -1.
// Phase r of x receives tap k = stride*m + b with b = (r + pad) % stride, from
// y[q + a - m] with a = (r + pad) / stride; the inner correlation reads
// y[q - inner_pad + t], so m = a + inner_pad - t.
__device__ __forceinline__ int phase_tap(int r, int t, int stride, int pad, int kernel,
                                         int inner_pad) {
    const int a = (r + pad) / stride, b = (r + pad) % stride;
    const int m = a + inner_pad - t;
    const int tap = stride * m + b;
    return (m >= 0 && tap < kernel) ? tap : -1;
}

// w' from w: one thread per element of w', zero where no tap lands.
extern "C" __global__ void subpixel_weight(
        const storage_t* __restrict__ w, storage_t* __restrict__ w_sub, int CY, int CX, int KH,
        int KW,
        int SH, int SW, int pad_top, int pad_left, int inner_top, int inner_left, int TH,
        int TW) {
    const int total = SH * SW * CX * CY * TH * TW;
    GRID_STRIDE_LOOP(idx, total) {
        int t = idx;
        const int tw = t % TW;
        t /= TW;
        const int th = t % TH;
        t /= TH;
        const int o = t % CY;
        t /= CY;
        const int c = t % CX;
        const int phase = t / CX;
        const int kh = phase_tap(phase / SW, th, SH, pad_top, KH, inner_top);
        const int kw = phase_tap(phase % SW, tw, SW, pad_left, KW, inner_left);
        w_sub[idx] = (kh < 0 || kw < 0) ? store_value(0.0f)
                                        : w[((o * CX + c) * KH + kh) * KW + kw];
    }
}

// x [N, C, H, W] from x' (drops the cells past the edge). One thread per
// element of x, so the writes are coalesced; a warp's reads fall on SW planes.
extern "C" __global__ void subpixel_interleave(
        const storage_t* __restrict__ x_sub, storage_t* __restrict__ x, int N, int C, int H,
        int W,
        int QH, int QW, int SH, int SW) {
    const int total = N * C * H * W;
    GRID_STRIDE_LOOP(idx, total) {
        int t = idx;
        const int col = t % W;
        t /= W;
        const int row = t % H;
        t /= H;
        const int c = t % C;
        const int n = t / C;
        const int phase = (row % SH) * SW + col % SW;
        x[idx] = x_sub[((n * SH * SW + phase) * C + c) * QH * QW + (row / SH) * QW + col / SW];
    }
}

// x' from x [N, C, H, W] (zeros in the cells past the edge). One thread per
// element of x', so the writes are coalesced.
extern "C" __global__ void subpixel_split(
        const storage_t* __restrict__ x, storage_t* __restrict__ x_sub, int N, int C, int H,
        int W,
        int QH, int QW, int SH, int SW) {
    const int total = N * SH * SW * C * QH * QW;
    GRID_STRIDE_LOOP(idx, total) {
        int t = idx;
        const int qw = t % QW;
        t /= QW;
        const int qh = t % QH;
        t /= QH;
        const int c = t % C;
        t /= C;
        const int phase = t % (SH * SW);
        const int n = t / (SH * SW);
        const int row = qh * SH + phase / SW, col = qw * SW + phase % SW;
        x_sub[idx] = (row < H && col < W) ? x[((n * C + c) * H + row) * W + col]
                                          : store_value(0.0f);
    }
}
