"""Scale-hyperprior ``.gdn`` files (format version 16 where the lanes run on the host's
threads, a GPU codec's default, else 13; 8 and 4 read): side
information z, then y.

    codec = Codec.from_checkpoint("runs/hyper/checkpoint.h5")   # a HyperpriorCodec
    data = codec.compress(image)
    image_hat = codec.decompress(data)

Compression: the image is reflection-padded to multiples of 64; g_a gives
y (M, h, w) (tile by tile, as the factorized codec); h_a(|y|) gives z
(N, h/4, w/4) on the model's device; q_z = round(z - median) is coded with
z's entropy-bottleneck tables, channel by channel (:mod:`gdnflow.codec.tables`).
The encoder then computes the scales from q_z exactly as the decoder will
(:class:`~gdnflow.codec.hyper_synthesis.ExactHyperSynthesis`: integer
arithmetic, identical on every device; computed on the model's device),
takes each element's table index
(:func:`~gdnflow.codec.gaussian_tables.scale_indexes`), and codes
q_y = round(y) (half to even, the model's evaluation rounding) block by
block (the substreams of :mod:`gdnflow.codec.format`), each block grouped
by table: first every element of the block with table 0 in raster order of
(channel, row, column), then table 1's, and so on: one constriction call
per table present.

Decompression decodes q_z's substreams, recomputes the indexes, decodes
each of y's substreams table by table and scatters them back, and runs g_s
on y_hat = q_y as float32 (bit for bit the evaluation path's y_hat, on any
device). Version 4 files (one stream: z, then all of y by table) are read too.

What differs from the model's own evaluation forward: the scales (the
exact transform rounds weights and activations, see its module) and the
coded density (the table scale at or above each scale, with 16-bit
frequencies): the file's size is close to, not equal to, the model's
estimated rate; tests/codec/test_hyperprior_codec.py measures the gap.
"""
import dataclasses
import functools
import hashlib

import numpy as np

from gdnflow.autograd import no_grad
from gdnflow.codec.codec import CODECS, Codec, quantize_latents
from gdnflow.codec.device_groups import table_groups_by_block, table_groups_on_host
from gdnflow.codec.device_latents import quantize_on_device
from gdnflow.codec.format import (DOWNSAMPLING, HYPERPRIOR_RANS_VERSION, HYPERPRIOR_VERSION,
                                  QUIET_VERSIONS, SIDE_DOWNSAMPLING, SINGLE_STREAM_VERSIONS,
                                  BitReader, BitWriter, CodecError, Header, check_model, pack,
                                  unpack)
from gdnflow.codec.rans import RansTables
from gdnflow.codec.rans_substreams import (decode_lanes, decode_rans, encode_lanes, encode_rans,
                                           table_lanes)
from gdnflow.codec.substreams import (assemble, categorical_model, check_latents, choose_split,
                                      decode_blocks, decode_channels, decode_factorized,
                                      decode_substream, decode_values, encode_blocks,
                                      encode_channels, encode_factorized, encode_substream,
                                      encode_values, estimated_bits, factorized_split,
                                      quiet_zero, read_coded_groups, write_coded_groups)
from gdnflow.codec.gaussian_tables import gaussian_tables
from gdnflow.codec.exact_layers import BIAS_LIMIT, SUM_BITS, WEIGHT_BITS
from gdnflow.codec.hyper_synthesis import ACTIVATION_LIMIT, FRACTION_BITS, ExactHyperSynthesis
from gdnflow.codec.tables import build_tables
from gdnflow.codec.tiling import analysis_crop, tile_ranges
from gdnflow.models.scale_hyperprior import ScaleHyperprior
from gdnflow.ops import entropy as entropy_ops
from gdnflow.tensor import Tensor

TABLES_VERSION = b"gdnflow-hyperprior-tables-1"
#: The hyperprior's substreams aim at twice the factorized prior's payload (SUBSTREAM_BITS):
#: y is coded by table, one constriction call per table present in a block, so half as
#: many blocks is about half as many calls: at 768x512, y's coding took 2.7-7.8 ms
#: against 2.9-10.9 ms encoding and 3.4-6.5 against 2.8-7.6 decoding (q1-q4, 2 cores),
#: and the split costs 0.15-0.18% of the file instead of 0.29-0.31%. For version 16 the
#: size is needed: a rANS lane's termination costs a few bytes more, and at the smaller
#: size its split would cost 0.54-0.60% (benchmarks/results/rate_rans.md; #28 asks for
#: under 0.5%).
HYPERPRIOR_SUBSTREAM_BITS = 1 << 15


@dataclasses.dataclass(frozen=True, eq=False)
class HyperpriorTables:
    """Everything a hyperprior file is coded with.

    Fields: ``z`` (z's :class:`~gdnflow.codec.tables.CodingTables`),
    ``gaussian`` (:class:`~gdnflow.codec.gaussian_tables.GaussianTables`),
    ``hyper_synthesis`` (:class:`~gdnflow.codec.hyper_synthesis.ExactHyperSynthesis`),
    ``channels`` (M, y's channels), ``hyper_channels`` (N, z's).
    """

    z: object
    gaussian: object
    hyper_synthesis: object
    channels: int
    hyper_channels: int

    @property
    def model_id(self):
        """The model id of the weights (all of them: z's tables carry it)."""
        return self.z.model_id

    @property
    def medians(self):
        """y's rounding offsets: zeros (the Gaussian conditional rounds y itself)."""
        return np.zeros(self.channels, np.float32)

    def digest(self):
        """32-byte SHA-256 of z's tables, the Gaussian tables and the exact arithmetic's widths."""
        h = hashlib.sha256(TABLES_VERSION)
        h.update(self.z.digest())
        h.update(self.gaussian.digest())
        h.update(np.array([FRACTION_BITS, WEIGHT_BITS, ACTIVATION_LIMIT, SUM_BITS, BIAS_LIMIT],
                          "<f8").tobytes())
        return h.digest()

    def indexes(self, q_z, device="numpy"):
        """Each y element's table index (M, h, w) uint8, from the integer side information q_z,
        computed on ``device`` ("numpy" or "cuda": the same indexes, see
        :class:`~gdnflow.codec.hyper_synthesis.ExactHyperSynthesis`)."""
        return self.hyper_synthesis.indexes(q_z, self.gaussian.scales, device=device)

    def start_indexes(self, q_z, device="numpy"):
        """:meth:`indexes` started: a function that returns them (on a GPU the host may work
        while the kernels run: ExactHyperSynthesis.start_indexes)."""
        return self.hyper_synthesis.start_indexes(q_z, self.gaussian.scales, device=device)


def build_hyperprior_tables(model):
    """The :class:`HyperpriorTables` of a ScaleHyperprior ``model``."""
    z = build_tables(model)
    return HyperpriorTables(z=z, gaussian=gaussian_tables(),
                            hyper_synthesis=ExactHyperSynthesis(model.h_s, z.medians),
                            channels=model.M, hyper_channels=model.N)


@functools.lru_cache(maxsize=1)
def gaussian_models():
    """One constriction model per Gaussian table (built once: the tables are fixed)."""
    tables = gaussian_tables()
    return tuple(categorical_model(tables.probabilities(k)) for k in range(len(tables.scales)))


@functools.lru_cache(maxsize=1)
def quiet_tables():
    """Which Gaussian tables are quiet (bool, :func:`~gdnflow.codec.substreams.quiet_zero`)."""
    tables = gaussian_tables()
    zero_frequency = [int(cdf[high + 1] - cdf[high]) for cdf, high in zip(tables.cdfs, tables.high)]
    return quiet_zero(np.array(zero_frequency), tables.precision)


def table_groups(indexes, wanted=None):
    """(order, bounds): positions of the flat ``indexes`` grouped by table, each group in
    raster order (a stable sort): table k's group is ``order[bounds[k]:bounds[k + 1]]``.
    ``wanted`` (bool per table), if given: only those tables' groups are needed (the others'
    may come out empty), so that most of a sort can be saved when most elements are not."""
    counts = np.bincount(indexes, minlength=len(gaussian_models()))
    if wanted is not None and 2 * counts[wanted].sum() < indexes.size:
        positions = np.flatnonzero(wanted[indexes])
        order = positions[np.argsort(indexes[positions], kind="stable")]
        counts = np.where(wanted, counts, 0)
    else:
        order = np.argsort(indexes, kind="stable")      # a radix sort for uint8: one pass
    return order, np.concatenate([[0], np.cumsum(counts)])


def listed_quiet_tables(indexes, groups):
    """The quiet tables present in a block of flat table ``indexes`` (``groups``: its
    :func:`table_groups`, or None): those whose coded-or-not bits the escapes list."""
    present = np.bincount(indexes, minlength=len(gaussian_models())) > 0 if groups is None \
        else np.diff(groups[1]) > 0
    return np.flatnonzero(quiet_tables() & present)


def write_coded_tables(escapes, q, indexes, quiet, groups, nonzero=None):
    """(coded, (order, bounds)) of a block's values ``q`` and table ``indexes`` (flat, or
    any shape where ``groups`` is given): which tables are coded (bool per table; with
    ``quiet``, the quiet tables present that are not all 0, listed first in ``escapes``) and
    the block's groups (``groups`` if given). ``nonzero``: the block's count of non-zero
    values per table, where the grouping counted them."""
    coded = np.ones(len(gaussian_models()), bool)
    if quiet:
        listed = listed_quiet_tables(indexes, groups)
        if nonzero is None:
            nonzero = np.bincount(indexes[q != 0], minlength=coded.size)
        write_coded_groups(escapes, nonzero[listed] > 0)
        coded[listed] = nonzero[listed] > 0
    return coded, table_groups(indexes, coded) if groups is None else groups


def read_coded_tables(reader, indexes, quiet, groups, source):
    """What :func:`write_coded_tables` gave for a block of flat table ``indexes``, the coded
    quiet tables read from ``reader``."""
    coded = np.ones(len(gaussian_models()), bool)
    if quiet:
        listed = listed_quiet_tables(indexes, groups)
        coded[listed] = read_coded_groups(reader, len(listed), source)
    return coded, table_groups(indexes, coded) if groups is None else groups


def encode_by_table(encoder, escapes, q, indexes, quiet=False, groups=None):
    """Code y's integer values ``q`` (any shape), each with the Gaussian table of its index
    in ``indexes`` (same shape), grouped by table: table 0's values in raster order, then
    table 1's, ...: one constriction call per table present. With ``quiet``, the quiet
    tables whose values are all 0 are left out (listed first in the escape bits).
    ``groups``: ``table_groups(indexes.ravel())`` if the caller has it (a GPU made it)."""
    indexes, q = indexes.ravel(), q.ravel()
    coded, (order, bounds) = write_coded_tables(escapes, q, indexes, quiet, groups)
    highs = gaussian_tables().high
    for k in np.flatnonzero((np.diff(bounds) > 0) & coded):
        encode_values(encoder, escapes, q[order[bounds[k]:bounds[k + 1]]], -int(highs[k]),
                      int(highs[k]), gaussian_models()[k])


def decode_by_table(decoder, reader, indexes, quiet, groups, source):
    """The values (int32, the shape of ``indexes``) :func:`encode_by_table` coded
    (``quiet`` and ``groups`` as there)."""
    flat = indexes.ravel()
    coded, (order, bounds) = read_coded_tables(reader, flat, quiet, groups, source)
    q, highs = np.zeros(flat.shape, np.int32), gaussian_tables().high
    for k in np.flatnonzero((np.diff(bounds) > 0) & coded):
        q[order[bounds[k]:bounds[k + 1]]] = decode_values(
            decoder, reader, int(bounds[k + 1] - bounds[k]), -int(highs[k]), int(highs[k]),
            gaussian_models()[k], source)
    return q.reshape(indexes.shape)


@functools.lru_cache(maxsize=1)
def gaussian_rans_tables():
    """The Gaussian tables as rANS lanes' tables (:mod:`gdnflow.codec.rans`)."""
    tables = gaussian_tables()
    return RansTables.of(tables.cdfs, -np.asarray(tables.high), tables.precision)


def encode_by_table_rans(q, indexes, blocks, groups, quiet, device, positions=None,
                         nonzero=None):
    """Version 16's substreams of y ``q`` (M, h, w) with table ``indexes``: each block of
    ``blocks`` a rANS lane coding its values by table as :func:`encode_by_table` does
    (``groups``: each block's, or None to group on the host; ``positions`` and ``nonzero``:
    as :func:`block_groups` gives)."""
    writers, coded, grouped = [], [], []
    for b, ((channels, rows), group) in enumerate(zip(blocks, groups)):
        escapes = BitWriter()
        # Flat copies of the block only where the grouping has to be made here.
        block_q, block_indexes = q[channels, rows], indexes[channels, rows]
        if group is None:
            block_q, block_indexes = block_q.ravel(), block_indexes.ravel()
        mask, group = write_coded_tables(escapes, block_q, block_indexes, quiet, group,
                                         None if nonzero is None else nonzero[b])
        coded.append(np.flatnonzero((np.diff(group[1]) > 0) & mask))
        grouped.append(group)
        writers.append(escapes)
    return encode_lanes(table_lanes(blocks, grouped, coded, q.shape, positions),
                        gaussian_rans_tables(), q, writers, device)


def decode_by_table_rans(substreams, indexes, blocks, groups, quiet, device, source,
                         positions=None):
    """The y (M, h, w) int32 that :func:`encode_by_table_rans` coded."""
    readers, coded, grouped = [], [], []
    for (channels, rows), group, (_, escapes) in zip(blocks, groups, substreams):
        reader = BitReader(escapes, source)
        mask, group = read_coded_tables(reader, indexes[channels, rows].ravel(), quiet, group,
                                        source)
        coded.append(np.flatnonzero((np.diff(group[1]) > 0) & mask))
        grouped.append(group)
        readers.append(reader)
    return decode_lanes(table_lanes(blocks, grouped, coded, indexes.shape, positions),
                        gaussian_rans_tables(), substreams, readers, indexes.shape, device,
                        source)


def block_groups(indexes, blocks, device, lanes, values=None):
    """(groups, positions, nonzero): each block's ``table_groups`` and the grouped
    elements' offsets into y (:mod:`gdnflow.codec.device_groups`), made by the host
    build's threads where the ``lanes`` are coded there (with y's ``values``, also each
    block's count of non-zero values per table), else on the GPU for a cuda ``device``;
    else Nones: the coders group each block themselves."""
    if lanes == "host":
        return table_groups_on_host(indexes, blocks, values)
    if device == "cuda":
        return (*table_groups_by_block(indexes, blocks), None)
    return [None] * len(blocks), None, None


def encode_single_stream(encoder, escapes, q_z, q, tables):
    """Version 4's one stream: ``q_z`` channel by channel, then ``q`` grouped by table."""
    encode_channels(encoder, escapes, q_z, tables.z)
    encode_by_table(encoder, escapes, q, tables.indexes(q_z))


def decode_single_stream(decoder, reader, tables, hyper_shape, source):
    """(q_z, q) int32 of version 4's one stream (:func:`encode_single_stream`)."""
    q_z = decode_channels(decoder, reader, tables.z, hyper_shape, 0, False, source)
    return q_z, decode_by_table(decoder, reader, tables.indexes(q_z), False, None, source)


class HyperpriorCodec(Codec):
    """A scale-hyperprior model with its coding tables: compress and decompress images.

    As :class:`~gdnflow.codec.codec.Codec` (same arguments, attributes and
    methods), for a :class:`~gdnflow.models.ScaleHyperprior`; ``tables`` is
    a :class:`HyperpriorTables`. See the module docstring for the file.
    """

    #: Version 4 (one stream), 8 (substreams), 13 (substreams, quiet tables left out) and
    #: 16 (13's substreams as rANS lanes).
    versions = (4, 8, HYPERPRIOR_VERSION, HYPERPRIOR_RANS_VERSION)

    def close(self):
        """As :meth:`Codec.close`, and the exact hyper-synthesis's CUDA graphs too."""
        super().close()
        self.tables.hyper_synthesis.replays.close()

    def default_version(self):
        """Version 16 (rANS lanes) where the lanes are coded on the host's threads
        (``lanes="host"``, a GPU codec's default), else 13 (range-coded). At the rate #28
        allows the lanes are few for the hyperprior's small files (2 to 9 of y at 768x512):
        a GPU lane decodes about 8x slower than constriction's range decoder
        (benchmarks/results/rans_lanes.md), so 16 on GPU lanes was slower than 13 at
        quality 1-3 (codec_speed_h200.md). The host build of the lane coder is faster
        than constriction on one thread and runs the lanes side by side: 16 on host
        lanes is faster than 13 at every quality."""
        return HYPERPRIOR_RANS_VERSION if self.lanes == "host" else HYPERPRIOR_VERSION

    def default_substream_bits(self):
        """:data:`HYPERPRIOR_SUBSTREAM_BITS`, twice the factorized prior's."""
        return HYPERPRIOR_SUBSTREAM_BITS

    @staticmethod
    def build_tables(model):
        """The model's :class:`HyperpriorTables`."""
        return build_hyperprior_tables(model)

    def side_information(self, y):
        """q_z (N, h/4, w/4) int32: ``h_a(|y|)`` on the model's device, rounded around z's medians.

        Tile by tile (as :meth:`analyse`): each tile of z from the crop of y it reads.
        """
        y = np.asarray(y, np.float32)
        h_a = self.model.h_a
        tile = self.tile_pixels(*(DOWNSAMPLING * n for n in y.shape[1:]))
        side = None if tile is None else tile // self.multiple
        m = SIDE_DOWNSAMPLING
        shape = (self.tables.hyper_channels, y.shape[1] // m, y.shape[2] // m)
        q_z = np.empty(shape, np.int32)
        for top, bottom in tile_ranges(shape[1], side):
            r0, r1 = analysis_crop(h_a, top, bottom, y.shape[1])
            for left, right in tile_ranges(shape[2], side):
                c0, c1 = analysis_crop(h_a, left, right, y.shape[2])
                crop = np.ascontiguousarray(y[None, :, r0:r1, c0:c1])
                with no_grad():
                    z = h_a(entropy_ops.abs(Tensor(crop, device=self.device))).numpy()[0]
                r, c = r0 // m, c0 // m
                q_z[:, top:bottom, left:right] = quantize_latents(
                    z[:, top - r:bottom - r, left - c:right - c], self.tables.z.medians)
        return q_z

    def side_on_device(self, y):
        """:meth:`side_information` of the cuda Tensor y (1, M, h, w) that
        :meth:`~gdnflow.codec.codec.Codec.analyse_on_device` made: h_a of all of it, z
        quantised on the device."""
        m = SIDE_DOWNSAMPLING
        shape = (self.tables.hyper_channels, y.shape[2] // m, y.shape[3] // m)
        with no_grad():
            z = self._plans("h_a", entropy_ops.abs(y), y.shape[2] * y.shape[3] * DOWNSAMPLING ** 2)
        if z.shape[1:] != shape:
            raise CodecError(f"{type(self).__name__}: h_a made side information of "
                             f"{z.shape[1:]} from y of {y.shape[1:]}, expected {shape}")
        return quantize_on_device(z, self.tables.z.medians)

    def encode_latents(self, q, height, width, q_z):
        """The file bytes for integer latents ``q`` (M, h, w) and side information ``q_z``
        (N, h/4, w/4) of an image of height x width."""
        tables = self.tables
        q = check_latents(q, tables.channels, "HyperpriorCodec.encode_latents: q")
        q_z = check_latents(q_z, tables.hyper_channels, "HyperpriorCodec.encode_latents: q_z")
        m = SIDE_DOWNSAMPLING
        sides = (m * -(-height // self.multiple), m * -(-width // self.multiple))
        if q.shape[1:] != sides or q_z.shape[1:] != (sides[0] // m, sides[1] // m):
            raise ValueError(f"HyperpriorCodec.encode_latents: a {height}x{width} image has "
                             f"latents of {sides[0]}x{sides[1]} and side information of "
                             f"{sides[0] // m}x{sides[1] // m}, got {q.shape} and {q_z.shape}")
        if self.version not in SINGLE_STREAM_VERSIONS:
            quiet = self.version in QUIET_VERSIONS
            rans = self.version == HYPERPRIOR_RANS_VERSION
            # z is coded while a GPU works out y's table indexes from it.
            finish_indexes = tables.start_indexes(q_z, self.device)
            splits = (factorized_split(q_z, tables.z, self.substream_bits),)
            substreams = encode_rans(q_z, tables.z, splits[0], True, self.lanes) if rans else \
                encode_factorized(q_z, tables.z, splits[0], self.map, quiet)
            indexes = finish_indexes()
            gaussian = tables.gaussian
            splits += (choose_split(estimated_bits(q, indexes, gaussian, -gaussian.high),
                                    q.shape, self.substream_bits),)
            blocks = splits[1].blocks(q.shape)
            # Non-zero counts for version 16's coder only: the range coders find their own.
            groups, positions, nonzero = block_groups(indexes, blocks, self.device, self.lanes,
                                                      q if rans else None)
            if rans:
                substreams += encode_by_table_rans(q, indexes, blocks, groups, True, self.lanes,
                                                   positions, nonzero)
            else:
                substreams += encode_blocks(encode_by_table,
                                            [(q[c, r], indexes[c, r], quiet, g)
                                             for (c, r), g in zip(blocks, groups)], self.map)
        else:
            splits, substreams = (), [encode_substream(encode_single_stream, (q_z, q, tables))]
        header = Header(height, width, q.shape[0], q.shape[1], q.shape[2], self._id,
                        self._digest, self.version, tables.hyper_channels, splits)
        return pack(header, substreams)

    def compress(self, image):
        """The ``.gdn`` bytes of a uint8 (H, W, 3) image (on a GPU, y and z of an image of one
        tile are quantised on the device: :mod:`gdnflow.codec.device_latents`)."""
        y = self.analyse_on_device(image)
        if y is None:
            y = self.analyse(image)
            q, q_z = self.quantize(y), self.side_information(y)
        else:
            q, q_z = quantize_on_device(y, self.tables.medians), self.side_on_device(y)
        return self.encode_latents(q, image.shape[0], image.shape[1], q_z)

    def decode_quantized(self, data, source="<bytes>", on_device=False):
        """(Header, q int32 (M, h, w)): y's integer latents of a file's bytes, on the host
        (``on_device`` as the base class's, unused); errors name ``source``."""
        header, substreams = unpack(data, source)
        check_model(header, self.tables, source, self._digest)
        tables = self.tables
        if header.version in SINGLE_STREAM_VERSIONS:
            return header, decode_substream(decode_single_stream, substreams[0],
                                            (tables, header.hyper_shape), source)[1]
        quiet = header.version in QUIET_VERSIONS
        rans = header.version == HYPERPRIOR_RANS_VERSION
        split_z, split_y = header.splits
        side = split_z.groups * split_z.bands
        if rans:
            q_z = decode_rans(substreams[:side], tables.z, split_z, header.hyper_shape, source,
                              True, self.lanes)
        else:
            q_z = decode_factorized(substreams[:side], tables.z, split_z, header.hyper_shape,
                                    source, self.map, quiet)
        indexes = tables.indexes(q_z, self.device)
        blocks = split_y.blocks(header.latent_shape)
        groups, positions, _ = block_groups(indexes, blocks, self.device, self.lanes)
        if rans:
            return header, decode_by_table_rans(substreams[side:], indexes, blocks, groups,
                                                True, self.lanes, source, positions)
        parts = decode_blocks(decode_by_table, substreams[side:],
                              [(indexes[c, r], quiet, g) for (c, r), g in zip(blocks, groups)],
                              source, self.map)
        return header, assemble(header.latent_shape, blocks, parts)


CODECS[ScaleHyperprior.name] = HyperpriorCodec

__all__ = ["HyperpriorCodec", "HyperpriorTables", "build_hyperprior_tables"]
