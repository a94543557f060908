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

// Section "window fixed at compile time": both windowed pools' forward for
// the common windows (-DPOOL_KH, POOL_KW, POOL_SH, POOL_SW; -DPOOL_MAX for the
// maximum, else the average), without argmax (the max pool's inference forward).
// The kernels above loop over runtime window bounds and split every output's
// index with three divisions: Inception's 3x3 stride-1 average pools ran at
// about a fifth of HBM bandwidth (0.6 ms at batch 32 on an H200, for 0.13 ms
// of traffic). Here a thread computes POOL_Q consecutive outputs of one row:
// it reads each of the KH input rows' (POOL_Q - 1) * SW + KW columns once,
// the window loops unroll, and one index split serves POOL_Q outputs.
// Padding reads as -inf (max) or 0 (average), so each output's terms are
// combined in the order of the kernels above and the results are the same.
//
// x comes as up to POOL_PARTS parts of a concatenation along the channels
// (part k holds channels [start[k], start[k + 1]) of the `channels`, itself
// [N, start[k + 1] - start[k], H, W]): an inference plan pools a concatenation
// read by nothing else from its parts, so it is never written (SqueezeNet's
// fire modules before each pool). A plain input is one part.
#ifdef POOL_KH
#define POOL_Q 4
#define POOL_PARTS 4
struct PoolParts {                          // passed by value (the host packs it)
    const storage_t* x[POOL_PARTS];
    int start[POOL_PARTS + 1];
};

extern "C" __global__ void pool_forward_fixed(
        storage_t* __restrict__ y, int planes, int h, int w, int oh, int ow, int pad_top,
        int pad_left, int include_pad, int q_groups, int channels,
        const __grid_constant__ PoolParts parts) {
    constexpr int SPAN = (POOL_Q - 1) * POOL_SW + POOL_KW;
#ifdef POOL_MAX
    const float pad = -INFINITY;
#else
    const float pad = 0.0f;
#endif
    GRID_STRIDE_LOOP(i, planes * oh * q_groups) {
        const int group = i % q_groups, row = i / q_groups;
        const int p = row % oh, plane = row / oh;
        const int q0 = group * POOL_Q;
        const int h0 = p * POOL_SH - pad_top, w0 = q0 * POOL_SW - pad_left;
        const int n = plane / channels, c = plane - n * channels;
        int part = 0;
        while (c >= parts.start[part + 1]) ++part;
        const int width = parts.start[part + 1] - parts.start[part];
        const storage_t* xp =
            parts.x[part] + ((size_t)n * width + c - parts.start[part]) * h * w;
        float acc[POOL_Q];
#pragma unroll
        for (int k = 0; k < POOL_Q; ++k) acc[k] = pad;
#pragma unroll
        for (int r = 0; r < POOL_KH; ++r) {
            const int ih = h0 + r;
            if (ih < 0 || ih >= h) continue;
            float v[SPAN];
#pragma unroll
            for (int s = 0; s < SPAN; ++s) {
                const int iw = w0 + s;
                v[s] = iw >= 0 && iw < w ? load_value(xp[(size_t)ih * w + iw]) : pad;
            }
#pragma unroll
            for (int k = 0; k < POOL_Q; ++k)
#pragma unroll
                for (int j = 0; j < POOL_KW; ++j) {
                    const float t = v[k * POOL_SW + j];
#ifdef POOL_MAX
                    if (t > acc[k] || (isnan(t) && !isnan(acc[k]))) acc[k] = t;
#else
                    acc[k] += t;
#endif
                }
        }
        storage_t* yp = y + (size_t)row * ow + q0;
#pragma unroll
        for (int k = 0; k < POOL_Q; ++k) {
            if (q0 + k >= ow) break;
#ifdef POOL_MAX
            yp[k] = store_value(acc[k]);
#else
            yp[k] = store_value(acc[k] / window_count(p, q0 + k, h, w, POOL_KH, POOL_KW, POOL_SH,
                                                      POOL_SW, pad_top, pad_left, include_pad));
#endif
        }
    }
}
#endif
