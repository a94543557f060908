"""The rANS lanes coded on the host's threads (gdnflow/codec/host_lanes.py: cuda_src/rans.cu
built for the host with OpenMP) against the NumPy coder: the same words and values, for few
lanes and many (corrupt streams: tests/codec/test_rans.py); codecs writing and reading the
same bytes either way."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gdnflow.codec import host_lanes
from gdnflow.codec.codec import Codec
from gdnflow.codec.hyperprior import HyperpriorCodec
from gdnflow.codec.rans import ESCAPE_MARK, LANE_OK, decode_numpy, encode_numpy

from codec_kit import make_hyperprior, make_model, random_case, smooth_image

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def outside_the_supports(lanes, tables, latents):
    """Per lane, how many of its values are beyond their table's support."""
    counts = []
    for lane in range(lanes.lanes):
        values, ids = latents[lanes.lane_positions(lane)], lanes.lane_tables(lane)
        counts.append(int(((values < tables.low[ids]) | (values > tables.high[ids])).sum()))
    return counts


@needs_nvcc
@pytest.mark.parametrize("lane_count, size", [(6, 3000), (40, 200_000)])
def test_host_lanes_code_as_the_numpy_coder(rng, lane_count, size):
    lanes, tables, _, latents = random_case(rng, lanes=lane_count, size=size)
    want = encode_numpy(lanes, tables, latents)
    streams, escapes = host_lanes.encode_host(lanes, tables, latents)
    assert len(streams) == len(want)
    for got, expected in zip(streams, want):
        np.testing.assert_array_equal(got, expected)
    assert escapes.tolist() == outside_the_supports(lanes, tables, latents)
    assert escapes.sum() > 0
    expected_values = np.zeros(size, np.int32)
    expected_status = decode_numpy(lanes, tables, want, expected_values)
    values = np.full(size, 7, np.int32)
    status, decoded_escapes = host_lanes.decode_host(lanes, tables, want, values)
    np.testing.assert_array_equal(status, expected_status)
    assert (status == LANE_OK).all()
    coded = np.concatenate([lanes.lane_positions(j) for j in range(lanes.lanes)])
    np.testing.assert_array_equal(values[coded], expected_values[coded])
    assert decoded_escapes.tolist() == [int((values[lanes.lane_positions(j)] == ESCAPE_MARK).sum())
                                        for j in range(lanes.lanes)]
    assert decoded_escapes.tolist() == escapes.tolist()


@needs_nvcc
@pytest.mark.parametrize("lane_count, size", [(6, 3000), (40, 200_000)])
def test_the_host_lists_each_lanes_escapes_in_coding_order(rng, lane_count, size):
    """lane_escapes gives the offsets and tables of each lane's escaped values, in coding
    order: on the values to encode (beyond the supports) and on the decoded latents
    (ESCAPE_MARK), against each lane's every position listed in NumPy."""
    lanes, tables, _, latents = random_case(rng, lanes=lane_count, size=size)
    streams, escapes = host_lanes.encode_host(lanes, tables, latents)
    decoded = np.zeros(size, np.int32)
    _, decoded_escapes = host_lanes.decode_host(lanes, tables, streams, decoded)
    for values, counts, marked in ((latents, escapes, False), (decoded, decoded_escapes, True)):
        found = host_lanes.lane_escapes(lanes, tables, values, counts, marked)
        assert len(found) == lanes.lanes
        for lane, (offsets, ids) in enumerate(found):
            positions, tables_of = lanes.lane_positions(lane), lanes.lane_tables(lane)
            v = values[positions]
            escaped = v == ESCAPE_MARK if marked else \
                (v < tables.low[tables_of]) | (v > tables.high[tables_of])
            np.testing.assert_array_equal(offsets, positions[escaped])
            np.testing.assert_array_equal(ids, tables_of[escaped])
        assert sum(len(offsets) for offsets, _ in found) == escapes.sum() > 0
    # Counts that the lanes do not hold (a caller's mistake) are refused.
    with pytest.raises(ValueError, match="escapes where"):
        host_lanes.lane_escapes(lanes, tables, latents, escapes + 1, False)


@needs_nvcc
def test_host_lanes_escape_values_at_the_ends_of_int32_as_numpy(rng):
    """Values next to +-2^31 under tables of negative and positive low (value - low is past
    an int's range there) are escapes, as on NumPy, which subtracts in int64."""
    lanes, tables, _, latents = random_case(rng)
    tables.low[:] = np.where(np.arange(len(tables.low)) % 2 == 0, -7, 5)
    extremes = rng.choice(len(latents), 300, replace=False)
    info = np.iinfo(np.int32)
    latents[extremes] = np.where(np.arange(300) % 2 == 0, info.max, info.min + 1)
    streams, escapes = host_lanes.encode_host(lanes, tables, latents)
    for got, expected in zip(streams, encode_numpy(lanes, tables, latents)):
        np.testing.assert_array_equal(got, expected)
    assert escapes.tolist() == outside_the_supports(lanes, tables, latents)


@needs_nvcc
def test_decoding_refuses_latents_it_cannot_write_in_place(rng):
    lanes, tables, _, latents = random_case(rng)
    streams, _ = host_lanes.encode_host(lanes, tables, latents)
    with pytest.raises(ValueError, match="contiguous int32"):
        host_lanes.decode_host(lanes, tables, streams, np.zeros(latents.shape, np.int64))


@needs_nvcc
@pytest.mark.parametrize("make, version", [(make_model, 14), (make_hyperprior, 16)])
def test_codecs_write_and_read_the_same_bytes_with_host_or_numpy_lanes(rng, make, version):
    model = make()
    image = smooth_image(rng, 80, 144)
    kind = HyperpriorCodec if version == 16 else Codec
    host = kind(model, lanes="host", version=version, substream_bits=256)
    numpy = kind(model, lanes="numpy", version=version, substream_bits=256)
    data = host.compress(image)
    assert data == numpy.compress(image)
    np.testing.assert_array_equal(host.decompress(data), numpy.decompress(data))
    _, q = host.decode_quantized(data)
    np.testing.assert_array_equal(q, numpy.decode_quantized(data)[1])


@needs_nvcc
def test_host_lanes_make_the_hyperprior_write_its_lanes_version():
    model = make_hyperprior()
    assert HyperpriorCodec(model, lanes="host").version == 16
    assert HyperpriorCodec(model).version == 13          # a NumPy codec's lanes: NumPy's
    assert Codec(make_model(), lanes="host").version == 14


def test_the_lanes_argument_is_checked():
    model = make_model()
    with pytest.raises(ValueError, match="Codec: lanes must be one of .* got 'gpu'"):
        Codec(model, lanes="gpu")
    with pytest.raises(ValueError, match="lanes=\"cuda\" needs a model on the cuda device"):
        Codec(model, lanes="cuda")


#: Asks for host lanes where no nvcc can be found and none was built (a fresh cache).
WITHOUT_NVCC = """
from gdnflow.codec.codec import Codec
from gdnflow.errors import BackendUnavailableError
from codec_kit import make_model
try:
    Codec(make_model(), lanes="host")
except BackendUnavailableError as error:
    print(error)
"""


def test_host_lanes_without_nvcc_are_refused_by_name(tmp_path):
    environment = dict(os.environ, PATH=str(tmp_path), CUDA_HOME=str(tmp_path),
                       GDNFLOW_KERNEL_CACHE=str(tmp_path / "cache"),
                       PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1])]
                                                  + sys.path))
    result = subprocess.run([sys.executable, "-c", WITHOUT_NVCC], env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Codec: lanes=\"host\" needs nvcc to build the lane coder" in result.stdout, \
        result.stdout + result.stderr
