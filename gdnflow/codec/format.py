"""The ``.gdn`` bitstream: a small header, the entropy-coded latents in substreams, a checksum.

Layout of format version 7, the factorized prior's (versions 11, 13, 14 and 16,
the newest, differ only inside the substreams: see the end; integers marked varint are
unsigned LEB128: 7 bits a byte, low bits first, high bit set on every byte but
the last)::

    magic          4 bytes   b"GDNF"
    version        1 byte    7
    model id      16 bytes   the first 16 bytes of SHA-256 of the model's
                             parameters and buffers (tables.model_id)
    tables         4 bytes   the first 4 bytes of the coding tables' digest
                             (CodingTables.digest): readers with other tables refuse
    height, width  varint    the image's size in pixels (before padding), each <= 65536,
                             height * width <= MAX_PIXELS
    channels       varint    latent channels M
    latent h, w    varint    latent rows and columns: ceil(height / 16), ceil(width / 16)
    split          2 varints channel groups G (1..M) and row bands B (1..latent h)
    index          2 varints per substream, G x B of them in substream order: its
                             payload's length in 32-bit words, its escape bits' length
                             in bytes
    substreams               each substream's payload (constriction RangeEncoder
                             words, little-endian uint32; versions 14 and 16:
                             rANS uint16 words, padded) then its escape bits
                             (Elias-gamma codes of the values outside the
                             supports, most significant bit first, zero-padded
                             to a whole byte), one substream after the other
    checksum       4 bytes   zlib.crc32 (CRC-32, ISO-HDLC polynomial) of every
                             byte before it, little-endian

The split (:class:`Split`) cuts the integer latents q (M, h, w) into G x B
blocks: group g holds channels [g M // G, (g + 1) M // G), band b rows
[b h // B, (b + 1) h // B); substream g B + b codes block (g, b) with a range
coder and an escape-bit writer of its own, starting from the coder's initial
state: any substream decodes without the others. Within a block, channel
by channel, each channel's rows of the block in raster order, every symbol
with its channel's categorical model (:class:`~gdnflow.codec.tables.CodingTables`;
values outside the support as the escape symbol, their distance past it in
the block's escape bits, in the same order). How the encoder chooses G and B
(about one substream per 2 KiB of payload, 4 KiB for a hyperprior's, each costing
about 5 bytes) is
:mod:`gdnflow.codec.substreams`'s business: readers take any split that fits.
The header is 32 to 46 bytes before the index, which takes 2 to 4 a substream
(at the encoder's substream sizes), and the checksum 4; bpp counts the whole file.

A decoder with many lanes (a GPU's threads) maps onto this layout as follows:
read the index, take the prefix sums of the substreams' sizes (each
substream's payload and escape offsets in the file), give each substream
a lane, and let each lane decode its block into q at the block's offset; no
lane waits for another. The blocks are given by G, B and the latent shape
alone, and each lane needs only its channels' tables (factorized) or the
Gaussian tables and its block of table indexes (hyperprior, after z). How
many lanes a file offers is the encoder's choice, bounded by the rate: each
substream costs about 5 bytes (the range coder's termination and its index
entry), so under 0.5% of the file means at most one substream per ~1 KB.
Finer parallelism (an interleaved rANS with 32 lanes per substream) would
be a new version with the same header and index.

Readers check the magic and the version, then the checksum BEFORE anything
else: a file changed anywhere after its version byte (any single flipped
bit, any burst of up to 32 bits) is refused as corrupted, never decoded
to another image nor blamed on another model. Then the image size against
:data:`MAX_PIXELS` (before anything is allocated), that the sizes agree
with each other and are plausible, that the split fits the latents, that
the file is long enough for the substream count's index (before the blocks
are listed), that each substream's sizes are plausible for its block, that
the substreams end exactly where the file does; then the model and tables
(:func:`check_model`), and while decoding, that each substream's escape
bits end where its index says.

Version 8 is the scale hyperprior's file (:mod:`gdnflow.codec.hyperprior`):
version 7's layout with one more varint after the latent width, the side
information's channels N (z is N x latent h/4 x latent w/4), latent sides
of 4 ceil(height / 64) and 4 ceil(width / 64) (the model pads images to
multiples of 64), and two splits: z's (its groups of N channels and bands
of h/4 rows), then y's. The index lists z's substreams, then y's. z's
substreams code z as version 7 codes y; y's code their block grouped by
coding table (every element of table 0 in raster order of (channel, row,
column) within the block, then table 1's, ...; see that module), the
tables chosen by the scales that the whole of z gives: a decoder decodes
z's substreams (in parallel), computes the scales, then y's (in parallel).

The single-stream versions, still read (:data:`SINGLE_STREAM_VERSIONS`):
version 2 has, instead of the split and the index, one varint (the
payload's size in bytes, a multiple of 4), then the payload, then the
escape bits: one substream of the whole of q. Version 1 (gdnflow before
the checksum) is version 2 without the checksum (every check but the
checksum: a flipped bit in its payload may decode to a different image).
Version 4 is the hyperprior's: version 2's layout with the side
information's channels after the latent width, and one stream coding z
channel by channel, then all of y grouped by table.

Versions 11 and 13 are versions 7 and 8 (the same header, split and index)
whose substreams leave out their *quiet* groups that hold only zeros. A
group is a channel of the block (factorized prior, and z in a hyperprior
file) or a coding table of the block (y in a hyperprior file), and it is
quiet when its table gives the value 0 at least 1 - 2^-8 of the mass (a
frequency of at least 65280 of 65536; :func:`gdnflow.codec.substreams.quiet_zero`):
the trained models' unused channels and their smallest scales, which hold
most of the latents and almost never anything but 0. Each substream's escape
bits start with which of the block's quiet groups (those present in it, in
channel or table order) are coded anyway: their count + 1, then each one's
distance from the previous one (the first's from -1), all Elias-gamma codes
(one bit when none is). Every other quiet group of the block is all zeros and
not in the payload; the rest is coded as in versions 7 and 8. The coder then
spends no time on the zeros (most of the symbols at the shipped qualities),
and the file is a few bits smaller or larger.

Version 14 is version 11 (the same header, split, index, quiet channels and escape
bits) whose substreams' payloads are rANS streams instead of range-coded ones: the
16-bit words of :mod:`gdnflow.codec.rans` (little-endian, padded with a zero word
to a whole number of 32-bit words, which the index counts), coding the same symbols
in the same order. One lane (a GPU thread, or a host thread's turn:
:mod:`gdnflow.codec.host_lanes`) decodes (and encodes) each substream, and the
NumPy coder reads and writes the same words. A GPU codec writes it by default.
Version 16 is the same for version 13: z's substreams as version 14's, y's as
lanes coding each block's values by table in version 13's order (one run per
coded table, gathering the table's elements); a GPU codec's hyperprior writes it.

The version numbers: 1, 2, 4, 7, 8, 11, 13, 14 and 16 are each at least two bits
from any other, so a single flipped bit of the version byte never turns one
readable version into another (none escapes the checksum by reading as
version 1, which has none).
"""
import dataclasses
import typing
import zlib

import numpy as np
from gdnflow.errors import GdnflowError

MAGIC = b"GDNF"
#: The factorized prior's files, in substreams, quiet channels left out (module docstring).
FORMAT_VERSION = 11
#: The scale hyperprior's files, in substreams, quiet tables left out.
HYPERPRIOR_VERSION = 13
#: The versions of one range-coded stream (1: no checksum; 2 and 4 before substreams).
SINGLE_STREAM_VERSIONS = (1, 2, 4)
#: The scale hyperprior's versions (the header has the side information's channels).
HYPERPRIOR_VERSIONS = (4, 8, 13, 16)
#: The versions whose substreams leave out their quiet groups that are all 0.
QUIET_VERSIONS = (11, 13, 14, 16)
#: The factorized prior's files whose substreams are rANS streams (module docstring):
#: what a GPU codec writes.
RANS_VERSION = 14
#: The scale hyperprior's files whose substreams are rANS streams.
HYPERPRIOR_RANS_VERSION = 16
#: The versions readers accept; writers write any of them (Codec's ``version``).
READABLE_VERSIONS = (1, 2, 4, 7, 8, 11, 13, 14, 16)
CHECKSUM_BYTES = 4
MODEL_ID_BYTES = 16
TABLES_DIGEST_BYTES = 4
#: Latent side per image side: the analysis transform's downsampling.
DOWNSAMPLING = 16
#: Latents of y per element of the side information z, a side (the scale hyperprior's h_a).
SIDE_DOWNSAMPLING = 4
#: Largest image side and latent channel count a file may declare: a corrupt
#: header must not make the reader allocate gigabytes before it fails.
MAX_SIDE = 1 << 16
MAX_CHANNELS = 1 << 12
#: Largest image (height * width) a file may hold: 16384 x 16384. Checked from the
#: header before anything is allocated; decoding one at the limit with M = 192 latent
#: channels holds about 10 bytes a pixel (q as int32, y_hat as float32, the uint8
#: image): 2.7 GB. A scale-hyperprior file (versions 4, 8, 13, 16) holds up to about 20 bytes a pixel
#: (5 GB at the limit; measured 19 at 2048x2048 with every latent in one table's group:
#: the group's positions as int64 dominate). A version 14 file decoded on NumPy holds
#: about 12 bytes more a coded latent (the lanes' padded tables, int32; at most 0.75
#: latents a pixel: up to about 9 bytes a pixel). Encoders refuse larger images, so every
#: file written is readable.
MAX_PIXELS = 1 << 28
#: Largest |q| coded: the escape codes and the float32 round trip of q stay exact below it.
MAX_SYMBOL = 2 ** 24
# An escape's zigzag number is below 2 * (MAX_SYMBOL + support): longer Elias-gamma
# codes are corrupt data, not latents.
_MAX_GAMMA_ZEROS = (2 * MAX_SYMBOL).bit_length()
# A symbol's probability is at least 2^-16 (tables.PRECISION): at most 16 bits of
# payload each, plus the range coder's rounding and its two words of termination.
_MAX_PAYLOAD_BITS_PER_SYMBOL = 17
# An escape's Elias-gamma code is at most 2 * _MAX_GAMMA_ZEROS + 1 bits: whole bytes, rounded up.
_MAX_ESCAPE_BYTES_PER_SYMBOL = -(-(2 * _MAX_GAMMA_ZEROS + 1) // 8)


class CodecError(GdnflowError, ValueError):
    """A file or data the codec cannot code or decode; the message names the file."""


class FormatError(CodecError):
    """Not a complete gdnflow codec file: wrong magic, unknown version, truncated or corrupt."""


class ModelMismatchError(CodecError):
    """A file coded by another model (or with other tables) than the one given."""


class Split(typing.NamedTuple):
    """How a latent tensor (C, h, w) is cut into independent substreams: ``groups`` runs
    of consecutive channels times ``bands`` runs of consecutive rows.

    Group g holds channels [g C // groups, (g + 1) C // groups), band b rows
    [b h // bands, (b + 1) h // bands); 1 <= groups <= C and 1 <= bands <= h,
    so no block is empty.
    """

    groups: int
    bands: int

    def blocks(self, shape):
        """[(channel slice, row slice)] of the substreams of a ``shape`` tensor, group-major."""
        channels, rows = shape[0], shape[1]
        return [(slice(g * channels // self.groups, (g + 1) * channels // self.groups),
                 slice(b * rows // self.bands, (b + 1) * rows // self.bands))
                for g in range(self.groups) for b in range(self.bands)]

    def fits(self, shape):
        """Whether every block of a ``shape`` tensor is non-empty."""
        return 1 <= self.groups <= shape[0] and 1 <= self.bands <= shape[1]


#: The split of a single-stream file's tensors.
WHOLE = Split(1, 1)


@dataclasses.dataclass(frozen=True)
class Header:
    """The header of a ``.gdn`` file (see the module docstring).

    ``model_id`` holds the :data:`MODEL_ID_BYTES` stored bytes and
    ``tables_digest`` the :data:`TABLES_DIGEST_BYTES`; ``latent_shape`` is
    (channels, latent_height, latent_width). ``hyper_channels`` is the
    side information's channel count in a hyperprior file (versions 4, 8, 13 and 16), 0
    otherwise. ``splits``: one :class:`Split` per coded tensor (:meth:`coded_shapes`)
    in versions 7, 8, 11, 13, 14 and 16, () in the single-stream versions.
    """

    height: int
    width: int
    channels: int
    latent_height: int
    latent_width: int
    model_id: bytes
    tables_digest: bytes
    version: int = FORMAT_VERSION
    hyper_channels: int = 0
    splits: tuple = ()

    @property
    def latent_shape(self):
        """(channels, latent_height, latent_width)."""
        return (self.channels, self.latent_height, self.latent_width)

    @property
    def hyper_shape(self):
        """The side information's shape (hyper_channels, latent_height/4, latent_width/4)."""
        return (self.hyper_channels, self.latent_height // SIDE_DOWNSAMPLING,
                self.latent_width // SIDE_DOWNSAMPLING)

    @property
    def symbols(self):
        """How many latent values the payload codes (y's, and z's in a hyperprior file)."""
        return int(np.prod(self.latent_shape)) + int(np.prod(self.hyper_shape))

    def coded_shapes(self):
        """The shapes of the tensors coded, in file order: z's (hyperprior), then y's."""
        hyper = self.version in HYPERPRIOR_VERSIONS
        return [self.hyper_shape, self.latent_shape] if hyper else [self.latent_shape]

    def substream_symbols(self):
        """How many values each substream codes, in file order (one entry if single-stream)."""
        if self.version in SINGLE_STREAM_VERSIONS:
            return [self.symbols]
        return [len(range(*channels.indices(shape[0]))) * len(range(*rows.indices(shape[1])))
                * shape[2] for split, shape in zip(self.splits, self.coded_shapes())
                for channels, rows in split.blocks(shape)]


# ------------------------------------------------------------ varints --
def write_varint(value):
    """The unsigned LEB128 bytes of a non-negative integer."""
    value = int(value)
    if value < 0:
        raise ValueError(f"write_varint: {value} is negative")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def read_varint(data, pos, source, what):
    """(value, next position) of the LEB128 integer at ``data[pos]``; FormatError if cut short."""
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise FormatError(f"{source}: truncated: the file ends inside the header ({what})")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise FormatError(f"{source}: corrupt header: {what} is not a valid number")


# ------------------------------------------------------- whole stream --
def checksum(data):
    """The 4 checksum bytes of ``data``: zlib.crc32, little-endian."""
    return zlib.crc32(data).to_bytes(CHECKSUM_BYTES, "little")


def pack(header, substreams):
    """The bytes of a file: ``header`` (a :class:`Header`) and ``substreams``, a list of
    (payload bytes, escape bytes), one per block of ``header.splits`` in file order
    (exactly one in the single-stream versions).

    Versions 2 and up get the checksum; version 1 (for tests of old files) not.
    """
    if len(header.model_id) != MODEL_ID_BYTES or len(header.tables_digest) != TABLES_DIGEST_BYTES:
        raise ValueError(f"pack: model id and tables digest must be {MODEL_ID_BYTES} and "
                         f"{TABLES_DIGEST_BYTES} bytes")
    if header.version not in READABLE_VERSIONS:
        raise ValueError(f"pack: format version {header.version} is not one of "
                         f"{READABLE_VERSIONS}")
    if (header.version in HYPERPRIOR_VERSIONS) != (header.hyper_channels > 0):
        raise ValueError(f"pack: hyper_channels {header.hyper_channels} with format version "
                         f"{header.version} (only versions {HYPERPRIOR_VERSIONS} have them)")
    single = header.version in SINGLE_STREAM_VERSIONS
    expected = 1 if single else sum(s.groups * s.bands for s in header.splits)
    if single == bool(header.splits) or len(substreams) != expected or not single and \
            len(header.splits) != len(header.coded_shapes()):
        raise ValueError(f"pack: version {header.version} with splits {header.splits} and "
                         f"{len(substreams)} substreams (expected {expected})")
    sizes = [header.height, header.width, header.channels, header.latent_height,
             header.latent_width]
    if header.version in HYPERPRIOR_VERSIONS:
        sizes.append(header.hyper_channels)
    if single:
        index = [len(substreams[0][0])]
    else:
        index = [n for split in header.splits for n in split]
        index += [n for payload, escapes in substreams for n in (len(payload) // 4, len(escapes))]
    body = b"".join([MAGIC, bytes([header.version]), header.model_id, header.tables_digest,
                     *(write_varint(v) for v in (*sizes, *index)),
                     *(part for substream in substreams for part in substream)])
    return body + checksum(body) if header.version >= 2 else body


def _verified_body(data, source):
    """``data`` without its checksum, once the magic, version and checksum are right."""
    fixed = len(MAGIC) + 1 + MODEL_ID_BYTES + TABLES_DIGEST_BYTES
    head = data[:len(MAGIC)]
    if head != MAGIC:
        if MAGIC.startswith(head):       # an empty file, or one cut inside the magic
            raise FormatError(f"{source}: truncated: {len(data)} bytes is not even a header")
        raise FormatError(f"{source}: not a gdnflow compressed image (magic {head!r}, "
                          f"expected {MAGIC!r})")
    if len(data) < len(MAGIC) + 1:
        raise FormatError(f"{source}: truncated: the file ends inside the header")
    version = data[len(MAGIC)]
    if version not in READABLE_VERSIONS:
        raise FormatError(f"{source}: format version {version} is not supported (this gdnflow "
                          f"reads versions {', '.join(map(str, READABLE_VERSIONS))}): corrupt, "
                          "or written by a newer gdnflow")
    if version == 1:
        return data
    if len(data) < fixed + CHECKSUM_BYTES:
        raise FormatError(f"{source}: truncated: the file ends inside the header")
    body, stored = data[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
    if checksum(body) != stored:
        raise FormatError(f"{source}: corrupted (checksum mismatch): the file was changed or "
                          "truncated after it was written; nothing in it can be trusted")
    return body


def unpack(data, source="<bytes>"):
    """(Header, substreams) of a file's bytes: substreams is a list of (payload bytes,
    escape bytes) in file order; FormatError naming ``source``.

    Checks the magic, the version and the checksum first, then that the image
    is at most :data:`MAX_PIXELS`, that the latent shape fits the image size,
    that the splits fit the latents, and that every substream is of a
    plausible size and they end exactly where the file does. Whether the
    model fits is the caller's check (:func:`check_model`).
    """
    data = _verified_body(bytes(data), source)
    version, pos = data[len(MAGIC)], len(MAGIC) + 1
    if len(data) < pos + MODEL_ID_BYTES + TABLES_DIGEST_BYTES:
        raise FormatError(f"{source}: truncated: the file ends inside the header")
    model = data[pos:pos + MODEL_ID_BYTES]
    pos += MODEL_ID_BYTES
    digest = data[pos:pos + TABLES_DIGEST_BYTES]
    pos += TABLES_DIGEST_BYTES
    hyper = version in HYPERPRIOR_VERSIONS
    values = []
    for what in ["height", "width", "channels", "latent height", "latent width",
                 *(["side information channels"] if hyper else [])]:
        value, pos = read_varint(data, pos, source, what)
        values.append(value)
    height, width, channels, latent_h, latent_w = values[:5]
    hyper_channels = values[5] if hyper else 0
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE and 0 < channels <= MAX_CHANNELS
            and (not hyper or 0 < hyper_channels <= MAX_CHANNELS)):
        raise FormatError(f"{source}: corrupt header: image {height}x{width} with "
                          f"{channels} latent channels"
                          + (f" and {hyper_channels} side-information channels" if hyper else ""))
    if height * width > MAX_PIXELS:
        raise FormatError(f"{source}: the header claims a {height}x{width} image "
                          f"({height * width} pixels), more than the format's limit of "
                          f"{MAX_PIXELS} pixels: corrupt or not written by gdnflow")
    expected = (-(-height // DOWNSAMPLING), -(-width // DOWNSAMPLING))
    if hyper:
        m = SIDE_DOWNSAMPLING
        expected = (m * -(-height // (m * DOWNSAMPLING)), m * -(-width // (m * DOWNSAMPLING)))
    if (latent_h, latent_w) != expected:
        raise FormatError(f"{source}: corrupt header: a {latent_h}x{latent_w} latent for a "
                          f"{height}x{width} image (expected {expected[0]}x{expected[1]})")
    header = Header(height, width, channels, latent_h, latent_w, model, digest, version,
                    hyper_channels)
    if version in SINGLE_STREAM_VERSIONS:
        size, pos = read_varint(data, pos, source, "payload size")
        if size % 4:
            raise FormatError(f"{source}: corrupt header: payload size {size} is not a "
                              "multiple of 4")
        check_payload_size(size, header.symbols, source)
        if pos + size > len(data):
            raise FormatError(f"{source}: truncated: the payload needs {size} bytes, the file "
                              f"has {len(data) - pos} after its header ({len(data)} bytes in all)")
        return header, [(data[pos:pos + size], data[pos + size:])]
    splits = []
    for shape in header.coded_shapes():
        groups, pos = read_varint(data, pos, source, "channel groups")
        bands, pos = read_varint(data, pos, source, "row bands")
        splits.append(Split(groups, bands))
        if not splits[-1].fits(shape):
            raise FormatError(f"{source}: corrupt header: {groups} channel groups x {bands} row "
                              f"bands of a {shape[0]}x{shape[1]}x{shape[2]} latent")
    # Two varints of index at least per substream: checked before the blocks are listed
    # (G x B of them, up to 2^24 from a header of a few bytes).
    count = sum(split.groups * split.bands for split in splits)
    if 2 * count > len(data) - pos:
        raise FormatError(f"{source}: corrupt header: {count} substreams in a file of "
                          f"{len(data)} bytes")
    header = dataclasses.replace(header, splits=tuple(splits))
    symbols = header.substream_symbols()
    sizes = []
    for k, count in enumerate(symbols):
        words, pos = read_varint(data, pos, source, f"substream {k}'s payload size")
        escapes, pos = read_varint(data, pos, source, f"substream {k}'s escape size")
        check_payload_size(4 * words, count, source, f"substream {k}: ")
        if escapes > count * _MAX_ESCAPE_BYTES_PER_SYMBOL:
            raise FormatError(f"{source}: corrupt substream index: substream {k} has {escapes} "
                              f"escape bytes for {count} latents")
        sizes.append((4 * words, escapes))
    total = sum(a + b for a, b in sizes)
    if total > len(data) - pos:
        raise FormatError(f"{source}: truncated: the substreams need {total} bytes, the file "
                          f"has {len(data) - pos} after its header ({len(data)} bytes in all)")
    if total < len(data) - pos:
        raise FormatError(f"{source}: {len(data) - pos - total} unexpected byte(s) after the "
                          "coded data (another file appended, or a corrupt substream index?)")
    substreams = []
    for payload, escapes in sizes:
        substreams.append((data[pos:pos + payload], data[pos + payload:pos + payload + escapes]))
        pos += payload + escapes
    return header, substreams


def check_payload_size(size, symbols, source, what=""):
    """FormatError unless ``size`` payload bytes are plausible for ``symbols`` latents."""
    most = max_payload_bytes(symbols)
    if size > most:
        raise FormatError(f"{source}: corrupt header: {what}a payload of {size} bytes for "
                          f"{symbols} latents (at most {most})")


def max_payload_bytes(symbols):
    """The most payload bytes ``symbols`` latents can take (16-bit tables; module constants)."""
    return 4 * (-(-symbols * _MAX_PAYLOAD_BITS_PER_SYMBOL // 32) + 2)


def check_model(header, tables, source="<bytes>", digest=None):
    """Raise ModelMismatchError unless ``header`` was written with ``tables``' model and tables.

    ``tables``: a factorized model's CodingTables, or a hyperprior's tables
    (which have ``hyper_channels``); ``digest``: ``tables.digest()`` if the
    caller has it already (a codec computes it once: it hashes every table).
    """
    hyper = getattr(tables, "hyper_channels", 0)
    if bool(header.hyper_channels) != bool(hyper):
        kinds = ("a factorized-prior", "a scale-hyperprior")
        raise ModelMismatchError(
            f"{source}: written by {kinds[bool(header.hyper_channels)]} model, the checkpoint "
            f"given is {kinds[bool(hyper)]} model: decode it with the checkpoint it was "
            "compressed with")
    if header.model_id != tables.model_id[:MODEL_ID_BYTES]:
        raise ModelMismatchError(
            f"{source}: coded by another model (model id {header.model_id.hex()}, the "
            f"checkpoint given is {tables.model_id[:MODEL_ID_BYTES].hex()}): decode it with "
            "the checkpoint it was compressed with")
    if header.channels != tables.channels:
        raise ModelMismatchError(f"{source}: {header.channels} latent channels, the model has "
                                 f"{tables.channels}")
    if header.hyper_channels != hyper:
        raise ModelMismatchError(f"{source}: {header.hyper_channels} side-information channels, "
                                 f"the model has {hyper}")
    digest = tables.digest() if digest is None else digest
    if header.tables_digest != digest[:TABLES_DIGEST_BYTES]:
        raise ModelMismatchError(
            f"{source}: the model matches but its coding tables differ from the writer's "
            "(written by another gdnflow version?)")


# ------------------------------------------------------- escape bits --
class BitWriter:
    """Bits appended most significant first; :meth:`getvalue` pads the last byte with zeros."""

    def __init__(self):
        self.bits = []

    def write(self, value, count):
        """Append the ``count`` low bits of ``value``, highest first."""
        self.bits.extend((value >> i) & 1 for i in range(count - 1, -1, -1))

    def write_gamma(self, n):
        """Append the Elias-gamma code of n >= 1: (bit length - 1) zeros, then n in binary."""
        if n < 1:
            raise ValueError(f"Elias gamma codes integers >= 1, got {n}")
        length = int(n).bit_length()
        self.write(0, length - 1)
        self.write(int(n), length)

    def getvalue(self):
        """The bits as bytes."""
        return np.packbits(np.array(self.bits, np.uint8)).tobytes() if self.bits else b""


class BitReader:
    """Reads what :class:`BitWriter` wrote; FormatError (naming ``source``) past the end.

    Bits are read from the bytes in place: a file's escape section costs no
    more memory than the file.
    """

    def __init__(self, data, source):
        self.data, self.size = bytes(data), 8 * len(data)
        self.pos, self.source = 0, source

    def read(self, count):
        """The next ``count`` bits as an integer."""
        if self.pos + count > self.size:
            raise FormatError(f"{self.source}: truncated: the escape bits end early")
        value = 0
        for pos in range(self.pos, self.pos + count):
            value = (value << 1) | (self.data[pos >> 3] >> (7 - (pos & 7))) & 1
        self.pos += count
        return value

    def read_gamma(self):
        """The next Elias-gamma coded integer."""
        zeros = 0
        while self.read(1) == 0:
            zeros += 1
            if zeros > _MAX_GAMMA_ZEROS:
                raise FormatError(f"{self.source}: corrupt escape bits")
        return (1 << zeros) | self.read(zeros)

    def check_end(self):
        """Raise FormatError unless only the zero padding of the last byte is left."""
        left = self.size - self.pos
        if left >= 8 or (left and self.read(left)):
            raise FormatError(f"{self.source}: {left // 8} unexpected byte(s) after the "
                              "coded data (another file appended, or a corrupt payload?)")
