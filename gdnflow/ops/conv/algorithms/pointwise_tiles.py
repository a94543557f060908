"""Tile variants of the direct 1x1 kernel (``cuda_src/pointwise.cu``) and the cost model
that picks one.

A block computes BM = TM*TY output channels x BN = TN*TX pixels, each
thread TM x TN of them in registers (KSPLIT groups of threads may share the
tile, each taking part of every K step), K in steps of BK through 2-4
shared-memory stages filled by cp.async. :func:`choose_config` takes the
variant of least :func:`predicted_seconds`: HBM and L2 traffic slowed when
too few bytes are in flight, multiply-adds including those a tile's
overhang wastes at an FFMA efficiency that grows with the thread tile,
occupancy from estimated registers, the last wave's tail; memory and
arithmetic added. The model's constants describe an H200 in float32; how it
was fitted and how it compares with measurements: docs/conv.md.
"""
import dataclasses
import functools
import itertools

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

