"""The ``.gdn`` bitstream: a small header, the range-coded latents, the escape bits, a checksum.

Layout of format version 2 (integers marked varint are unsigned LEB128: 7
bits a byte, low bits first, high bit set on every byte but the last)::

    magic          4 bytes   b"GDNF"
    version        1 byte    2
    model id      16 bytes   the first 16 bytes of SHA-256 of the model's
                             parameters and buffers (tables.model_id)
    tables         4 bytes   the first 4 bytes of the coding tables' digest
                             (CodingTables.digest): readers with other tables refuse
    height, width  varint    the image's size in pixels (before padding), each <= 65536,
                             height * width <= MAX_PIXELS
    channels       varint    latent channels M
    latent h, w    varint    latent rows and columns: ceil(height / 16), ceil(width / 16)
    payload size   varint    bytes of the range-coded payload (a multiple of 4)
    payload                  constriction's RangeEncoder words, little-endian uint32
    escape bits              Elias-gamma codes of the values outside the
                             supports, most significant bit first, zero-padded
                             to a whole byte
    checksum       4 bytes   zlib.crc32 (CRC-32, ISO-HDLC polynomial) of every
                             byte before it, little-endian

The payload codes the integer latents q[c, i, j] channel by channel, each
channel in raster order, every symbol with its channel's categorical model
(:class:`~gdnflow.codec.tables.CodingTables`; values outside the support as
the escape symbol, their distance past it in the escape bits, in the same
order). A header is 30 to 40 bytes; bpp counts the whole file.

Readers check the magic and the version, then the checksum BEFORE anything
else: a file changed anywhere after its version byte (any single flipped
bit, any burst of up to 32 bits) is refused as corrupted, never decoded
to another image nor blamed on another model. Then the image size against
:data:`MAX_PIXELS` (before anything is allocated), the model and tables
(:func:`check_model`), that the sizes agree with each other and are
plausible, and that the file ends exactly where the escape bits end.

Version 1 (gdnflow before the checksum): the same layout without the
checksum. It is still read, with every check but the checksum (a flipped bit
in its payload may decode to a different image); factorized-prior writers
write version 2.

Version 4 is the scale hyperprior's file (:mod:`gdnflow.codec.hyperprior`):
version 2's layout with one more varint after the latent width, the side
information's channels N (z is N x latent h/4 x latent w/4), and latent
sides of 4 ceil(height / 64) and 4 ceil(width / 64) (the model pads images
to multiples of 64). Its payload codes z first, channel by channel as
above, then y grouped by coding table (see that module); the escape bits
follow the same order. (Not 3: 3 is one flipped bit from 1, which has no
checksum; 4 is two bits from both 1 and 2, so a single flipped bit of the
version byte never turns one readable version into another.)
"""
import dataclasses
import zlib

import numpy as np
from gdnflow.errors import GdnflowError

MAGIC = b"GDNF"
FORMAT_VERSION = 2
#: The scale hyperprior's files (see the module docstring).
HYPERPRIOR_VERSION = 4
#: The versions readers accept (1: no checksum, see the module docstring).
READABLE_VERSIONS = (1, 2, 4)
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
#: image): 2.7 GB. A scale-hyperprior file (version 4) holds up to about 20 bytes a pixel
#: (5 GB at the limit; measured 19 at 2048x2048 with every latent in one table's group:
#: the group's positions as int64 dominate). Encoders refuse larger images, so every
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


class CodecError(GdnflowError, ValueError):
    """A file or data the codec cannot code or decode; the message names the file."""


class FormatError(CodecError):
    """Not a complete gdnflow codec file: wrong magic, unknown version, truncated or corrupt."""


class ModelMismatchError(CodecError):
    """A file coded by another model (or with other tables) than the one given."""


@dataclasses.dataclass(frozen=True)
class Header:
    """The header of a ``.gdn`` file (see the module docstring).

    ``model_id`` holds the :data:`MODEL_ID_BYTES` stored bytes and
    ``tables_digest`` the :data:`TABLES_DIGEST_BYTES`; ``latent_shape`` is
    (channels, latent_height, latent_width). ``hyper_channels`` is the
    side information's channel count in a hyperprior file (version 4), 0
    otherwise.
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


def pack(header, payload, escapes):
    """The bytes of a file: ``header`` (a :class:`Header`), ``payload`` and ``escapes`` (bytes).

    Versions 2 and 4 get the checksum; version 1 (for tests of old files) not.
    """
    if len(header.model_id) != MODEL_ID_BYTES or len(header.tables_digest) != TABLES_DIGEST_BYTES:
        raise ValueError(f"pack: model id and tables digest must be {MODEL_ID_BYTES} and "
                         f"{TABLES_DIGEST_BYTES} bytes")
    if header.version not in READABLE_VERSIONS:
        raise ValueError(f"pack: format version {header.version} is not one of "
                         f"{READABLE_VERSIONS}")
    if (header.version == HYPERPRIOR_VERSION) != (header.hyper_channels > 0):
        raise ValueError(f"pack: hyper_channels {header.hyper_channels} with format version "
                         f"{header.version} (only version {HYPERPRIOR_VERSION} has them)")
    sizes = [header.height, header.width, header.channels, header.latent_height,
             header.latent_width]
    if header.version == HYPERPRIOR_VERSION:
        sizes.append(header.hyper_channels)
    body = b"".join([MAGIC, bytes([header.version]), header.model_id, header.tables_digest,
                     *(write_varint(v) for v in (*sizes, len(payload))), payload, escapes])
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
    """(Header, payload bytes, escape bytes) of a file's bytes; FormatError naming ``source``.

    Checks the magic, the version and the checksum first, then that the image
    is at most :data:`MAX_PIXELS`, that the latent shape fits the image size,
    and that the payload is complete and of a plausible size. Whether the
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
    fields = ["height", "width", "channels", "latent height", "latent width", "payload size"]
    if version == HYPERPRIOR_VERSION:
        fields.insert(5, "side information channels")
    values = []
    for what in fields:
        value, pos = read_varint(data, pos, source, what)
        values.append(value)
    height, width, channels, latent_h, latent_w = values[:5]
    hyper_channels, size = (values[5], values[6]) if version == HYPERPRIOR_VERSION \
        else (0, values[5])
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE and 0 < channels <= MAX_CHANNELS
            and (version != HYPERPRIOR_VERSION or 0 < hyper_channels <= MAX_CHANNELS)):
        raise FormatError(f"{source}: corrupt header: image {height}x{width} with "
                          f"{channels} latent channels"
                          + (f" and {hyper_channels} side-information channels"
                             if version == HYPERPRIOR_VERSION else ""))
    if height * width > MAX_PIXELS:
        raise FormatError(f"{source}: the header claims a {height}x{width} image "
                          f"({height * width} pixels), more than the format's limit of "
                          f"{MAX_PIXELS} pixels: corrupt or not written by gdnflow")
    expected = (-(-height // DOWNSAMPLING), -(-width // DOWNSAMPLING))
    if version == HYPERPRIOR_VERSION:
        m = SIDE_DOWNSAMPLING
        expected = (m * -(-height // (m * DOWNSAMPLING)), m * -(-width // (m * DOWNSAMPLING)))
    if (latent_h, latent_w) != expected:
        raise FormatError(f"{source}: corrupt header: a {latent_h}x{latent_w} latent for a "
                          f"{height}x{width} image (expected {expected[0]}x{expected[1]})")
    if size % 4:
        raise FormatError(f"{source}: corrupt header: payload size {size} is not a multiple of 4")
    header = Header(height, width, channels, latent_h, latent_w, model, digest, version,
                    hyper_channels)
    most = max_payload_bytes(header.symbols)
    if size > most:
        raise FormatError(f"{source}: corrupt header: a payload of {size} bytes for "
                          f"{header.symbols} latents (at most {most})")
    if pos + size > len(data):
        raise FormatError(f"{source}: truncated: the payload needs {size} bytes, the file has "
                          f"{len(data) - pos} after its header ({len(data)} bytes in all)")
    return header, data[pos:pos + size], data[pos + size:]


def max_payload_bytes(symbols):
    """The most payload bytes ``symbols`` latents can take (16-bit tables; module constants)."""
    return 4 * (-(-symbols * _MAX_PAYLOAD_BITS_PER_SYMBOL // 32) + 2)


def check_model(header, tables, source="<bytes>"):
    """Raise ModelMismatchError unless ``header`` was written with ``tables``' model and tables.

    ``tables``: a factorized model's CodingTables, or a hyperprior's tables
    (which have ``hyper_channels``).
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
    if header.tables_digest != tables.digest()[:TABLES_DIGEST_BYTES]:
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


# ---------------------------------------------------- entropy coding --
def categorical_model(probabilities):
    """A constriction categorical model that codes with exactly ``probabilities``.

    ``perfect=True`` makes constriction choose the KL-optimal 24-bit
    quantisation of the probabilities; gdnflow's are multiples of 2^-16 (each
    >= 2^-16), which 24 bits represent exactly, so that optimum is the table
    itself: the coder codes with exactly the tables' frequencies, whatever
    constriction's heuristics (its "fast" quantiser shifts them slightly).
    """
    return _constriction().stream.model.Categorical(probabilities, perfect=True)


def _models(tables):
    """One constriction categorical model per channel of factorized ``tables``."""
    return [categorical_model(tables.probabilities(c)) for c in range(tables.channels)]


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
    for v in values[outside]:
        d = int(v) - int(high if v > high else low)
        escapes.write_gamma(2 * d - 1 if d > 0 else -2 * d)


def decode_values(decoder, reader, count, low, high, model, source):
    """The ``count`` values :func:`encode_values` coded (int32); escapes read from ``reader``."""
    try:
        # int32: values stay below MAX_SYMBOL; half the memory of int64 for large groups.
        symbols = np.asarray(decoder.decode(model, count), np.int32)
    except Exception as exc:    # noqa: BLE001 (constriction raises its own error types)
        raise FormatError(f"{source}: corrupt or truncated payload ({exc})") from None
    values = symbols + low
    for i in np.flatnonzero(symbols == high - low + 1):
        n = reader.read_gamma()
        value = high + (n + 1) // 2 if n % 2 else low - n // 2
        if abs(value) >= MAX_SYMBOL:
            raise FormatError(f"{source}: corrupt escape bits (a latent of {value})")
        values[i] = value
    return values


def check_latents(q, channels, what="encode_symbols"):
    """``q`` as an array; ValueError unless it is integer latents of shape (channels, h, w)."""
    q = np.asarray(q)
    if q.ndim != 3 or q.shape[0] != channels or q.dtype.kind not in "iu":
        raise ValueError(f"{what}: expected integer latents of shape ({channels}, h, w), "
                         f"got {q.dtype} {q.shape}")
    return q


def encode_channels(encoder, escapes, q, tables):
    """Code latents ``q`` (C, h, w) channel by channel in raster order with factorized ``tables``."""
    q = check_latents(q, tables.channels)
    for c, model in enumerate(_models(tables)):
        encode_values(encoder, escapes, q[c].ravel(), int(tables.low[c]), int(tables.high[c]),
                      model)


def decode_channels(decoder, reader, tables, latent_shape, source):
    """The latents (C, h, w) int32 :func:`encode_channels` coded."""
    channels, h, w = latent_shape
    q = np.empty((channels, h * w), np.int32)
    for c, model in enumerate(_models(tables)):
        q[c] = decode_values(decoder, reader, h * w, int(tables.low[c]), int(tables.high[c]),
                             model, source)
    return q.reshape(channels, h, w)


def encode_symbols(q, tables):
    """Range-code integer latents ``q`` (C, h, w); returns (payload bytes, escape bytes)."""
    encoder, escapes = range_encoder(), BitWriter()
    encode_channels(encoder, escapes, q, tables)
    return encoder.get_compressed().astype("<u4").tobytes(), escapes.getvalue()


def decode_symbols(payload, escapes, tables, latent_shape, source="<bytes>"):
    """The integer latents (C, h, w) int32 that :func:`encode_symbols` coded.

    Raises FormatError if the escape bits run out, an escape is beyond
    +-MAX_SYMBOL, or bytes are left over.
    """
    decoder, reader = range_decoder(payload, source), BitReader(escapes, source)
    q = decode_channels(decoder, reader, tables, latent_shape, source)
    reader.check_end()
    return q
