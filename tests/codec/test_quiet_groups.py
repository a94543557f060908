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


class CountingEncoder:
    """Stands where a constriction encoder goes: counts the symbols it is given."""

    def __init__(self):
        self.symbols = 0

    def encode(self, symbols, model):
        self.symbols += len(symbols)


@pytest.fixture(scope="module")
def shipped_q1():
    """The shipped factorized q1's codec: 170 of its 192 channels are quiet."""
    from gdnflow.codec import pretrained
    return pretrained("factorized_prior", 1, "numpy")


def latents_with_quiet_zeros(rng, quiet, shape, woken=()):
    """Random latents (C, h, w) whose quiet channels are all 0 but for a 1 in each of ``woken``."""
    q = rng.integers(-3, 4, (quiet.size,) + shape).astype(np.int32)
    q[quiet] = 0
    for channel in woken:
        q[channel, rng.integers(shape[0]), rng.integers(shape[1])] = 1
    return q


def test_the_shipped_models_quiet_channels_are_their_unused_ones(shipped_q1):
    """Most of a trained model's channels are quiet, and an image's latents are 0 in every
    quiet channel and not in every other one (the test model's wide densities: none quiet)."""
    quiet = substreams.quiet_channels(shipped_q1.tables)
    assert quiet.shape == (192,) and quiet.sum() > 96
    q = shipped_q1.quantize(shipped_q1.analyse(smooth_image(np.random.default_rng(0), 128, 192)))
    assert not q[quiet].any()
    assert q[~quiet].any(axis=(1, 2)).all()
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


def test_factorized_quiet_channels_decode_to_the_plain_substreams_latents(shipped_q1):
    """Versions 11 and 7 of the same latents (many substreams, quiet channels zero but for
    a few) decode to the same latents."""
    codec = shipped_q1
    plain = type(codec)(codec.model, substream_bits=256, version=7)
    quiet_codec = type(codec)(codec.model, substream_bits=256)
    quiet = substreams.quiet_channels(codec.tables)
    rng = np.random.default_rng(3)
    for shape, woken in [((5, 7), ()), ((3, 4), np.flatnonzero(quiet)[[0, 9, 50]]),
                         ((1, 1), np.flatnonzero(quiet)[:40])]:
        q = latents_with_quiet_zeros(rng, quiet, shape, woken)
        data = quiet_codec.encode_latents(q, 16 * shape[0], 16 * shape[1])
        assert data[4] == 11 and len(F.unpack(data)[1]) > 1
        _, y_hat = quiet_codec.decode_latents(data)
        want = plain.decode_latents(plain.encode_latents(q, 16 * shape[0], 16 * shape[1]))[1]
        np.testing.assert_array_equal(y_hat, want)


def test_hyperprior_quiet_tables_decode_to_the_plain_substreams_latents():
    net = make_hyperprior()
    codec = type(codec_for(net))(net, substream_bits=64)
    plain = type(codec)(net, substream_bits=64, version=8)
    rng = np.random.default_rng(3)
    for height, width in [(130, 200), (17, 40), (64, 64)]:
        image = smooth_image(rng, height, width)
        data = codec.compress(image)
        assert data[4] == 13
        np.testing.assert_array_equal(codec.decode_latents(data)[1],
                                      plain.decode_latents(plain.compress(image))[1])


def test_only_the_quiet_channels_that_are_all_zero_are_left_out(shipped_q1):
    """The coder is given every channel that is not quiet, and the quiet ones that hold a
    nonzero value, whole; the quiet channels that are all zero not at all."""
    tables = shipped_q1.tables
    quiet = substreams.quiet_channels(tables)
    woken = np.flatnonzero(quiet)[[2, 7]]
    q = latents_with_quiet_zeros(np.random.default_rng(4), quiet, (4, 5), woken)
    encoder, escapes = CountingEncoder(), BitWriter()
    substreams.encode_channels(encoder, escapes, q, tables, quiet=True)
    assert encoder.symbols == (np.count_nonzero(~quiet) + len(woken)) * 20
    reader = BitReader(escapes.getvalue(), "f.gdn")
    assert np.flatnonzero(read_coded_groups(reader, int(quiet.sum()), "f.gdn")).tolist() == \
        [2, 7]


def test_hyperprior_quiet_tables_with_a_nonzero_value_are_coded():
    """y's quiet tables are left out unless they hold a nonzero value (counted: every
    element coded is in a table that is not quiet or that woke)."""
    codec = codec_for(make_hyperprior())
    image = smooth_image(np.random.default_rng(5), 128, 192)
    y = codec.analyse(image)
    q, indexes = codec.quantize(y), codec.tables.indexes(codec.side_information(y))
    quiet = hyperprior_codec.quiet_tables()[indexes]
    assert quiet.any() and (~quiet).any()
    q[quiet & (indexes > 0)] = 0             # the quiet tables but the first fall asleep
    awake = np.isin(indexes, np.unique(indexes[q != 0]))
    assert (quiet & awake).any() and (quiet & ~awake).any()   # woken quiet tables, and asleep
    encoder = CountingEncoder()
    hyperprior_codec.encode_by_table(encoder, BitWriter(), q, indexes, quiet=True)
    assert encoder.symbols == np.count_nonzero(~quiet | awake) < q.size
    data = codec.encode_latents(q, 128, 192, codec.side_information(y))
    np.testing.assert_array_equal(codec.decode_latents(data)[1], q.astype(np.float32))
