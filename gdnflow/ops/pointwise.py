"""1x1 convolutions as one direct kernel (``cuda_src/pointwise.cu``): no cuBLAS, epilogue fused.

For x [N, C_in, H, W] and w [C_out, C_in, 1, 1] (stride 1, no padding,
groups 1)::

    y[n, o, p] = act(b[o] + residual[n, o, p] + sum_c w[o, c] x[n, c, p])

a matrix product whose columns are all N*H*W pixels of the batch
(:class:`~gdnflow.ops.conv.Pointwise` runs it as one cuBLAS GEMM per image
instead). Backward-data is the same kernel with w transposed (gx[n, c, p] =
sum_o w[o, c] gy[n, o, p]); the weight gradient stays with the GEMM path.

When it pays. Per pixel the layer moves 4 (C_in + C_out) bytes and does
C_in C_out multiply-adds: its arithmetic intensity is C_in C_out /
(2 (C_in + C_out)) flop per byte (:func:`intensity`), against a balance of
about 12 on an H200 (50 TFLOP/s SGEMM over 4.1 TB/s). MobileNetV2's 1x1
layers run from 5 (32 -> 16) to 128 (320 -> 1280). Below ~16 the work is the
memory traffic, and there cuBLAS's per-image GEMMs (N = H*W, K = C_in of
16-32) ran at 40-60% of HBM bandwidth (64x16x112² -> 96: 208 µs against an
87 µs floor, H200, benchmarks/results/conv.md) and paid an epilogue pass over
y for bias + ReLU6 (+ residual) on top. This kernel writes y once with the
epilogue applied and reads x once per tile of output channels. The planner
prefers it up to :data:`MAX_INTENSITY`; autotune compares it with the GEMM
path everywhere it applies.

Tiles (:func:`choose_config`). Each block computes BM = TM*TY output channels x
BN = TN*TX pixels, each thread TM x TN of them in registers, K in steps of
BK through two shared-memory stages filled by cp.async. The host picks the
tile by a cost model (:func:`predicted_seconds`): HBM traffic (x once, y
once, x again from L2 for each extra tile of channels), multiply-adds
including those wasted on a tile's overhang past C_out or the pixels, an
FFMA efficiency that grows with the thread tile, occupancy from an estimate
of registers, and the tail of the last wave. So 24 output channels take
BM = 24 (TM 4 x TY 6), not a 32-row tile with a quarter idle.

Prediction (before any GPU run; H200, batch 64, forward, GPU time as
bench_conv's "gpu ms" column measures it, GEMM path's wall time in
parentheses): the eight memory-bound MobileNetV2 shapes at 65-80% of their
floor: 32 -> 16 at 112² ~54 µs (124), 16 -> 96 at 112² ~117 (208), 96 -> 24
at 56² ~35 (65), 24 -> 144 ~48 (110), 144 -> 24 ~47 (81), 144 -> 32 at 28²
~13 (43), 32 -> 192 ~17 (54), 192 -> 32 ~17 (52): 1.6-2.5x torch's GPU time.
The per-layer wall-time column adds ~15-20 µs of Python dispatch to both
sides, which compresses the small layers' ratios toward 1 (1.1-1.4 for the
28² ones, 1.6-1.9 for the 112² ones). The compute-bound shapes (intensity
above 16: 192 -> 64 and wider) stay with cuBLAS by heuristic; the forced
"pointwise_direct ms" column will say whether the 14x14 and 7x7 ones (where
the per-image GEMMs have only 196 or 49 columns) should come over too:
expected yes for 7x7 (fewer, fuller tiles across images), unsure for 14x14.
"""
import dataclasses
import functools
import itertools

from gdnflow.backends import cuda

SOURCE = "pointwise.cu"

#: The heuristic prefers this kernel for layers of at most this many flop per
#: byte moved (:func:`intensity`); above it, cuBLAS's GEMM.
MAX_INTENSITY = 16.0

# Cost model constants (H200, fp32): measured HBM copy rate, a guess at L2
# bandwidth, FFMA peak in multiply-adds per second (132 SMs x 128 lanes x 1.98 GHz).
HBM_BYTES_PER_S = 4.1e12
L2_BYTES_PER_S = 10e12
FMA_PER_S = 33.5e12
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
SHARED_PER_SM = 227 * 1024
STATIC_SHARED_LIMIT = 48 * 1024
#: Bytes of reads an SM needs in flight to take its share of HBM bandwidth
#: (4.1 TB/s / 132 SMs x ~0.7 µs latency).
READS_IN_FLIGHT = 20 * 1024


def intensity(g):
    """Flop per byte of a 1x1 layer: C_in C_out / (2 (C_in + C_out)) (x read, y written once)."""
    return g.c_in * g.c_out / (2 * (g.c_in + g.c_out))


@dataclasses.dataclass(frozen=True)
class PointwiseConfig:
    """One compiled variant of pointwise_conv (its -D values; see pointwise.cu)."""

    tm: int
    tn: int
    tx: int
    ty: int
    bk: int
    vec_x: int

    @property
    def bm(self):
        """Rows of A (output channels) per block."""
        return self.tm * self.ty

    @property
    def bn(self):
        """Columns (pixels) per block."""
        return self.tn * self.tx

    @property
    def threads(self):
        return self.tx * self.ty

    @property
    def shared_bytes(self):
        """The kernel's static shared memory: two stages of the A and x tiles."""
        return 4 * 2 * self.bk * (self.bm + self.bn)

    @property
    def registers(self):
        """Registers per thread, estimated: TM*TN sums + TM + TN operands + ~28 (ptxas, sm_90:
        48 for 4x4, 65-79 for 4x8 and 8x4, 105-127 for 8x8, 141-147 for 12x8)."""
        return -(-(self.tm * self.tn + self.tm + self.tn + 28) // 8) * 8

    def defines(self, trans_a):
        return (("TM", self.tm), ("TN", self.tn), ("TX", self.tx), ("TY", self.ty),
                ("BK", self.bk), ("VEC_X", self.vec_x), ("TRANS_A", int(trans_a)))


@functools.lru_cache(maxsize=None)
def candidate_configs(vec_x):
    """Every variant the host may pick: 64-256 threads in whole warps, thread tiles 4-12 x 4-8.

    Each thread must copy the same columns of x at every step of K, so the
    threads are a multiple of the x tile's vector slots per row (BN / vec_x);
    BK (8 or 16) covers at least one pass of all threads over those slots;
    the two stages fit in 48 KB of static shared memory.
    """
    configs = []
    for tm, tn, tx, ty in itertools.product((4, 8, 12), (4, 8), (8, 16, 32), range(1, 33)):
        threads = tx * ty
        if not 64 <= threads <= 256 or threads % 32 or tm * tn > 96:
            continue
        slots = tn * tx // vec_x
        if threads % slots or threads // slots > 16:
            continue
        config = PointwiseConfig(tm, tn, tx, ty, max(8, threads // slots), vec_x)
        if config.shared_bytes <= STATIC_SHARED_LIMIT:
            configs.append(config)
    return tuple(configs)


def blocks_per_sm(config):
    """Resident blocks of ``config`` per SM, limited by threads, registers and shared memory."""
    warps = -(-config.threads // 32)
    return max(1, min(THREADS_PER_SM // config.threads,
                      REGISTERS_PER_SM // (config.registers * 32 * warps),
                      SHARED_PER_SM // config.shared_bytes, 32))


def predicted_seconds(config, m, k, columns, sm_count=132):
    """The cost model's time for an m x columns output with inner dimension k.

    Per SM, for the busiest one (ceil(blocks / SMs) blocks, so the last
    wave's idle SMs count): its share of memory traffic and of multiply-adds
    (padded to whole tiles), each at the SM's share of the chip's rate; the
    larger of the two. Traffic: each block's x tile (from HBM for the first
    tile of channels, L2 for the others), y tile (HBM) and A tile (L2). The
    x reads slow down when the resident blocks keep fewer than
    :data:`READS_IN_FLIGHT` bytes of copies in flight (two stages each);
    the arithmetic when fewer than 8 warps are resident.
    """
    m_tiles, j_tiles = -(-m // config.bm), -(-columns // config.bn)
    blocks = m_tiles * j_tiles
    per_sm = -(-blocks // sm_count)
    steps = -(-k // config.bk)
    resident = min(per_sm, blocks_per_sm(config))
    in_flight = resident * min(steps, 2) * 4 * config.bk * config.bn
    x_tile, y_tile, a_tile = config.bn * k, config.bm * config.bn, config.bm * steps * config.bk
    hbm_rate, l2_rate = HBM_BYTES_PER_S / sm_count, L2_BYTES_PER_S / sm_count
    memory = per_sm * 4 * ((x_tile / m_tiles) * max(1.0, READS_IN_FLIGHT / in_flight) / hbm_rate
                           + y_tile / hbm_rate
                           + (x_tile * (1 - 1 / m_tiles) + a_tile) / l2_rate)
    per_k = config.tm * config.tn
    efficiency = 0.85 * per_k / (per_k + (config.tm + config.tn) / 4 + 4)
    warps = resident * config.threads / 32
    arithmetic = (per_sm * config.bm * config.bn * steps * config.bk
                  / (FMA_PER_S / sm_count * efficiency) * max(1.0, 8 / warps))
    return max(memory, arithmetic)


@functools.lru_cache(maxsize=1024)
def choose_config(m, k, hw, columns, vec_x, sm_count=132):
    """The :class:`PointwiseConfig` with the least :func:`predicted_seconds`.

    Times within 1% count as equal (the memory-bound configurations all hit
    the same floor); among them, the most warps resident per SM (more to hide
    latency with than the model counts), then the smaller thread tile.
    """
    def key(c):
        seconds = predicted_seconds(c, m, k, columns, sm_count)
        return (float(f"{seconds:.2g}"), -blocks_per_sm(c) * c.threads, c.tm * c.tn, c.bk)
    return min(candidate_configs(vec_x), key=key)


def _aligned(*arrays):
    """True if every given array's address is 16-byte aligned (None is skipped)."""
    return all(a is None or a.ptr % 16 == 0 for a in arrays)


@functools.lru_cache(maxsize=None)
def _sm_count():
    """The device's multiprocessor count (one device per process)."""
    from gdnflow.backends.cuda.runtime import get_runtime
    return get_runtime().sm_count


def pointwise_product(a, x, y, m, k, n, hw, trans_a=False, bias=None, residual=None,
                      activation=0):
    """y [n, m, hw] <- act(A @ x_image + bias + residual) for every image (see pointwise.cu).

    A is ``a`` as [m, k] (``trans_a`` False) or its [k, m] transpose; x is
    [n, k, hw]. Returns y.
    """
    from gdnflow.backends.cuda.kernels import check_index_range
    columns = n * hw
    check_index_range(columns, "pointwise pixels")
    if columns == 0 or m == 0:
        return y
    vec_x = 4 if hw % 4 == 0 and _aligned(x, y, residual) else 1
    config = choose_config(m, k, hw, columns, vec_x, _sm_count())
    m_tiles = -(-m // config.bm)
    blocks = m_tiles * -(-columns // config.bn)
    kernel = cuda.kernel(SOURCE, "pointwise_conv", "PPPPP" + "i" * 6, config.defines(trans_a))
    kernel((blocks, 1, 1), (config.threads, 1, 1), a.ptr, x.ptr,
           0 if bias is None else bias.ptr, 0 if residual is None else residual.ptr, y.ptr,
           m, k, hw, columns, m_tiles, activation)
    return y


class PointwiseDirect:
    """1x1 convolution by the direct kernel: forward (epilogue fused) and backward-data.

    The weight gradient is the GEMM path's
    (:meth:`gdnflow.ops.conv.Pointwise.backward_weight`); the planner does
    not ask this class for it.
    """

    name = "pointwise_direct"
    stages = ("forward", "backward_data")
    fuses_bias_activation = True
    fuses_residual = True

    @staticmethod
    def supports(g):
        """1x1, stride 1, no padding, groups 1."""
        return g.is_pointwise and g.groups == 1

    @staticmethod
    def preferred(g):
        """Memory-bound layers: :func:`intensity` at most :data:`MAX_INTENSITY`."""
        return intensity(g) <= MAX_INTENSITY

    @staticmethod
    def forward(g, x, w, bias=None, activation=0, residual=None):
        """y = act(w @ x + bias + residual) per image, one pass over x and one over y."""
        y = cuda.empty(g.y_shape)
        return pointwise_product(w, x, y, g.c_out, g.c_in, g.n, g.h * g.w, bias=bias,
                                 residual=residual, activation=activation)

    @staticmethod
    def backward_data(g, gy, w):
        """gx = w^T @ gy per image (the same kernel reading w transposed)."""
        gx = cuda.empty(g.x_shape)
        return pointwise_product(w, gy, gx, g.c_in, g.c_out, g.n, g.h * g.w, trans_a=True)

    @staticmethod
    def backward_weight(g, x, gy):
        """The GEMM path's (not offered to the planner; here for completeness)."""
        from gdnflow.ops.conv import Pointwise
        return Pointwise.backward_weight(g, x, gy)
