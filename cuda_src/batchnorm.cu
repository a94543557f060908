// Batch normalisation over the channels of [N, C, L] tensors (L = H*W for
// NCHW). Python side: gdnflow/ops/batchnorm.py.
//
// Per-channel sums are split over a (splits x C) grid so that a few channels
// of many pixels still fill the GPU: block (s, c) adds up slice s of channel
// c's N*L elements into partial[c, s, 0:2], then one thread per channel adds
// the slices (a fixed order: no atomics, results do not depend on scheduling)
// and derives the per-channel coefficients. The elementwise passes read those
// coefficients and touch each element once.
//
// The variance is computed from sums of the data shifted by one of its own
// values K = x[0, c, 0] ("shifted data" algorithm): var = E[(x-K)^2] - E[x-K]^2
// cancels only as much as (mean - K)^2 / var, where the unshifted sums of
// squares would lose every digit of a channel whose mean is large against
// its spread.
#include "gdnflow_common.cuh"

#ifndef BN_BLOCK
#define BN_BLOCK 256
#endif

// Block (s, c) visits elements j of channel c with j in slice s of [0, n*l),
// element j being x[j / l, c, j % l]. term(offset) returns the pair of
// values to add for the element at ``offset``; the block's two sums go to
// partial[(c * splits + s) * 2 + {0, 1}].
template <typename Term>
__device__ __forceinline__ void channel_sums(float* __restrict__ partial, int n, int c, int l,
                                             Term term) {
    const int ch = blockIdx.y, s = blockIdx.x, splits = gridDim.x;
    const int count = n * l;
    const int per_slice = (count + splits - 1) / splits;
    const int begin = s * per_slice, end = min(begin + per_slice, count);
    float sum0 = 0.0f, sum1 = 0.0f;
    for (int j = begin + threadIdx.x; j < end; j += BN_BLOCK) {
        const int ni = j / l;
        const float2 v = term((size_t)(ni * c + ch) * l + (j - ni * l));
        sum0 += v.x;
        sum1 += v.y;
    }
    sum0 = block_sum(sum0);
    sum1 = block_sum(sum1);
    if (threadIdx.x == 0) {
        partial[((size_t)ch * splits + s) * 2] = sum0;
        partial[((size_t)ch * splits + s) * 2 + 1] = sum1;
    }
}

// partial[c, s] = (sum (x - K_c), sum (x - K_c)^2) over slice s, K_c = x[0, c, 0].
extern "C" __global__ void __launch_bounds__(BN_BLOCK)
bn_stats_partial(const float* __restrict__ x, float* __restrict__ partial, int n, int c, int l) {
    const float shift = x[(size_t)blockIdx.y * l];
    channel_sums(partial, n, c, l, [&](size_t k) {
        const float d = x[k] - shift;
        return make_float2(d, d * d);
    });
}

// Training: per channel, from the partial sums of bn_stats_partial,
//   mean = K + S1/M, var = S2/M - (S1/M)^2 (biased), invstd = 1/sqrt(var + eps),
//   scale = gamma * invstd;
// and when update_running, the running statistics (PyTorch's rule, unbiased
// variance): running = (1 - momentum) * running + momentum * batch value.
extern "C" __global__ void bn_stats_finalize(
        const float* __restrict__ partial, const float* __restrict__ x,
        const float* __restrict__ gamma, float* __restrict__ mean, float* __restrict__ invstd,
        float* __restrict__ scale, float* __restrict__ running_mean,
        float* __restrict__ running_var, int c, int l, int splits, int count, float momentum,
        float eps, int update_running) {
    GRID_STRIDE_LOOP(ch, c) {
        float s1 = 0.0f, s2 = 0.0f;
        for (int s = 0; s < splits; ++s) {
            s1 += partial[((size_t)ch * splits + s) * 2];
            s2 += partial[((size_t)ch * splits + s) * 2 + 1];
        }
        const float d = s1 / count;
        const float m = x[(size_t)ch * l] + d;
        const float var = fmaxf(s2 / count - d * d, 0.0f);
        const float is = 1.0f / sqrtf(var + eps);
        mean[ch] = m;
        invstd[ch] = is;
        scale[ch] = gamma[ch] * is;
        if (update_running) {
            running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * m;
            running_var[ch] = (1.0f - momentum) * running_var[ch]
                              + momentum * var * ((float)count / (float)(count - 1));
        }
    }
}

// Inference: the same coefficients from the running statistics.
extern "C" __global__ void bn_eval_coefficients(
        const float* __restrict__ running_mean, const float* __restrict__ running_var,
        const float* __restrict__ gamma, float* __restrict__ mean, float* __restrict__ invstd,
        float* __restrict__ scale, int c, float eps) {
    GRID_STRIDE_LOOP(ch, c) {
        const float is = 1.0f / sqrtf(running_var[ch] + eps);
        mean[ch] = running_mean[ch];
        invstd[ch] = is;
        scale[ch] = gamma[ch] * is;
    }
}

// y = (x - mean[c]) * scale[c] + beta[c]. Subtracting the mean first keeps
// the result accurate when the mean is large against the spread.
extern "C" __global__ void bn_normalize(
        const float* __restrict__ x, float* __restrict__ y, const float* __restrict__ mean,
        const float* __restrict__ scale, const float* __restrict__ beta, int c, int l, int n) {
    GRID_STRIDE_LOOP(i, n) {
        const int ch = (i / l) % c;
        y[i] = (x[i] - mean[ch]) * scale[ch] + beta[ch];
    }
}

// partial[c, s] = (sum gy, sum gy * (x - mean_c)) over slice s.
extern "C" __global__ void __launch_bounds__(BN_BLOCK)
bn_backward_partial(const float* __restrict__ gy, const float* __restrict__ x,
                    const float* __restrict__ mean, float* __restrict__ partial,
                    int n, int c, int l) {
    const float m = mean[blockIdx.y];
    channel_sums(partial, n, c, l, [&](size_t k) {
        const float g = gy[k];
        return make_float2(g, g * (x[k] - m));
    });
}

// gbeta = sum gy, ggamma = invstd * sum gy (x - mean) = sum gy * xhat.
extern "C" __global__ void bn_backward_finalize(
        const float* __restrict__ partial, const float* __restrict__ invstd,
        float* __restrict__ gbeta, float* __restrict__ ggamma, int c, int splits) {
    GRID_STRIDE_LOOP(ch, c) {
        float s1 = 0.0f, s2 = 0.0f;
        for (int s = 0; s < splits; ++s) {
            s1 += partial[((size_t)ch * splits + s) * 2];
            s2 += partial[((size_t)ch * splits + s) * 2 + 1];
        }
        gbeta[ch] = s1;
        ggamma[ch] = s2 * invstd[ch];
    }
}

// Training (batch statistics depend on x):
//   gx = gamma * invstd * (gy - (gbeta + xhat * ggamma) / M),  xhat = (x - mean) * invstd;
// inference (fixed statistics): gx = gamma * invstd * gy, and x, gbeta,
// ggamma are not read.
extern "C" __global__ void bn_backward_data(
        const float* __restrict__ gy, const float* __restrict__ x,
        const float* __restrict__ mean, const float* __restrict__ invstd,
        const float* __restrict__ scale, const float* __restrict__ gbeta,
        const float* __restrict__ ggamma, float* __restrict__ gx, int c, int l, int n,
        float inv_count, int training) {
    GRID_STRIDE_LOOP(i, n) {
        const int ch = (i / l) % c;
        float g = gy[i];
        if (training) {
            const float xhat = (x[i] - mean[ch]) * invstd[ch];
            g -= (gbeta[ch] + xhat * ggamma[ch]) * inv_count;
        }
        gx[i] = scale[ch] * g;
    }
}
