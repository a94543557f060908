"""Entropy coding of the latents in independent substreams, in parallel where asked.

A file of format version 7, 8, 11, 13, 14 or 16 (:mod:`gdnflow.codec.format`) cuts each
coded tensor into channel groups x row bands (a :class:`~gdnflow.codec.format.Split`);
each block is one substream, range-coded by a coder of its own with its own
escape bits, so substreams can be coded and decoded in any order and at once.

How many: each substream costs about 5 bytes (the coder's termination, about 2
bytes on average, and its two index varints), so the encoder makes as many as
keep that under about 0.25% of the file: one per :data:`SUBSTREAM_BITS` of
the payload, estimated from the tables before coding (:func:`estimated_bits`),
at least one. Channel groups come first (the factorized prior codes a channel
with one constriction call; a row band would split it into more calls), row
bands only beyond one group per channel. A 768x512 photo at the shipped
qualities gets 2 to 8 substreams (benchmarks/results/entropy_coding.md).

In parallel: the functions here take a ``mapper`` (the builtin ``map``,
or an executor's); constriction (0.5) holds the GIL while it codes, so a thread
pool gains nothing (measured in benchmarks/bench_entropy_coding.py). Every
function given to ``mapper`` is a module-level function of picklable
arguments, so a process pool works; each worker builds a model's constriction
models once (:func:`channel_model` keys them by the tables' model id, not by
the pickled copy each task brings), so what a task costs beyond its coding is
the pickling of its block and result. That still loses: a pool of 4 or 8
processes coded slower than one process at 768x512 and at 2048x1536 on the
H200 host's 16 cores (benchmarks/results/codec_speed_h200.md).
"""
import weakref
from collections import OrderedDict
from itertools import repeat

import numpy as np

from gdnflow.codec.format import (MAX_SYMBOL, BitReader, BitWriter, CodecError, FormatError,
                                  Split)

#: Estimated payload bits per substream the encoder aims for (see the module docstring).
SUBSTREAM_BITS = 1 << 14
#: About how many values :func:`estimated_bits` looks at.
_ESTIMATE_SAMPLES = 1 << 15
#: A table is quiet when its value 0 is at least 1 - 2^-QUIET_BITS likely: format versions
#: 11, 13, 14 and 16 leave out a block's quiet groups (channels, tables) whose values are
#: all 0.
QUIET_BITS = 8
#: Factorized tables whose constriction models a process keeps (the most recently used).
MODEL_CACHE_TABLES = 8
# Per model id (the tables are a pure function of the weights it hashes), least recently
# used first: a dict of the constriction models of its channels (keyed by channel number)
# and of its quiet channels (key "quiet", see quiet_channels).
_MODELS = OrderedDict()
# Per tables object: its bit costs (weak keys: a Codec's tables live as long as the Codec).
_COSTS = weakref.WeakKeyDictionary()


def categorical_model(probabilities):
    """A constriction categorical model that codes with exactly ``probabilities``.

    ``perfect=True`` makes constriction choose the KL-optimal 24-bit
    quantisation of the probabilities; gdnflow's are multiples of 2^-16 (each
    >= 2^-16), which 24 bits represent exactly, so that optimum is the table
    itself: the coder codes with exactly the tables' frequencies, whatever
    constriction's heuristics (its "fast" quantiser shifts them slightly).
    """
    return _constriction().stream.model.Categorical(probabilities, perfect=True)


def _model_cache(tables):
    """The process's cache entry of factorized ``tables``' model id (made, and marked most
    recently used; the least recently used beyond MODEL_CACHE_TABLES dropped)."""
    cache = _MODELS.setdefault(tables.model_id, {})
    _MODELS.move_to_end(tables.model_id)
    while len(_MODELS) > MODEL_CACHE_TABLES:
        _MODELS.popitem(last=False)
    return cache


def channel_model(tables, channel):
    """The constriction model of ``channel`` of factorized ``tables``, built once per process
    for the tables of each model id (the models are immutable: threads share them)."""
    models = _model_cache(tables)
    if channel not in models:
        models[channel] = categorical_model(tables.probabilities(channel))
    return models[channel]


def _constriction():
    try:
        # local import: on first use; a missing one is a CodecError that says so
        import constriction
    except ImportError:
        raise CodecError("the codec needs the constriction package (pip install "
                         "constriction)") from None
    return constriction


def range_encoder():
    """A new constriction range encoder (the payload's coder)."""
    return _constriction().stream.queue.RangeEncoder()


def range_decoder(payload, source):
    """A constriction range decoder over a payload's bytes; FormatError naming ``source``."""
    words = np.frombuffer(payload, "<u4").astype(np.uint32)
    try:
        return _constriction().stream.queue.RangeDecoder(words)
    except Exception as exc:    # noqa: BLE001 (constriction raises its own error types)
        raise FormatError(f"{source}: corrupt payload ({exc})") from None


def encode_values(encoder, escapes, values, low, high, model):
    """Code integer ``values`` (1-D) with one categorical ``model`` over [low, high] + escape.

    Symbol k < L = high - low + 1 is the value low + k; symbol L, the
    escape, stands for a value outside [low, high], whose distance past the
    support goes to ``escapes`` (a :class:`BitWriter`) as an Elias-gamma code
    of its zigzag number (see :mod:`gdnflow.codec.tables`).
    """
    symbols = values.astype(np.int64) - low
    escape = high - low + 1
    outside = (symbols < 0) | (symbols > escape - 1)
    symbols[outside] = escape
    encoder.encode(symbols.astype(np.int32), model)
    write_escapes(escapes, values[outside], low, high)


def write_escapes(escapes, values, low, high):
    """Append the escape codes of ``values`` (each outside its [low, high]; ``low`` and
    ``high`` numbers or arrays like ``values``): the Elias-gamma code of the zigzag number of
    each one's distance past its support."""
    for v, lo, hi in zip(values.tolist(), np.broadcast_to(low, np.shape(values)).tolist(),
                         np.broadcast_to(high, np.shape(values)).tolist()):
        d = v - (hi if v > hi else lo)
        escapes.write_gamma(2 * d - 1 if d > 0 else -2 * d)


def read_escape(reader, low, high, source):
    """The value of the next escape code in ``reader``, outside [low, high] (what
    :func:`write_escapes` wrote); FormatError naming ``source`` for an impossible one."""
    n = reader.read_gamma()
    value = high + (n + 1) // 2 if n % 2 else low - n // 2
    if abs(value) >= MAX_SYMBOL:
        raise FormatError(f"{source}: corrupt escape bits (a latent of {value})")
    return value


def decode_values(decoder, reader, count, low, high, model, source):
    """The ``count`` values :func:`encode_values` coded (int32); escapes read from ``reader``."""
    try:
        # int32: values stay below MAX_SYMBOL; half the memory of int64 for large groups.
        symbols = np.asarray(decoder.decode(model, count), np.int32)
    except Exception as exc:    # noqa: BLE001 (constriction raises its own error types)
        raise FormatError(f"{source}: corrupt or truncated payload ({exc})") from None
    values = symbols + low
    for i in np.flatnonzero(symbols == high - low + 1):
        values[i] = read_escape(reader, low, high, source)
    return values


# ------------------------------------------------------ quiet groups --
def quiet_zero(frequency, precision):
    """Whether a table whose value 0 has ``frequency`` (of 2^precision) is quiet: the value 0
    at least 1 - 2^-QUIET_BITS likely (numbers: arrays work too)."""
    return frequency >= (1 << precision) - (1 << (precision - QUIET_BITS))


def quiet_channels(tables):
    """Which channels of factorized ``tables`` are quiet (bool (C,); cached per model id)."""
    cache = _model_cache(tables)
    if "quiet" not in cache:
        zero_frequency = [int(cdf[-low + 1] - cdf[-low]) if low <= 0 <= high else 0
                          for cdf, low, high in zip(tables.cdfs, tables.low, tables.high)]
        cache["quiet"] = quiet_zero(np.array(zero_frequency), tables.precision)
    return cache["quiet"]


def write_coded_groups(escapes, coded):
    """Which of a block's quiet groups are coded (bool, in group order), in the escape bits:
    their count + 1, then each one's distance from the previous one (the first's from -1),
    Elias-gamma coded: one bit when none is."""
    positions = np.flatnonzero(coded)
    escapes.write_gamma(len(positions) + 1)
    for distance in np.diff(positions, prepend=-1):
        escapes.write_gamma(int(distance))


def read_coded_groups(reader, count, source):
    """What :func:`write_coded_groups` wrote of a block with ``count`` quiet groups."""
    coded = np.zeros(count, bool)
    listed, position = reader.read_gamma() - 1, -1
    if listed > count:
        raise FormatError(f"{source}: corrupt escape bits ({listed} coded groups of {count})")
    for _ in range(listed):
        position += reader.read_gamma()
        if position >= count:
            raise FormatError(f"{source}: corrupt escape bits (coded group {position} of "
                              f"{count})")
        coded[position] = True
    return coded


def check_latents(q, channels, what="encode_latents"):
    """``q`` as an array; ValueError unless it is integer latents of shape (channels, h, w)."""
    q = np.asarray(q)
    if q.ndim != 3 or q.shape[0] != channels or q.dtype.kind not in "iu":
        raise ValueError(f"{what}: expected integer latents of shape ({channels}, h, w), "
                         f"got {q.dtype} {q.shape}")
    return q


def encode_channels(encoder, escapes, q, tables, first=0, quiet=False):
    """Code latents ``q`` (C, h, w), channels ``first`` ... ``first + C - 1`` of factorized
    ``tables``, channel by channel, each in raster order; with ``quiet``, the quiet
    channels that are all 0 are left out (listed first in the escape bits)."""
    coded = np.ones(q.shape[0], bool)
    if quiet:
        is_quiet = quiet_channels(tables)[first:first + q.shape[0]]
        nonzero = q[is_quiet].reshape(int(is_quiet.sum()), q[0].size).any(axis=1)
        write_coded_groups(escapes, nonzero)
        coded[is_quiet] = nonzero
    for c in np.flatnonzero(coded):
        k = first + c
        encode_values(encoder, escapes, q[c].ravel(), int(tables.low[k]), int(tables.high[k]),
                      channel_model(tables, k))


def decode_channels(decoder, reader, tables, shape, first, quiet, source):
    """The latents (C, h, w) int32 that :func:`encode_channels` coded, ``shape`` = (C, h, w)
    (``quiet`` as there)."""
    channels, h, w = shape
    q = np.zeros((channels, h * w), np.int32)
    coded = np.ones(channels, bool)
    if quiet:
        is_quiet = quiet_channels(tables)[first:first + channels]
        coded[is_quiet] = read_coded_groups(reader, int(is_quiet.sum()), source)
    for c in np.flatnonzero(coded):
        k = first + c
        q[c] = decode_values(decoder, reader, h * w, int(tables.low[k]), int(tables.high[k]),
                             channel_model(tables, k), source)
    return q.reshape(shape)


# ------------------------------------------------------- substreams --
def encode_substream(code, arguments):
    """(payload bytes, escape bytes) of ``code(encoder, escapes, *arguments)`` on a coder of its own."""
    encoder, escapes = range_encoder(), BitWriter()
    code(encoder, escapes, *arguments)
    return encoder.get_compressed().astype("<u4").tobytes(), escapes.getvalue()


def decode_substream(code, substream, arguments, source):
    """What ``code(decoder, reader, *arguments, source)`` decodes of ``substream`` (payload
    bytes, escape bytes); FormatError naming ``source`` if escape bits are left over."""
    payload, escapes = substream
    decoder, reader = range_decoder(payload, source), BitReader(escapes, source)
    values = code(decoder, reader, *arguments, source)
    reader.check_end()
    return values


def encode_blocks(code, arguments, mapper=map):
    """The substreams of ``code`` over each block's ``arguments`` (a list of tuples), mapped
    by ``mapper`` (the builtin ``map``, or an executor's)."""
    return list(mapper(encode_substream, repeat(code), arguments))


def decode_blocks(code, substreams, arguments, source, mapper=map):
    """The values ``code`` decodes of each substream with its block's ``arguments``."""
    return list(mapper(decode_substream, repeat(code), substreams, arguments, repeat(source)))


def assemble(shape, blocks, parts):
    """An int32 array of ``shape`` with each of ``parts`` at its block (channel slice, row slice)."""
    q = np.empty(shape, np.int32)
    for (channels, rows), part in zip(blocks, parts):
        q[channels, rows] = part.reshape(q[channels, rows].shape)
    return q


def encode_factorized(q, tables, split, mapper=map, quiet=False):
    """The substreams of latents ``q`` (C, h, w) under factorized ``tables``, cut by ``split``
    (``quiet``: leave out the quiet channels that are all 0, format versions 11 and 13)."""
    return encode_blocks(encode_channels, [(q[channels, rows], tables, channels.start, quiet)
                                           for channels, rows in split.blocks(q.shape)], mapper)


def decode_factorized(substreams, tables, split, shape, source, mapper=map, quiet=False):
    """The latents (C, h, w) int32 :func:`encode_factorized` coded."""
    blocks = split.blocks(shape)
    arguments = [(tables, (channels.stop - channels.start, rows.stop - rows.start, shape[2]),
                  channels.start, quiet) for channels, rows in blocks]
    return assemble(shape, blocks, decode_blocks(decode_channels, substreams, arguments,
                                                 source, mapper))


# ------------------------------------------------------ the split --
def _bit_costs(tables):
    """A (tables, width + 1) float64 matrix of ``tables``' symbol costs in bits (-log2 p),
    and ``width``: row k holds table k's symbol s at column s + 1 and its escape's cost in
    column 0 (below the support) and from column len(cdf k) - 1 on (the escape itself and
    above), so that any value's cost is one lookup at its clipped column."""
    if tables not in _COSTS:
        frequencies = [np.diff(cdf) for cdf in tables.cdfs]
        width = max(len(f) for f in frequencies) + 1
        costs = np.empty((len(frequencies), width + 1))
        for k, f in enumerate(frequencies):
            bits = tables.precision - np.log2(f.astype(np.float64))
            costs[k] = bits[-1]
            costs[k, 1:len(f)] = bits[:-1]
        _COSTS[tables] = costs, width
    return _COSTS[tables]


def estimated_bits(values, ids, tables, low):
    """About the payload bits of coding integer ``values`` (C, h, w), value i with table
    ``ids[i]`` of ``tables`` (anything with ``cdfs`` and ``precision``) whose support
    starts at ``low[ids[i]]``; ``ids`` broadcasts against ``values``.

    Measured on every k-th position of each channel (about :data:`_ESTIMATE_SAMPLES`
    values in all) and scaled up: it only chooses how many substreams, so a few percent
    off costs nothing, and the full sum would cost a third of the coding. A value outside
    its table's support costs the escape symbol (its escape bits are not counted: rare).
    Flat lookups (``take``) into :func:`_bit_costs`' matrix: about 2.4x faster than
    indexing per table (a GPU encode waits on this).
    """
    costs, width = _bit_costs(tables)
    channels = values.shape[0]
    step = max(1, values.size // _ESTIMATE_SAMPLES)
    sample = values.reshape(channels, -1)[:, ::step]
    rows = np.broadcast_to(ids, values.shape).reshape(channels, -1)[:, ::step].astype(np.intp)
    # Column s + 1 for symbol s = value - low, clipped onto the escape's columns.
    columns = np.clip(sample - (np.asarray(low, np.int64) - 1).take(rows), 0, width)
    rows *= width + 1
    rows += columns
    return float(costs.ravel().take(rows).sum()) * values.size / sample.size


def choose_split(bits, shape, substream_bits=SUBSTREAM_BITS):
    """The :class:`Split` of a ``shape`` tensor whose payload is about ``bits``: one
    substream per ``substream_bits``, channel groups first (module docstring)."""
    count = max(1, int(bits // substream_bits))
    groups = min(count, shape[0])
    return Split(groups, min(max(1, count // groups), shape[1]))


def factorized_split(q, tables, substream_bits=SUBSTREAM_BITS):
    """The split of latents ``q`` (C, h, w) under factorized ``tables`` (:func:`choose_split`)."""
    ids = np.arange(tables.channels)[:, None, None]
    return choose_split(estimated_bits(q, ids, tables, tables.low), q.shape, substream_bits)
