// Optimiser updates: one launch updates every tensor of a parameter group.
// Python side: gdnflow/optim/optimizer.py (FusedGroup builds the tables),
// gdnflow/optim/sgd.py, gdnflow/optim/adam.py, gdnflow/optim/clip.py.
#include "gdnflow_common.cuh"

// ------------------------------------------------------ multi-tensor layout --
// A group of n tensors is described by two device arrays:
//
//   table   pointers, ROWS rows of n (row r, tensor t at table[r * n + t]):
//             row 0        parameters (updated in place)
//             row 1        gradients; nullptr: leave tensor t alone in this
//                          launch (it has no gradient, or another launch with
//                          other scalars updates it)
//             rows 2, ...  state arrays of the optimiser (SGD: momentum
//                          buffer; Adam: exp_avg, exp_avg_sq); nullptr where
//                          the update does not read them
//   blocks  3 ints per CUDA block: tensor index, first element, one past the
//           last element it updates (at most CHUNK = 4096 elements, so a
//           tensor of s elements has ceil(s / 4096) blocks)
//   per_tensor  nullptr, or K floats per tensor (per_tensor[K * t + j]) that
//           replace the last K scalar arguments for tensor t: the host
//           passes them this way only when they differ between the tensors
//           of a launch (Adam's bias corrections after a parameter missed a
//           step); SGD has K = 0 and ignores it
//
// The grid has one block per entry of `blocks`; each block walks its range
// with a block-stride loop, so loads and stores are coalesced. All tensors
// are float32, C-contiguous, with fewer than 2^31 elements.
struct Chunk {
    int tensor, begin, end;
};

__device__ __forceinline__ Chunk block_chunk(const int* __restrict__ blocks) {
    const int* entry = blocks + 3 * blockIdx.x;
    return Chunk{entry[0], entry[1], entry[2]};
}

// SGD (PyTorch's rule, dampening 0), for each element:
//   d = g + weight_decay * p
//   if momentum != 0: b = momentum * b + d;  d = nesterov ? d + momentum * b : b
//   p = p - lr * d
// The momentum buffer (row 2) starts at zero, which makes b = d on the first
// step without a branch; it is only read when momentum != 0.
extern "C" __global__ void sgd_step(
        float* const* __restrict__ table, const int* __restrict__ blocks, int n,
        const float* /* per_tensor: unused, K = 0 */, float lr, float momentum, float weight_decay, int nesterov) {
    const Chunk c = block_chunk(blocks);
    const float* __restrict__ grad = table[n + c.tensor];
    if (grad == nullptr) return;
    float* __restrict__ param = table[c.tensor];
    float* __restrict__ buffer = table[2 * n + c.tensor];
    for (int i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
        const float p = param[i];
        float d = grad[i];
        if (weight_decay != 0.0f) d += weight_decay * p;
        if (momentum != 0.0f) {
            const float b = momentum * buffer[i] + d;
            buffer[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        param[i] = p - lr * d;
    }
}

// Adam (PyTorch's rule, no amsgrad), for each element at the tensor's step t:
//   g = g + weight_decay * p
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
//   p = p - step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bias_correction2_sqrt =
// sqrt(1 - beta2^t) computed on the host in double precision (K = 2: per
// tensor when the step counts of a launch differ). m is row 2, v row 3.
extern "C" __global__ void adam_step(
        float* const* __restrict__ table, const int* __restrict__ blocks, int n,
        const float* __restrict__ per_tensor,
        float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
        float eps, float weight_decay, float step_size, float bias_correction2_sqrt) {
    const Chunk c = block_chunk(blocks);
    const float* __restrict__ grad = table[n + c.tensor];
    if (grad == nullptr) return;
    if (per_tensor != nullptr) {
        step_size = per_tensor[2 * c.tensor];
        bias_correction2_sqrt = per_tensor[2 * c.tensor + 1];
    }
    float* __restrict__ param = table[c.tensor];
    float* __restrict__ exp_avg = table[2 * n + c.tensor];
    float* __restrict__ exp_avg_sq = table[3 * n + c.tensor];
    for (int i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
        const float p = param[i];
        float g = grad[i];
        if (weight_decay != 0.0f) g += weight_decay * p;
        const float m = beta1 * exp_avg[i] + one_minus_beta1 * g;
        const float v = beta2 * exp_avg_sq[i] + one_minus_beta2 * (g * g);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
        param[i] = p - step_size * (m / denom);
    }
}

// ------------------------------------------------------------ clipping ----
// x = x * scale in place (gradient clipping). One pointer, so no aliasing
// question arises, unlike the unary `affine` kernel with x == y.
extern "C" __global__ void scale_in_place(float* __restrict__ x, int n, float scale) {
    GRID_STRIDE_LOOP(i, n) { x[i] *= scale; }
}
