// 2-D convolution, NCHW: the lowering kernels around cuBLAS's GEMMs and the
// fused inference epilogue. Python side: gdnflow/ops/conv/ (the GEMM calls
// are there, through gdnflow/backends/cuda/blas.py). Built for float tensors,
// and with -DSTORAGE_BF16 / -DSTORAGE_FP16 for 16-bit ones (storage_t:
// gdnflow_common.cuh); sums and the epilogue compute in float.
//
// Column matrices. For image n of a chunk, the column matrix has one row per
// (input channel c, kernel tap i, j), row = (c * KH + i) * KW + j, and one
// column per output pixel p = oh * OW + ow. Element (n, row, p) lives at
//     n * image_stride + row * row_stride + p.
// With row_stride = OH*OW, image_stride = C*KH*KW*OH*OW each image's matrix is
// contiguous (the forward's image-batched GEMM); with row_stride = nb*OH*OW,
// image_stride = OH*OW the images sit side by side along the columns, so one
// GEMM sums the weight gradient over the whole chunk.
//
// KH and KW are compile-time (-DKH, -DKW) so the tap loops unroll; strides,
// dilations and paddings are runtime arguments (a multiply each).
#include "gdnflow_common.cuh"

#ifndef KH
#define KH 3
#endif
#ifndef KW
#define KW 3
#endif

// cols <- the input under every kernel tap; zeros where a tap reads padding.
// One thread per (n, c, oh, ow): it writes the KH*KW rows of its channel in
// column p, so a warp writes consecutive addresses of each row.
extern "C" __global__ void im2col(
        const storage_t* __restrict__ x, storage_t* __restrict__ cols,
        int nb, int C, int H, int W, int OH, int OW,
        int SH, int SW, int DH, int DW, int pad_top, int pad_left,
        int row_stride, int image_stride) {
    const int total = nb * C * OH * OW;
    GRID_STRIDE_LOOP(idx, total) {
        const int ow = idx % OW;
        int t = idx / OW;
        const int oh = t % OH;
        t /= OH;
        const int c = t % C;
        const int n = t / C;
        const storage_t* xp = x + ((size_t)n * C + c) * H * W;
        storage_t* cp = cols + (size_t)n * image_stride + (size_t)c * (KH * KW) * row_stride
                        + oh * OW + ow;
        const int ih0 = oh * SH - pad_top, iw0 = ow * SW - pad_left;
#pragma unroll
        for (int i = 0; i < KH; ++i) {
            const int ih = ih0 + i * DH;
            const bool row_inside = ih >= 0 && ih < H;
#pragma unroll
            for (int j = 0; j < KW; ++j) {
                const int iw = iw0 + j * DW;
                cp[(size_t)(i * KW + j) * row_stride] =
                    (row_inside && iw >= 0 && iw < W) ? xp[ih * W + iw] : store_value(0.0f);
            }
        }
    }
}

// x <- the sum, over every tap that read x[n, c, h, w], of that tap's column
// entry: the adjoint of im2col (backward-data). A gather, one thread per input
// element, so no atomics and a deterministic order. A tap (i, j) read (h, w)
// from output (oh, ow) when h = oh*SH - pad_top + i*DH, i.e. when
// h + pad_top - i*DH is a non-negative multiple of SH below SH*OH.
extern "C" __global__ void col2im(
        const storage_t* __restrict__ cols, storage_t* __restrict__ x,
        int nb, int C, int H, int W, int OH, int OW,
        int SH, int SW, int DH, int DW, int pad_top, int pad_left,
        int row_stride, int image_stride) {
    const int total = nb * C * H * W;
    GRID_STRIDE_LOOP(idx, total) {
        const int w = idx % W;
        int t = idx / W;
        const int h = t % H;
        t /= H;
        const int c = t % C;
        const int n = t / C;
        const storage_t* cp = cols + (size_t)n * image_stride + (size_t)c * (KH * KW) * row_stride;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < KH; ++i) {
            const int th = h + pad_top - i * DH;
            if (th < 0 || th % SH != 0 || th / SH >= OH) continue;
            const int oh = th / SH;
#pragma unroll
            for (int j = 0; j < KW; ++j) {
                const int tw = w + pad_left - j * DW;
                if (tw < 0 || tw % SW != 0 || tw / SW >= OW) continue;
                acc += load_value(cp[(size_t)(i * KW + j) * row_stride + oh * OW + tw / SW]);
            }
        }
        x[idx] = store_value(acc);
    }
}

// dst[c, n, p] = src[n, c, p]: NCHW -> CNHW, so that a chunk's gradient (or,
// for 1x1 convolutions, its input) becomes one matrix with the images side by
// side, as the weight-gradient GEMM wants. Rows of P elements move whole, so
// reads and writes are both coalesced.
extern "C" __global__ void nchw_to_cnhw(
        const storage_t* __restrict__ src, storage_t* __restrict__ dst, int nb, int C, int P) {
    const int total = nb * C * P;
    GRID_STRIDE_LOOP(idx, total) {
        const int p = idx % P;
        const int t = idx / P;
        const int c = t % C;
        const int n = t / C;
        dst[((size_t)c * nb + n) * P + p] = src[idx];
    }
}

// The fused epilogue, one pass over the convolution's output y [N, C, HW]:
//     out = act(y + bias[c] + residual)
// bias and residual may be null (0). out may be y itself (in place), so the
// two are not __restrict__. The channel of element idx is (idx / HW) % C, each
// division a multiply and a shift (quotient_of; (magic, shift) of HW and of C):
// with two run-time divisions per element the pass was bound by its integer
// instructions, not by memory.
extern "C" __global__ void conv_epilogue(
        const storage_t* y, const storage_t* __restrict__ bias,
        const storage_t* __restrict__ residual, storage_t* out, int total, int C,
        unsigned hw_magic, unsigned hw_shift, unsigned c_magic, unsigned c_shift, int act) {
    GRID_STRIDE_LOOP(idx, total) {
        float v = load_value(y[idx]);
        if (bias) {
            const unsigned plane = quotient_of(idx, hw_magic, hw_shift);
            v += load_value(bias[plane - quotient_of(plane, c_magic, c_shift) * C]);
        }
        if (residual) v += load_value(residual[idx]);
        out[idx] = store_value(activate(v, act));
    }
}

// The same pass a vector V (16, 8 or 4 bytes: VALUES values) at a time, where
// HW is a multiple of VALUES (so that a vector lies within one channel plane)
// and y and the residual are aligned to V. One 2-byte value per access reached
// about a third of the H200's memory bandwidth. ``vectors`` is total / VALUES;
// (magic, shift) are those of HW / VALUES and of C.
template <typename V>
__device__ __forceinline__ void conv_epilogue_vectors(
        const storage_t* y, const storage_t* __restrict__ bias,
        const storage_t* __restrict__ residual, storage_t* out, int vectors, int C,
        unsigned plane_magic, unsigned plane_shift, unsigned c_magic, unsigned c_shift,
        int act) {
    constexpr int VALUES = sizeof(V) / sizeof(storage_t);
    GRID_STRIDE_LOOP(idx, vectors) {
        V bits = reinterpret_cast<const V*>(y)[idx];
        V residual_bits = bits;     // read only with a residual
        if (residual) residual_bits = reinterpret_cast<const V*>(residual)[idx];
        float b = 0.0f;
        if (bias) {
            const unsigned plane = quotient_of(idx, plane_magic, plane_shift);
            b = load_value(bias[plane - quotient_of(plane, c_magic, c_shift) * C]);
        }
        storage_t* values = reinterpret_cast<storage_t*>(&bits);
        const storage_t* residuals = reinterpret_cast<const storage_t*>(&residual_bits);
#pragma unroll
        for (int j = 0; j < VALUES; ++j) {
            float v = load_value(values[j]) + b;
            if (residual) v += load_value(residuals[j]);
            values[j] = store_value(activate(v, act));
        }
        reinterpret_cast<V*>(out)[idx] = bits;
    }
}

#define CONV_EPILOGUE_VECTORS(name, V)                                                   \
    extern "C" __global__ void name(                                                     \
            const storage_t* y, const storage_t* __restrict__ bias,                       \
            const storage_t* __restrict__ residual, storage_t* out, int vectors, int C,   \
            unsigned plane_magic, unsigned plane_shift, unsigned c_magic, unsigned c_shift, \
            int act) {                                                                     \
        conv_epilogue_vectors<V>(y, bias, residual, out, vectors, C, plane_magic,         \
                                 plane_shift, c_magic, c_shift, act);                     \
    }
CONV_EPILOGUE_VECTORS(conv_epilogue_vectors16, uint4)
CONV_EPILOGUE_VECTORS(conv_epilogue_vectors8, uint2)
CONV_EPILOGUE_VECTORS(conv_epilogue_vectors4, unsigned)

// The gradient through the fused activation, from its output y:
// relu passes where y > 0, relu6 where 0 < y < 6 (y = z exactly there).
extern "C" __global__ void conv_activation_backward(
        const storage_t* __restrict__ gy, const storage_t* __restrict__ y,
        storage_t* __restrict__ gz, int total, int act) {
    GRID_STRIDE_LOOP(idx, total) {
        const float v = load_value(y[idx]);
        const bool pass = act == ACT_RELU ? v > 0.0f
                        : act == ACT_RELU6 ? (v > 0.0f && v < 6.0f) : true;
        gz[idx] = pass ? gy[idx] : store_value(0.0f);
    }
}
