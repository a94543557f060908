"""The rANS lanes (gdnflow/codec/rans.py, cuda_src/rans.cu) and format versions 14 and 16.

The NumPy coder against a one-symbol-at-a-time coder written here from the
definition; the kernels built for the host and on the GPU against the NumPy
coder (the same words, the same values); corrupt streams refused; version 14
files against version 11's latents, across devices byte for byte."""
import shutil

import numpy as np
import pytest

from gdnflow.backends import cuda
from gdnflow.codec import Codec, codec_for, host_lanes, rans
from gdnflow.codec.format import (HYPERPRIOR_RANS_VERSION, RANS_VERSION, FormatError, Split,
                                  checksum, unpack)
from gdnflow.codec.device_groups import table_groups_on_host
from gdnflow.codec.hyperprior import decode_by_table_rans, encode_by_table_rans, table_groups
from gdnflow.codec.rans import (ESCAPE_MARK, LANE_BAD_END, LANE_OK, LANE_TRUNCATED, STATE_LOW,
                                Lanes, RansTables, decode_cuda, decode_numpy, encode_cuda,
                                encode_numpy, symbols_of)
from gdnflow.codec.rans_substreams import decode_rans, encode_rans

from codec_kit import make_hyperprior, random_case, random_tables, smooth_image
from host_kernels import ShimDevice, host_builder

LANE_ARGS = ("const int* lane_runs, const int* run_table, const int* run_count, "
             "const long long* run_dest, const int* positions, const int* cdf, "
             "const int* table_offset, const int* table_size, const int* table_low")
LANE_NAMES = ("lane_runs, run_table, run_count, run_dest, positions, cdf, table_offset, "
              "table_size, table_low")
HOST_SHIM = f"""
extern "C" void host_rans_encode(const int* latents, {LANE_ARGS}, const long long* lane_end,
                                 int lanes, unsigned short* words, int* lane_words) {{
    for (int lane = lanes - 1; lane >= 0; --lane)
        lane_words[lane] = rans_encode_lane(lane, latents, {LANE_NAMES}, words, lane_end[lane]);
}}
extern "C" void host_rans_decode(const unsigned short* words, const long long* lane_begin,
                                 {LANE_ARGS}, const int* buckets, int lanes, int* latents,
                                 int* lane_status, int* lane_escapes) {{
    for (int lane = lanes - 1; lane >= 0; --lane)
        lane_status[lane] = rans_decode_lane(lane, words, lane_begin[lane], lane_begin[lane + 1],
                                             {LANE_NAMES}, buckets, latents,
                                             lane_escapes + lane);
}}
"""


@pytest.fixture(scope="module")
def host_device(tmp_path_factory):
    build = host_builder(tmp_path_factory.mktemp("rans_host"), "rans.cu", suffix=HOST_SHIM)
    return ShimDevice(build(), rans.SOURCE)


def reference_encode(symbols, cdfs):
    """One lane's words, one symbol at a time from the definition (rans.py's docstring)."""
    x, given = STATE_LOW, []
    for table, s in reversed(symbols):
        c, f = int(cdfs[table][s]), int(cdfs[table][s + 1] - cdfs[table][s])
        if x >= f << 16:
            given.append(x & 0xFFFF)
            x >>= 16
        x = (x // f << 16) + x % f + c
    words = [x >> 16, x & 0xFFFF] + given[::-1]
    return words + [0] * (len(words) % 2)


def test_numpy_coder_writes_the_definitions_words(rng):
    lanes, tables, cdfs, latents = random_case(rng)
    streams = encode_numpy(lanes, tables, latents)
    assert len(streams) == lanes.lanes
    for lane, words in enumerate(streams):
        ids = lanes.lane_tables(lane)
        symbols = symbols_of(latents[lanes.lane_positions(lane)], tables, ids)
        assert words.dtype == np.uint16 and len(words) % 2 == 0
        assert words.tolist() == reference_encode(list(zip(ids.tolist(), symbols.tolist())),
                                                  cdfs)
    assert streams[3].tolist() == [1, 0]            # an empty lane: the first state, 2^16


def test_numpy_decoder_gives_the_values_back_and_marks_escapes(rng):
    lanes, tables, cdfs, latents = random_case(rng)
    streams = encode_numpy(lanes, tables, latents)
    decoded = np.full(latents.shape, 12345, np.int32)
    status = decode_numpy(lanes, tables, streams, decoded)
    assert status.tolist() == [LANE_OK] * lanes.lanes
    coded = np.concatenate([lanes.lane_positions(j) for j in range(lanes.lanes)])
    ids = np.concatenate([lanes.lane_tables(j) for j in range(lanes.lanes)])
    inside = (latents[coded] >= tables.low[ids]) & (latents[coded] <= tables.high[ids])
    assert 0 < (~inside).sum() < inside.sum()       # escapes, but mostly values
    np.testing.assert_array_equal(decoded[coded[inside]], latents[coded[inside]])
    assert (decoded[coded[~inside]] == ESCAPE_MARK).all()
    untouched = np.setdiff1d(np.arange(latents.size), coded)
    assert (decoded[untouched] == 12345).all()


def host_lanes_status(lanes, tables, streams, latents):
    """Each lane's status from the lanes decoded on the host's threads."""
    return host_lanes.decode_host(lanes, tables, streams, latents)[0]


NEEDS_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@pytest.mark.parametrize("decode", [decode_numpy, pytest.param(host_lanes_status,
                                                               marks=NEEDS_NVCC)])
def test_corrupt_streams_are_caught(rng, decode):
    lanes, tables, _, latents = random_case(rng)
    streams = encode_numpy(lanes, tables, latents)
    long_lane = int(np.argmax(lanes.symbols()))

    def status_with(words):
        changed = list(streams)
        changed[long_lane] = np.asarray(words, np.uint16)
        return decode(lanes, tables, changed, np.zeros(latents.shape, np.int32))[long_lane]

    words = streams[long_lane]
    assert status_with(words[:-4]) == LANE_TRUNCATED
    assert status_with(words[:1]) == LANE_TRUNCATED
    assert status_with(np.append(words, [7, 0])) == LANE_BAD_END
    flipped = words.copy()
    flipped[0] ^= 1
    assert status_with(flipped) != LANE_OK


def test_tables_of_other_precisions_are_refused():
    with pytest.raises(ValueError, match="12-bit"):
        RansTables.of([np.array([0, 100, 4096])], [0], 12)


def check_kernels(rng, **kwargs):
    lanes, tables, _, latents = random_case(rng, **kwargs)
    streams = encode_numpy(lanes, tables, latents)
    got = encode_cuda(lanes, tables, latents)
    assert [s.tolist() for s in got] == [s.tolist() for s in streams]
    runtime = cuda.get_runtime()
    expected = np.zeros(latents.shape, np.int32)
    want_status = decode_numpy(lanes, tables, streams, expected)
    out = runtime.from_numpy(np.zeros(latents.shape, np.int32))
    status, escapes = decode_cuda(lanes, tables, streams, out)
    np.testing.assert_array_equal(runtime.to_numpy(out), expected)
    assert status.tolist() == want_status.tolist() == [LANE_OK] * lanes.lanes
    marks = [(expected[lanes.lane_positions(j)] == ESCAPE_MARK).sum()
             for j in range(lanes.lanes)]
    assert escapes.tolist() == marks and sum(marks) > 0
    truncated = list(streams)
    truncated[0] = streams[0][:-2]
    status, _ = decode_cuda(lanes, tables, truncated, out)
    assert status[0] != LANE_OK and (status[1:] == LANE_OK).all()


def test_host_built_kernels_code_as_numpy(host_device, rng):
    with cuda.simulated(host_device):
        check_kernels(rng)
    assert host_device.launched[:2] == ["rans_encode", "rans_decode"]


@pytest.mark.gpu
@pytest.mark.parametrize("lanes, size", [(6, 3000), (40, 200000)])
def test_gpu_kernels_code_as_numpy(rng, lanes, size):
    check_kernels(rng, lanes=lanes, size=size)


# ------------------------------------------------------ version 14 --
def latents_like_a_photo(rng, tables, shape):
    """Integer latents around each channel's median, a few quiet channels all zero, some
    values beyond the supports."""
    q = np.round(rng.laplace(0, 1.5, shape)).astype(np.int32)
    q[::3] = 0
    q[1, 0, 0] = tables.high[1] + 9
    return q


@pytest.mark.parametrize("split", [Split(1, 1), Split(5, 2), Split(12, 3)])
def test_version_14_substreams_round_trip_on_numpy(model, rng, split):
    codec = Codec(model)
    q = latents_like_a_photo(rng, codec.tables, (12, 7, 9))
    substreams = encode_rans(q, codec.tables, split, True, "numpy")
    assert len(substreams) == split.groups * split.bands
    back = decode_rans(substreams, codec.tables, split, q.shape, "x.gdn", True, "numpy")
    np.testing.assert_array_equal(back, q)


def test_version_14_files_hold_version_11s_latents_at_about_its_size(model, small_image):
    codec = Codec(model)
    assert codec.version == 11              # on NumPy the range-coded files by default
    q = codec.quantize(codec.analyse(small_image))
    h, w = small_image.shape[:2]
    files = {v: Codec(model, version=v).encode_latents(q, h, w) for v in (11, RANS_VERSION)}
    assert files[RANS_VERSION][4] == RANS_VERSION
    latents = [Codec(model).decode_latents(files[v])[1] for v in (11, RANS_VERSION)]
    np.testing.assert_array_equal(latents[0], latents[1])
    assert abs(len(files[RANS_VERSION]) - len(files[11])) <= 0.02 * len(files[11]) + 8


def test_a_corrupt_version_14_payload_is_refused_by_name(model, small_image):
    codec = Codec(model, version=RANS_VERSION)
    data = bytearray(codec.compress(small_image))
    coded = sum(len(payload) + len(escapes) for payload, escapes in unpack(bytes(data))[1])
    data[len(data) - 4 - coded] ^= 0x10     # the first payload word: the coder's final state
    data[-4:] = checksum(bytes(data[:-4]))  # past the checksum: the coder must notice
    with pytest.raises(FormatError, match="photo.gdn: corrupt payload in substream 0"):
        codec.decompress(bytes(data), "photo.gdn")


def test_host_built_kernels_write_and_read_version_14_as_numpy(model, host_device, rng):
    codec = Codec(model, version=RANS_VERSION)
    q = latents_like_a_photo(rng, codec.tables, (12, 10, 13))
    split = Split(4, 3)
    on_host = encode_rans(q, codec.tables, split, True, "numpy")
    with cuda.simulated(host_device):
        assert encode_rans(q, codec.tables, split, True, "cuda") == on_host
        back = decode_rans(on_host, codec.tables, split, q.shape, "x.gdn", True, "cuda")
    np.testing.assert_array_equal(back, q)


@pytest.mark.gpu
def test_gpu_codec_writes_version_14_that_numpy_reads_byte_for_byte(model, rng):
    gpu = Codec(model.to("cuda"))
    try:
        assert gpu.version == RANS_VERSION
        image = smooth_image(rng, 150, 211)
        data = gpu.compress(image)
        cpu = Codec(model.to("numpy"), version=RANS_VERSION)
        q = cpu.quantize(cpu.analyse(image))
        header, y_gpu = gpu.decode_latents(data)
        np.testing.assert_array_equal(cpu.decode_latents(data)[1], y_gpu)
        assert cpu.encode_latents(np.round(y_gpu - cpu.tables.medians[:, None, None]).astype(
            np.int32), 150, 211) == data
        assert np.abs(q - np.round(y_gpu - cpu.tables.medians[:, None, None])).max() <= 1
    finally:
        model.to("numpy")


def test_lanes_without_symbols_decode_on_numpy(rng):
    tables, _ = random_tables(rng)
    lanes = Lanes.of([[], [(1, 0, 5)]])
    streams = encode_numpy(lanes, tables, np.zeros(8, np.int32))
    assert [s.tolist() for s in streams] == [[1, 0], [1, 0]]
    assert decode_numpy(lanes, tables, streams, np.zeros(8, np.int32)).tolist() == [LANE_OK] * 2


def test_tables_of_one_symbol_are_refused():
    with pytest.raises(ValueError, match="table 1 must have at least two symbols"):
        RansTables.of([np.array([0, 1, 65536]), np.array([0, 65536])], [0, 0], 16)


# ------------------------------------------------------ version 16 --
@pytest.fixture(scope="module")
def hyperprior():
    return make_hyperprior()


def test_version_16_files_hold_version_13s_latents(hyperprior):
    image = smooth_image(np.random.default_rng(5), 150, 211)
    codec = codec_for(hyperprior)
    assert codec.version == 13              # on NumPy the range-coded files by default
    y = codec.analyse(image)
    q, q_z = codec.quantize(y), codec.side_information(y)
    files = {v: type(codec)(hyperprior, version=v, substream_bits=256).encode_latents(
        q, 150, 211, q_z) for v in (13, HYPERPRIOR_RANS_VERSION)}
    assert files[HYPERPRIOR_RANS_VERSION][4] == HYPERPRIOR_RANS_VERSION
    assert len(unpack(files[HYPERPRIOR_RANS_VERSION])[1]) > 4       # several lanes
    latents = [codec.decode_latents(files[v])[1] for v in files]
    np.testing.assert_array_equal(latents[0], latents[1])
    np.testing.assert_array_equal(latents[1], q)
    # The same symbols in the same order: every substream's escape bits (the coded quiet
    # groups, then the escapes in coding order) are version 13's, byte for byte.
    escapes = [[e for _, e in unpack(files[v])[1]] for v in files]
    assert escapes[0] == escapes[1] and any(escapes[0])
    assert abs(len(files[16]) - len(files[13])) <= 0.03 * len(files[13]) + 8 * 6


def y_case(rng, shape=(12, 8, 12)):
    """y with its table indexes, quiet tables all zero but one (coded anyway)."""
    indexes = rng.integers(0, 64, shape).astype(np.uint8)
    indexes[rng.random(shape) < 0.6] = 1
    q = np.round(rng.laplace(0, 2, shape)).astype(np.int32)
    q[indexes < 4] = 0
    q[0, 0, 0], indexes[0, 0, 0] = 3, 2             # a quiet table coded
    q[1, 2, 3], indexes[1, 2, 3] = 500, 10          # an escape
    return q, indexes


@pytest.mark.parametrize("split", [Split(1, 1), Split(4, 3)])
def test_y_by_table_lanes_round_trip_with_host_groups(rng, split):
    q, indexes = y_case(rng)
    blocks = split.blocks(q.shape)
    nones = [None] * len(blocks)
    substreams = encode_by_table_rans(q, indexes, blocks, nones, True, "numpy")
    back = decode_by_table_rans(substreams, indexes, blocks, nones, True, "numpy", "y.gdn")
    np.testing.assert_array_equal(back, q)


@NEEDS_NVCC
@pytest.mark.parametrize("split", [Split(1, 1), Split(4, 3)])
def test_y_by_table_on_host_lanes_with_the_host_grouping_writes_numpys_bytes(rng, split):
    """The host grouping's offsets and non-zero counts (a quiet table coded, an escape) in
    place of the coder's own grouping: the same substreams, and the same y back."""
    q, indexes = y_case(rng)
    blocks = split.blocks(q.shape)
    nones = [None] * len(blocks)
    want = encode_by_table_rans(q, indexes, blocks, nones, True, "numpy")
    groups, positions, nonzero = table_groups_on_host(indexes, blocks, q)
    assert encode_by_table_rans(q, indexes, blocks, groups, True, "host", positions,
                                nonzero) == want
    groups, positions, _ = table_groups_on_host(indexes, blocks)
    back = decode_by_table_rans(want, indexes, blocks, groups, True, "host", "y.gdn", positions)
    np.testing.assert_array_equal(back, q)


def test_host_built_kernels_code_y_by_table_as_numpy(host_device, rng):
    """The device groups' full order (every table) and the host's (coded tables only) give
    the same lanes' words."""
    q, indexes = y_case(rng)
    blocks = Split(4, 3).blocks(q.shape)
    nones = [None] * len(blocks)
    on_host = encode_by_table_rans(q, indexes, blocks, nones, True, "numpy")
    groups = [table_groups(indexes[c, r].ravel()) for c, r in blocks]
    with cuda.simulated(host_device):
        assert encode_by_table_rans(q, indexes, blocks, groups, True, "cuda") == on_host
        back = decode_by_table_rans(on_host, indexes, blocks, groups, True, "cuda", "y.gdn")
    np.testing.assert_array_equal(back, q)


@pytest.mark.gpu
def test_gpu_hyperprior_writes_version_16_that_numpy_reads_byte_for_byte(hyperprior):
    """The same latents: the GPU's encoder (device groups, lanes on the GPU) writes the
    NumPy encoder's bytes (host groups, NumPy lanes); both decoders give them back."""
    image = smooth_image(np.random.default_rng(6), 150, 211)
    gpu = type(codec_for(hyperprior))(hyperprior.to("cuda"), version=HYPERPRIOR_RANS_VERSION)
    try:
        y = gpu.analyse(image)
        q, q_z = gpu.quantize(y), gpu.side_information(y)
        data = gpu.encode_latents(q, 150, 211, q_z)
        np.testing.assert_array_equal(gpu.decode_latents(data)[1], q)
        cpu = type(gpu)(hyperprior.to("numpy"), version=HYPERPRIOR_RANS_VERSION)
        assert cpu.encode_latents(q, 150, 211, q_z) == data
        np.testing.assert_array_equal(cpu.decode_latents(data)[1], q)
    finally:
        hyperprior.to("numpy")


@pytest.mark.parametrize("escape", [False, True])
def test_host_built_decoding_can_leave_the_latents_on_the_device(model, host_device, rng,
                                                                 escape, monkeypatch):
    """on_device: the device array itself without escapes (nothing read back); with one,
    the latents read back, patched and uploaded again; the same values either way."""
    codec = Codec(model, version=RANS_VERSION)
    q = latents_like_a_photo(rng, codec.tables, (12, 10, 13))
    if not escape:
        q = np.clip(q, codec.tables.low[:, None, None], codec.tables.high[:, None, None])
    split = Split(4, 3)
    substreams = encode_rans(q, codec.tables, split, True, "numpy")
    reads = []
    to_numpy = host_device.to_numpy
    monkeypatch.setattr(host_device, "to_numpy", lambda a: reads.append(a.shape) or to_numpy(a))
    with cuda.simulated(host_device):
        back = decode_rans(substreams, codec.tables, split, q.shape, "x.gdn", True, "cuda",
                           on_device=True)
    assert back.shape == q.shape and not isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back.array, q)
    assert (q.shape in reads) == escape


def test_host_built_decoding_on_the_device_refuses_a_corrupt_lane(model, host_device, rng):
    codec = Codec(model, version=RANS_VERSION)
    q = latents_like_a_photo(rng, codec.tables, (12, 10, 13))
    split = Split(4, 3)
    substreams = encode_rans(q, codec.tables, split, True, "numpy")
    payload, escapes = substreams[2]
    substreams[2] = (payload[:-4], escapes)
    with cuda.simulated(host_device), pytest.raises(FormatError, match="substream 2"):
        decode_rans(substreams, codec.tables, split, q.shape, "x.gdn", True, "cuda",
                    on_device=True)
