// Conversions between float32 and the 16-bit floats (float16, bfloat16).
// Python side: gdnflow/ops/cast.py. Rounding to 16 bits is to nearest, ties
// to even (the _rn intrinsics), as NumPy's float16 and ml_dtypes' bfloat16
// round; widening is exact. 16-bit to 16-bit goes through float, exactly
// (every float16 and bfloat16 value is a float32).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "gdnflow_common.cuh"

#define CAST_KERNEL(NAME, IN_T, OUT_T, CONVERT)                               \
extern "C" __global__ void NAME(const IN_T* __restrict__ x,                   \
                                OUT_T* __restrict__ y, int n) {               \
    GRID_STRIDE_LOOP(i, n) { const IN_T v = x[i]; y[i] = (CONVERT); }         \
}

CAST_KERNEL(float32_to_float16,  float,         __half,        __float2half_rn(v))
CAST_KERNEL(float32_to_bfloat16, float,         __nv_bfloat16, __float2bfloat16_rn(v))
CAST_KERNEL(float16_to_float32,  __half,        float,         __half2float(v))
CAST_KERNEL(bfloat16_to_float32, __nv_bfloat16, float,         __bfloat162float(v))
CAST_KERNEL(float16_to_bfloat16, __half,        __nv_bfloat16, __float2bfloat16_rn(__half2float(v)))
CAST_KERNEL(bfloat16_to_float16, __nv_bfloat16, __half,        __float2half_rn(__bfloat162float(v)))
