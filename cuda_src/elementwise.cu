// Elementwise operators: unary maps with up to two scalar parameters, and
// binary arithmetic with broadcasting. Python side: gdnflow/ops/elementwise.py.
// Built for float tensors, and with -DSTORAGE_BF16 / -DSTORAGE_FP16 for
// 16-bit ones (storage_t, load_value and store_value: gdnflow_common.cuh).
#include "gdnflow_common.cuh"

// Vectors: where every array of a launch is 16-byte aligned (pooled arrays
// are; views at an offset may not be), each thread moves 16 bytes per load
// and store (4 floats, 8 16-bit values), then the elements past the last
// whole vector go one at a time. On the H200 this took 16-bit ReLU over 2^26
// values from 1770 to 3106 GB/s (benchmarks/results/precision/half.md).
constexpr int VECTOR_ELEMENTS = 16 / sizeof(storage_t);
struct alignas(16) StorageVector { storage_t v[VECTOR_ELEMENTS]; };

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// out[i] = f(in0[i], ..., in{K-1}[i]) over [0, n), computed in float: the
// loop every same-shape elementwise kernel runs. An input f ignores costs no
// load (the compiler drops it).
template <int K, typename F>
__device__ __forceinline__ void map_elements(const storage_t* const (&in)[K],
                                             storage_t* __restrict__ out, int n, F f) {
    const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    bool aligned = aligned16(out);
    for (int k = 0; k < K; ++k) aligned = aligned && aligned16(in[k]);
    int done = 0;
    if (aligned) {
        const int vectors = n / VECTOR_ELEMENTS;
        for (int v = first; v < vectors; v += stride) {
            StorageVector loaded[K], result;
            for (int k = 0; k < K; ++k) loaded[k] = reinterpret_cast<const StorageVector*>(in[k])[v];
#pragma unroll
            for (int j = 0; j < VECTOR_ELEMENTS; ++j) {
                float values[K];
                for (int k = 0; k < K; ++k) values[k] = load_value(loaded[k].v[j]);
                result.v[j] = store_value(f(values));
            }
            reinterpret_cast<StorageVector*>(out)[v] = result;
        }
        done = vectors * VECTOR_ELEMENTS;
    }
    for (int i = done + first; i < n; i += stride) {
        float values[K];
        for (int k = 0; k < K; ++k) values[k] = load_value(in[k][i]);
        out[i] = store_value(f(values));
    }
}

// ---------------------------------------------------------------- unary ----
// Every unary operator NAME gets two kernels with one signature each:
//   NAME_forward (x, y, n, p0, p1):            y  = FORWARD(x)
//   NAME_backward(x, y, gy, gx, n, p0, p1):    gx = BACKWARD(x, y, gy)
// where p0, p1 are the operator's scalar parameters (exponent, bounds...).
// A backward that needs only x or only y lets the compiler drop the other load.
#define UNARY_OPERATOR(NAME, FORWARD, BACKWARD)                               \
extern "C" __global__ void NAME##_forward(                                    \
        const storage_t* __restrict__ x_, storage_t* __restrict__ y_, int n,  \
        float p0, float p1) {                                                 \
    const storage_t* const in[1] = {x_};                                      \
    map_elements<1>(in, y_, n, [=](const float (&v)[1]) {                     \
        const float x = v[0];                                                 \
        return (FORWARD);                                                     \
    });                                                                       \
}                                                                             \
extern "C" __global__ void NAME##_backward(                                   \
        const storage_t* __restrict__ x_, const storage_t* __restrict__ y_,   \
        const storage_t* __restrict__ gy_, storage_t* __restrict__ gx_, int n,\
        float p0, float p1) {                                                 \
    const storage_t* const in[3] = {x_, y_, gy_};                             \
    map_elements<3>(in, gx_, n, [=](const float (&v)[3]) {                    \
        [[maybe_unused]] const float x = v[0], y = v[1];                      \
        const float gy = v[2];                                                \
        return (BACKWARD);                                                    \
    });                                                                       \
}

// The unary operators, one X(NAME, FORWARD, BACKWARD) each: expanded into
// their kernels here and into the fused programs' opcodes below. erf and
// the trigonometric and hyperbolic maps are gdnflow/ops/special.py's;
// 1.1283791671f is 2/sqrt(pi).
#define UNARY_OPERATORS(X)                                                        \
    X(neg,     -x,                          -gy)                                  \
    X(exp,     expf(x),                     gy * y)                               \
    X(log,     logf(x),                     gy / x)                               \
    X(sqrt,    sqrtf(x),                    gy * 0.5f / y)                        \
    X(pow,     powf(x, p0),                 gy * p0 * powf(x, p0 - 1.0f))         \
    X(relu,    fmaxf(x, 0.0f),              x > 0.0f ? gy : 0.0f)                 \
    X(relu6,   fminf(fmaxf(x, 0.0f), 6.0f), (x > 0.0f && x < 6.0f) ? gy : 0.0f)   \
    X(sigmoid, 1.0f / (1.0f + expf(-x)),    gy * y * (1.0f - y))                  \
    X(clamp,   fminf(fmaxf(x, p0), p1),     (x >= p0 && x <= p1) ? gy : 0.0f)     \
    X(affine,  p0 * x + p1,                 p0 * gy)                              \
    X(erf,     erff(x),                     gy * 1.1283791671f * expf(-x * x))    \
    X(sin,     sinf(x),                     gy * cosf(x))                         \
    X(cos,     cosf(x),                     -gy * sinf(x))                        \
    X(tan,     tanf(x),                     gy * (1.0f + y * y))                  \
    X(asin,    asinf(x),                    gy * rsqrtf(1.0f - x * x))            \
    X(acos,    acosf(x),                    -gy * rsqrtf(1.0f - x * x))           \
    X(atan,    atanf(x),                    gy / (1.0f + x * x))                  \
    X(sinh,    sinhf(x),                    gy * coshf(x))                        \
    X(cosh,    coshf(x),                    gy * sinhf(x))                        \
    X(asinh,   asinhf(x),                   gy * rsqrtf(x * x + 1.0f))            \
    X(acosh,   acoshf(x),                   gy * rsqrtf((x - 1.0f) * (x + 1.0f))) \
    X(atanh,   atanhf(x),                   gy / (1.0f - x * x))

#ifndef FUSED_PROGRAM      // a fused program's module holds its kernel alone (section below)
UNARY_OPERATORS(UNARY_OPERATOR)
#endif

// --------------------------------------------------------------- binary ----
// out = a OP b. NAME_same: a, b and out have one shape. NAME_broadcast: out
// has (up to) six dimensions d0 x d1 x ... x d5 (the host merges adjacent
// dimensions and pads with leading 1s); an operand's element for out index
// (i0, ..., i5) is at sum_k ik * sk, a stride being 0 along a broadcast
// dimension. Dimensions of size 1 are skipped (a uniform branch), so the
// common merged layouts pay one or two divisions, not five.
#define BROADCAST_DIMS int d1, int d2, int d3, int d4, int d5
#define BROADCAST_STRIDES(s) int s##0, int s##1, int s##2, int s##3, int s##4, int s##5

#define BROADCAST_STEP(D, SA, SB)                                             \
    if (D > 1) { const int k = i % D; i /= D; oa += k * SA; ob += k * SB; }

__device__ __forceinline__ void broadcast_offsets(
        int i, BROADCAST_DIMS, BROADCAST_STRIDES(as), BROADCAST_STRIDES(bs),
        int& oa, int& ob) {
    oa = 0; ob = 0;
    BROADCAST_STEP(d5, as5, bs5)
    BROADCAST_STEP(d4, as4, bs4)
    BROADCAST_STEP(d3, as3, bs3)
    BROADCAST_STEP(d2, as2, bs2)
    BROADCAST_STEP(d1, as1, bs1)
    oa += i * as0; ob += i * bs0;
}

#define BINARY_OPERATOR(NAME, EXPR)                                           \
extern "C" __global__ void NAME##_same(                                       \
        const storage_t* __restrict__ a_, const storage_t* __restrict__ b_,   \
        storage_t* __restrict__ out, int n) {                                 \
    const storage_t* const in[2] = {a_, b_};                                  \
    map_elements<2>(in, out, n, [](const float (&v)[2]) {                     \
        const float a = v[0], b = v[1];                                       \
        return (EXPR);                                                        \
    });                                                                       \
}                                                                             \
extern "C" __global__ void NAME##_broadcast(                                  \
        const storage_t* __restrict__ a_, const storage_t* __restrict__ b_,   \
        storage_t* __restrict__ out, int n, BROADCAST_DIMS,                   \
        BROADCAST_STRIDES(as), BROADCAST_STRIDES(bs)) {                       \
    GRID_STRIDE_LOOP(i, n) {                                                  \
        int oa, ob;                                                           \
        broadcast_offsets(i, d1, d2, d3, d4, d5, as0, as1, as2, as3, as4, as5, \
                          bs0, bs1, bs2, bs3, bs4, bs5, oa, ob);              \
        const float a = load_value(a_[oa]), b = load_value(b_[ob]);           \
        out[i] = store_value(EXPR);                                           \
    }                                                                         \
}

#define BINARY_OPERATORS(X) X(add, a + b) X(sub, a - b) X(mul, a * b) X(div, a / b)

#ifndef FUSED_PROGRAM
BINARY_OPERATORS(BINARY_OPERATOR)

// out = x broadcast to out's shape (the backward of a reduction).
extern "C" __global__ void broadcast_copy(
        const storage_t* __restrict__ x, storage_t* __restrict__ out, int n,
        BROADCAST_DIMS, BROADCAST_STRIDES(s)) {
    GRID_STRIDE_LOOP(i, n) {
        int ox, unused;
        broadcast_offsets(i, d1, d2, d3, d4, d5, s0, s1, s2, s3, s4, s5,
                          0, 0, 0, 0, 0, 0, ox, unused);
        out[i] = x[ox];
    }
}
#endif

// ------------------------------------------------------- fused programs ----
// fused_program: one pass for a chain of the operators above that an
// inference plan fused (Python side: gdnflow/ops/fused_elementwise.py, which
// writes the program; gdnflow/inference/passes.py, which finds the chains).
// A module built with -DFUSED_PROGRAM=<statements> -DFUSED_INPUTS=<k> holds
// this kernel only: each program is compiled once (and cached on disk like
// every module), its operators inlined, its values in registers. Input k's
// element for out index (i0, ..., i5) is at sum_j ij * strides[k][j], a
// stride 0 where the input is broadcast and permuted where a transpose was
// folded in. The statements read input0 ... input<k-1> (the inputs' elements),
// define more r's with the op_* functions, and assign the out value to
// `result`.
#ifdef FUSED_PROGRAM
#define PROGRAM_INPUTS 8
#define PROGRAM_DIMS 6

#define UNARY_FUNCTION(NAME, FORWARD, BACKWARD)                               \
    __device__ __forceinline__ float op_##NAME(float x, float p0, float p1) { \
        return (FORWARD);                                                     \
    }
#define BINARY_FUNCTION(NAME, EXPR)                                           \
    __device__ __forceinline__ float op_##NAME(float a, float b) { return (EXPR); }
UNARY_OPERATORS(UNARY_FUNCTION)
BINARY_OPERATORS(BINARY_FUNCTION)

// Passed by value (the host packs the same layout: 4-byte fields). An index
// is split by each dimension d with a multiply and a shift: q = (umulhi(i,
// magic[d]) + i) >> shift[d] is i / dims[d] for i < 2^31, where a division
// by a run-time value costs a few dozen instructions.
struct ProgramLayout {
    int dims[PROGRAM_DIMS];                      // out's merged dimensions, outermost first
    int strides[PROGRAM_INPUTS][PROGRAM_DIMS];   // element strides per input and dimension
    unsigned magic[PROGRAM_DIMS];
    unsigned shift[PROGRAM_DIMS];
};

// offset[k]: the element of input k that out's element i is computed from (in
// fused_program_vector, out's vector i starts at).
__device__ __forceinline__ void input_offsets(unsigned i, const ProgramLayout& layout,
                                              int (&offset)[PROGRAM_INPUTS]) {
#pragma unroll
    for (int k = 0; k < PROGRAM_INPUTS; ++k) offset[k] = 0;
    unsigned rest = i;
#pragma unroll
    for (int d = PROGRAM_DIMS - 1; d > 0; --d) {
        if (layout.dims[d] == 1) continue;
        const unsigned quotient = quotient_of(rest, layout.magic[d], layout.shift[d]);
        const int index = rest - quotient * layout.dims[d];
        rest = quotient;
#pragma unroll
        for (int k = 0; k < FUSED_INPUTS; ++k) offset[k] += index * layout.strides[k][d];
    }
#pragma unroll
    for (int k = 0; k < FUSED_INPUTS; ++k) offset[k] += rest * layout.strides[k][0];
}

// Every program kernel's first arguments (out, then the inputs), and a macro
// applied to each input's number.
#define PROGRAM_POINTERS storage_t* __restrict__ out,                              \
    const storage_t* __restrict__ in0, const storage_t* __restrict__ in1,          \
    const storage_t* __restrict__ in2, const storage_t* __restrict__ in3,          \
    const storage_t* __restrict__ in4, const storage_t* __restrict__ in5,          \
    const storage_t* __restrict__ in6, const storage_t* __restrict__ in7
#define FOR_EACH_INPUT(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

#define LOAD_INPUT(k) [[maybe_unused]] const float input##k = k < FUSED_INPUTS ? load_value(in##k[offset[k]]) : 0.0f;

extern "C" __global__ void fused_program(
        PROGRAM_POINTERS, int n, const ProgramLayout layout) {
    GRID_STRIDE_LOOP(i, n) {
        int offset[PROGRAM_INPUTS];
        input_offsets(i, layout, offset);
        FOR_EACH_INPUT(LOAD_INPUT)
        float result;
        FUSED_PROGRAM
        out[i] = store_value(result);
    }
}

// fused_program_vector: the same program, VECTOR_ELEMENTS consecutive elements a
// thread (16 bytes a load and a store), where the host found that out's
// innermost merged dimension is a multiple of VECTOR_ELEMENTS, that every input
// steps along it by 1 (read as one vector) or 0 (one value serves the vector),
// and that every array is 16-byte aligned at every vector. Indices count vectors:
// the layout's innermost dimension and strides are in vectors (the host divides
// and scales them). One 4-byte value a thread at a time kept too few loads in
// flight: ConvNeXt's bias + GELU over [32, 56, 56, 384] ran at 2.3 TB/s on the H200.
#define LOAD_VECTOR(k) StorageVector vector##k;                                   \
    if (k < FUSED_INPUTS) {                                                       \
        if (layout.strides[k][PROGRAM_DIMS - 1] != 0)                             \
            vector##k = *reinterpret_cast<const StorageVector*>(in##k + offset[k]); \
        else                                                                      \
            for (int j = 0; j < VECTOR_ELEMENTS; ++j) vector##k.v[j] = in##k[offset[k]]; \
    }
#define VECTOR_INPUT(k) [[maybe_unused]] const float input##k = k < FUSED_INPUTS ? load_value(vector##k.v[j]) : 0.0f;

extern "C" __global__ void fused_program_vector(
        PROGRAM_POINTERS, int n, const ProgramLayout layout) {
    GRID_STRIDE_LOOP(i, n) {
        int offset[PROGRAM_INPUTS];
        input_offsets(i, layout, offset);
        FOR_EACH_INPUT(LOAD_VECTOR)
        StorageVector stored;
#pragma unroll
        for (int j = 0; j < VECTOR_ELEMENTS; ++j) {
            FOR_EACH_INPUT(VECTOR_INPUT)
            float result;
            FUSED_PROGRAM
            stored.v[j] = store_value(result);
        }
        reinterpret_cast<StorageVector*>(out)[i] = stored;
    }
}

// fused_program_staged (a module built with -DFUSED_STAGED=<mask> as well): the
// same program where the inputs in the bit mask are read through shared memory.
// out's last two merged dimensions are [rows, cols] (cols innermost); a staged
// input steps by 1 along rows and by more along cols: one read transposed, as
// ConvNeXt's block reads its last product [N, H, W, C] for a [N, C, H, W]
// result. Read one element a thread along out's order, each warp's loads of
// it touched 32 lines; here a block of 32 x 8 threads takes a 32 x 32 tile
// of (row, col) of one outer index, reads each staged input's tile with lanes
// along rows (coalesced) into shared memory and the other inputs with lanes
// along cols into registers, then computes with lanes along cols, out written
// along cols (coalesced too).
#ifdef FUSED_STAGED
#define STAGE_TILE 32
#define STAGE_ROWS 8
__host__ __device__ constexpr int bits_set(unsigned mask) { return mask ? (mask & 1u) + bits_set(mask >> 1) : 0; }
constexpr int STAGED_INPUTS = bits_set(FUSED_STAGED);
// The shared tile of staged input k: how many staged inputs come before it
// (clamped, for the inputs that are not staged: their branch never runs).
__host__ __device__ constexpr int stage_slot(int k) {
    return bits_set(FUSED_STAGED & ((1u << k) - 1u)) < STAGED_INPUTS
        ? bits_set(FUSED_STAGED & ((1u << k) - 1u)) : STAGED_INPUTS - 1;
}
#define IS_STAGED(k) (k < FUSED_INPUTS && ((FUSED_STAGED >> (k)) & 1))
// Input k's element at (row0 + a, col0 + b) of the block's tile: base[k], the
// tile's first, plus the steps along rows and cols (the last two dimensions:
// a tile never wraps past either, so no index is split per element).
#define TILE_AT(k, a, b) (base[k] + (a) * layout.strides[k][PROGRAM_DIMS - 2] \
                          + (b) * layout.strides[k][PROGRAM_DIMS - 1])
#define STAGE_INPUT(k) \
    if (IS_STAGED(k)) tile[stage_slot(k)][lane][j] = load_value(in##k[TILE_AT(k, lane, j)]);
#define LOAD_UNSTAGED(k) \
    if (k < FUSED_INPUTS && !IS_STAGED(k)) loaded[r][k] = load_value(in##k[TILE_AT(k, j, lane)]);
#define STAGED_INPUT(k) [[maybe_unused]] const float input##k = k >= FUSED_INPUTS ? 0.0f \
    : IS_STAGED(k) ? tile[stage_slot(k)][j][lane] : loaded[r][k];
#define STAGE_STEPS (STAGE_TILE / STAGE_ROWS)

extern "C" __global__ void fused_program_staged(
        PROGRAM_POINTERS, int rows, int cols, int row_tiles, int col_tiles,
        const ProgramLayout layout) {
    __shared__ float tile[STAGED_INPUTS][STAGE_TILE][STAGE_TILE + 1];
    const int lane = threadIdx.x;
    const int col0 = (blockIdx.x % col_tiles) * STAGE_TILE;
    const int rest = blockIdx.x / col_tiles;
    const int row0 = (rest % row_tiles) * STAGE_TILE;
    const unsigned first = static_cast<unsigned>(rest / row_tiles) * rows * cols;
    int base[PROGRAM_INPUTS];
    input_offsets(first + row0 * cols + col0, layout, base);
    // Both reads before the barrier, so that a block waits on memory once: the staged
    // inputs with lanes along rows into the tile, the others with lanes along cols
    // into registers. Loops of a fixed count, unrolled: every load in flight at once.
    float loaded[STAGE_STEPS][PROGRAM_INPUTS];
#pragma unroll
    for (int r = 0; r < STAGE_STEPS; ++r) {
        const int j = threadIdx.y + r * STAGE_ROWS;
        if (row0 + lane < rows && col0 + j < cols) {
            FOR_EACH_INPUT(STAGE_INPUT)
        }
        if (row0 + j < rows && col0 + lane < cols) {
            FOR_EACH_INPUT(LOAD_UNSTAGED)
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < STAGE_STEPS; ++r) {
        const int j = threadIdx.y + r * STAGE_ROWS;
        if (row0 + j < rows && col0 + lane < cols) {
            FOR_EACH_INPUT(STAGED_INPUT)
            float result;
            FUSED_PROGRAM
            out[first + (row0 + j) * cols + col0 + lane] = store_value(result);
        }
    }
}
#endif

// fused_concat_program (a module built with -DFUSED_CONCAT=<r> as well): the
// same program where input r is a concatenation, read from its parts instead
// of from a copy. out is [outer, total, inner] (total: the concatenated axis,
// a row of it being one channel in DenseNet's concatenations, which this
// serves); part k fills rows [start[k], start[k + 1]) and is itself [outer,
// start[k + 1] - start[k], inner]. The other inputs are read through three
// strides, over out's outer, row and inner axes (0 where broadcast; the host
// refuses an input whose axes before or after the row axis do not merge). A block first writes, in shared
// memory, which part each row is in (one byte a row, at most CONCAT_ROWS
// rows); then each element finds its line and row with two multiply-shift
// divisions and its part with one shared-memory read. (A line per block, as
// concat_inputs did then, left most threads idle on DenseNet's 7x7 and 14x14
// planes, lines of 49 and 196 values: 1.7 ms for its 62 launches at batch 32
// on the H200, against 0.65 ms of memory traffic.) The concatenation's copy,
// a write and a read of the whole tensor, is gone.
#ifdef FUSED_CONCAT
#define CONCAT_PARTS 64
#define CONCAT_ROWS 4096

struct ConcatProgramLayout {                         // passed by value (the host packs it)
    const storage_t* part[CONCAT_PARTS];
    int start[CONCAT_PARTS + 1];
    int strides[PROGRAM_INPUTS][3];                  // per input: outer, row, inner
    unsigned inner_magic, inner_shift, total_magic, total_shift;
};

#define LOAD_CONCAT_INPUT(k) [[maybe_unused]] const float input##k = k >= FUSED_INPUTS ? 0.0f \
    : load_value(k == FUSED_CONCAT ? source : in##k[offset[k]]);

extern "C" __global__ void fused_concat_program(
        PROGRAM_POINTERS, int n, int total, int inner, int count,
        const __grid_constant__ ConcatProgramLayout layout) {
    // __grid_constant__: the table is indexed with run-time values in place (constant
    // bank loads), not copied to local memory first.
    __shared__ unsigned char part_of_row[CONCAT_ROWS];
    for (int row = threadIdx.x; row < total; row += blockDim.x) {
        int low = 0, high = count - 1;              // the last part starting at or before row
        while (low < high) {
            const int middle = (low + high + 1) / 2;
            if (layout.start[middle] <= row) low = middle; else high = middle - 1;
        }
        part_of_row[row] = static_cast<unsigned char>(low);
    }
    __syncthreads();
    GRID_STRIDE_LOOP(i, n) {
        const unsigned line = quotient_of(i, layout.inner_magic, layout.inner_shift);
        const int j = i - line * inner;
        const int o = quotient_of(line, layout.total_magic, layout.total_shift);
        const int row = line - o * total;
        const int part = part_of_row[row];
        const int first = layout.start[part], width = layout.start[part + 1] - first;
        const storage_t source =
            layout.part[part][((size_t)o * width + row - first) * inner + j];
        int offset[PROGRAM_INPUTS];
#pragma unroll
        for (int q = 0; q < PROGRAM_INPUTS; ++q)
            offset[q] = o * layout.strides[q][0] + row * layout.strides[q][1]
                        + j * layout.strides[q][2];
        FOR_EACH_INPUT(LOAD_CONCAT_INPUT)
        float result;
        FUSED_PROGRAM
        out[i] = store_value(result);
    }
}
#endif
#endif
