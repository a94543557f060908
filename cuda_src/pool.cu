// 2-D pooling over NCHW planes. Python side: gdnflow/ops/pool.py. Built for
// float tensors, and with -DSTORAGE_BF16 / -DSTORAGE_FP16 for 16-bit ones (the
// windowed pools; sums in float, rounded once).
//
// The input is seen as P = N*C planes of H x W, the output as P planes of
// OH x OW. Output (p, q) pools the window of rows p*sh - pad_top + [0, kh)
// and columns q*sw - pad_left + [0, kw), clipped to the input: the padding
// contributes -inf to a maximum and zeros to an average (counted in the
// divisor only with count_include_pad).
//
// The backward kernels gather: one thread per input element adds up the
// gradients of the outputs whose window covers it. No atomics, so results do
// not depend on scheduling, and gx needs no zero-fill pass first.
#include "gdnflow_common.cuh"

// The first output index whose window (of extent k, stride s, offset pad)
// covers input index i: ceil((i + pad - k + 1) / s), at least 0.
__device__ __forceinline__ int first_window(int i, int pad, int k, int s) {
    const int num = i + pad - k + 1;
    return num <= 0 ? 0 : (num + s - 1) / s;
}

// y[p, q] = max over the window; argmax (if not null) = the row-major index
// h * W + w of the maximum within its plane, the first one on ties (as
// NumPy's argmax); NaN wins and stays (the first NaN), as in NumPy and PyTorch.
extern "C" __global__ void max_pool_forward(
        const storage_t* __restrict__ x, storage_t* __restrict__ y, int* __restrict__ argmax,
        int planes, int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
        int pad_top, int pad_left) {
    GRID_STRIDE_LOOP(i, planes * oh * ow) {
        const int q = i % ow, t = i / ow, p = t % oh, plane = t / oh;
        const int h0 = p * sh - pad_top, w0 = q * sw - pad_left;
        const int hs = max(h0, 0), he = min(h0 + kh, h);
        const int ws = max(w0, 0), we = min(w0 + kw, w);
        const storage_t* xp = x + (size_t)plane * h * w;
        // padding < kernel (checked on the host) keeps every window non-empty.
        int best_index = hs * w + ws;
        float best = load_value(xp[best_index]);
        for (int r = hs; r < he; ++r)
            for (int c = ws; c < we; ++c) {
                const float v = load_value(xp[r * w + c]);
                if (v > best || (isnan(v) && !isnan(best))) { best = v; best_index = r * w + c; }
            }
        y[i] = store_value(best);
        if (argmax) argmax[i] = best_index;
    }
}

// gx[r, c] = sum of gy[p, q] over the outputs whose argmax is (r, c).
extern "C" __global__ void max_pool_backward(
        const storage_t* __restrict__ gy, const int* __restrict__ argmax, storage_t* __restrict__ gx,
        int planes, int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
        int pad_top, int pad_left) {
    GRID_STRIDE_LOOP(i, planes * h * w) {
        const int c = i % w, t = i / w, r = t % h, plane = t / h;
        const int p0 = first_window(r, pad_top, kh, sh), p1 = min(oh - 1, (r + pad_top) / sh);
        const int q0 = first_window(c, pad_left, kw, sw), q1 = min(ow - 1, (c + pad_left) / sw);
        const size_t base = (size_t)plane * oh * ow;
        const int self = r * w + c;
        float acc = 0.0f;
        for (int p = p0; p <= p1; ++p)
            for (int q = q0; q <= q1; ++q) {
                const size_t o = base + p * ow + q;
                if (argmax[o] == self) acc += load_value(gy[o]);
            }
        gx[i] = store_value(acc);
    }
}

// The divisor of the average at output (p, q): the whole window with
// count_include_pad (ceil_mode is off, so the window always lies inside the
// padded input), else the number of input elements under it.
__device__ __forceinline__ float window_count(int p, int q, int h, int w, int kh, int kw,
                                              int sh, int sw, int pad_top, int pad_left,
                                              int include_pad) {
    if (include_pad) return (float)(kh * kw);
    const int h0 = p * sh - pad_top, w0 = q * sw - pad_left;
    return (float)((min(h0 + kh, h) - max(h0, 0)) * (min(w0 + kw, w) - max(w0, 0)));
}

extern "C" __global__ void avg_pool_forward(
        const storage_t* __restrict__ x, storage_t* __restrict__ y,
        int planes, int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
        int pad_top, int pad_left, int include_pad) {
    GRID_STRIDE_LOOP(i, planes * oh * ow) {
        const int q = i % ow, t = i / ow, p = t % oh, plane = t / oh;
        const int h0 = p * sh - pad_top, w0 = q * sw - pad_left;
        const int hs = max(h0, 0), he = min(h0 + kh, h);
        const int ws = max(w0, 0), we = min(w0 + kw, w);
        const storage_t* xp = x + (size_t)plane * h * w;
        float acc = 0.0f;
        for (int r = hs; r < he; ++r)
            for (int c = ws; c < we; ++c) acc += load_value(xp[r * w + c]);
        y[i] = store_value(
            acc / window_count(p, q, h, w, kh, kw, sh, sw, pad_top, pad_left, include_pad));
    }
}

// gx[r, c] = sum of gy[p, q] / count(p, q) over the windows covering (r, c).
extern "C" __global__ void avg_pool_backward(
        const storage_t* __restrict__ gy, storage_t* __restrict__ gx,
        int planes, int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
        int pad_top, int pad_left, int include_pad) {
    GRID_STRIDE_LOOP(i, planes * h * w) {
        const int c = i % w, t = i / w, r = t % h, plane = t / h;
        const int p0 = first_window(r, pad_top, kh, sh), p1 = min(oh - 1, (r + pad_top) / sh);
        const int q0 = first_window(c, pad_left, kw, sw), q1 = min(ow - 1, (c + pad_left) / sw);
        const storage_t* gp = gy + (size_t)plane * oh * ow;
        float acc = 0.0f;
        for (int p = p0; p <= p1; ++p)
            for (int q = q0; q <= q1; ++q)
                acc += load_value(gp[p * ow + q]) /
                       window_count(p, q, h, w, kh, kw, sh, sw, pad_top, pad_left, include_pad);
        gx[i] = store_value(acc);
    }
}

// Global average pooling's backward: gx[plane, j] = scale * gy[plane] for
// every pixel j of the plane (scale = 1 / (H*W)). The forward is a row sum
// (gdnflow/ops/reduction.py).
extern "C" __global__ void global_avg_pool_backward(
        const float* __restrict__ gy, float* __restrict__ gx, int n, int pixels, float scale) {
    GRID_STRIDE_LOOP(i, n) gx[i] = gy[i / pixels] * scale;
}
