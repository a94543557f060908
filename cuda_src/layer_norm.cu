// Layer normalisation over the last axes. Python side: gdnflow/ops/layernorm.py.
//
// x is seen as [rows, cols] (cols: the product of the normalised axes) and
// each row is normalised over its cols values, with scale and bias [cols]:
//   mean = (1/cols) sum x,   var = (1/cols) sum (x - mean)^2,   inv = 1 / sqrt(var + eps)
//   xhat = (x - mean) inv,   y = xhat scale + bias
// The variance is that of the centred values (the row kernels: a second pass
// over the row, read again from cache; the channels-first kernel: Welford's
// running mean and sum of squared deviations), not E[x^2] - mean^2, whose
// cancellation loses digits where |mean| >> std. Backward, with g = gy scale:
//   gx = inv (g - mean_j(g) - xhat mean_j(g xhat))
//   gscale = sum over rows of gy xhat,   gbias = sum over rows of gy
// One warp per row (rows of a few hundred values: ConvNeXt's 96 to 768).
#include "gdnflow_common.cuh"

#define ROWS_PER_BLOCK 8        // warps per block of the row kernels (256 threads)
#define PARAMETER_ROWS 8        // threadIdx.y extent of layer_norm_backward_params

// The sum over the warp, in every lane (butterfly).
__device__ __forceinline__ float warp_total(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

#define FOR_EACH_ROW(row)                                                     \
    for (int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5); row < rows; \
         row += gridDim.x * ROWS_PER_BLOCK)

extern "C" __global__ void layer_norm_forward(
        const float* __restrict__ x, const float* __restrict__ scale,
        const float* __restrict__ bias, float* __restrict__ y, float* __restrict__ mean_out,
        float* __restrict__ inv_out, int rows, int cols, float eps) {
    const int lane = threadIdx.x & 31;
    FOR_EACH_ROW(row) {
        const float* xr = x + static_cast<long long>(row) * cols;
        float sum = 0.0f;
        for (int c = lane; c < cols; c += 32) sum += xr[c];
        const float mean = warp_total(sum) / cols;
        float squares = 0.0f;
        for (int c = lane; c < cols; c += 32) {
            const float d = xr[c] - mean;
            squares += d * d;
        }
        const float inv = 1.0f / sqrtf(warp_total(squares) / cols + eps);
        float* yr = y + static_cast<long long>(row) * cols;
        for (int c = lane; c < cols; c += 32) yr[c] = (xr[c] - mean) * inv * scale[c] + bias[c];
        if (lane == 0) {
            mean_out[row] = mean;
            inv_out[row] = inv;
        }
    }
}

extern "C" __global__ void layer_norm_backward_data(
        const float* __restrict__ x, const float* __restrict__ gy,
        const float* __restrict__ scale, const float* __restrict__ mean,
        const float* __restrict__ inv, float* __restrict__ gx, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    FOR_EACH_ROW(row) {
        const long long at = static_cast<long long>(row) * cols;
        const float m = mean[row], s = inv[row];
        float g_sum = 0.0f, g_xhat_sum = 0.0f;
        for (int c = lane; c < cols; c += 32) {
            const float g = gy[at + c] * scale[c];
            g_sum += g;
            g_xhat_sum += g * (x[at + c] - m) * s;
        }
        const float g_mean = warp_total(g_sum) / cols, g_xhat_mean = warp_total(g_xhat_sum) / cols;
        for (int c = lane; c < cols; c += 32) {
            const float xhat = (x[at + c] - m) * s;
            gx[at + c] = s * (gy[at + c] * scale[c] - g_mean - xhat * g_xhat_mean);
        }
    }
}

// Column sums over the rows: block (32, PARAMETER_ROWS) covers 32 columns;
// blockIdx.y picks a share of the rows. Each block adds its partial sums into
// gscale and gbias, which the host zeroes first.
extern "C" __global__ void layer_norm_backward_params(
        const float* __restrict__ x, const float* __restrict__ gy,
        const float* __restrict__ mean, const float* __restrict__ inv,
        float* __restrict__ gscale, float* __restrict__ gbias, int rows, int cols) {
    __shared__ float partial[2][PARAMETER_ROWS][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float scale_sum = 0.0f, bias_sum = 0.0f;
    if (c < cols) {
        for (int row = blockIdx.y * PARAMETER_ROWS + threadIdx.y; row < rows;
             row += gridDim.y * PARAMETER_ROWS) {
            const long long at = static_cast<long long>(row) * cols + c;
            scale_sum += gy[at] * (x[at] - mean[row]) * inv[row];
            bias_sum += gy[at];
        }
    }
    partial[0][threadIdx.y][threadIdx.x] = scale_sum;
    partial[1][threadIdx.y][threadIdx.x] = bias_sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        for (int k = 1; k < PARAMETER_ROWS; ++k) {
            scale_sum += partial[0][k][threadIdx.x];
            bias_sum += partial[1][k][threadIdx.x];
        }
        atomicAdd(gscale + c, scale_sum);
        atomicAdd(gbias + c, bias_sum);
    }
}

// Channels first: x is [N, C, S] (S: the product of the spatial axes) and
// the rows are its N * S columns (n, s), each normalised over its C values;
// y is written [N, S, C], as the layer norm of x moved to channels last (the
// transpose that ConvNeXt's exported block puts before it, fused), or, with
// channels_out_first, [N, C, S] like x (the transpose back after it fused too:
// torchvision's LayerNorm2d before each downsampling). A block
// of 32 x 8 threads takes 32 consecutive s of one n (a one-dimensional grid
// of N times the tiles of S): the statistics read x
// along s (coalesced), each of the 8 thread rows summing every 8th channel;
// y goes out through a shared tile 32 channels at a time, so that its rows
// are written along c (coalesced too). Statistics are saved per row (n, s).
#define TILE 32
#define TILE_ROWS 8

// (count, mean, squares) of some values, squares the sum of their squared
// deviations from their mean, merged with those of others (count_b of them):
// Chan, Golub and LeVeque's pairwise update. Branch-free, so that the loads of
// the loop around it issue ahead; both sides empty give NaN (only for positions
// past the plane, whose statistics are never used).
__device__ __forceinline__ void merge_statistics(float& count, float& mean, float& squares,
                                                 float count_b, float mean_b, float squares_b) {
    const float total = count + count_b;
    const float delta = mean_b - mean;
    mean += delta * __fdividef(count_b, total);
    squares += squares_b + delta * delta * __fdividef(count * count_b, total);
    count = total;
}

extern "C" __global__ void layer_norm_channels_first_forward(
        const float* __restrict__ x, const float* __restrict__ scale,
        const float* __restrict__ bias, float* __restrict__ y, float* __restrict__ mean_out,
        float* __restrict__ inv_out, int channels, int spatial, float eps,
        int channels_out_first) {
    __shared__ float partial[3][TILE_ROWS][TILE];
    __shared__ float row_mean[TILE], row_inv[TILE];
    __shared__ float tile[TILE][TILE + 1];
    // blockIdx.x = n * tiles + tile: any batch (gridDim.y would stop at 65535).
    const int tiles = (spatial + TILE - 1) / TILE;
    const int n = blockIdx.x / tiles, s0 = (blockIdx.x % tiles) * TILE;
    const int lane = threadIdx.x, ty = threadIdx.y;
    const int s = s0 + lane;
    const float* xn = x + static_cast<long long>(n) * channels * spatial;
    // One pass for both statistics: each thread keeps a running count, mean and
    // sum of squared deviations over its channels (c = ty, ty + 8, ...), taking
    // them 4 at a time (the 4 values' own mean and deviations, exact in
    // registers) and merging each group in (Chan et al.'s pairwise update); thread
    // row 0 then merges the 8 rows' the same way. No difference of large sums is
    // taken, so nothing cancels (a one-pass E[(x - shift)^2] lost a factor of up
    // to C in the variance where one channel was far from the rest), and x is
    // read twice in all instead of three times. (Welford's update, one value at a
    // time, made ConvNeXt-T's 23 layer norms 0.15-0.4 ms slower at batch 32 on the
    // H200.)
    float count = 0.0f, centre = 0.0f, squares = 0.0f;     // the mean so far
    if (s < spatial) {
        int c = ty;
#pragma unroll 2
        for (; c + 3 * TILE_ROWS < channels; c += 4 * TILE_ROWS) {
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = xn[static_cast<long long>(c + j * TILE_ROWS) * spatial + s];
            const float group_mean = 0.25f * ((v[0] + v[1]) + (v[2] + v[3]));
            float group_squares = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) group_squares += (v[j] - group_mean) * (v[j] - group_mean);
            merge_statistics(count, centre, squares, 4.0f, group_mean, group_squares);
        }
        for (; c < channels; c += TILE_ROWS)
            merge_statistics(count, centre, squares, 1.0f,
                             xn[static_cast<long long>(c) * spatial + s], 0.0f);
    }
    partial[0][ty][lane] = count;
    partial[1][ty][lane] = centre;
    partial[2][ty][lane] = squares;
    __syncthreads();
    if (ty == 0) {
        for (int k = 1; k < TILE_ROWS; ++k)
            merge_statistics(count, centre, squares, partial[0][k][lane], partial[1][k][lane],
                             partial[2][k][lane]);
        row_mean[lane] = centre;
        const float inv = 1.0f / sqrtf(squares / channels + eps);
        row_inv[lane] = inv;
        if (s < spatial) {
            mean_out[static_cast<long long>(n) * spatial + s] = centre;
            inv_out[static_cast<long long>(n) * spatial + s] = inv;
        }
    }
    __syncthreads();
    const float mean = row_mean[lane], inv = row_inv[lane];
    float* yn = y + static_cast<long long>(n) * spatial * channels;
    if (channels_out_first) {       // the same for every thread of the launch
        if (s < spatial)
            for (int c = ty; c < channels; c += TILE_ROWS) {
                const long long at = static_cast<long long>(c) * spatial + s;
                yn[at] = (xn[at] - mean) * inv * scale[c] + bias[c];
            }
        return;
    }
    for (int c0 = 0; c0 < channels; c0 += TILE) {
        // tile[c - c0][s - s0]: read along s ...
        for (int k = ty; k < TILE; k += TILE_ROWS) {
            const int c = c0 + k;
            tile[k][lane] = (s < spatial && c < channels)
                ? (xn[static_cast<long long>(c) * spatial + s] - mean) * inv : 0.0f;
        }
        __syncthreads();
        // ... written along c.
        const int c = c0 + lane;
        if (c < channels)
            for (int k = ty; k < TILE; k += TILE_ROWS) {
                const int row = s0 + k;
                if (row < spatial)
                    yn[static_cast<long long>(row) * channels + c] = tile[lane][k] * scale[c] + bias[c];
            }
        __syncthreads();
    }
}
