"""Format versions 11 and 13: a block's quiet groups (channels, coding tables) that are all
zero are left out of the payload. The same latents as version 7/8 files, with and
without quiet groups coded anyway; what is coded; the threshold; a corrupt list."""
import numpy as np
import pytest

from gdnflow.codec import FormatError, substreams
from gdnflow.codec import hyperprior as hyperprior_codec
from gdnflow.codec.codec import codec_for
from gdnflow.codec import format as F
from gdnflow.codec.format import BitReader, BitWriter
from gdnflow.codec.gaussian_tables import gaussian_tables
from gdnflow.codec.substreams import quiet_zero, read_coded_groups, write_coded_groups

from codec_kit import make_hyperprior, make_model, smooth_image


@pytest.fixture
def half_quiet(monkeypatch):
    """Quiet groups in the small test models, some of them not all zero (encoder and
    decoder both read the patched rules): Gaussian tables quiet from p(0) >= 1/2 on, and
    every other channel of a factorized model (whose wide test densities have none)."""
    monkeypatch.setattr(substreams, "QUIET_BITS", 1)
    hyperprior_codec.quiet_tables.cache_clear()
    monkeypatch.setattr(substreams, "quiet_channels",
                        lambda tables: np.arange(tables.channels) % 2 == 0)
    yield
    hyperprior_codec.quiet_tables.cache_clear()


def test_the_shipped_models_quiet_channels_are_their_unused_ones():
    """Most of a trained model's channels are quiet (the test model's wide densities: none)."""
    from gdnflow.codec import pretrained
    quiet = substreams.quiet_channels(pretrained("factorized_prior", 1, "numpy").tables)
    assert quiet.shape == (192,) and quiet.sum() > 96
    assert not substreams.quiet_channels(codec_for(make_model()).tables).any()


def test_the_threshold_is_one_minus_2_to_the_minus_8():
    assert quiet_zero(65280, 16) and not quiet_zero(65279, 16)
    assert quiet_zero(np.array([65536, 0]), 16).tolist() == [True, False]
    # the shipped Gaussian tables: the four smallest scales are quiet, no other
    assert np.flatnonzero(hyperprior_codec.quiet_tables()).tolist() == [0, 1, 2, 3]
    high, cdf = gaussian_tables().high[4], gaussian_tables().cdfs[4]
    assert not quiet_zero(int(cdf[high + 1] - cdf[high]), 16)


@pytest.mark.parametrize("coded", [[], [True], [False, False, True, False, True],
                                   [True] * 9, [False] * 40 + [True]])
def test_the_coded_groups_list_round_trips(coded):
    writer = BitWriter()
    write_coded_groups(writer, np.array(coded, bool))
    writer.write(5, 3)                      # what follows is read where it was written
    reader = BitReader(writer.getvalue(), "f.gdn")
    assert read_coded_groups(reader, len(coded), "f.gdn").tolist() == list(coded)
    assert reader.read(3) == 5
    if not any(coded):
        assert len(writer.bits) == 1 + 3    # one bit when none is coded


@pytest.mark.parametrize("coded, count, problem", [([False, True, True], 2, r"coded group 2 of 2"),
                                                   ([True, True, True], 2, r"3 coded groups of 2")])
def test_a_corrupt_coded_groups_list_is_refused(coded, count, problem):
    writer = BitWriter()
    write_coded_groups(writer, np.array(coded))
    with pytest.raises(FormatError, match=f"f.gdn: corrupt escape bits \\({problem}\\)"):
        read_coded_groups(BitReader(writer.getvalue(), "f.gdn"), count, "f.gdn")


@pytest.mark.parametrize("which", ["factorized", "hyperprior"])
def test_quiet_groups_decode_to_the_plain_substreams_latents(which, half_quiet):
    net = make_model() if which == "factorized" else make_hyperprior()
    plain_version = type(codec_for(net)).versions[1]
    codec = type(codec_for(net))(net, substream_bits=64)
    plain = type(codec)(net, substream_bits=64, version=plain_version)
    rng = np.random.default_rng(3)
    for height, width in [(130, 200), (17, 40), (64, 64)]:
        image = smooth_image(rng, height, width)
        data = codec.compress(image)
        _, y_hat = codec.decode_latents(data)
        np.testing.assert_array_equal(y_hat, plain.decode_latents(plain.compress(image))[1])
        np.testing.assert_array_equal(codec.decompress(data), plain.decompress(
            plain.compress(image)))


def test_only_the_quiet_channels_that_are_all_zero_are_left_out(half_quiet, monkeypatch):
    """Latents with quiet channels all zero, and one quiet channel with a single 1: the
    payload codes every other channel, that one included, and decodes to the latents."""
    codec = codec_for(make_model())
    quiet = substreams.quiet_channels(codec.tables)
    rng = np.random.default_rng(4)
    q = rng.integers(-2, 3, (quiet.size, 4, 5)).astype(np.int32)
    q[quiet] = 0
    awake = np.flatnonzero(quiet)[0]
    q[awake, 2, 3] = 1
    coded = []
    encode_values = substreams.encode_values

    def counting(encoder, escapes, values, low, high, model):
        coded.append(values.size)
        encode_values(encoder, escapes, values, low, high, model)
    monkeypatch.setattr(substreams, "encode_values", counting)
    data = codec.encode_latents(q, 64, 80)
    assert sum(coded) == (quiet.size - quiet.sum() + 1) * 20
    _, y_hat = codec.decode_latents(data)
    medians = np.asarray(codec.tables.medians, np.float32)[:, None, None]
    np.testing.assert_array_equal(y_hat, q.astype(np.float32) + medians)


def test_hyperprior_quiet_tables_with_a_nonzero_value_are_coded(half_quiet, monkeypatch):
    """y's quiet tables are left out unless they hold a nonzero value (counted: every
    element coded is in a table that is not quiet or that woke)."""
    codec = codec_for(make_hyperprior())
    image = smooth_image(np.random.default_rng(5), 128, 192)
    q = codec.quantize(codec.analyse(image))
    q_z = codec.side_information(codec.analyse(image))
    indexes = codec.tables.indexes(q_z)
    quiet = hyperprior_codec.quiet_tables()[indexes]
    assert quiet.any() and (~quiet).any()
    q[quiet] = 0
    woken = np.flatnonzero(quiet)[::7]
    q[np.unravel_index(woken, q.shape)] = 2                   # some quiet elements wake
    coded = []
    encode_values = hyperprior_codec.encode_values

    def counting(encoder, escapes, values, low, high, model):
        coded.append(values.size)
        encode_values(encoder, escapes, values, low, high, model)
    monkeypatch.setattr(hyperprior_codec, "encode_values", counting)
    data = codec.encode_latents(q, 128, 192, q_z)
    np.testing.assert_array_equal(codec.decode_latents(data)[1], q.astype(np.float32))
    # per block, a woken quiet table is coded whole, the others not at all
    awake = np.zeros(q.shape, bool)
    for channels, rows in F.unpack(data)[0].splits[1].blocks(q.shape):
        tables = indexes[channels, rows]
        awake[channels, rows] = np.isin(tables, np.unique(tables[q[channels, rows] != 0]))
    assert sum(coded) == np.count_nonzero(~quiet | awake) < q.size
