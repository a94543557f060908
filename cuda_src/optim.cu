// Optimiser updates: one launch updates every tensor of a parameter group.
// Python side: gdnflow/optim/optimizer.py (FusedGroup builds the tables),
// gdnflow/optim/sgd.py, gdnflow/optim/adam.py, gdnflow/optim/clip.py.
#include "gdnflow_common.cuh"

// ------------------------------------------------------ multi-tensor layout --
// A group of n tensors is described by three device arrays:
//
//   table   pointers, ROWS rows of n (row r, tensor t at table[r * n + t]):
//             row 0        parameters (updated in place)
//             row 1        gradients; nullptr: leave tensor t alone in this
//                          launch (it has no gradient this step)
//             rows 2, ...  state arrays of the optimiser (SGD: momentum
//                          buffer; Adam: exp_avg, exp_avg_sq); nullptr where
//                          the update does not read them
//   blocks  3 ints per CUDA block: tensor index, first element, one past the
//           last element it updates (at most CHUNK = 4096 elements, so a
//           tensor of s elements has ceil(s / 4096) blocks)
//   scalars S floats per tensor (scalars[S * t + j]): the update's scalar
//           arguments for tensor t (learning rate, betas, bias corrections,
//           ...), computed by the host for this step. They are read from
//           memory, not passed as launch arguments, so that a captured
//           training step replays the launch with the values the host wrote
//           before each replay (schedules, Adam's step counts).
//
// `skip`: nullptr, or a flag that, when nonzero, turns the launch into a
// no-op (a compiled step whose loss went non-finite: gdnflow/step_context.py).
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
// Scalars (S = 4): lr, momentum, weight_decay, nesterov (0 or 1).
// The momentum buffer (row 2) starts at zero, which makes b = d on the first
// step without a branch; it is only read when momentum != 0.
extern "C" __global__ void sgd_step(
        float* const* __restrict__ table, const int* __restrict__ blocks, int n,
        const float* __restrict__ scalars, const int* __restrict__ skip) {
    if (skip != nullptr && *skip != 0) return;
    const Chunk c = block_chunk(blocks);
    const float* __restrict__ grad = table[n + c.tensor];
    if (grad == nullptr) return;
    const float* s = scalars + 4 * c.tensor;
    const float lr = s[0], momentum = s[1], weight_decay = s[2];
    const bool nesterov = s[3] != 0.0f;
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
// Scalars (S = 8): beta1, 1 - beta1, beta2, 1 - beta2, eps, weight_decay,
// step_size = lr / (1 - beta1^t), bias_correction2_sqrt = sqrt(1 - beta2^t),
// computed on the host in double precision and rounded to float, as PyTorch
// does. m is row 2, v row 3.
extern "C" __global__ void adam_step(
        float* const* __restrict__ table, const int* __restrict__ blocks, int n,
        const float* __restrict__ scalars, const int* __restrict__ skip) {
    if (skip != nullptr && *skip != 0) return;
    const Chunk c = block_chunk(blocks);
    const float* __restrict__ grad = table[n + c.tensor];
    if (grad == nullptr) return;
    const float* s = scalars + 8 * c.tensor;
    const float beta1 = s[0], one_minus_beta1 = s[1], beta2 = s[2], one_minus_beta2 = s[3];
    const float eps = s[4], weight_decay = s[5], step_size = s[6];
    const float bias_correction2_sqrt = s[7];
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
// Clipping by the global norm of a list of gradients, in three launches
// whatever their number, and nothing read back (gdnflow/optim/clip.py).
// `table` holds one pointer per tensor and `blocks` the block map above.
//
// 1. partials[b] = sum of g^2 over block b's range (one block per entry);
extern "C" __global__ void square_sum_partials(const float* const* __restrict__ table,
                                               const int* __restrict__ blocks,
                                               float* __restrict__ partials) {
    const Chunk c = block_chunk(blocks);
    const float* __restrict__ g = table[c.tensor];
    float sum = 0.0f;
    for (int i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) sum += g[i] * g[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// 2. total[0] = the sum of the `count` partials, by one block in a fixed
//    order (no atomics: the same gradients give the same norm, bit for bit);
extern "C" __global__ void sum_partials(const float* __restrict__ partials, int count,
                                        float* __restrict__ total) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) total[0] = sum;
}

// 3. norm = sqrt(*square_sum) and, if norm > max_norm, g *= max_norm / (norm
//    + eps) for every tensor of the table, the factor in double and rounded to
//    float as PyTorch's clip_grad_norm_ does; a NaN norm scales nothing, an
//    infinite one gives the factor 0 (as in PyTorch).
extern "C" __global__ void scale_to_max_norm(float* const* __restrict__ table,
                                             const int* __restrict__ blocks,
                                             const float* __restrict__ square_sum,
                                             double max_norm, double eps) {
    const double norm = sqrt((double)*square_sum);
    if (!(norm > max_norm)) return;
    const float scale = (float)(max_norm / (norm + eps));
    const Chunk c = block_chunk(blocks);
    float* __restrict__ g = table[c.tensor];
    for (int i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) g[i] *= scale;
}
