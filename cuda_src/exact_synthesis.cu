// The codec's exact transforms on the GPU: the hyperprior's hyper-synthesis here,
// and the image synthesis g_s in the last section. Python side:
// gdnflow/codec/hyper_synthesis.py, whose docstring gives the arithmetic: every
// weight, bias and activation is an integer (in float64), every partial sum of a
// layer stays below 2^53, so these float64 sums are exact in any order, with or
// without FMA, and equal NumPy's bit for bit; the rounding (rint: half to even),
// the power-of-two rescaling (ldexp) and the clipping between layers are exact
// IEEE operations too. The scale indexes the decoder derives are therefore the
// same on every device, which the file format needs.
//
// Two ways per layer, the same integers either way. Where its buffers are small
// enough (hyper_synthesis.GEMM_BYTES), a layer's sums of products are one float64
// GEMM (cuBLAS, through gdnflow.backends.cuda.matmul): a convolution's weights
// times its column matrix (exact_columns), or a transposed convolution's weights
// (transposed) times its input, whose per-tap products the finishing kernels sum
// for each output (exact_*_from_products). Otherwise one thread per output
// element, the channel slowest so that a warp's threads share their weights
// (broadcast loads): exact_hidden_layer and exact_last_layer. The per-element
// steps are __host__ __device__: tests/codec/test_hyper_synthesis_kernels.py builds
// this file for the host and runs it against NumPy without a GPU.
#include "gdnflow_common.cuh"

struct ExactLayerShape {
    int in_channels, in_height, in_width;
    int out_channels, out_height, out_width;
    int kernel_height, kernel_width, stride_y, stride_x, padding_y, padding_x;
};

// The most kernel taps of a transposed convolution that reach one output
// in the direct kernels' lists (exact_layers.MAX_EXACT_TAPS): ceil(kh / stride_y) *
// ceil(kw / stride_x); the kernels that finish from products take any.
#define MAX_EXACT_TAPS 25

// The taps of a transposed convolution that reach output (oy, ox): output row oy
// reads the input rows iy = (oy + padding - ky) / stride where that division is exact
// (ky = (oy + padding) mod stride, then every stride-th tap; so for columns).
// exact_visit_taps calls visit(input offset iy * in_width + ix, weight tap ky * kw + kx)
// for each, in order; exact_transposed_taps lists them (at most MAX_EXACT_TAPS) and
// returns how many.
template <typename Visit>
__host__ __device__ inline void exact_visit_taps(const ExactLayerShape& s, int oy, int ox,
                                                 Visit visit) {
    for (int ky = (oy + s.padding_y) % s.stride_y; ky < s.kernel_height; ky += s.stride_y) {
        const int iy = (oy + s.padding_y - ky) / s.stride_y;
        if (iy < 0 || iy >= s.in_height) continue;
        for (int kx = (ox + s.padding_x) % s.stride_x; kx < s.kernel_width; kx += s.stride_x) {
            const int ix = (ox + s.padding_x - kx) / s.stride_x;
            if (ix >= 0 && ix < s.in_width) visit(iy * s.in_width + ix, ky * s.kernel_width + kx);
        }
    }
}

__host__ __device__ inline int exact_transposed_taps(const ExactLayerShape& s, int oy, int ox,
                                                     int* input_offset, int* tap_offset) {
    int count = 0;
    exact_visit_taps(s, oy, ox, [&](int input, int tap) {
        if (count == MAX_EXACT_TAPS) return;
        input_offset[count] = input;
        tap_offset[count++] = tap;
    });
    return count;
}

// The layer's sum of products plus bias at output (channel, oy, ox), then the
// ReLU when one follows. A convolution's weights are (out, in, kh, kw); a
// transposed convolution's (in, out, kh, kw), and the taps that reach the output
// (exact_transposed_taps) are the same for every input channel: listed once,
// then each channel's sum is a run of multiply-adds
// without divisions or bounds tests (2-2.5x faster on the hyperprior's
// transposed layers; a convolution's plain loop was faster as it is).
__host__ __device__ inline double exact_layer_value(
        const double* a, const double* weight, const double* bias,
        const ExactLayerShape& s, int transpose, int relu, int channel, int oy, int ox) {
    double sum = 0.0;
    const int taps = s.kernel_height * s.kernel_width;
    const long long plane_size = (long long)s.in_height * s.in_width;
    if (transpose) {
        int input_offset[MAX_EXACT_TAPS], tap_offset[MAX_EXACT_TAPS];
        const int count = exact_transposed_taps(s, oy, ox, input_offset, tap_offset);
        const long long weight_step = (long long)s.out_channels * taps;
        const double* w = weight + (long long)channel * taps;
        for (int ci = 0; ci < s.in_channels; ++ci, w += weight_step) {
            const double* plane = a + ci * plane_size;
            for (int t = 0; t < count; ++t) sum += plane[input_offset[t]] * w[tap_offset[t]];
        }
    } else {
        for (int ci = 0; ci < s.in_channels; ++ci) {
            const double* plane = a + ci * plane_size;
            const double* w = weight + ((long long)channel * s.in_channels + ci) * taps;
            for (int ky = 0; ky < s.kernel_height; ++ky) {
                const int iy = oy * s.stride_y - s.padding_y + ky;
                if (iy < 0 || iy >= s.in_height) continue;
                for (int kx = 0; kx < s.kernel_width; ++kx) {
                    const int ix = ox * s.stride_x - s.padding_x + kx;
                    if (ix < 0 || ix >= s.in_width) continue;
                    sum += plane[iy * s.in_width + ix] * w[ky * s.kernel_width + kx];
                }
            }
        }
    }
    sum += bias[channel];
    return relu ? fmax(sum, 0.0) : sum;
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

// Output element i (channel-major) of a hidden layer: the rounded, clipped activation.
__host__ __device__ inline double exact_hidden_element(
        int i, const double* a, const double* weight, const double* bias,
        const ExactLayerShape& s, int transpose, int relu, int exponent, double limit) {
    const int plane = s.out_height * s.out_width, channel = i / plane, pixel = i - channel * plane;
    return exact_activation(exact_layer_value(a, weight, bias, s, transpose, relu, channel,
                                              pixel / s.out_width, pixel % s.out_width),
                            exponent, limit);
}

// Output element i of the last layer: its scale ldexp(value, -shift) as a table index.
__host__ __device__ inline unsigned char exact_last_element(
        int i, const double* a, const double* weight, const double* bias, const double* table,
        int table_count, const ExactLayerShape& s, int transpose, int relu, int shift) {
    const int plane = s.out_height * s.out_width, channel = i / plane, pixel = i - channel * plane;
    const double value = exact_layer_value(a, weight, bias, s, transpose, relu, channel,
                                           pixel / s.out_width, pixel % s.out_width);
    return exact_scale_index(ldexp(value, -shift), table, table_count);
}

// A hidden layer: out (out_channels, out_height, out_width) from input a.
extern "C" __global__ void exact_hidden_layer(
        const double* __restrict__ a, const double* __restrict__ weight,
        const double* __restrict__ bias, double* __restrict__ out, ExactLayerShape s,
        int transpose, int relu, int exponent, double limit) {
    GRID_STRIDE_LOOP(i, s.out_channels * s.out_height * s.out_width)
        out[i] = exact_hidden_element(i, a, weight, bias, s, transpose, relu, exponent, limit);
}

// The last layer: the table index of each output's scale, as uint8.
extern "C" __global__ void exact_last_layer(
        const double* __restrict__ a, const double* __restrict__ weight,
        const double* __restrict__ bias, unsigned char* __restrict__ indexes,
        const double* __restrict__ table, int table_count, ExactLayerShape s, int transpose,
        int relu, int shift) {
    GRID_STRIDE_LOOP(i, s.out_channels * s.out_height * s.out_width)
        indexes[i] = exact_last_element(i, a, weight, bias, table, table_count, s, transpose,
                                        relu, shift);
}

// Element i of a convolution's column matrix [in_channels * kh * kw, out pixels]:
// row (ci * kh + ky) * kw + kx holds the input under tap (ky, kx) of each output
// pixel (zero outside the input), so that weight (out, in * kh * kw) times it is
// the layer's sums.
__host__ __device__ inline double exact_column_value(int i, const double* a,
                                                     const ExactLayerShape& s) {
    const int pixels = s.out_height * s.out_width, taps = s.kernel_height * s.kernel_width;
    const int row = i / pixels, pixel = i - row * pixels;
    const int channel = row / taps, tap = row - channel * taps;
    const int iy = (pixel / s.out_width) * s.stride_y - s.padding_y + tap / s.kernel_width;
    const int ix = (pixel % s.out_width) * s.stride_x - s.padding_x + tap % s.kernel_width;
    if (iy < 0 || iy >= s.in_height || ix < 0 || ix >= s.in_width) return 0.0;
    return a[((long long)channel * s.in_height + iy) * s.in_width + ix];
}

// The output channels one thread of the kernels that finish a layer from its GEMM's
// products takes (exact_layers.CHANNELS_PER_THREAD): their sums read the same taps,
// so the thread has that many loads in flight at a time, where one channel's sum
// waits for each load in turn.
#define EXACT_CHANNELS_PER_THREAD 4

// The thread order of those kernels: j runs over blocks of EXACT_CHANNELS_PER_THREAD
// channels, output rows, then each row's columns by phase (ox mod stride_x: the even
// columns, then the odd ones at stride 2), each phase padded to
// ceil(out_width / stride_x) threads. A warp's threads then take outputs of one
// phase, which the same taps of a transposed layer reach (exact_visit_taps),
// from consecutive input columns: one path, coalesced reads (at stride 1 it is the
// plain order). exact_phase_threads is the threads' count; exact_phase_output sets
// (first channel, oy, ox) and is false for a padding thread.
__host__ __device__ inline int exact_phase_threads(const ExactLayerShape& s) {
    return (s.out_channels + EXACT_CHANNELS_PER_THREAD - 1) / EXACT_CHANNELS_PER_THREAD *
           s.out_height * s.stride_x * ((s.out_width + s.stride_x - 1) / s.stride_x);
}

__host__ __device__ inline bool exact_phase_output(int j, const ExactLayerShape& s,
                                                   int* first, int* oy, int* ox) {
    const int phase_width = (s.out_width + s.stride_x - 1) / s.stride_x;
    const int row_threads = phase_width * s.stride_x, plane_threads = row_threads * s.out_height;
    const int block = j / plane_threads;
    *first = block * EXACT_CHANNELS_PER_THREAD;
    const int in_plane = j - block * plane_threads;
    *oy = in_plane / row_threads;
    const int k = in_plane - *oy * row_threads;
    *ox = (k % phase_width) * s.stride_x + k / phase_width;
    return *ox < s.out_width;
}

// The layer's values at output (oy, ox) of channels first.. (count of them, at most
// EXACT_CHANNELS_PER_THREAD) from the GEMM's products, plus bias and the ReLU when one
// follows: a convolution's sum is its products element; a transposed convolution's
// products are [(out channel * kh + ky) * kw + kx][input pixel], and an output sums
// those of the taps that reach it (exact_visit_taps).
__host__ __device__ inline void exact_values_from_products(
        const double* products, const double* bias, const ExactLayerShape& s, int transpose,
        int relu, int first, int count, int oy, int ox, double* values) {
    const long long pixel = (long long)oy * s.out_width + ox;
    double sums[EXACT_CHANNELS_PER_THREAD];
    if (transpose) {
        const long long in_plane = (long long)s.in_height * s.in_width;
        const long long channel_step = (long long)s.kernel_height * s.kernel_width * in_plane;
        const double* rows = products + first * channel_step;
        for (int k = 0; k < EXACT_CHANNELS_PER_THREAD; ++k) sums[k] = 0.0;
        exact_visit_taps(s, oy, ox, [&](int input, int tap) {
            const double* p = rows + tap * in_plane + input;
            #pragma unroll
            for (int k = 0; k < EXACT_CHANNELS_PER_THREAD; ++k)
                if (k < count) sums[k] += p[k * channel_step];
        });
    } else {
        const long long plane = (long long)s.out_height * s.out_width;
        #pragma unroll
        for (int k = 0; k < EXACT_CHANNELS_PER_THREAD; ++k)
            sums[k] = k < count ? products[(first + k) * plane + pixel] : 0.0;
    }
    #pragma unroll
    for (int k = 0; k < EXACT_CHANNELS_PER_THREAD; ++k) {
        const double sum = sums[k] + (k < count ? bias[first + k] : 0.0);
        values[k] = relu ? fmax(sum, 0.0) : sum;
    }
}

// The channels thread j of a finishing kernel takes from `first` on (0 for padding).
__host__ __device__ inline int exact_thread_channels(int j, const ExactLayerShape& s,
                                                     int* first, int* oy, int* ox) {
    if (!exact_phase_output(j, s, first, oy, ox)) return 0;
    const int left = s.out_channels - *first;
    return left < EXACT_CHANNELS_PER_THREAD ? left : EXACT_CHANNELS_PER_THREAD;
}

// Thread j of a finishing kernel: its outputs' values (exact_values_from_products),
// each handed to store(channel, oy, ox, value).
template <typename Store>
__host__ __device__ inline void exact_finish_thread(int j, const double* products,
                                                    const double* bias,
                                                    const ExactLayerShape& s, int transpose,
                                                    int relu, Store store) {
    int first, oy, ox;
    const int count = exact_thread_channels(j, s, &first, &oy, &ox);
    if (!count) return;
    double values[EXACT_CHANNELS_PER_THREAD];
    exact_values_from_products(products, bias, s, transpose, relu, first, count, oy, ox,
                               values);
    for (int k = 0; k < count; ++k) store(first + k, oy, ox, values[k]);
}

// Thread j of exact_hidden_from_products: its outputs' rounded, clipped activations.
__host__ __device__ inline void exact_hidden_thread(
        int j, const double* products, const double* bias, double* out,
        const ExactLayerShape& s, int transpose, int relu, int exponent, double limit) {
    exact_finish_thread(j, products, bias, s, transpose, relu,
                        [&](int channel, int oy, int ox, double value) {
        out[((long long)channel * s.out_height + oy) * s.out_width + ox] =
            exact_activation(value, exponent, limit);
    });
}

// Thread j of exact_last_from_products: its outputs' table indexes.
__host__ __device__ inline void exact_last_thread(
        int j, const double* products, const double* bias, unsigned char* indexes,
        const double* table, int table_count, const ExactLayerShape& s, int transpose,
        int relu, int shift) {
    exact_finish_thread(j, products, bias, s, transpose, relu,
                        [&](int channel, int oy, int ox, double value) {
        indexes[((long long)channel * s.out_height + oy) * s.out_width + ox] =
            exact_scale_index(ldexp(value, -shift), table, table_count);
    });
}

// A convolution's column matrix (exact_column_value), for the GEMM.
extern "C" __global__ void exact_columns(const double* __restrict__ a, ExactLayerShape s,
                                         double* __restrict__ columns) {
    GRID_STRIDE_LOOP(i, s.in_channels * s.kernel_height * s.kernel_width * s.out_height *
                        s.out_width)
        columns[i] = exact_column_value(i, a, s);
}

// A hidden layer's rounded, clipped activations from the GEMM's products.
extern "C" __global__ void exact_hidden_from_products(
        const double* __restrict__ products, const double* __restrict__ bias,
        double* __restrict__ out, ExactLayerShape s, int transpose, int relu, int exponent,
        double limit) {
    GRID_STRIDE_LOOP(j, exact_phase_threads(s))
        exact_hidden_thread(j, products, bias, out, s, transpose, relu, exponent, limit);
}

// The last layer's table indexes from the GEMM's products.
extern "C" __global__ void exact_last_from_products(
        const double* __restrict__ products, const double* __restrict__ bias,
        unsigned char* __restrict__ indexes, const double* __restrict__ table, int table_count,
        ExactLayerShape s, int transpose, int relu, int shift) {
    GRID_STRIDE_LOOP(j, exact_phase_threads(s))
        exact_last_thread(j, products, bias, indexes, table, table_count, s, transpose, relu,
                          shift);
}

// ---------------------------------------------------------------------------------
// The image synthesis g_s in exact arithmetic (gdnflow/codec/exact_image.py, whose
// docstring gives the arithmetic): transposed convolutions as above (GEMM, then
// exact_hidden_from_products, a few output channels at a time), inverse GDNs as the
// squares (exact_squares), one float64 GEMM of the integer gamma with them, and
// exact_inverse_gdn; the last layer's sums become 8-bit pixels (exact_pixel). Every
// step is an exact IEEE operation or a correctly rounded one (sqrt, a product): with
// no addition after a product that FMA could fuse inexactly, the pixels equal
// NumPy's bit for bit.

// The digits of a pixel's value v in [0, 1] kept before it is scaled to 0..255.
#define EXACT_PIXEL_BITS 32

// y_hat (float32) in units of 2^-fraction_bits, rounded half to even and clipped: the
// first layer's input.
__host__ __device__ inline double exact_input_unit(float value, int fraction_bits,
                                                   double limit) {
    return fmin(fmax(rint(ldexp((double)value, fraction_bits)), -limit), limit);
}

// x^2 in units of 2^(shift - 2 fraction bits), rounded: x * x is exact (|x| is at most
// 2^24 units, the activations' limit).
__host__ __device__ inline double exact_square(double x, int shift) {
    return rint(ldexp(x * x, -shift));
}

// An inverse GDN's output x sqrt(n) in x's units, rounded and clipped, where
// n = (beta + norm) 2^-norm_shift and norm is gamma's sum over the squares: the sum
// is of integers below 2^53, sqrt and the product are correctly rounded.
__host__ __device__ inline double exact_inverse_gdn_value(double x, double norm, double beta,
                                                          int norm_shift, double limit) {
    return fmin(fmax(rint(x * sqrt(ldexp(beta + norm, -norm_shift))), -limit), limit);
}

// The 8-bit pixel of a last-layer value (units of 2^-shift): v clipped to [0, 1],
// rounded to EXACT_PIXEL_BITS fraction bits, then round(255 v) with halves up; the
// last products and sums are exact (255 r < 2^41), fused or not.
__host__ __device__ inline unsigned char exact_pixel(double value, int shift) {
    const double v = fmin(fmax(ldexp(value, -shift), 0.0), 1.0);
    const double r = rint(ldexp(v, EXACT_PIXEL_BITS));
    return (unsigned char)floor(ldexp(r * 255.0 + ldexp(1.0, EXACT_PIXEL_BITS - 1),
                                      -EXACT_PIXEL_BITS));
}

extern "C" __global__ void exact_input_units(const float* __restrict__ y,
                                             double* __restrict__ units, int count,
                                             int fraction_bits, double limit) {
    GRID_STRIDE_LOOP(i, count) units[i] = exact_input_unit(y[i], fraction_bits, limit);
}

extern "C" __global__ void exact_squares(const double* __restrict__ x,
                                         double* __restrict__ squares, int count, int shift) {
    GRID_STRIDE_LOOP(i, count) squares[i] = exact_square(x[i], shift);
}

// x (channels, plane) replaced by its inverse GDN, norms (channels, plane) gamma's sums,
// channel c's beta and norm in units of 2^-norm_shift[c].
extern "C" __global__ void exact_inverse_gdn(double* __restrict__ x,
                                             const double* __restrict__ norms,
                                             const double* __restrict__ beta,
                                             const int* __restrict__ norm_shift, int channels,
                                             int plane, double limit) {
    GRID_STRIDE_LOOP(i, channels * plane)
        x[i] = exact_inverse_gdn_value(x[i], norms[i], beta[i / plane], norm_shift[i / plane],
                                       limit);
}

// Thread j of exact_pixels_from_products: the pixels of a last (transposed) layer's
// outputs, for the output channels first_channel.. of an image of image_channels:
// pixels (height, width, image_channels), channels last; bias starts at
// first_channel's.
__host__ __device__ inline void exact_pixel_thread(
        int j, const double* products, const double* bias, unsigned char* pixels,
        const ExactLayerShape& s, int first_channel, int image_channels, int shift) {
    exact_finish_thread(j, products, bias, s, 1, 0,
                        [&](int channel, int oy, int ox, double value) {
        pixels[((long long)oy * s.out_width + ox) * image_channels + first_channel + channel] =
            exact_pixel(value, shift);
    });
}

extern "C" __global__ void exact_pixels_from_products(
        const double* __restrict__ products, const double* __restrict__ bias,
        unsigned char* __restrict__ pixels, ExactLayerShape s, int first_channel,
        int image_channels, int shift) {
    GRID_STRIDE_LOOP(j, exact_phase_threads(s))
        exact_pixel_thread(j, products, bias, pixels, s, first_channel, image_channels, shift);
}
