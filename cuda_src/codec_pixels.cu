// The codec's 8-bit pixels to and from the transforms' float32, on the GPU.
// Python side: gdnflow/codec/device_pixels.py. Their NumPy twins are
// image_to_array and to_uint8 in gdnflow/codec/codec.py, and these kernels
// compute the same IEEE float32 operations, so both give the same values bit
// for bit: a correctly rounded division by 255 one way; a clip, a multiply by
// 255 and an add of 1/2, each rounded on its own (no FMA contraction, hence
// __fmul_rn and __fadd_rn), then floor, the other way. The per-element steps
// are __host__ __device__ for tests/codec/test_device_pixels.py, which builds
// this file for the host.
#include "gdnflow_common.cuh"

// a * 255 + 1/2 with each operation rounded on its own. On the host (the tests'
// build) the two statements are not contracted because x86-64 code without
// -march has no FMA instruction to contract them into.
__host__ __device__ inline float times_255_plus_half(float a) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(__fmul_rn(a, 255.0f), 0.5f);
#else
    const float product = a * 255.0f;
    return product + 0.5f;
#endif
}

// Element i of the tile x (3, height, width): the image's channel at
// (rows[y], columns[x]) over 255. image is (image_height, image_width, 3) uint8;
// rows and columns hold the tile's source positions (reflection padding included).
__host__ __device__ inline float unit_pixel(int i, const unsigned char* image, const int* rows,
                                            const int* columns, int height, int width,
                                            int image_width) {
    const int plane = height * width, channel = i / plane, pixel = i - channel * plane;
    const int y = pixel / width, x = pixel - y * width;
    const unsigned char v = image[((long long)rows[y] * image_width + columns[x]) * 3 + channel];
    return (float)v / 255.0f;
}

// Element i of out (out_height, out_width, 3) uint8: round(255 clip(x, 0, 1)),
// halves up, of x (3, height, width) at (top + y, left + x).
__host__ __device__ inline unsigned char uint8_pixel(int i, const float* x, int height, int width,
                                                     int top, int left, int out_width) {
    const int channel = i % 3, pixel = i / 3;
    const int y = pixel / out_width, column = pixel - y * out_width;
    const float v = x[((long long)channel * height + top + y) * width + left + column];
    const float clipped = fminf(fmaxf(v, 0.0f), 1.0f);
    return (unsigned char)floorf(times_255_plus_half(clipped));
}

extern "C" __global__ void unit_pixels(const unsigned char* __restrict__ image,
                                       const int* __restrict__ rows,
                                       const int* __restrict__ columns, float* __restrict__ x,
                                       int height, int width, int image_width) {
    GRID_STRIDE_LOOP(i, 3 * height * width)
        x[i] = unit_pixel(i, image, rows, columns, height, width, image_width);
}

extern "C" __global__ void uint8_pixels(const float* __restrict__ x,
                                        unsigned char* __restrict__ out, int height, int width,
                                        int top, int left, int out_height, int out_width) {
    GRID_STRIDE_LOOP(i, 3 * out_height * out_width)
        out[i] = uint8_pixel(i, x, height, width, top, left, out_width);
}
