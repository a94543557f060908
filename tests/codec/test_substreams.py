"""Latents in independent substreams (format versions 7 and 8): the split recorded in
the header, the same latents as the one-stream coder, in any executor, every size, and a
forged substream index refused naming the file."""
import dataclasses
import pickle
import tracemalloc
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

from gdnflow.codec import format as F
from gdnflow.codec import substreams
from gdnflow.codec.codec import Codec, codec_for
from gdnflow.codec.gaussian_tables import gaussian_tables
from gdnflow.codec.substreams import SUBSTREAM_BITS, choose_split

from codec_kit import make_hyperprior, smooth_image


@pytest.fixture(scope="module")
def hyperprior():
    return make_hyperprior()


@pytest.fixture(scope="module")
def image():
    """A 130x200 photo-like image: a few hundred bytes under the test models."""
    return smooth_image(np.random.default_rng(21), 130, 200)


def versions(model):
    """(one-stream version, substream version, newest range-coded version) of ``model``'s
    codec (the factorized prior's rANS version 14: tests/codec/test_rans.py)."""
    return type(codec_for(model)).versions[:3]


@pytest.mark.parametrize("split", [F.Split(1, 1), F.Split(3, 2), F.Split(12, 1), F.Split(5, 9)])
def test_blocks_cover_the_tensor_once(split):
    shape = (12, 9, 4)
    seen = np.zeros(shape, np.int64)
    blocks = split.blocks(shape)
    assert len(blocks) == split.groups * split.bands and split.fits(shape)
    for channels, rows in blocks:
        assert channels.stop > channels.start and rows.stop > rows.start
        seen[channels, rows] += 1
    assert np.all(seen == 1)
    assert not F.Split(13, 1).fits(shape) and not F.Split(1, 10).fits(shape)


def test_the_split_follows_the_estimated_payload():
    assert choose_split(0, (192, 32, 48)) == F.Split(1, 1)
    assert choose_split(5.5 * SUBSTREAM_BITS, (192, 32, 48)) == F.Split(5, 1)
    assert choose_split(1000 * SUBSTREAM_BITS, (192, 32, 48)) == F.Split(192, 5)
    assert choose_split(1000 * SUBSTREAM_BITS, (8, 1, 1)) == F.Split(8, 1)     # all it has


def test_estimated_bits_sum_each_sampled_values_cost():
    """The estimate is the sampled values' -log2 of their probability under their tables
    (the escape's below and above the support), scaled to the whole tensor: against a
    per-element loop over the CDFs, with values past both ends of the support, on every
    value of a small tensor and on every k-th of each channel of a large one."""
    tables = gaussian_tables()
    low = -np.asarray(tables.high)

    def cost(value, k):
        cdf, s = tables.cdfs[k], value - low[k]
        if not 0 <= s < len(cdf) - 2:           # outside the support: the escape, last
            s = len(cdf) - 2
        return tables.precision - np.log2(float(cdf[s + 1] - cdf[s]))

    rng = np.random.default_rng(4)
    shape = (7, 37, 53)                 # 13,727 values: under the sample size, all of them
    values = np.rint(rng.standard_normal(shape) * 6).astype(np.int32)
    values[0, 0, :4] = [10_000, -10_000, 0, 1]
    ids = rng.integers(0, len(tables.cdfs), shape).astype(np.uint8)
    expected = sum(cost(v, k) for v, k in zip(values.ravel(), ids.ravel()))
    assert substreams.estimated_bits(values, ids, tables, low) == pytest.approx(expected,
                                                                                rel=1e-12)
    # Broadcast table ids (a factorized prior's: one table per channel), 600,000 values.
    big = np.rint(rng.standard_normal((5, 300, 400)) * 8).astype(np.int32)
    step = big.size // substreams._ESTIMATE_SAMPLES
    sample = big.reshape(5, -1)[:, ::step]
    expected = sum(cost(v, c) for c in range(5) for v in sample[c]) * big.size / sample.size
    assert substreams.estimated_bits(big, np.arange(5)[:, None, None], tables, low) == \
        pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("which", ["factorized", "hyperprior"])
def test_substreams_give_the_one_stream_latents(which, model, hyperprior, image):
    """Forced into many substreams (64 bits each), the new version decodes to exactly
    the latents of the old one-stream version (read by the same codec); the split is in
    the header, one substream per block; the executor changes nothing in the bytes."""
    net = model if which == "factorized" else hyperprior
    old_version, plain_version, new_version = versions(net)
    old = type(codec_for(net))(net, version=old_version).compress(image)
    codec = type(codec_for(net))(net, substream_bits=64)
    data = codec.compress(image)
    header, substreams = F.unpack(data)
    assert (old[4], data[4], header.version) == (old_version, new_version, new_version)
    plain = type(codec)(net, substream_bits=64, version=plain_version).compress(image)
    assert np.array_equal(codec.decode_latents(plain)[1], codec.decode_latents(old)[1])
    assert len(header.splits) == len(header.coded_shapes()) == (1 if which == "factorized" else 2)
    assert len(substreams) == sum(s.groups * s.bands for s in header.splits) > 4
    assert all(s.fits(shape) for s, shape in zip(header.splits, header.coded_shapes()))
    assert np.array_equal(codec.decode_latents(data)[1], codec.decode_latents(old)[1])
    # What a substream costs: its coder's termination and two index varints (measured
    # 4.3 to 4.9 bytes each on average).
    assert len(data) - len(old) <= 6 * len(substreams)
    with ThreadPoolExecutor(2) as pool:
        threaded = type(codec)(net, substream_bits=64, executor=pool)
        assert threaded.compress(image) == data
        assert np.array_equal(threaded.decode_latents(data)[1], codec.decode_latents(old)[1])


def test_a_process_pool_codes_the_same_file(model, image):
    """Everything the executor runs pickles (module-level functions, plain arguments)."""
    with ProcessPoolExecutor(2) as pool:
        codec = Codec(model, substream_bits=64, executor=pool)
        data = codec.compress(image)
        assert data == Codec(model, substream_bits=64).compress(image)
        assert np.array_equal(codec.decompress(data), Codec(model).decompress(data))


def test_models_are_built_once_per_model_id(model):
    """A worker process gets a pickled copy of the tables with every task: the constriction
    models are kept per model id, so equal copies share them; the cache keeps the last
    MODEL_CACHE_TABLES models' tables."""
    tables = Codec(model).tables
    copy = pickle.loads(pickle.dumps(tables))
    assert copy is not tables and copy.model_id == tables.model_id
    assert substreams.channel_model(copy, 3) is substreams.channel_model(tables, 3)
    others = [dataclasses.replace(tables, model_id=bytes([k]) * 32)
              for k in range(substreams.MODEL_CACHE_TABLES)]
    first = substreams.channel_model(tables, 3)
    for other in others:
        substreams.channel_model(other, 3)
    assert substreams.channel_model(tables, 3) is not first      # dropped, built again
    assert substreams.channel_model(others[-1], 3) is substreams.channel_model(others[-1], 3)


@pytest.mark.parametrize("size", [(1, 1), (1, 40), (17, 3), (70, 1)])
@pytest.mark.parametrize("which", ["factorized", "hyperprior"])
def test_tiny_images_with_as_many_substreams_as_blocks(which, model, hyperprior, size):
    """substream_bits=1 asks for more substreams than the latents have channels x rows:
    the split stops at one block per channel and row, and decodes."""
    net = model if which == "factorized" else hyperprior
    image = np.random.default_rng(size[0]).integers(0, 256, (*size, 3), np.uint8)
    codec = type(codec_for(net))(net, substream_bits=1)
    data = codec.compress(image)
    header, substreams = F.unpack(data)
    for split, shape in zip(header.splits, header.coded_shapes()):
        assert split == (shape[0], shape[1])
    single = type(codec)(net, version=versions(net)[0]).compress(image)
    assert np.array_equal(codec.decode_latents(data)[1], codec.decode_latents(single)[1])
    assert np.array_equal(codec.decompress(data), codec.decompress(single))


def test_writers_refuse_versions_of_the_other_model(model, hyperprior):
    with pytest.raises(ValueError, match=r"Codec: writes format versions \(2, 7, 11, 14\), got 4"):
        Codec(model, version=4)
    with pytest.raises(ValueError,
                       match=r"HyperpriorCodec: writes format versions \(4, 8, 13, 16\), got 7"):
        codec_for(hyperprior).__class__(hyperprior, version=7)


@pytest.mark.parametrize("bits", [0, -64, float("nan")])
def test_a_substream_size_that_is_not_positive_is_refused(model, bits):
    with pytest.raises(ValueError, match=r"^Codec: substream_bits must be a positive number of "
                                         rf"bits, got {bits!r}"):
        Codec(model, substream_bits=bits)


def forged(data, index):
    """``data`` with its substream index replaced by ``index`` (a list of integers) and its
    checksum recomputed: a file whose writer lied about the substreams' sizes."""
    header, substreams = F.unpack(data)
    old = b"".join(F.write_varint(n) for payload, escapes in substreams
                   for n in (len(payload) // 4, len(escapes)))
    body = data[:-F.CHECKSUM_BYTES]
    start = len(body) - sum(len(p) + len(e) for p, e in substreams) - len(old)
    assert body[start:start + len(old)] == old
    body = body[:start] + b"".join(F.write_varint(n) for n in index) + body[start + len(old):]
    return body + F.checksum(body)


def test_a_corrupted_substream_index_is_refused_naming_the_file(model, image):
    codec = Codec(model, substream_bits=64)
    data = codec.compress(image)
    header, substreams = F.unpack(data)
    index = [n for payload, escapes in substreams for n in (len(payload) // 4, len(escapes))]
    assert forged(data, index) == data
    # A flipped bit in the index: the checksum.
    start = len(data) - 4 - sum(len(p) + len(e) for p, e in substreams) - 2
    for bit in range(8 * start, 8 * start + 16):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        with pytest.raises(F.FormatError, match=r"^x\.gdn: corrupted \(checksum mismatch\)"):
            codec.decompress(bytes(flipped), "x.gdn")
    # Forged with a valid checksum: sizes that do not add up to the file, a payload too
    # large for its block, escape bytes past any escape code's length.
    cases = [([index[0] + 1] + index[1:], "x.gdn: truncated: the substreams need"),
             ([index[0] - 1] + index[1:], "x.gdn: 4 unexpected byte"),
             ([10 ** 6] + index[1:], "x.gdn: corrupt header: substream 0: a payload of"),
             (index[:1] + [10 ** 6] + index[2:], "x.gdn: corrupt substream index: substream 0 "
                                                  "has 1000000 escape bytes")]
    for bad, message in cases:
        with pytest.raises(F.FormatError, match=f"^{message}"):
            codec.decompress(forged(data, bad), "x.gdn")


def with_split(data, groups, bands):
    """A factorized file's ``data`` with its split's varints replaced, checksum recomputed."""
    header = F.unpack(data)[0]
    sizes = (header.height, header.width, header.channels, header.latent_height,
             header.latent_width)
    start = len(F.MAGIC) + 1 + F.MODEL_ID_BYTES + F.TABLES_DIGEST_BYTES + \
        len(b"".join(F.write_varint(v) for v in sizes))
    old = b"".join(F.write_varint(v) for v in header.splits[0])
    assert data[start:start + len(old)] == old
    body = data[:start] + F.write_varint(groups) + F.write_varint(bands) + \
        data[start + len(old):-F.CHECKSUM_BYTES]
    return body + F.checksum(body)


def test_a_split_that_does_not_fit_the_latents_is_refused(model, image):
    codec = Codec(model)
    data = codec.compress(image)
    channels, rows = F.unpack(data)[0].latent_shape[:2]
    assert codec.decode_latents(with_split(data, 1, 1))[0].splits == (F.Split(1, 1),)
    for groups, bands in ((channels + 1, 1), (1, rows + 1), (0, 1), (1, 0)):
        with pytest.raises(F.FormatError, match=rf"^x\.gdn: corrupt header: {groups} channel "
                                                rf"groups x {bands} row bands"):
            codec.decompress(with_split(data, groups, bands), "x.gdn")


def test_a_split_bomb_is_refused_before_its_blocks_are_listed():
    """A small file (valid checksum) whose split claims 1024 x 1024 substreams of a
    4096-channel latent: refused from the substream count and the file's length, without
    listing a million blocks (that took seconds and hundreds of MB)."""
    sizes = (65536, 16, 4096, 4096, 1, 1024, 1024)
    body = F.MAGIC + bytes([F.FORMAT_VERSION]) + bytes(F.MODEL_ID_BYTES) + \
        bytes(F.TABLES_DIGEST_BYTES) + b"".join(F.write_varint(v) for v in sizes) + bytes(64)
    tracemalloc.start()
    try:
        with pytest.raises(F.FormatError, match=r"^bomb\.gdn: corrupt header: 1048576 "
                                                r"substreams in a file of"):
            F.unpack(body + F.checksum(body), "bomb.gdn")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
