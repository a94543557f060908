// Kernels of a compiled training step that are not operators.
// Python side: gdnflow/step_context.py (StepContext.guard_finite).
#include "gdnflow_common.cuh"

// flag[0] = step + 1 if flag[0] is still 0 and one of the `count` scalars
// *s0 .. *s7 (one float each; unused ones null) is NaN or infinite. `step`
// is the step's number as two 32-bit words in device memory (low first),
// read at run time so that a captured graph sees each replay's number.
// The flag keeps the first bad step: optimiser kernels skip their update
// while it is set (optim.cu), so the parameters stay those before that step.
// One warp; lane j checks scalar j.
extern "C" __global__ void guard_finite(int* __restrict__ flag,
                                        const unsigned int* __restrict__ step, int count,
                                        const float* s0, const float* s1, const float* s2,
                                        const float* s3, const float* s4, const float* s5,
                                        const float* s6, const float* s7) {
    const float* scalars[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
    const int lane = threadIdx.x;
    const bool bad = lane < count && lane < 8 && !isfinite(*scalars[lane]);
    const unsigned int any_bad = __ballot_sync(0xffffffffu, bad);
    if (lane == 0 && any_bad != 0u && *flag == 0) {
        // The step numbers a run reaches fit in 31 bits; saturate past that.
        const unsigned long long number = ((unsigned long long)step[1] << 32 | step[0]) + 1ull;
        *flag = number > 0x7fffffffull ? 0x7fffffff : (int)number;
    }
}
