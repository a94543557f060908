"""Format versions 14 and 16's substreams: the blocks of the split as rANS lanes.

Each block of a split (:class:`~gdnflow.codec.format.Split`) is a lane of
:mod:`gdnflow.codec.rans`, coding the same symbols, in the same order, as the
range-coded versions 11 and 13 do:

- a factorized tensor (the factorized prior's y, a hyperprior's z): the block's
  coded channels in order, each channel's rows of the block in raster order (one
  contiguous run per channel), with the channel's table;
- a hyperprior's y: the block's coded Gaussian tables in order, each table's
  elements of the block in raster order (one gathered run per table, at the
  positions :func:`~gdnflow.codec.hyperprior.table_groups` lists).

The escape bits are the range-coded versions': which quiet groups are coded (the
caller writes and reads those), then the escape codes in coding order. The
``device`` that codes the lanes: ``"host"`` (the lane coder built for the host, the
lanes shared among threads: :mod:`gdnflow.codec.host_lanes`), ``"cuda"`` (every
lane at once, one GPU thread each) or ``"numpy"`` (the lanes advance together,
one vectorised step per symbol).
"""
import numpy as np

from gdnflow.backends import cuda
from gdnflow.codec.format import BitReader, BitWriter, FormatError
from gdnflow.codec.host_lanes import decode_host, encode_host, lane_escapes
from gdnflow.codec.rans import (ESCAPE_MARK, LANE_ERRORS, LANE_OK, Lanes, RansTables,
                                decode_cuda, decode_numpy, encode_numpy, start_encode_cuda)
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


# ------------------------------------------------------ any lanes --
def encode_lanes(lanes, tables, q, writers, device):
    """The substreams (payload bytes, escape bytes) of the lanes of the int latents ``q``
    (any shape) under ``tables`` (RansTables): each lane's escape codes appended to its
    BitWriter in ``writers`` (which may hold the quiet groups already), coded on ``device``."""
    flat = np.ascontiguousarray(q, np.int32).ravel()
    # On a GPU the lanes are coded while the host writes the escape codes; the host's
    # coder says which lanes have escapes, so that only those are looked through.
    finish = start_encode_cuda(lanes, tables, flat) if device == "cuda" else None
    streams, escaped = encode_host(lanes, tables, flat) if device == "host" else (None, None)
    # The host build lists the escapes itself; elsewhere each lane's values are looked through.
    found = lane_escapes(lanes, tables, flat, escaped, False) \
        if device == "host" and escaped.any() else None
    for lane, escapes in enumerate(writers):
        if escaped is not None and not escaped[lane]:
            continue
        if found is not None:
            positions, ids = found[lane]
            values = flat[positions]
        else:
            values, ids = flat[lanes.lane_positions(lane)], lanes.lane_tables(lane)
            outside = (values < tables.low[ids]) | (values > tables.high[ids])
            values, ids = values[outside], ids[outside]
        if len(values):
            write_escapes(escapes, values, tables.low[ids], tables.high[ids])
    if finish is not None:
        streams = finish()
    elif streams is None:
        streams = encode_numpy(lanes, tables, flat)
    return [(words.astype("<u2").tobytes(), escapes.getvalue())
            for words, escapes in zip(streams, writers)]


def decode_lanes(lanes, tables, substreams, readers, shape, device, source, on_device=False):
    """The int32 latents of ``shape`` that :func:`encode_lanes` coded (0 where no lane
    codes), decoded on ``device``; each lane's escape codes read from its BitReader in
    ``readers`` (past the quiet groups), which must end there. FormatError naming
    ``source`` for a corrupt substream. ``on_device`` (a GPU codec's): return a device
    array (decoded there by a ``"cuda"`` device, which brings it to the host only if a lane
    escaped; else uploaded)."""
    streams = [np.frombuffer(payload, "<u2").astype(np.uint16) for payload, _ in substreams]
    device_q = None
    if device == "cuda":
        runtime = cuda.get_runtime()
        device_q = cuda.zeros(tuple(shape), np.int32)
        status, escaped = decode_cuda(lanes, tables, streams, device_q)
        bad = np.flatnonzero(status != LANE_OK)
        if on_device and not bad.size and not escaped.any():
            for reader in readers:
                reader.check_end()
            return device_q
        q = runtime.to_numpy(device_q).ravel()
    elif device == "host":
        q = np.zeros(int(np.prod(shape)), np.int32)
        status, escaped = decode_host(lanes, tables, streams, q)
    else:
        q = np.zeros(int(np.prod(shape)), np.int32)
        status = decode_numpy(lanes, tables, streams, q)
        escaped = np.ones(lanes.lanes, np.int32)     # looked for below
    found = None
    if device == "host" and escaped.any() and np.all(status == LANE_OK):
        found = lane_escapes(lanes, tables, q, escaped, True)
    for lane, reader in enumerate(readers):
        if status[lane] != LANE_OK:
            raise FormatError(f"{source}: corrupt payload in substream {lane} "
                              f"({LANE_ERRORS[int(status[lane])]})")
        if escaped[lane]:
            if found is not None:
                positions, ids = found[lane]
            else:
                positions, ids = lanes.lane_positions(lane), lanes.lane_tables(lane)
                marked = q[positions] == ESCAPE_MARK
                positions, ids = positions[marked], ids[marked]
            for position, k in zip(positions.tolist(), ids.tolist()):
                q[position] = read_escape(reader, int(tables.low[k]), int(tables.high[k]),
                                          source)
        reader.check_end()
    if on_device:
        return cuda.get_runtime().from_numpy(q.reshape(shape))
    return q.reshape(shape)


# ---------------------------------------------------- factorized --
def _channel_lanes(blocks, coded, shape):
    """The lanes of ``blocks`` of a (C, h, w) tensor, block b coding channels ``coded[b]``."""
    height, width = shape[1:]
    return Lanes.of([[(int(k), (rows.stop - rows.start) * width, (int(k) * height + rows.start)
                       * width) for k in channels]
                     for (_, rows), channels in zip(blocks, coded)])


def encode_rans(q, tables, split, quiet, device):
    """The substreams of latents ``q`` (C, h, w) under factorized ``tables``, cut by
    ``split`` (``quiet``: leave out the quiet channels that are all 0), as rANS lanes."""
    blocks = split.blocks(q.shape)
    is_quiet = quiet_channels(tables) if quiet else np.zeros(q.shape[0], bool)
    coded, writers = [], []
    for channels, rows in blocks:
        block = q[channels, rows]
        escapes = BitWriter()
        keep = np.ones(block.shape[0], bool)
        block_quiet = is_quiet[channels]
        if quiet:
            nonzero = block[block_quiet].reshape(int(block_quiet.sum()), block[0].size).any(1)
            write_coded_groups(escapes, nonzero)
            keep[block_quiet] = nonzero
        coded.append(channels.start + np.flatnonzero(keep))
        writers.append(escapes)
    return encode_lanes(_channel_lanes(blocks, coded, q.shape), rans_tables(tables), q,
                        writers, device)


def decode_rans(substreams, tables, split, shape, source, quiet, device, on_device=False):
    """The latents (C, h, w) int32 that :func:`encode_rans` coded, decoded on ``device``
    (``on_device``: as :func:`decode_lanes`)."""
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
    return decode_lanes(_channel_lanes(blocks, coded, shape), rans_tables(tables), substreams,
                        readers, shape, device, source, on_device)


# ---------------------------------------------------- by table --
def table_lanes(blocks, groups, coded, shape, positions=None):
    """The lanes of y's ``blocks`` ((channel slice, row slice) of a (M, h, w) tensor) coded
    by table: block b's tables ``coded[b]`` in order, table k's run gathering the block's
    elements ``order[bounds[k]:bounds[k + 1]]`` of its ``groups[b]`` = (order, bounds)
    (element numbers in the block's raster order). ``positions``: those elements' offsets
    into y, block after block, where the grouping listed them (else made here)."""
    height, width = shape[1:]
    lane_runs, made, offset = [], [], 0
    for (channels, rows), (order, bounds), tables in zip(blocks, groups, coded):
        if positions is None:
            per_channel = (rows.stop - rows.start) * width
            channel, rest = np.divmod(np.asarray(order, np.int64), per_channel)
            made.append((channels.start + channel) * (height * width) + rows.start * width
                        + rest)
        lane_runs.append([(int(k), int(bounds[k + 1] - bounds[k]), -1 - (offset + int(bounds[k])))
                          for k in tables])
        offset += len(order)
    if positions is None and made:
        positions = np.concatenate(made)
    return Lanes.of(lane_runs, positions)
