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
prefers it up to :data:`MAX_INTENSITY`, and for small products whatever
their intensity (:data:`SMALL_PRODUCT_FMAS`: there a cuBLAS call's host
time outweighs the GPU time); autotune compares it with the GEMM path
everywhere it applies. :class:`Im2colDirect` runs the same product after
im2col.

Tiles (:func:`choose_config`). Each block computes BM = TM*TY output channels x
BN = TN*TX pixels, each thread TM x TN of them in registers (KSPLIT groups of
threads may share the tile, each taking part of every K step), K in steps of
BK through 2-4 shared-memory stages filled by cp.async. The host picks the
variant by a cost model (:func:`predicted_seconds`): HBM traffic (x once, y
once, x again from L2 for each extra tile of channels), slowed when too few
bytes are in flight; multiply-adds including those wasted on a tile's
overhang past C_out or the pixels, at an FFMA efficiency that grows with the
thread tile; occupancy from an estimate of registers; the tail of the last
wave; memory and arithmetic added, as they overlap only in part. So 24
output channels take BM = 24, not a 32-row tile with a quarter idle.

Measured (H200, batch 64, GPU time, benchmarks/results/conv.md and
pointwise_tiles.md): the memory-bound MobileNetV2 layers at 112² and 56² run
1.55-2.2x cuDNN's time; the narrow 28² projections (144 -> 32, 192 -> 32)
0.93-0.95x, where HBM traffic and FMAs each take about half the time and
overlap badly; the model's times are 1.3-2.5x too optimistic, and its
choice is within 11% of the fastest variant measured.
"""
import dataclasses
import functools
import itertools

from gdnflow.backends import cuda

SOURCE = "pointwise.cu"

#: The heuristic prefers this kernel for layers of at most this many flop per
#: byte moved (:func:`intensity`); above it, cuBLAS's GEMM.
MAX_INTENSITY = 16.0
#: ... and for small products whatever their intensity: at most this many
#: multiply-adds, C_in and C_out at most SMALL_PRODUCT_MAX_K (the inner
#: dimension of the forward and of backward-data). There the GPU time is a
#: few µs and the call's host time decides: a cuBLAS call
#: costs 12-20 µs on the host, a launch 4-7 µs (profile_host.md). At batch 1
#: the MobileNetV2 1x1 layers that qualify ran 1.2-2x faster by the direct
#: kernel, event-timed (conv.md's forced columns); those with K = 576 or 960
#: ran slower (a long K loop over few blocks).
SMALL_PRODUCT_FMAS = 32e6
SMALL_PRODUCT_MAX_K = 384

# Cost model constants (H200, fp32): measured HBM copy rate, a guess at L2
# bandwidth, FFMA peak in multiply-adds per second (132 SMs x 128 lanes x 1.98 GHz).
HBM_BYTES_PER_S = 4.1e12
L2_BYTES_PER_S = 10e12
FMA_PER_S = 33.5e12
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
SHARED_PER_SM = 227 * 1024
STATIC_SHARED_LIMIT = 48 * 1024
#: Shared memory the driver reserves per resident block.
SHARED_RESERVED_PER_BLOCK = 1024
#: Bytes of reads an SM needs in flight to take its share of HBM bandwidth
#: (4.1 TB/s / 132 SMs x ~1.5 µs latency under load; fitted to the measured
#: times of the 2-stage kernel on the narrow MobileNetV2 layers).
READS_IN_FLIGHT = 48 * 1024


def intensity(g):
    """Flop per byte of a 1x1 layer: C_in C_out / (2 (C_in + C_out)) (x read, y written once)."""
    return product_intensity(g.c_out, g.c_in)


def product_intensity(m, k):
    """Flop per byte of an [m, k] x [k, pixels] product reading its input and writing its
    output once: m k / (2 (m + k))."""
    return m * k / (2 * (m + k))


@dataclasses.dataclass(frozen=True)
class PointwiseConfig:
    """One compiled variant of pointwise_conv (its -D values; see pointwise.cu)."""

    tm: int
    tn: int
    tx: int
    ty: int
    bk: int
    vec_x: int
    stages: int = 2
    ksplit: int = 1

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
        """Threads per block: KSPLIT groups of TX x TY."""
        return self.tx * self.ty * self.ksplit

    @property
    def shared_bytes(self):
        """The kernel's static shared memory: ``stages`` stages of the A and x tiles, or the
        sums of groups 1 .. KSPLIT-1 after the last step, whichever is larger."""
        return 4 * max(self.stages * self.bk * (self.bm + self.bn),
                       (self.ksplit - 1) * self.tm * self.tn * self.tx * self.ty)

    @property
    def registers(self):
        """Registers per thread, estimated: TM*TN sums + TM + TN operands + ~28, + 6 per stage
        past two (ptxas, sm_90: 48 for 4x4, 65-79 for 4x8 and 8x4, 105-127 for 8x8, 141-147
        for 12x8; 4x8 with BK 16 at 2, 3, 4 stages: 79, 85, 95)."""
        return -(-(self.tm * self.tn + self.tm + self.tn + 28 + 6 * (self.stages - 2)) // 8) * 8

    def defines(self, trans_a):
        return (("TM", self.tm), ("TN", self.tn), ("TX", self.tx), ("TY", self.ty),
                ("BK", self.bk), ("STAGES", self.stages), ("KSPLIT", self.ksplit),
                ("VEC_X", self.vec_x), ("TRANS_A", int(trans_a)))


@functools.lru_cache(maxsize=None)
def candidate_configs(vec_x):
    """Every variant the host may pick: 64-256 threads in whole warps, in 1, 2 or 4 groups
    (KSPLIT) of thread tiles 4-12 x 4-8; 2-4 stages of BK = 8, 16 or 32.

    Each thread must copy the same columns of x at every step of K, so the
    threads are a multiple of the x tile's vector slots per row (BN / vec_x);
    BK covers at least one pass of all threads over those slots and gives
    each group at least 4 rows; the stages (and the groups' sums) fit in
    48 KB of static shared memory.
    """
    configs = []
    for tm, tn, tx, ty, ksplit in itertools.product((4, 8, 12), (4, 8), (16, 32),
                                                     range(1, 33), (1, 2, 4)):
        threads = tx * ty * ksplit
        if not 64 <= threads <= 256 or (tx * ty) % 32 or tm * tn > 96:
            continue
        slots = tn * tx // vec_x
        if threads % slots or threads // slots > 32:
            continue
        for bk, stages in itertools.product((8, 16, 32), (2, 3, 4)):
            if bk < threads // slots or bk < 4 * ksplit:
                continue
            config = PointwiseConfig(tm, tn, tx, ty, bk, vec_x, stages, ksplit)
            if config.shared_bytes <= STATIC_SHARED_LIMIT:
                configs.append(config)
    return tuple(configs)


def blocks_per_sm(config):
    """Resident blocks of ``config`` per SM, limited by threads, registers and shared memory."""
    warps = -(-config.threads // 32)
    return max(1, min(THREADS_PER_SM // config.threads,
                      REGISTERS_PER_SM // (config.registers * 32 * warps),
                      SHARED_PER_SM // (config.shared_bytes + SHARED_RESERVED_PER_BLOCK), 32))


def predicted_seconds(config, m, k, columns, sm_count=132):
    """The cost model's time for an m x columns output with inner dimension k.

    Per SM, for the busiest one (ceil(blocks / SMs) blocks, so the last
    wave's idle SMs count): its share of memory traffic and of multiply-adds
    (padded to whole tiles), each at the SM's share of the chip's rate; their
    sum (the two overlap only in part: the sum ranked the measured variants
    better than the larger of the two, pointwise_tiles.md). Traffic: each
    block's x tile (from HBM for the first tile of channels, L2 for the
    others), y tile (HBM) and A tile (L2). The
    x reads slow down when the resident blocks keep fewer than
    :data:`READS_IN_FLIGHT` bytes of copies in flight (stages - 1 steps
    each: the stage being multiplied has landed); the arithmetic when fewer
    than 8 warps are resident.
    """
    m_tiles, j_tiles = -(-m // config.bm), -(-columns // config.bn)
    blocks = m_tiles * j_tiles
    per_sm = -(-blocks // sm_count)
    steps = -(-k // config.bk)
    resident = min(per_sm, blocks_per_sm(config))
    in_flight = resident * min(steps, config.stages - 1) * 4 * config.bk * config.bn
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
    return memory + arithmetic


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
        """Memory-bound layers (:func:`intensity` at most :data:`MAX_INTENSITY`) and small
        products (see :data:`SMALL_PRODUCT_FMAS`)."""
        small = (g.n * g.h * g.w * g.c_in * g.c_out <= SMALL_PRODUCT_FMAS
                 and max(g.c_in, g.c_out) <= SMALL_PRODUCT_MAX_K)
        return intensity(g) <= MAX_INTENSITY or small

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


class Im2colDirect:
    """Any convolution with groups 1, forward only: im2col, then the direct kernel's product.

    After im2col an image's columns are [C_in*kh*kw, OH*OW], laid out as a
    1x1 layer's input of C_in*kh*kw channels, so :func:`pointwise_product`
    multiplies them by w [C_out, C_in*kh*kw] with the epilogue fused, where
    :class:`~gdnflow.ops.conv.Im2colGemm` runs cuBLAS and then a separate
    epilogue pass. Preferred for the same memory-bound shapes as
    :class:`PointwiseDirect` (:func:`intensity` of C_out and C_in*kh*kw at
    most :data:`MAX_INTENSITY`): the RGB first layers, K = 27, whose GEMM is
    all memory traffic and whose cuBLAS call costs 12-20 µs of host time
    (benchmarks/results/profile_host.md) against 4-7 µs for a launch.
    """

    name = "im2col_direct"
    stages = ("forward",)
    fuses_bias_activation = True
    fuses_residual = True

    @staticmethod
    def supports(g):
        """Groups 1 (the product has one weight matrix)."""
        return g.groups == 1

    @staticmethod
    def preferred(g):
        """Memory-bound products: :func:`product_intensity` of (C_out, C_in*kh*kw) at most
        :data:`MAX_INTENSITY`."""
        return product_intensity(g.c_out, g.c_in * g.kh * g.kw) <= MAX_INTENSITY

    @staticmethod
    def forward(g, x, w, bias=None, activation=0, residual=None):
        """y = act(w @ im2col(x) + bias + residual), lowered a chunk of images at a time."""
        from gdnflow.ops.conv import _chunk_images, _im2col, _ptr
        y = cuda.empty(g.y_shape)
        ohw, k = g.oh * g.ow, g.c_in * g.kh * g.kw
        chunk = _chunk_images(g.n, k * ohw)
        cols = cuda.empty((chunk * k * ohw,))
        for n0 in range(0, g.n, chunk):
            nb = min(chunk, g.n - n0)
            _im2col(g, _ptr(x, n0 * g.c_in * g.h * g.w), cols, nb, ohw, k * ohw)
            out_shape = (nb, g.c_out, g.oh, g.ow)
            pointwise_product(w, cols, y.offset(n0 * g.c_out * ohw, out_shape), g.c_out, k, nb,
                              ohw, bias=bias, activation=activation,
                              residual=None if residual is None
                              else residual.offset(n0 * g.c_out * ohw, out_shape))
        return y

