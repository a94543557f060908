// The bounded maximum behind GDN's non-negative reparameterisation, alone and
// fused with the square and the pedestal.
// Python side: gdnflow/ops/parametrize.py.
#include "gdnflow_common.cuh"

// y = max(x, bound).
extern "C" __global__ void lower_bound_forward(const float* __restrict__ x, float* __restrict__ y,
                                               int n, float bound) {
    GRID_STRIDE_LOOP(i, n) y[i] = fmaxf(x[i], bound);
}

// The gradient passes where x >= bound, and also below the bound where it is
// negative: a descent step (which moves x against the gradient) then raises
// x toward the bound instead of leaving it stuck under it.
extern "C" __global__ void lower_bound_backward(const float* __restrict__ x,
                                                const float* __restrict__ gy,
                                                float* __restrict__ gx, int n, float bound) {
    GRID_STRIDE_LOOP(i, n) {
        const float g = gy[i];
        gx[i] = (x[i] >= bound || g < 0.0f) ? g : 0.0f;
    }
}

// v = max(p, bound)^2 - pedestal.
extern "C" __global__ void nonnegative_forward(const float* __restrict__ p, float* __restrict__ v,
                                               int n, float bound, float pedestal) {
    GRID_STRIDE_LOOP(i, n) v[i] = nonnegative_value(p[i], bound, pedestal);
}

// gp = 2 max(p, bound) gv, where lower_bound_backward lets the gradient pass
// (2 max(p, bound) > 0 keeps the sign of gv).
extern "C" __global__ void nonnegative_backward(const float* __restrict__ p,
                                                const float* __restrict__ gv,
                                                float* __restrict__ gp, int n, float bound) {
    GRID_STRIDE_LOOP(i, n) gp[i] = nonnegative_value_grad(p[i], gv[i], bound);
}
