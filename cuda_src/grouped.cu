// Grouped 2-D convolution with few channels per group, NCHW: a direct kernel.
// Python side: gdnflow/ops/conv/algorithms/grouped.py. Tensors are storage_t
// (float32, or 16 bits with -DSTORAGE_BF16 / -DSTORAGE_FP16): the products and
// the epilogue run in float32 and each output is rounded once.
//
// Why not im2col + GEMM: a group of RegNet (8 channels in, 8 out) or
// ResNeXt (4 to 32) is a product of [OG, CG*KH*KW] by [CG*KH*KW, OH*OW]: far
// too small for a GEMM kernel to fill the GPU, so the GEMM path runs one
// cuBLAS call per group or per image (hundreds of tiny launches per network)
// and writes the column matrix besides. Here each thread computes OPT output
// channels of one group at one output pixel from the CG*KH*KW inputs under
// its window, so each group's input planes are read OG/OPT times, once per
// chunk of output channels (from L1/L2 where windows overlap), and y is
// written once, bias and activation fused. A first layer on image channels
// (groups 1, C_in 1 to 4) with a small output is one such group: OG = C_out,
// CG = C_in.
//
// A block takes one image, one chunk of OPT consecutive output channels (all
// in one group: OPT divides OG) and a run of `blockDim.x` consecutive output
// pixels. It stages the chunk's weights into shared memory as
// [CG][KH][KW][OPT], so that every thread of a warp reads the same OPT
// weights (a broadcast) for each input value it loads.
//
// Compile-time (-D): KH, KW (taps), SH, SW (strides), DH, DW (dilations), CG
// (input channels per group), OPT (output channels per thread).
//
// The steps are __host__ __device__ functions: tests/ops/conv/test_grouped.py
// builds this file for the host and runs every block and thread through
// them, so the index arithmetic is checked without a GPU.
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
#ifndef CG
#define CG 8
#endif
#ifndef OPT
#define OPT 8
#endif
// Threads per block at most (gdnflow/ops/conv/algorithms/grouped.py: MAX_THREADS).
#define GROUPED_MAX_THREADS 256

// The block's image, first output channel and first input channel, from its index:
// blocks run n * (c_out / OPT) * pixel_tiles, the pixel tile fastest.
struct GroupedBlock {
    int n, o0, c0, tile;
};

__host__ __device__ inline GroupedBlock grouped_block(int block, int c_out, int og,
                                                      int pixel_tiles) {
    GroupedBlock b;
    b.tile = block % pixel_tiles;
    const int rest = block / pixel_tiles, chunks = c_out / OPT;
    b.o0 = (rest % chunks) * OPT;
    b.n = rest / chunks;
    b.c0 = (b.o0 / og) * CG;
    return b;
}

// Thread t of `threads` copies its share of the chunk's weights:
// w[o0 + o, c, tap] -> weights[(c * KH*KW + tap) * OPT + o].
__host__ __device__ inline void stage_grouped_weights(const storage_t* __restrict__ w,
                                                      float* weights, int o0, int t,
                                                      int threads) {
    for (int i = t; i < CG * KH * KW * OPT; i += threads) {
        const int o = i % OPT, k = i / OPT;
        weights[i] = load_value(w[(size_t)(o0 + o) * CG * KH * KW + k]);
    }
}

// Output pixel p of the block's OPT channels:
// y[n, o, p] = act(b[o] + residual[n, o, p]
//                  + sum_{c < CG, i, j} weights[c, i, j, o - o0] x[n, c0 + c, oy*SH - top + i*DH, ox*SW - left + j*DW]).
__host__ __device__ inline void compute_grouped_pixel(
        const storage_t* __restrict__ x, const float* weights,
        const storage_t* __restrict__ bias, const storage_t* __restrict__ residual,
        storage_t* __restrict__ y, const GroupedBlock& b, int p,
        int c_in, int h, int wd, int c_out, int oh, int ow, int pad_top, int pad_left,
        int activation) {
    const int pixels = oh * ow;
    const int oy = p / ow, ox = p - oy * ow;
    const int iy0 = oy * SH - pad_top, ix0 = ox * SW - pad_left;

    float acc[OPT];
#pragma unroll
    for (int o = 0; o < OPT; ++o) acc[o] = 0.0f;

    const storage_t* plane = x + ((size_t)b.n * c_in + b.c0) * h * wd;
    const float* tap_weights = weights;
#pragma unroll 2
    for (int c = 0; c < CG; ++c, plane += (size_t)h * wd, tap_weights += KH * KW * OPT) {
#pragma unroll
        for (int i = 0; i < KH; ++i) {
            const int iy = iy0 + i * DH;
            if (iy < 0 || iy >= h) continue;
            const storage_t* row = plane + (size_t)iy * wd;
#pragma unroll
            for (int j = 0; j < KW; ++j) {
                const int ix = ix0 + j * DW;
                if (ix < 0 || ix >= wd) continue;
                HOST_CHECK(b.c0 + c < c_in);
                const float v = load_value(row[ix]);
                const float* k = tap_weights + (i * KW + j) * OPT;
#pragma unroll
                for (int o = 0; o < OPT; ++o) acc[o] = fmaf(v, k[o], acc[o]);
            }
        }
    }

    const size_t out = ((size_t)b.n * c_out + b.o0) * pixels + p;
#pragma unroll
    for (int o = 0; o < OPT; ++o) {
        HOST_CHECK(b.o0 + o < c_out);
        float v = acc[o];
        if (bias) v += load_value(bias[b.o0 + o]);
        if (residual) v += load_value(residual[out + (size_t)o * pixels]);
        y[out + (size_t)o * pixels] = store_value(activate(v, activation));
    }
}

// The launch: one GroupedBlock per block, blockDim.x consecutive pixels of it.
extern "C" __global__ void __launch_bounds__(GROUPED_MAX_THREADS) grouped_conv_forward(
        const storage_t* __restrict__ x, const storage_t* __restrict__ w,
        const storage_t* __restrict__ bias, const storage_t* __restrict__ residual,
        storage_t* __restrict__ y, int c_in, int h, int wd, int c_out, int oh, int ow,
        int pad_top, int pad_left, int og, int pixel_tiles, int activation) {
    __shared__ __align__(16) float weights[CG * KH * KW * OPT];
    const GroupedBlock b = grouped_block(blockIdx.x, c_out, og, pixel_tiles);
    stage_grouped_weights(w, weights, b.o0, threadIdx.x, blockDim.x);
    __syncthreads();
    const int p = b.tile * blockDim.x + threadIdx.x;
    if (p < oh * ow)
        compute_grouped_pixel(x, weights, bias, residual, y, b, p, c_in, h, wd, c_out, oh, ow,
                              pad_top, pad_left, activation);
}
