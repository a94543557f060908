"""Format version 14's substreams: the factorized prior's blocks as rANS lanes.

Each block of the split (:class:`~gdnflow.codec.format.Split`) is a lane of
:mod:`gdnflow.codec.rans`: its coded channels in order, each channel's rows of
the block in raster order (one run per channel), with the channel's table;
the same symbols, in the same order, as version 11's range coder codes. The
escape bits are version 11's: which quiet channels are coded, then the escape
codes in coding order. On a GPU codec every lane is coded at once (one thread
each); on NumPy the lanes advance together, one vectorised step per symbol.
"""
import numpy as np

from gdnflow.codec.format import BitReader, BitWriter, FormatError
from gdnflow.codec.rans import (ESCAPE_MARK, LANE_ERRORS, LANE_OK, Lanes, RansTables,
                                decode_cuda, decode_numpy, encode_cuda, encode_numpy)
from gdnflow.codec.substreams import (quiet_channels, read_coded_groups, read_escape,
                                      write_coded_groups, write_escapes)

_TABLES = {}        # per factorized tables' model id: their RansTables


def rans_tables(tables):
    """The :class:`~gdnflow.codec.rans.RansTables` of factorized ``tables`` (made once per
    model id)."""
    made = _TABLES.get(tables.model_id)
    if made is None:
        made = RansTables.of(tables.cdfs, tables.low, tables.precision)
        _TABLES.clear()         # one model at a time is the common case; tables are small
        _TABLES[tables.model_id] = made
    return made


def _lanes(blocks, coded, shape):
    """The lanes of ``blocks`` of a (C, h, w) tensor, block b coding channels ``coded[b]``."""
    height, width = shape[1:]
    return Lanes.of([[(int(k), (rows.stop - rows.start) * width, (int(k) * height + rows.start)
                       * width) for k in channels]
                     for (_, rows), channels in zip(blocks, coded)])


def encode_rans(q, tables, split, quiet, device):
    """The substreams (payload bytes, escape bytes) of latents ``q`` (C, h, w) cut by
    ``split``, coded as rANS lanes on ``device`` ("cuda" or "numpy")."""
    blocks = split.blocks(q.shape)
    is_quiet = quiet_channels(tables) if quiet else np.zeros(q.shape[0], bool)
    coded, escape_bytes = [], []
    for channels, rows in blocks:
        block = q[channels, rows]
        escapes = BitWriter()
        keep = np.ones(block.shape[0], bool)
        block_quiet = is_quiet[channels]
        if quiet:
            nonzero = block[block_quiet].reshape(int(block_quiet.sum()), block[0].size).any(1)
            write_coded_groups(escapes, nonzero)
            keep[block_quiet] = nonzero
        numbers = channels.start + np.flatnonzero(keep)
        values = block[keep]
        low = tables.low[numbers][:, None, None]
        high = tables.high[numbers][:, None, None]
        outside = (values < low) | (values > high)
        if outside.any():
            write_escapes(escapes, values[outside], np.broadcast_to(low, values.shape)[outside],
                          np.broadcast_to(high, values.shape)[outside])
        coded.append(numbers)
        escape_bytes.append(escapes.getvalue())
    lanes = _lanes(blocks, coded, q.shape)
    flat = np.ascontiguousarray(q, np.int32).ravel()
    encode = encode_cuda if device == "cuda" else encode_numpy
    streams = encode(lanes, rans_tables(tables), flat)
    return [(words.astype("<u2").tobytes(), escapes)
            for words, escapes in zip(streams, escape_bytes)]


def decode_rans(substreams, tables, split, shape, source, quiet, device):
    """The latents (C, h, w) int32 that :func:`encode_rans` coded, decoded on ``device``."""
    blocks = split.blocks(shape)
    is_quiet = quiet_channels(tables) if quiet else np.zeros(shape[0], bool)
    readers, coded = [], []
    for (channels, _), (_, escapes) in zip(blocks, substreams):
        reader = BitReader(escapes, source)
        keep = np.ones(channels.stop - channels.start, bool)
        block_quiet = is_quiet[channels]
        if quiet:
            keep[block_quiet] = read_coded_groups(reader, int(block_quiet.sum()), source)
        readers.append(reader)
        coded.append(channels.start + np.flatnonzero(keep))
    lanes = _lanes(blocks, coded, shape)
    streams = [np.frombuffer(payload, "<u2").astype(np.uint16) for payload, _ in substreams]
    size = int(np.prod(shape))
    if device == "cuda":
        from gdnflow.backends import cuda    # local import: PyCUDA on first use
        runtime = cuda.get_runtime()
        flat = cuda.zeros((size,), np.int32)
        status, escaped = decode_cuda(lanes, rans_tables(tables), streams, flat)
        q = runtime.to_numpy(flat)
    else:
        q = np.zeros(size, np.int32)
        status = decode_numpy(lanes, rans_tables(tables), streams, q)
        escaped = np.ones(lanes.lanes, np.int32)     # looked for below
    for lane, reader in enumerate(readers):
        if status[lane] != LANE_OK:
            raise FormatError(f"{source}: corrupt payload in substream {lane} "
                              f"({LANE_ERRORS[int(status[lane])]})")
        if escaped[lane]:
            positions = lanes.lane_positions(lane)
            positions = positions[q[positions] == ESCAPE_MARK]
            channels = positions // (shape[1] * shape[2])
            for position, k in zip(positions.tolist(), channels.tolist()):
                q[position] = read_escape(reader, int(tables.low[k]), int(tables.high[k]),
                                          source)
        reader.check_end()
    return q.reshape(shape)
