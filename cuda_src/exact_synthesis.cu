// The hyperprior codec's exact hyper-synthesis on the GPU. Python side:
// gdnflow/codec/hyper_synthesis.py, whose docstring gives the arithmetic: every
// weight, bias and activation is an integer (in float64), every partial sum of a
// layer stays below 2^53, so these float64 sums are exact in any order, with or
// without FMA, and equal NumPy's bit for bit; the rounding (rint: half to even),
// the power-of-two rescaling (ldexp) and the clipping between layers are exact
// IEEE operations too. The scale indexes the decoder derives are therefore the
// same on every device, which the file format needs.
//
// A thread per EXACT_CHANNELS output channels of a pixel, the channels slowest so
// that a warp's threads share their weights (broadcast loads). The per-thread steps
// are __host__ __device__: tests/codec/test_hyper_synthesis_kernels.py builds this file for the host
// and runs it against NumPy without a GPU.
#include "gdnflow_common.cuh"

struct ExactLayerShape {
    int in_channels, in_height, in_width;
    int out_channels, out_height, out_width;
    int kernel_height, kernel_width, stride_y, stride_x, padding_y, padding_x;
};

// Output channels a thread sums at once: it reads each input value once for all of
// them (the weights, the same across a warp, are broadcast).
#define EXACT_CHANNELS 8

// The layer's sums of products plus bias at outputs (channel0 + k, oy, ox) for the
// k < EXACT_CHANNELS below out_channels, each followed by the ReLU when one follows,
// into values[k]. A convolution's weights are (out, in, kh, kw); a transposed
// convolution's (in, out, kh, kw), and its output row oy reads the input rows
// iy = (oy + padding - ky) / stride where that division is exact (ky = (oy +
// padding) mod stride, then every stride-th tap; so for columns).
__host__ __device__ inline void exact_layer_values(
        const double* a, const double* weight, const double* bias,
        const ExactLayerShape& s, int transpose, int relu, int channel0, int oy, int ox,
        double* values) {
    double sum[EXACT_CHANNELS];
    for (int k = 0; k < EXACT_CHANNELS; ++k) sum[k] = 0.0;
    const int count = s.out_channels - channel0 < EXACT_CHANNELS
        ? s.out_channels - channel0 : EXACT_CHANNELS;
    const int taps = s.kernel_height * s.kernel_width;
    // From one output channel's weights to the next one's.
    const long long step = transpose ? taps : (long long)s.in_channels * taps;
    for (int ci = 0; ci < s.in_channels; ++ci) {
        const double* plane = a + (long long)ci * s.in_height * s.in_width;
        const double* w = weight + (transpose
            ? ((long long)ci * s.out_channels + channel0) * taps
            : ((long long)channel0 * s.in_channels + ci) * taps);
        if (transpose) {
            for (int ky = (oy + s.padding_y) % s.stride_y; ky < s.kernel_height;
                 ky += s.stride_y) {
                const int iy = (oy + s.padding_y - ky) / s.stride_y;
                if (iy < 0 || iy >= s.in_height) continue;
                for (int kx = (ox + s.padding_x) % s.stride_x; kx < s.kernel_width;
                     kx += s.stride_x) {
                    const int ix = (ox + s.padding_x - kx) / s.stride_x;
                    if (ix < 0 || ix >= s.in_width) continue;
                    const double v = plane[iy * s.in_width + ix];
                    const int t = ky * s.kernel_width + kx;
#pragma unroll
                    for (int k = 0; k < EXACT_CHANNELS; ++k)
                        if (k < count) sum[k] += v * w[k * step + t];
                }
            }
        } else {
            for (int ky = 0; ky < s.kernel_height; ++ky) {
                const int iy = oy * s.stride_y - s.padding_y + ky;
                if (iy < 0 || iy >= s.in_height) continue;
                for (int kx = 0; kx < s.kernel_width; ++kx) {
                    const int ix = ox * s.stride_x - s.padding_x + kx;
                    if (ix < 0 || ix >= s.in_width) continue;
                    const double v = plane[iy * s.in_width + ix];
                    const int t = ky * s.kernel_width + kx;
#pragma unroll
                    for (int k = 0; k < EXACT_CHANNELS; ++k)
                        if (k < count) sum[k] += v * w[k * step + t];
                }
            }
        }
    }
    for (int k = 0; k < count; ++k) {
        const double value = sum[k] + bias[channel0 + k];
        values[k] = relu ? fmax(value, 0.0) : value;
    }
}

// Thread i's outputs: channels [channel0, channel0 + EXACT_CHANNELS) of one pixel, the
// channel block slowest (a warp's threads share their weights).
__host__ __device__ inline int exact_threads(const ExactLayerShape& s) {
    return (s.out_channels + EXACT_CHANNELS - 1) / EXACT_CHANNELS * s.out_height * s.out_width;
}

// A hidden layer's activation: the value in units of 2^-FRACTION_BITS, rounded
// half to even and clipped to +-limit (ExactHyperSynthesis.scales).
__host__ __device__ inline double exact_activation(double value, int exponent, double limit) {
    return fmin(fmax(rint(ldexp(value, -exponent)), -limit), limit);
}

// The first table scale at or above `scale` (gaussian_tables.scale_indexes:
// searchsorted(table[:-1], scale, "left")): how many of the `count` scales of
// `table` lie strictly below it.
__host__ __device__ inline unsigned char exact_scale_index(double scale, const double* table,
                                                           int count) {
    int low = 0, high = count;
    while (low < high) {
        const int middle = (low + high) / 2;
        if (table[middle] < scale) low = middle + 1; else high = middle;
    }
    return (unsigned char)low;
}

// Thread i of a hidden layer: its outputs' rounded, clipped activations into out
// (out_channels, out_height, out_width).
__host__ __device__ inline void exact_hidden_outputs(
        int i, const double* a, const double* weight, const double* bias,
        const ExactLayerShape& s, int transpose, int relu, int exponent, double limit,
        double* out) {
    const int plane = s.out_height * s.out_width, block = i / plane, pixel = i - block * plane;
    const int channel0 = block * EXACT_CHANNELS;
    double values[EXACT_CHANNELS];
    exact_layer_values(a, weight, bias, s, transpose, relu, channel0, pixel / s.out_width,
                       pixel % s.out_width, values);
    for (int k = 0; k < EXACT_CHANNELS && channel0 + k < s.out_channels; ++k)
        out[(long long)(channel0 + k) * plane + pixel] = exact_activation(values[k], exponent,
                                                                          limit);
}

// Thread i of the last layer: its outputs' scales ldexp(value, -shift) as table indexes.
__host__ __device__ inline void exact_last_outputs(
        int i, const double* a, const double* weight, const double* bias, const double* table,
        int table_count, const ExactLayerShape& s, int transpose, int relu, int shift,
        unsigned char* indexes) {
    const int plane = s.out_height * s.out_width, block = i / plane, pixel = i - block * plane;
    const int channel0 = block * EXACT_CHANNELS;
    double values[EXACT_CHANNELS];
    exact_layer_values(a, weight, bias, s, transpose, relu, channel0, pixel / s.out_width,
                       pixel % s.out_width, values);
    for (int k = 0; k < EXACT_CHANNELS && channel0 + k < s.out_channels; ++k)
        indexes[(long long)(channel0 + k) * plane + pixel] =
            exact_scale_index(ldexp(values[k], -shift), table, table_count);
}

// A hidden layer: out (out_channels, out_height, out_width) from input a.
extern "C" __global__ void exact_hidden_layer(
        const double* __restrict__ a, const double* __restrict__ weight,
        const double* __restrict__ bias, double* __restrict__ out, ExactLayerShape s,
        int transpose, int relu, int exponent, double limit) {
    GRID_STRIDE_LOOP(i, exact_threads(s))
        exact_hidden_outputs(i, a, weight, bias, s, transpose, relu, exponent, limit, out);
}

// The last layer: the table index of each output's scale, as uint8.
extern "C" __global__ void exact_last_layer(
        const double* __restrict__ a, const double* __restrict__ weight,
        const double* __restrict__ bias, unsigned char* __restrict__ indexes,
        const double* __restrict__ table, int table_count, ExactLayerShape s, int transpose,
        int relu, int shift) {
    GRID_STRIDE_LOOP(i, exact_threads(s))
        exact_last_outputs(i, a, weight, bias, table, table_count, s, transpose, relu, shift,
                           indexes);
}
