// Winograd convolution F(M x M, 3 x 3), NCHW float32, for 3x3 kernels at
// stride 1, dilation 1, groups 1. Python side: gdnflow/ops/winograd.py, which
// runs the three kernels below around one strided-batched cuBLAS SGEMM.
//
// With A = M + 2 and the transform matrices B^T [A x A], G [A x 3], A^T [M x A]
// (Lavin & Gray 2016; points 0, 1, -1 for M = 2 and 0, 1, -1, 2, -2 for M = 4,
// plus infinity), one output tile Y [M x M] of one (image, output channel) is
//     Y = A^T [ sum_c (G g_c G^T) .* (B^T d_c B) ] A
// where d_c is the A x A input tile of channel c and g_c the 3x3 filter. The
// sum over c, for each of the A*A positions xi = (i, j) of the transformed
// tile, is a matrix product over all tiles at once:
//     M[xi] (C_y x T) = U[xi] (C_y x C_x) @ V[xi] (C_x x T).
//
// The same kernels serve the forward (x -> y) and the backward-data pass
// (gy -> gx, the filter flipped and its channel axes swapped), so they speak
// of a generic "x" (the convolution's input, C_x channels, H_x x W_x) and "y"
// (its output, C_y channels, H_y x W_y):
//     y[n, o, p, q] = sum_{c, i, j} u[o, c, i, j] * x[n, c, p - pad_top + i, q - pad_left + j]
// with x zero outside [0, H_x) x [0, W_x). pad_top/pad_left may be negative
// (backward-data of a convolution padded by more than 2 crops its input).
//
// Tiles. y is cut into TH x TW tiles of M x M per image (TH = ceil(H_y / M):
// the last row and column of tiles may hang over the edge; those outputs are
// computed from zeros and not stored). Tile t = (n * TH + th) * TW + tw; a
// launch handles the chunk of tiles [t_begin, t_begin + T) and its V and M
// buffers are indexed by the tile's place in the chunk, tl = t - t_begin:
//     U[xi][o][c]   at (xi * C_y + o) * C_x + c
//     V[xi][c][tl]  at (xi * C_x + c) * T + tl
//     M[xi][o][tl]  at (xi * C_y + o) * T + tl
// One thread per (channel, tile): consecutive threads take consecutive tiles,
// so the V and M accesses of a warp are contiguous for every xi (with column
// phases, see below, the SW phases of a tile come first: runs of tiles still).
//
// Phase views. The input the input transform reads and the output the output
// transform writes may each be a phase split of a real tensor (the sub-pixel
// rewrite of strided convolutions, gdnflow/ops/subpixel.py): channel
// c = (rh * SW + rw) * C0 + c0, cell (h, w) of the pass's [C, H, W] planes is
// element (c0, h * SH + rh, w * SW + rw) of the real [C0, HS, WS] image, and
// cells past the real tensor's edge are zeros when read and not written.
// SH = SW = 1 (C0 = C, HS = H, WS = W) is the tensor itself. So the rewrite
// needs no pass of its own to split x or interleave y.
//
// The per-thread work is __host__ __device__: tests/ops/test_winograd.py
// compiles this file for the host and runs every thread index through it, so
// the index arithmetic is checked on machines without a GPU.
#include "gdnflow_common.cuh"

#ifdef __CUDA_ARCH__
#define WINOGRAD_LOAD(p) __ldg(p)
#else
#define WINOGRAD_LOAD(p) (*(p))
#endif
#define WINOGRAD_HD __host__ __device__ __forceinline__

// The one-dimensional transforms, written out so that the compiler sees every
// zero and one of the matrices. 2-D transforms apply them to the columns,
// then to the rows. gdnflow/ops/winograd.py holds the same matrices as arrays
// (TRANSFORMS), and the tests check one against the other.
template <int M> struct Transform;

// F(2, 3): points 0, 1, -1, infinity.
template <> struct Transform<2> {
    static constexpr int A = 4;
    // v = B^T d
    WINOGRAD_HD static void input(const float (&d)[4], float (&v)[4]) {
        v[0] = d[0] - d[2];
        v[1] = d[1] + d[2];
        v[2] = d[2] - d[1];
        v[3] = d[1] - d[3];
    }
    // u = G g
    WINOGRAD_HD static void filter(const float (&g)[3], float (&u)[4]) {
        const float even = 0.5f * (g[0] + g[2]), odd = 0.5f * g[1];
        u[0] = g[0];
        u[1] = even + odd;
        u[2] = even - odd;
        u[3] = g[2];
    }
    // y = A^T m
    WINOGRAD_HD static void output(const float (&m)[4], float (&y)[2]) {
        y[0] = m[0] + m[1] + m[2];
        y[1] = m[1] - m[2] - m[3];
    }
};

// F(4, 3): points 0, 1, -1, 2, -2, infinity.
template <> struct Transform<4> {
    static constexpr int A = 6;
    WINOGRAD_HD static void input(const float (&d)[6], float (&v)[6]) {
        const float a = d[4] - 4.0f * d[2], b = d[3] - 4.0f * d[1];   // rows 1, 2
        const float c = d[4] - d[2], e = 2.0f * (d[3] - d[1]);         // rows 3, 4
        v[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];
        v[1] = a + b;
        v[2] = a - b;
        v[3] = c + e;
        v[4] = c - e;
        v[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
    }
    WINOGRAD_HD static void filter(const float (&g)[3], float (&u)[6]) {
        const float even = g[0] + g[2];
        u[0] = 0.25f * g[0];
        u[1] = -(even + g[1]) * (1.0f / 6.0f);
        u[2] = -(even - g[1]) * (1.0f / 6.0f);
        const float quarter = 0.25f * g[0] + g[2], half = 0.5f * g[1];
        u[3] = (quarter + half) * (1.0f / 6.0f);
        u[4] = (quarter - half) * (1.0f / 6.0f);
        u[5] = g[2];
    }
    WINOGRAD_HD static void output(const float (&m)[6], float (&y)[4]) {
        const float s1 = m[1] + m[2], d1 = m[1] - m[2];
        const float s2 = m[3] + m[4], d2 = m[3] - m[4];
        y[0] = m[0] + s1 + s2;
        y[1] = d1 + 2.0f * d2;
        y[2] = s1 + 4.0f * s2;
        y[3] = d1 + 8.0f * d2 + m[5];
    }
};

// The tile a chunk-local tile index names: image n, tile row th, tile column tw.
struct TileIndex {
    int n, th, tw;
};

WINOGRAD_HD TileIndex tile_index(int t, int TH, int TW) {
    TileIndex i;
    i.tw = t % TW;
    const int r = t / TW;
    i.th = r % TH;
    i.n = r / TH;
    return i;
}

// Where the cells of channel c of a phase-viewed tensor live (see the top).
struct PhasePlane {
    size_t base;        // offset of the real plane (image n, channel c0)
    int row0, col0;     // the phase: real row = h * SH + row0, column = w * SW + col0
    int rows, cols;     // cells of this phase inside the real tensor
};

WINOGRAD_HD PhasePlane phase_plane(int n, int c, int C0, int SH, int SW, int HS, int WS) {
    PhasePlane p;
    const int phase = c / C0, c0 = c - phase * C0;
    p.row0 = phase / SW;
    p.col0 = phase - p.row0 * SW;
    p.rows = (HS - p.row0 + SH - 1) / SH;
    p.cols = (WS - p.col0 + SW - 1) / SW;
    p.base = ((size_t)n * C0 + c0) * HS * WS;
    return p;
}

// The (channel, chunk-local tile) of thread idx of a transform over C * T
// (channel, tile) pairs. Channel-major (c = idx / T) without column phases
// (SW = 1); with them, the SW column phases of one (row phase, real channel,
// tile) go to adjacent threads, so that their strided accesses to the real
// tensor together cover whole 32-byte sectors (HBM writes a partly written
// sector as a read-modify-write), while their V / M accesses stay runs of
// consecutive tiles.
WINOGRAD_HD void channel_and_tile(int idx, int T, int C0, int SW, int& c, int& tl) {
    if (SW == 1) {
        c = idx / T;
        tl = idx - c * T;
        return;
    }
    const int rw = idx % SW, rest = idx / SW;
    tl = rest % T;
    const int q = rest / T, rh = q / C0, c0 = q - rh * C0;
    c = (rh * SW + rw) * C0 + c0;
}

// U[xi][o][c] <- G g G^T for the pair idx = o * C_x + c of a [C_y, C_x] grid.
// flip = 0: g = w[o, c] of w [C_y, C_x, 3, 3] (the forward).
// flip = 1: g = w[c, o] rotated by 180 degrees, of w [C_x, C_y, 3, 3]
//           (backward-data: gx = conv(gy, w flipped, channels swapped)).
template <int M>
WINOGRAD_HD void filter_transform_pair(const float* w, float* u, int idx, int C_y, int C_x,
                                       int flip) {
    constexpr int A = Transform<M>::A;
    const int o = idx / C_x, c = idx - o * C_x;
    float g[3][3];
    const float* wp = w + (size_t)(flip ? c * C_y + o : o * C_x + c) * 9;
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
        for (int j = 0; j < 3; ++j)
            g[i][j] = WINOGRAD_LOAD(wp + (flip ? (2 - i) * 3 + (2 - j) : i * 3 + j));
    float gg[A][3];                       // G g: the columns of g transformed
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        const float col[3] = {g[0][j], g[1][j], g[2][j]};
        float out[A];
        Transform<M>::filter(col, out);
#pragma unroll
        for (int i = 0; i < A; ++i) gg[i][j] = out[i];
    }
    const size_t plane = (size_t)C_y * C_x;
#pragma unroll
    for (int i = 0; i < A; ++i) {         // (G g) G^T: then its rows
        float out[A];
        Transform<M>::filter(gg[i], out);
#pragma unroll
        for (int j = 0; j < A; ++j) u[(i * A + j) * plane + idx] = out[j];
    }
}

// V[xi][c][tl] <- B^T d B for the input tile of (channel c, tile tl), idx = c * T + tl;
// x: C channels, phase-viewed through (C0, SH, SW, HS, WS).
template <int M>
WINOGRAD_HD void input_transform_tile(const float* x, float* v, int idx, int C, int C0, int SH,
                                      int SW, int HS, int WS, int TH, int TW, int t_begin,
                                      int T, int pad_top, int pad_left) {
    constexpr int A = Transform<M>::A;
    int c, tl;
    channel_and_tile(idx, T, C0, SW, c, tl);
    const size_t slot = (size_t)c * T + tl;     // its place in V[xi]
    const TileIndex ti = tile_index(t_begin + tl, TH, TW);
    const int h0 = ti.th * M - pad_top, w0 = ti.tw * M - pad_left;
    const PhasePlane p = phase_plane(ti.n, c, C0, SH, SW, HS, WS);
    const float* xp = x + p.base;
    float d[A][A];
#pragma unroll
    for (int i = 0; i < A; ++i) {
        const int h = h0 + i;
        const bool row_inside = h >= 0 && h < p.rows;
        const int row = h * SH + p.row0;
#pragma unroll
        for (int j = 0; j < A; ++j) {
            const int w = w0 + j;
            d[i][j] = (row_inside && w >= 0 && w < p.cols)
                          ? WINOGRAD_LOAD(xp + (size_t)row * WS + w * SW + p.col0) : 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < A; ++j) {         // B^T d: the columns
        float col[A], out[A];
#pragma unroll
        for (int i = 0; i < A; ++i) col[i] = d[i][j];
        Transform<M>::input(col, out);
#pragma unroll
        for (int i = 0; i < A; ++i) d[i][j] = out[i];
    }
    const size_t plane = (size_t)C * T;
#pragma unroll
    for (int i = 0; i < A; ++i) {         // (B^T d) B: the rows
        float out[A];
        Transform<M>::input(d[i], out);
#pragma unroll
        for (int j = 0; j < A; ++j) v[(i * A + j) * plane + slot] = out[j];
    }
}

// Stores one row of a tile's outputs: M values at y, y + step, ... (columns
// w0 .. w0 + M - 1 of the plane), only those with column < W unless vector
// (then all M are inside, step is 1 and the address is aligned to M floats).
template <int M> struct RowStore;

template <> struct RowStore<2> {
    WINOGRAD_HD static void store(float* y, const float (&r)[2], bool vector, int w0, int W,
                                  int step) {
        if (vector) {
            *reinterpret_cast<float2*>(y) = make_float2(r[0], r[1]);
            return;
        }
        if (w0 < W) y[0] = r[0];         // a phase may end a column before the tiles do
        if (w0 + 1 < W) y[step] = r[1];
    }
    WINOGRAD_HD static void load(const float* p, float (&r)[2], bool vector, int w0, int W,
                                 int step) {
        if (vector) {
            const float2 f = *reinterpret_cast<const float2*>(p);
            r[0] = f.x;
            r[1] = f.y;
            return;
        }
        r[0] = w0 < W ? WINOGRAD_LOAD(p) : 0.0f;
        r[1] = w0 + 1 < W ? WINOGRAD_LOAD(p + step) : 0.0f;
    }
};

template <> struct RowStore<4> {
    WINOGRAD_HD static void store(float* y, const float (&r)[4], bool vector, int w0, int W,
                                  int step) {
        if (vector) {
            *reinterpret_cast<float4*>(y) = make_float4(r[0], r[1], r[2], r[3]);
            return;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (w0 + j < W) y[j * step] = r[j];
    }
    WINOGRAD_HD static void load(const float* p, float (&r)[4], bool vector, int w0, int W,
                                 int step) {
        if (vector) {
            const float4 f = *reinterpret_cast<const float4*>(p);
            r[0] = f.x;
            r[1] = f.y;
            r[2] = f.z;
            r[3] = f.w;
            return;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) r[j] = w0 + j < W ? WINOGRAD_LOAD(p + j * step) : 0.0f;
    }
};

// y tile <- act(A^T M A + bias[o0] + residual) for (output channel o, tile tl),
// idx = o * T + tl, y (and residual) phase-viewed through (C0, SH, SW, HS, WS)
// and o0 = o % C0 the real channel; bias and residual may be null. vector:
// no phases, W % M == 0 and y, residual aligned to M floats, so every row of a
// tile is stored whole.
template <int M>
WINOGRAD_HD void output_transform_tile(const float* m, const float* bias, const float* residual,
                                       float* y, int idx, int C, int C0, int SH, int SW, int HS,
                                       int WS, int TH, int TW, int t_begin, int T, int act,
                                       int vector) {
    constexpr int A = Transform<M>::A;
    int o, tl;
    channel_and_tile(idx, T, C0, SW, o, tl);
    const size_t slot = (size_t)o * T + tl;     // its place in M[xi]
    const TileIndex ti = tile_index(t_begin + tl, TH, TW);
    const size_t plane = (size_t)C * T;
    float a[A][A];
#pragma unroll
    for (int i = 0; i < A; ++i)
#pragma unroll
        for (int j = 0; j < A; ++j) a[i][j] = m[(i * A + j) * plane + slot];
    float at[M][A];                       // A^T a: the columns
#pragma unroll
    for (int j = 0; j < A; ++j) {
        float col[A], out[M];
#pragma unroll
        for (int i = 0; i < A; ++i) col[i] = a[i][j];
        Transform<M>::output(col, out);
#pragma unroll
        for (int i = 0; i < M; ++i) at[i][j] = out[i];
    }
    const PhasePlane p = phase_plane(ti.n, o, C0, SH, SW, HS, WS);
    const float b = bias ? WINOGRAD_LOAD(bias + o % C0) : 0.0f;
    const int h0 = ti.th * M, w0 = ti.tw * M;
#pragma unroll
    for (int i = 0; i < M; ++i) {         // (A^T a) A: the rows, then the epilogue
        const int h = h0 + i;
        if (h >= p.rows) break;
        float row[M];
        Transform<M>::output(at[i], row);
        const size_t offset = p.base + (size_t)(h * SH + p.row0) * WS + (size_t)w0 * SW + p.col0;
        if (residual) {
            float r[M];
            RowStore<M>::load(residual + offset, r, vector, w0, p.cols, SW);
#pragma unroll
            for (int j = 0; j < M; ++j) row[j] += r[j];
        }
#pragma unroll
        for (int j = 0; j < M; ++j) row[j] = activate(row[j] + b, act);
        RowStore<M>::store(y + offset, row, vector, w0, p.cols, SW);
    }
}

// The kernels: grid-stride loops over the per-thread work above, one set per
// tile size (the suffix is M).
#define WINOGRAD_KERNELS(M)                                                                      \
    extern "C" __global__ void winograd_filter_f##M(const float* __restrict__ w,                \
                                                     float* __restrict__ u, int C_y, int C_x,    \
                                                     int flip) {                                 \
        GRID_STRIDE_LOOP(idx, C_y * C_x) filter_transform_pair<M>(w, u, idx, C_y, C_x, flip);   \
    }                                                                                            \
    extern "C" __global__ void winograd_input_f##M(                                              \
            const float* __restrict__ x, float* __restrict__ v, int C, int C0, int SH, int SW,   \
            int HS, int WS, int TH, int TW, int t_begin, int T, int pad_top, int pad_left) {     \
        GRID_STRIDE_LOOP(idx, C * T)                                                             \
            input_transform_tile<M>(x, v, idx, C, C0, SH, SW, HS, WS, TH, TW, t_begin, T,        \
                                    pad_top, pad_left);                                          \
    }                                                                                            \
    extern "C" __global__ void winograd_output_f##M(                                             \
            const float* __restrict__ m, const float* __restrict__ bias,                        \
            const float* __restrict__ residual, float* __restrict__ y, int C, int C0, int SH,    \
            int SW, int HS, int WS, int TH, int TW, int t_begin, int T, int act, int vector) {   \
        GRID_STRIDE_LOOP(idx, C * T)                                                             \
            output_transform_tile<M>(m, bias, residual, y, idx, C, C0, SH, SW, HS, WS, TH, TW,   \
                                     t_begin, T, act, vector);                                   \
    }

WINOGRAD_KERNELS(2)
WINOGRAD_KERNELS(4)
