"""rANS coding of the latents in lanes: NumPy (the reference) and the GPU (``cuda_src/rans.cu``).

Format versions 14 (factorized prior; :mod:`gdnflow.codec.format`) code each
substream with this coder instead of constriction's range coder, so that a GPU
codes every substream at once, one thread per substream (a *lane*), and
the NumPy coder writes and reads the same words on a machine without one.

The coder (Duda's asymmetric numeral systems, range variant), for tables of
16-bit frequencies (:data:`PRECISION`; every table has at least two symbols,
the last the escape, each of frequency f >= 1, so f < 2^16: :meth:`RansTables.of`
refuses others):

- the state x is 32 bits, in [2^16, 2^32) between symbols; words are 16 bits;
- encoding runs over a lane's symbols last to first, from x = 2^16: a symbol
  of frequency f and CDF start c first gives out x's low word if
  x >= f << 16 (then x >>= 16), then x = (x // f << 16) + x % f + c;
- the lane's stream is the final state (its high word, then its low word),
  then the words given out, last first; padded with a zero word to a whole
  number of 32-bit words (the file's index counts 32-bit words);
- decoding reads the stream forward: slot = x mod 2^16, the symbol s whose
  CDF interval holds slot, x = f (x >> 16) + slot - c, and a state below 2^16
  takes in the next word (x = x << 16 | word). A lane must end at x = 2^16
  with every word read but the padding: anything else is a corrupt stream.

Each symbol costs its -log2(f / 2^16) bits to within the rounding of the
state; a lane's termination costs 4 bytes (and 1 of padding on average),
where constriction's range coder's costs about 2.

What a lane codes is a list of *runs* (:class:`Lanes`): each run is a count
of values coded with one table, the values at consecutive positions of the
flat latent array from a start, or at listed positions. Values outside a
table's support are coded as its escape symbol; the caller writes their
values elsewhere (the substream's escape bits) and puts them back after
decoding: decoders leave :data:`ESCAPE_MARK` at their positions.
"""
import dataclasses

import numpy as np

from gdnflow.backends import cuda

SOURCE = "rans.cu"
#: Bits of the tables' frequencies (their CDFs rise to 2^PRECISION).
PRECISION = 16
#: The state's lower bound, and the encoder's first state.
STATE_LOW = 1 << 16
#: What a decoder leaves at an escaped value's position.
ESCAPE_MARK = np.iinfo(np.int32).min
#: A lane's status after decoding (the values of rans.cu's LANE_* constants).
LANE_OK, LANE_TRUNCATED, LANE_BAD_END = 0, 1, 2
LANE_ERRORS = {LANE_TRUNCATED: "the stream ends early",
               LANE_BAD_END: "the stream does not end where its coder did"}
_MASK = (1 << PRECISION) - 1


#: The GPU decoder finds a symbol from the one holding the first slot of its bucket
#: (the slots of one BUCKET_BITS-bit prefix) onward: one lookup and a step or two,
#: where a binary search over the CDF takes a load per halving.
BUCKET_BITS = 8


@dataclasses.dataclass(frozen=True)
class RansTables:
    """Coding tables for the lanes: ``cdf`` (int32, every table's CDF one after another),
    ``offset`` / ``size`` (int32 per table: where its CDF starts, its symbol count, the
    escape last), ``low`` (int32 per table: the value of symbol 0), ``buckets`` (int32,
    2^BUCKET_BITS per table: the symbol holding each bucket's first slot)."""

    cdf: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    low: np.ndarray
    buckets: np.ndarray

    @classmethod
    def of(cls, cdfs, lows, precision):
        """The tables of ``cdfs`` (each rising from 0 to 2^precision) and ``lows``."""
        if precision != PRECISION:
            raise ValueError(f"rANS lanes: tables of {precision}-bit frequencies, the coder "
                             f"takes {PRECISION}")
        for k, cdf in enumerate(cdfs):
            if len(cdf) < 3 or not (np.diff(cdf) > 0).all() or cdf[0] != 0 or \
                    cdf[-1] != 1 << precision:
                raise ValueError(f"rANS lanes: table {k} must have at least two symbols, each "
                                 f"of frequency >= 1, its CDF rising from 0 to 2^{precision}")
        sizes = np.array([len(c) - 1 for c in cdfs], np.int32)
        offsets = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]]).astype(np.int32)
        firsts = np.arange(1 << BUCKET_BITS) << (PRECISION - BUCKET_BITS)
        buckets = [np.searchsorted(c, firsts, side="right") - 1 for c in cdfs]
        return cls(cdf=np.concatenate(cdfs).astype(np.int32), offset=offsets, size=sizes,
                   low=np.asarray(lows, np.int32),
                   buckets=np.concatenate(buckets).astype(np.int32))

    @property
    def high(self):
        """The largest value each table codes without escape."""
        return self.low + self.size - 2


@dataclasses.dataclass(frozen=True)
class Lanes:
    """What each lane codes: lane j's runs are ``runs[j]:runs[j + 1]`` of the run arrays.

    Run r: ``count[r]`` values with table ``table[r]``, at flat positions ``dest[r]``,
    ``dest[r] + 1``, ... or, where ``dest[r] < 0``, at ``positions[-dest[r] - 1 + i]``.
    """

    runs: np.ndarray          # int32 (lanes + 1,)
    table: np.ndarray         # int32 (runs,)
    count: np.ndarray         # int32 (runs,)
    dest: np.ndarray          # int64 (runs,)
    positions: np.ndarray     # int32: the gathered runs' positions, one after another

    @classmethod
    def of(cls, lane_runs, positions=None):
        """Lanes from ``lane_runs``: per lane a list of (table, count, dest) triples
        (``dest`` an int, or -1 - an offset into ``positions``)."""
        flat = [run for runs in lane_runs for run in runs]
        arrays = np.array(flat, np.int64).reshape(len(flat), 3)
        return cls(runs=np.concatenate([[0], np.cumsum([len(r) for r in lane_runs])]
                                       ).astype(np.int32),
                   table=arrays[:, 0].astype(np.int32), count=arrays[:, 1].astype(np.int32),
                   dest=arrays[:, 2].copy(),
                   positions=np.zeros(1, np.int32) if positions is None
                   else np.ascontiguousarray(positions, np.int32))

    @property
    def lanes(self):
        """How many lanes."""
        return len(self.runs) - 1

    def symbols(self):
        """How many values each lane codes (int64)."""
        totals = np.concatenate([[0], np.cumsum(self.count, dtype=np.int64)])
        return totals[self.runs[1:]] - totals[self.runs[:-1]]

    def lane_positions(self, lane):
        """The flat positions of ``lane``'s values, in coding order (int64)."""
        r = slice(self.runs[lane], self.runs[lane + 1])
        count = self.count[r].astype(np.int64)
        run_of = np.repeat(np.arange(len(count)), count)
        within = np.arange(int(count.sum())) - (np.cumsum(count) - count)[run_of]
        dest = self.dest[r][run_of]
        out = dest + within
        gathered = dest < 0
        if gathered.any():
            out[gathered] = self.positions[-dest[gathered] - 1 + within[gathered]]
        return out

    def lane_tables(self, lane):
        """The table of each of ``lane``'s values, in coding order."""
        r = slice(self.runs[lane], self.runs[lane + 1])
        return np.repeat(self.table[r], self.count[r])


def padded_words(words):
    """uint16 ``words`` with a zero word appended if their count is odd."""
    return np.append(words, np.uint16(0)) if len(words) % 2 else words


def symbols_of(values, tables, ids):
    """The symbols of ``values`` under tables ``ids`` (int64): value - low, the escape
    (size - 1) for values outside [low, high]."""
    symbols = values.astype(np.int64) - tables.low[ids]
    escape = tables.size[ids].astype(np.int64) - 1
    return np.where((symbols < 0) | (symbols > escape), escape, symbols)


# ------------------------------------------------------------- NumPy --
def _by_length(lanes):
    """(lane order, longest first; their symbol counts): the active lanes of a step are
    then a prefix of that order."""
    counts = lanes.symbols()
    order = np.argsort(-counts, kind="stable")
    return order, counts[order]


def _padded_table(per_lane, order, counts, fill):
    """[lanes, longest] of each lane's per-symbol values (lanes in ``order``), ``fill`` after."""
    out = np.full((len(order), int(counts.max()) if len(counts) else 0), fill, np.int64)
    for row, lane in enumerate(order):
        out[row, :counts[row]] = per_lane(lane)
    return out


def encode_numpy(lanes, tables, latents):
    """Each lane's stream (uint16 words, padded) of the values of flat int ``latents``."""
    order, counts = _by_length(lanes)
    streams = [None] * lanes.lanes
    if lanes.lanes == 0:
        return streams
    ids = _padded_table(lanes.lane_tables, order, counts, 0)
    symbols = _padded_table(lambda j: symbols_of(latents[lanes.lane_positions(j)], tables,
                                                 lanes.lane_tables(j)), order, counts, 0)
    starts = tables.cdf[tables.offset[ids] + symbols].astype(np.int64)
    frequencies = tables.cdf[tables.offset[ids] + symbols + 1] - starts
    x = np.full(len(order), STATE_LOW, np.int64)
    out = np.zeros((len(order), ids.shape[1] + 2), np.uint16)
    given = np.zeros(len(order), np.int64)
    active = 0          # backward: a lane joins at its last symbol
    for t in range(ids.shape[1] - 1, -1, -1):
        while active < len(order) and counts[active] > t:
            active += 1
        xa, f = x[:active], frequencies[:active, t]
        renormalise = np.flatnonzero(xa >= f << 16)
        out[renormalise, given[renormalise]] = xa[renormalise] & 0xFFFF
        given[renormalise] += 1
        xa[renormalise] >>= 16
        x[:active] = ((xa // f) << PRECISION) + xa % f + starts[:active, t]
    for row, lane in enumerate(order):
        words = np.concatenate([[x[row] >> 16, x[row] & 0xFFFF], out[row, :given[row]][::-1]])
        streams[lane] = padded_words(words.astype(np.uint16))
    return streams


def _symbol_lookup(tables, ids):
    """{table: its symbol per slot (uint16, 2^PRECISION)} for the tables in ``ids``."""
    lookup = {}
    for k in np.unique(ids):
        cdf = tables.cdf[tables.offset[k]:tables.offset[k] + tables.size[k] + 1]
        lookup[int(k)] = np.repeat(np.arange(tables.size[k], dtype=np.uint16), np.diff(cdf))
    return lookup


def decode_numpy(lanes, tables, streams, latents):
    """Decode each lane's stream (uint16 words) into flat int32 ``latents`` (escapes as
    :data:`ESCAPE_MARK`); returns each lane's status (int32, :data:`LANE_OK` ...)."""
    order, counts = _by_length(lanes)
    status = np.zeros(lanes.lanes, np.int32)
    if lanes.lanes == 0:
        return status
    # int32 (values below 2^16, table numbers): about 12 bytes a coded latent in all.
    ids = _padded_table(lanes.lane_tables, order, counts, 0).astype(np.int32)
    lookup = _symbol_lookup(tables, ids) or _symbol_lookup(tables, np.zeros(1, np.int32))
    slots = np.stack(list(lookup.values()))
    row_of = np.zeros(len(tables.size), np.int32)
    row_of[list(lookup)] = np.arange(len(lookup))
    rows = row_of[ids]
    # Reads past a lane's end read zeros (the last column) and mark it truncated below.
    length = max(len(s) for s in streams) + 1
    words = np.zeros((len(order), length), np.int32)
    ends = np.array([len(streams[lane]) for lane in order], np.int64)
    for row, lane in enumerate(order):
        words[row, :ends[row]] = streams[lane]
    x = (words[:, 0].astype(np.int64) << 16) | words[:, 1]
    position = np.full(len(order), 2, np.int64)
    decoded = np.zeros(ids.shape, np.int32)
    active = len(order)
    for t in range(ids.shape[1]):
        while counts[active - 1] <= t:
            active -= 1
        xa = x[:active]
        slot = xa & _MASK
        s = slots[rows[:active, t], slot].astype(np.int64)
        base = tables.offset[ids[:active, t]] + s
        start = tables.cdf[base].astype(np.int64)
        xa = (tables.cdf[base + 1] - start) * (xa >> PRECISION) + slot - start
        low = np.flatnonzero(xa < STATE_LOW)
        xa[low] = (xa[low] << 16) | words[low, np.minimum(position[low], length - 1)]
        position[low] += 1
        x[:active] = xa
        decoded[:active, t] = s
    truncated = position > ends
    after = words[np.arange(len(order)), np.minimum(position, length - 1)]
    pad_ok = (position == ends) | ((position == ends - 1) & (after == 0))
    for row, lane in enumerate(order):
        n = counts[row]
        symbols, table_ids = decoded[row, :n].astype(np.int64), ids[row, :n]
        escape = symbols == tables.size[table_ids] - 1
        values = np.where(escape, ESCAPE_MARK, symbols + tables.low[table_ids])
        latents[lanes.lane_positions(lane)] = values
        status[lane] = (LANE_TRUNCATED if truncated[row] else
                        LANE_OK if x[row] == STATE_LOW and pad_ok[row] else LANE_BAD_END)
    return status


# -------------------------------------------------------------- CUDA --
def _device_arrays(runtime, lanes, tables, *more):
    """The lanes' and tables' arrays on the device, in the kernels' argument order."""
    return [runtime.from_numpy(a) for a in (lanes.runs, lanes.table, lanes.count, lanes.dest,
                                            lanes.positions, tables.cdf, tables.offset,
                                            tables.size, tables.low, *more)]


def encode_cuda(lanes, tables, latents):
    """:func:`encode_numpy` on the GPU, one thread per lane; ``latents``: a flat int32 NumPy
    array or device array."""
    return start_encode_cuda(lanes, tables, latents)()


def start_encode_cuda(lanes, tables, latents):
    """Launch :func:`encode_cuda`'s kernel and return a function that waits for it and
    returns the streams: the host may work in between."""
    runtime = cuda.get_runtime()
    if lanes.lanes == 0:
        return list
    source = latents if hasattr(latents, "ptr") else runtime.from_numpy(
        np.ascontiguousarray(latents, np.int32))
    capacity = lanes.symbols() + 2
    ends = np.cumsum(capacity)
    words = runtime.empty((int(ends[-1]),), np.uint16)
    used = runtime.empty((lanes.lanes,), np.int32)
    arrays = _device_arrays(runtime, lanes, tables)
    lane_end = runtime.from_numpy(ends.astype(np.int64))
    cuda.kernel(SOURCE, "rans_encode", "P" * 11 + "iPP").launch(
        lanes.lanes, source.ptr, *(a.ptr for a in arrays), lane_end.ptr, lanes.lanes, words.ptr,
        used.ptr, block=1)

    def finish():
        host, counts = runtime.to_numpy(words), runtime.to_numpy(used)
        return [padded_words(host[end - n:end]) for end, n in zip(ends, counts)]
    return finish


def decode_cuda(lanes, tables, streams, latents):
    """:func:`decode_numpy` on the GPU into the flat int32 device array ``latents``; returns
    each lane's status and escape count (int32 NumPy arrays)."""
    runtime = cuda.get_runtime()
    if lanes.lanes == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    begins = np.concatenate([[0], np.cumsum([len(s) for s in streams])]).astype(np.int64)
    words = runtime.from_numpy(np.concatenate(streams).astype(np.uint16))
    arrays = _device_arrays(runtime, lanes, tables, tables.buckets)
    lane_begin = runtime.from_numpy(begins)
    status = runtime.empty((lanes.lanes,), np.int32)
    escapes = runtime.empty((lanes.lanes,), np.int32)
    cuda.kernel(SOURCE, "rans_decode", "PP" + "P" * 10 + "iPPP").launch(
        lanes.lanes, words.ptr, lane_begin.ptr, *(a.ptr for a in arrays), lanes.lanes,
        latents.ptr, status.ptr, escapes.ptr, block=1)
    return runtime.to_numpy(status), runtime.to_numpy(escapes)
