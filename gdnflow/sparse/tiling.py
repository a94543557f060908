"""The compile-time tiling of the sparse convolution kernels (``cuda_src/sparse_conv.cu``).

A :class:`Tiling` is one variant of the kernels: a block of :data:`WARPS`
warps computes a tile of ``th x tw`` outputs for ``WARPS * cpw`` output
channels, staging ``cc`` input planes at a time in shared memory (rows of
``pitch`` words). :func:`choose_tiling` picks the variant for an output
size and a device (its SM count): pure host arithmetic, no GPU needed.
"""
import dataclasses
import functools

import numpy as np

from gdnflow.errors import ShapeError

FLOAT = 4
WARPS = 8                       # sparse_conv.cu's WARPS: 256 threads per block
SHARED_BUDGET = 24 * 1024       # bytes of staged input per block: 4+ blocks fit on an SM


@dataclasses.dataclass(frozen=True)
class Tiling:
    """The compile-time shape of one sparse_conv.cu variant (see the .cu's header).

    ``tw`` tile width (lanes across), ``rows`` outputs per lane, ``cpw``
    channels per warp, ``cc`` channels per staged chunk, ``sh, sw`` input step
    per output, ``span_h, span_w`` input rows/columns one output reads,
    ``pitch`` the staged row pitch.
    """

    tw: int
    rows: int
    cpw: int
    cc: int
    sh: int
    sw: int
    span_h: int
    span_w: int
    pitch: int

    @property
    def th(self):
        """Tile height in outputs."""
        return self.rows * (32 // self.tw)

    @property
    def in_h(self):
        """Rows of one staged input plane: what the tile's outputs read."""
        return (self.th - 1) * self.sh + self.span_h

    @property
    def in_w(self):
        """Columns of one staged input plane (before padding to ``pitch``)."""
        return (self.tw - 1) * self.sw + self.span_w

    @property
    def defines(self):
        """The ``-D`` macros that compile this variant of sparse_conv.cu."""
        return (("TW", self.tw), ("ROWS", self.rows), ("CPW", self.cpw), ("CC", self.cc),
                ("SH", self.sh), ("SW", self.sw), ("SPAN_H", self.span_h),
                ("SPAN_W", self.span_w), ("PITCH", self.pitch))

    def channel_groups(self, channels):
        """Blocks across ``channels`` output channels (WARPS * cpw channels each)."""
        return -(-channels // (WARPS * self.cpw))

    def blocks(self, n, channels, u, v):
        """The grid size for n images of ``channels`` x u x v outputs."""
        return n * self.channel_groups(channels) * -(-u // self.th) * -(-v // self.tw)


def _bank_conflicts(tw, rows, sh, sw, pitch):
    """Most lanes of a warp hitting one bank (distinct words) when all read row r of their tile."""
    lanes = np.arange(32)
    words = (lanes // tw) * rows * sh * pitch + (lanes % tw) * sw
    banks = {}
    for word in set(words.tolist()):
        banks[word % 32] = banks.get(word % 32, 0) + 1
    return max(banks.values())


@functools.lru_cache(maxsize=None)
def _pitch(tw, rows, sh, sw, in_w):
    """The smallest row pitch >= in_w with the fewest bank conflicts."""
    return min(range(in_w, in_w + 32),
               key=lambda p: (_bank_conflicts(tw, rows, sh, sw, p), p))


@functools.lru_cache(maxsize=4096)
def choose_tiling(n, channels_out, channels_in, u, v, sh, sw, span_h, span_w, sm_count,
                  per_sm=4):
    """The variant for an output of n x channels_out x u x v: wide tiles, and the most
    outputs per lane (rows x channels) that still give ``per_sm`` blocks per SM."""
    tw = 32 if v > 16 else 16 if v > 8 else 8
    ly = 32 // tw
    max_rows = max(1, -(-u // ly))
    # No more channels per warp than leave every warp of a block some (a
    # 7-channel output gets one per warp, not four in two warps).
    candidates = [(rows, cpw) for rows in (8, 4, 2, 1) for cpw in (4, 2, 1)
                  if (rows <= max_rows or rows == 1)
                  and (cpw == 1 or channels_out > WARPS * cpw // 2)]
    # Prefer more work per lane (register reuse of the entry's value), then
    # more channels per block (input staged once for more of them).
    target = per_sm * sm_count
    choice = None
    for rows, cpw in sorted(candidates, key=lambda rc: (-rc[0] * rc[1], -rc[0])):
        blocks = n * -(-channels_out // (WARPS * cpw)) * -(-u // (rows * ly)) * -(-v // tw)
        if choice is None or blocks > choice[0]:
            choice = (blocks, rows, cpw)
        if blocks >= target:
            choice = (blocks, rows, cpw)
            break
    _, rows, cpw = choice
    in_h = (rows * ly - 1) * sh + span_h
    in_w = (tw - 1) * sw + span_w
    pitch = _pitch(tw, rows, sh, sw, in_w)
    cc = 16
    while cc > 1 and (cc * in_h * pitch * FLOAT > SHARED_BUDGET or cc >= 2 * channels_in):
        cc //= 2
    if cc * in_h * pitch * FLOAT > 48 * 1024:
        raise ShapeError(f"sparse_conv2d: a {span_h}x{span_w} input window per output is too "
                         "large for the CUDA kernel's shared-memory tile")
    return Tiling(tw, rows, cpw, cc, sh, sw, span_h, span_w, pitch)
