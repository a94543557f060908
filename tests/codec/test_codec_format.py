"""The .gdn bitstream: varints, Elias-gamma escape bits, range-coded symbols
(escapes on both sides), and every malformed file refused with its name."""
import dataclasses
import tracemalloc
import zlib

import numpy as np
import pytest

from gdnflow.codec import format as F
from gdnflow.codec.codec import Codec, codec_for
from gdnflow.codec.substreams import (decode_channels, decode_substream, encode_channels,
                                      encode_substream)
from gdnflow.codec.tables import build_tables

from codec_kit import make_hyperprior


def test_varints_round_trip():
    for value in (0, 1, 127, 128, 300, 2 ** 32 + 5, 2 ** 62):
        data = F.write_varint(value) + b"\xff"
        assert F.read_varint(data, 0, "x", "v") == (value, len(data) - 1)
    with pytest.raises(F.FormatError, match="truncated"):
        F.read_varint(b"\x80\x80", 0, "x.gdn", "width")


def test_elias_gamma_round_trip(rng):
    values = [1, 2, 3, 4, 7, 8, 255, 256, 2 ** 25 + 3] + list(rng.integers(1, 10 ** 6, 50))
    writer = F.BitWriter()
    for n in values:
        writer.write_gamma(int(n))
    reader = F.BitReader(writer.getvalue(), "x.gdn")
    assert [reader.read_gamma() for _ in values] == [int(n) for n in values]
    reader.check_end()
    short = F.BitReader(writer.getvalue()[:-2], "x.gdn")
    with pytest.raises(F.FormatError, match="x.gdn: truncated"):
        for _ in values:
            short.read_gamma()


def encode_symbols(q, tables):
    """(payload, escapes) of latents ``q`` coded in one substream."""
    return encode_substream(encode_channels, (q, tables))


def decode_symbols(payload, escapes, tables, shape, source="<bytes>"):
    """The latents of ``shape`` :func:`encode_symbols` coded."""
    return decode_substream(decode_channels, (payload, escapes), (tables, shape, 0, False),
                            source)


def test_symbols_round_trip_with_escapes_on_both_sides(model, rng):
    tables = build_tables(model)
    q = rng.integers(-3, 4, (tables.channels, 5, 7))
    q[0, 0, 0] = tables.high[0] + 1               # just above the support
    q[1, 2, 3] = tables.low[1] - 1                # just below
    q[2, 4, 6] = 10 ** 6                          # far above
    q[3, 1, 1] = -(10 ** 6)                       # far below
    payload, escapes = encode_symbols(q, tables)
    assert len(payload) % 4 == 0 and len(escapes) > 0
    decoded = decode_symbols(payload, escapes, tables, q.shape, "x.gdn")
    assert decoded.dtype == np.int32 and np.array_equal(decoded, q)


def test_rate_is_the_tables_information_content(model, rng):
    """The range coder spends what the quantised tables say (constriction codes with
    exactly our 16-bit frequencies), plus a few words of termination."""
    tables = build_tables(model)
    q = rng.integers(-2, 3, (tables.channels, 16, 16))
    payload, escapes = encode_symbols(q, tables)
    bits = 0.0
    for c in range(tables.channels):
        frequencies = tables.frequencies(c)
        symbols = np.clip(q[c].ravel() - tables.low[c], 0, len(frequencies) - 1)
        bits -= np.log2(frequencies[symbols] / 2.0 ** 16).sum()
    assert bits <= 8 * len(payload) <= bits + 64


@pytest.fixture(scope="module")
def coded(model, small_image):
    """(codec, bytes of a 40x56 image)."""
    codec = Codec(model)
    return codec, codec.compress(small_image)


def test_header_round_trip(coded):
    codec, data = coded
    header, substreams = F.unpack(data, "x.gdn")
    assert (header.height, header.width, header.latent_shape) == (40, 56, (12, 3, 4))
    assert header.model_id == codec.tables.model_id[:16] and header.version == 11
    assert header.splits == (F.Split(1, 1),) and len(substreams) == 1
    assert F.pack(header, substreams) == data
    # The last 4 bytes are zlib's CRC-32 of all before them, little-endian.
    assert int.from_bytes(data[-4:], "little") == zlib.crc32(data[:-4])


def test_every_truncation_is_an_error_naming_the_file(coded):
    codec, data = coded
    for cut in range(len(data)):
        with pytest.raises(F.FormatError, match=r"^x\.gdn: ") as error:
            codec.decompress(data[:cut], "x.gdn")
        assert "truncated" in str(error.value) or "unexpected" in str(error.value), cut


def test_extra_bytes_are_an_error(coded):
    codec, data = coded
    with pytest.raises(F.FormatError, match="x.gdn: corrupted"):
        codec.decompress(data + b"\x00", "x.gdn")
    # With its checksum recomputed, the extra byte is found past the substreams the index
    # gives, or (index rewritten) where the escape bits end.
    with pytest.raises(F.FormatError, match="x.gdn: 1 unexpected byte"):
        codec.decompress(data[:-4] + b"\x00" + F.checksum(data[:-4] + b"\x00"), "x.gdn")
    header, [(payload, escapes)] = F.unpack(data)
    with pytest.raises(F.FormatError, match="x.gdn: 1 unexpected byte"):
        codec.decompress(F.pack(header, [(payload, escapes + b"\x00")]), "x.gdn")


def test_wrong_magic_and_version(coded):
    codec, data = coded
    with pytest.raises(F.FormatError, match="x.png: not a gdnflow compressed image"):
        codec.decompress(b"\x89PNG" + data[4:], "x.png")
    with pytest.raises(F.FormatError, match="x.gdn: format version 5 is not supported"):
        codec.decompress(data[:4] + b"\x05" + data[5:], "x.gdn")


def test_another_model_or_other_tables_are_refused(coded, other_model):
    codec, data = coded
    other = Codec(other_model)
    with pytest.raises(F.ModelMismatchError, match="x.gdn: coded by another model"):
        other.decompress(data, "x.gdn")
    header, substreams = F.unpack(data)
    forged = dataclasses.replace(header, tables_digest=bytes(b ^ 0xFF for b in header.tables_digest))
    with pytest.raises(F.ModelMismatchError, match="coding tables differ"):
        codec.decompress(F.pack(forged, substreams), "x.gdn")


def test_inconsistent_header_is_refused(coded):
    codec, data = coded
    header, substreams = F.unpack(data)
    bad = dataclasses.replace(header, latent_height=header.latent_height + 1)
    with pytest.raises(F.FormatError, match="corrupt header"):
        codec.decompress(F.pack(bad, substreams), "x.gdn")
    huge = dataclasses.replace(header, height=10 ** 9, latent_height=-(-10 ** 9 // 16))
    with pytest.raises(F.FormatError, match="corrupt header: image 1000000000x56"):
        codec.decompress(F.pack(huge, substreams), "x.gdn")


def assert_every_single_bit_flip_is_refused(codec, data):
    """Each of the file's bits flipped in turn: refused every time. No flip of the version
    byte gives another readable version (so none escapes the checksum by reading as
    version 1), and a flip anywhere past it (the model id included) is called
    corrupted, not another model."""
    for bit in range(8 * len(data)):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        with pytest.raises(F.FormatError) as error:
            codec.decompress(bytes(flipped), "x.gdn")
        expected = ("not a gdnflow compressed image" if bit < 32 else
                    "is not supported" if bit < 40 else "corrupted (checksum mismatch)")
        assert str(error.value).startswith("x.gdn: ") and expected in str(error.value), bit


def test_every_single_bit_flip_is_refused(coded):
    assert_every_single_bit_flip_is_refused(*coded)


def test_every_single_bit_flip_of_a_hyperprior_file_is_refused(small_image):
    codec = codec_for(make_hyperprior())
    assert_every_single_bit_flip_is_refused(codec, codec.compress(small_image[:20, :30]))


def test_versions_1_and_2_files_are_still_read(coded, model, small_image):
    """Versions 2 (one stream) and 1 (no checksum) decode as before, to the same image as
    version 7 (substreams)."""
    codec, data = coded
    version_2 = Codec(model, version=2).compress(small_image)
    header, substreams = F.unpack(version_2)
    assert version_2[4] == 2 and header.splits == () and len(substreams) == 1
    old = F.pack(dataclasses.replace(header, version=1), substreams)
    assert len(old) == len(version_2) - 4 and old[4] == 1
    assert np.array_equal(codec.decompress(old), codec.decompress(data))
    assert np.array_equal(codec.decompress(version_2), codec.decompress(data))
    assert F.unpack(old)[0].version == 1


def test_a_header_bomb_is_refused_before_any_allocation(coded):
    """A small file (valid checksum) whose header claims 65536x65536 pixels: refused
    from the header, naming the file and the limit, without allocating its latents."""
    codec, data = coded
    header, [(payload, escapes)] = F.unpack(data)
    bomb = F.pack(dataclasses.replace(header, height=65536, width=65536, latent_height=4096,
                                      latent_width=4096), [(payload + bytes(4096), escapes)])
    tracemalloc.start()
    try:
        with pytest.raises(F.FormatError, match=rf"^bomb.gdn: .*65536x65536 .*limit of "
                                                rf"{F.MAX_PIXELS} pixels"):
            codec.decompress(bomb, "bomb.gdn")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    at_limit = dataclasses.replace(header, height=1 << 14, width=1 << 14, latent_height=1024,
                                   latent_width=1024)
    assert F.unpack(F.pack(at_limit, [(payload, escapes)]))[0] == at_limit    # the limit is allowed


def test_implausible_payload_size_is_refused(coded):
    codec, data = coded
    header, [(payload, escapes)] = F.unpack(data)
    most = F.max_payload_bytes(12 * 3 * 4)
    with pytest.raises(F.FormatError, match=f"substream 0: a payload of {most + 4} bytes for "
                                            "144 latents"):
        codec.decompress(F.pack(header, [(bytes(most + 4), escapes)]), "x.gdn")


def test_the_payload_bound_holds_when_every_symbol_escapes(model, rng):
    """The worst case the bound must allow: every latent an escape (the least likely symbol)."""
    tables = build_tables(model)
    q = np.where(rng.random((tables.channels, 9, 11)) < 0.5, 5000, -5000).astype(np.int32)
    payload, escapes = encode_symbols(q, tables)
    assert len(payload) <= F.max_payload_bytes(q.size)
    assert np.array_equal(decode_symbols(payload, escapes, tables, q.shape), q)


def test_escapes_beyond_the_largest_symbol_are_refused(model):
    tables = build_tables(model)
    q = np.zeros((tables.channels, 2, 2), np.int32)
    q[0, 0, 0] = F.MAX_SYMBOL - 1
    payload, escapes = encode_symbols(q, tables)
    assert decode_symbols(payload, escapes, tables, q.shape)[0, 0, 0] == F.MAX_SYMBOL - 1
    q[0, 0, 0] = F.MAX_SYMBOL + 5        # the encoder never writes this (Codec.quantize refuses)
    payload, escapes = encode_symbols(q, tables)
    with pytest.raises(F.FormatError, match="x.gdn: corrupt escape bits"):
        decode_symbols(payload, escapes, tables, q.shape, "x.gdn")
