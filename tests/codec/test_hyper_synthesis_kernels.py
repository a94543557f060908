"""The exact hyper-synthesis kernels (cuda_src/exact_synthesis.cu) against the NumPy
path: the same table indexes bit for bit, built for the host (no GPU) and on the GPU,
for the codec tests' model, the widest models at their 2^52 bounds, odd sizes and
tiles, and the shipped hyperpriors."""
from pathlib import Path

import numpy as np
import pytest

from gdnflow.backends import cuda
from gdnflow.codec import exact_layers, hyper_synthesis
from gdnflow.codec.codec import codec_for
from gdnflow.codec.gaussian_tables import gaussian_tables, scale_indexes
from gdnflow.codec.hyper_synthesis import ExactHyperSynthesis

from codec_kit import make_hyperprior, widest_hyperprior
from exact_synthesis_kit import HOST_SHIM, GemmShimDevice
from host_kernels import HOST_CHECK_PRELUDE, host_builder

SHIPPED = sorted(Path(__file__).resolve().parents[2].glob("checkpoints/hyperprior_q*.h5"))


@pytest.fixture(scope="module")
def host_device(tmp_path_factory):
    build = host_builder(tmp_path_factory.mktemp("exact_synthesis_host"), "exact_synthesis.cu",
                         prefix=HOST_CHECK_PRELUDE, suffix=HOST_SHIM)
    return GemmShimDevice(build(), exact_layers.SOURCE)


def exact_of(model, gemm_bytes=hyper_synthesis.GEMM_BYTES, graph_shapes=0):
    """The exact h_s of ``model`` as its codec tables make it, taking the GEMM path for
    layers of at most ``gemm_bytes`` (0: the direct kernels only), keeping ``graph_shapes``
    passes as CUDA graphs (by default none: the host-built kernels have no graphs)."""
    return ExactHyperSynthesis(model.h_s, codec_for(model).tables.z.medians, gemm_bytes,
                               graph_shapes)


#: The two ways the GPU computes a layer: one GEMM (every layer of these small tests fits),
#: or the direct kernels.
PATHS = {"gemm": hyper_synthesis.GEMM_BYTES, "direct": 0}
#: What each path launches for the test model's h_s (transposed, transposed, convolution).
LAUNCHES = {"gemm": ["matmul", "exact_hidden_from_products"] * 2
                    + ["exact_columns", "matmul", "exact_last_from_products"],
            "direct": ["exact_hidden_layer"] * 2 + ["exact_last_layer"]}


def numpy_indexes(exact, q_z):
    return scale_indexes(exact.scales(q_z), gaussian_tables().scales).astype(np.uint8)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape, tile", [((8, 3, 5), None), ((8, 7, 9), 12), ((8, 1, 1), None),
                                         ((8, 6, 11), 4)])
def test_host_built_kernels_give_the_numpy_indexes(host_device, shape, tile, path):
    exact = exact_of(make_hyperprior(), PATHS[path])
    q_z = np.random.default_rng(sum(shape)).integers(-6, 7, shape)
    table = gaussian_tables().scales
    with cuda.simulated(host_device):
        got = exact.indexes(q_z, table, tile, device="cuda")
    expected = numpy_indexes(exact, q_z)
    assert got.dtype == np.uint8 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(expected)) > 10          # many tables in use, not one
    assert host_device.launched[-len(LAUNCHES[path]):] == LAUNCHES[path]


@pytest.mark.parametrize("path", PATHS)
def test_host_built_kernels_are_exact_at_the_bounds(host_device, path):
    model = widest_hyperprior()
    exact = ExactHyperSynthesis(model.h_s, np.zeros(192, np.float32), PATHS[path])
    rng = np.random.default_rng(2)
    q_z = rng.choice([-(2 ** 24 - 1), 2 ** 24 - 1], (192, 2, 3))
    with cuda.simulated(host_device):
        got = exact.indexes(q_z, gaussian_tables().scales, device="cuda")
    np.testing.assert_array_equal(got, numpy_indexes(exact, q_z))


def test_a_simulated_device_never_replays(host_device):
    """The host-built kernels have no CUDA graphs: with graphs asked for, every pass over a
    shape seen before still runs eagerly there, with the NumPy indexes."""
    exact = exact_of(make_hyperprior(), graph_shapes=2)
    q_z = np.random.default_rng(8).integers(-6, 7, (8, 4, 6))
    with cuda.simulated(host_device):
        assert cuda.simulating()
        for _ in range(3):
            np.testing.assert_array_equal(exact.indexes(q_z, gaussian_tables().scales,
                                                        device="cuda"),
                                          numpy_indexes(exact, q_z))
    assert not cuda.simulating() and not exact.replays.kept()


def test_an_unknown_device_is_refused():
    exact = exact_of(make_hyperprior())
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        exact.indexes(np.zeros((8, 2, 2), np.int64), gaussian_tables().scales, device="gpu")


@pytest.mark.gpu
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape, tile", [((8, 3, 5), None), ((8, 37, 53), None),
                                         ((8, 37, 53), 20)])
def test_gpu_kernels_give_the_numpy_indexes(shape, tile, path):
    exact = exact_of(make_hyperprior(), PATHS[path])
    q_z = np.random.default_rng(sum(shape)).integers(-6, 7, shape)
    got = exact.indexes(q_z, gaussian_tables().scales, tile, device="cuda")
    np.testing.assert_array_equal(got, numpy_indexes(exact, q_z))


@pytest.mark.gpu
@pytest.mark.parametrize("path", PATHS)
def test_gpu_passes_replayed_as_graphs_give_the_numpy_indexes(path):
    """The first pass over a shape runs eagerly, the second is captured as a CUDA graph and
    replayed, later ones replay it with their own input; the graphs of GRAPH_SHAPES shapes
    are kept (the least recently used goes); tiles of one image never replay (they would
    share the graph's result)."""
    exact = exact_of(make_hyperprior(), PATHS[path], graph_shapes=2)
    table = gaussian_tables().scales
    rng = np.random.default_rng(11)
    for shape in [(8, 9, 13), (8, 9, 13), (8, 9, 13), (8, 5, 7), (8, 5, 7), (8, 6, 6),
                  (8, 6, 6), (8, 9, 13)]:
        q_z = rng.integers(-6, 7, shape)
        np.testing.assert_array_equal(exact.indexes(q_z, table, device="cuda"),
                                      numpy_indexes(exact, q_z))
    assert [key[0] for key in exact.replays.kept()] == [(8, 6, 6), (8, 9, 13)]
    # Two replays started before either is read: each result is its own buffer.
    first, second = rng.integers(-6, 7, (2, 8, 9, 13))
    finishes = [exact.start_indexes(q_z, table, device="cuda") for q_z in (first, second)]
    for finish, q_z in zip(finishes, (first, second)):
        np.testing.assert_array_equal(finish(), numpy_indexes(exact, q_z))
    tiled = exact_of(make_hyperprior(), PATHS[path], graph_shapes=2)
    q_z = rng.integers(-6, 7, (8, 12, 12))
    for _ in range(3):      # 2 x 2 tiles of 24 latents: never replayed
        np.testing.assert_array_equal(tiled.indexes(q_z, table, tile=24, device="cuda"),
                                      numpy_indexes(tiled, q_z))
    assert not tiled.replays.kept()


@pytest.mark.gpu
@pytest.mark.parametrize("path", PATHS)
def test_gpu_kernels_are_exact_at_the_bounds(path):
    model = widest_hyperprior()
    exact = ExactHyperSynthesis(model.h_s, np.zeros(192, np.float32), PATHS[path])
    q_z = np.random.default_rng(3).choice([-(2 ** 24 - 1), 2 ** 24 - 1], (192, 5, 3))
    got = exact.indexes(q_z, gaussian_tables().scales, device="cuda")
    np.testing.assert_array_equal(got, numpy_indexes(exact, q_z))


@pytest.mark.gpu
@pytest.mark.skipif(not SHIPPED, reason="the shipped hyperprior checkpoints are not here")
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_gpu_kernels_give_the_numpy_indexes_of_the_shipped_models(path):
    from gdnflow.codec import Codec
    exact = Codec.from_checkpoint(path, "numpy").tables.hyper_synthesis
    # z of a 768x520 image with values like a photo's (mostly small, some large).
    rng = np.random.default_rng(4)
    q_z = np.rint(rng.laplace(0, 2, (exact.median_units.size, 13, 12))).astype(np.int64)
    got = exact.indexes(q_z, gaussian_tables().scales, device="cuda")
    np.testing.assert_array_equal(got, numpy_indexes(exact, q_z))


def test_asymmetric_padding_is_refused_by_name():
    from gdnflow.nn.conv import Conv2d
    from gdnflow.nn.layers import Sequential
    layer = Conv2d(4, 4, 3, padding=(1, 0, 1, 0), device="numpy")
    with pytest.raises(ValueError, match=r"hyper-synthesis .*: asymmetric padding \(1, 0, 1, 0\) "
                                         r"is not supported"):
        ExactHyperSynthesis(Sequential(layer), np.zeros(4, np.float32))


def h_s_with_the_most_taps(rng):
    """A transposed 9x9 layer at stride 2 (25 taps reach each output: MAX_EXACT_TAPS), then a
    5x5 convolution, with random weights and medians."""
    from gdnflow.nn.conv import Conv2d, ConvTranspose2d
    from gdnflow.nn.layers import ReLU, Sequential
    h_s = Sequential(ConvTranspose2d(6, 6, 9, stride=2, padding=4, output_padding=1,
                                     device="numpy"), ReLU(),
                     Conv2d(6, 8, 5, padding=2, device="numpy"))
    return ExactHyperSynthesis(h_s, rng.uniform(-1, 1, 6).astype(np.float32))


@pytest.mark.parametrize("path", PATHS)
def test_host_built_kernels_take_a_transposed_layer_at_the_tap_bound(host_device, rng, path):
    exact = h_s_with_the_most_taps(rng)
    exact.gemm_bytes = PATHS[path]
    q_z = rng.integers(-6, 7, (6, 5, 7))
    want = numpy_indexes(exact, q_z)
    assert len(np.unique(want)) > 3
    with cuda.simulated(host_device):
        got = exact.indexes(q_z, gaussian_tables().scales, device="cuda")
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("path", PATHS)
def test_gpu_kernels_take_a_transposed_layer_at_the_tap_bound(rng, path):
    exact = h_s_with_the_most_taps(rng)
    exact.gemm_bytes = PATHS[path]
    q_z = rng.integers(-6, 7, (6, 9, 13))
    np.testing.assert_array_equal(exact.indexes(q_z, gaussian_tables().scales, device="cuda"),
                                  numpy_indexes(exact, q_z))


def test_more_taps_per_output_than_the_gpu_kernels_list_are_refused_by_name(rng):
    """NumPy computes such a layer; the GPU path refuses it before launching anything."""
    from gdnflow.nn.conv import ConvTranspose2d
    from gdnflow.nn.layers import Sequential
    exact = ExactHyperSynthesis(Sequential(ConvTranspose2d(4, 4, 11, stride=2, padding=5,
                                                           output_padding=1, device="numpy")),
                                np.zeros(4, np.float32))
    q_z = rng.integers(-3, 4, (4, 3, 5))
    assert exact.indexes(q_z, gaussian_tables().scales).shape == (4, 6, 10)
    with pytest.raises(ValueError, match=r"hyper-synthesis .*: 36 kernel taps reach each output; "
                                         r"the GPU's exact kernels take at most 25"):
        exact.indexes(q_z, gaussian_tables().scales, device="cuda")
