"""reshape and flatten."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops
from gdnflow.testing import assert_backends_match, gradcheck


def test_reshape_infers_minus_one_and_keeps_order(rng):
    x = rng.standard_normal((2, 3, 4))
    t = gf.tensor(x, device="numpy", dtype=np.float64)
    np.testing.assert_array_equal(t.reshape(4, -1).numpy(), x.reshape(4, 6))
    np.testing.assert_array_equal(t.reshape((24,)).numpy(), x.ravel())


def test_flatten(rng):
    t = gf.tensor(rng.standard_normal((2, 3, 4, 5)), device="numpy")
    assert ops.flatten(t).shape == (2, 60)
    assert ops.flatten(t, 2).shape == (2, 3, 20)
    assert ops.flatten(t, 0).shape == (120,)


def test_reshape_gradient(rng):
    gradcheck(lambda t: ops.reshape(t, (3, 4)) * ops.reshape(t, (3, 4)), [rng.standard_normal((2, 6))])


@pytest.mark.parametrize("shape", [(5, 7), (2, -1, -1), (-2, 35)], ids=str)
def test_bad_reshape_names_shapes(shape):
    with pytest.raises(gf.ShapeError, match=r"reshape"):
        ops.reshape(gf.zeros((5, 6), device="numpy"), shape)


@pytest.mark.gpu
def test_reshape_cuda_matches_numpy(rng):
    assert_backends_match(lambda t: ops.flatten(t).relu(), [rng.standard_normal((3, 5, 17, 19))])


# ----------------------------------------------- transpose, slice, concat, pad --
from gdnflow.ops.shape import view_arguments  # noqa: E402


def view_offset(i, base, dims, strides):
    """What view_offset in shape.cu computes for one dense index."""
    offset = base
    for d, s in zip(reversed(dims), reversed(strides[1:])):
        if d > 1:
            offset += (i % d) * s
            i //= d
    return offset + i * strides[0]


@pytest.mark.parametrize("shape,perm", [((2, 3, 4), (2, 0, 1)), ((5, 1, 3, 2), (3, 1, 0, 2)),
                                        ((2, 3, 4, 5, 6, 7), (5, 4, 3, 2, 1, 0))], ids=str)
def test_view_arguments_address_a_transpose(shape, perm):
    x = np.arange(np.prod(shape)).reshape(shape)
    strides = [x.strides[p] // x.itemsize for p in perm]
    out_shape = [shape[p] for p in perm]
    dims, view_strides = view_arguments(out_shape, strides)
    got = [view_offset(i, 0, dims, view_strides) for i in range(x.size)]
    np.testing.assert_array_equal(got, np.transpose(x, perm).ravel())


SHAPE_OPS = {
    "transpose": (lambda t: ops.transpose(t, (2, 0, 3, 1)), lambda x: np.transpose(x, (2, 0, 3, 1))),
    "slice": (lambda t: ops.slice_(t, (slice(1, None), slice(None, None, -2), slice(3, 0, -1))),
              lambda x: x[1:, ::-2, 3:0:-1]),
    "slice_step": (lambda t: ops.slice_(t, (slice(None), slice(None), slice(None), slice(0, 5, 2))),
                   lambda x: x[:, :, :, 0:5:2]),
    "concat": (lambda t: ops.concat([t, t * 2, t + 1], axis=1),
               lambda x: np.concatenate([x, 2 * x, x + 1], axis=1)),
    "pad": (lambda t: ops.pad(t, [(0, 0), (1, 2), (0, 1), (3, 0)], value=-1.5),
            lambda x: np.pad(x, [(0, 0), (1, 2), (0, 1), (3, 0)], constant_values=-1.5)),
}


@pytest.mark.parametrize("name", SHAPE_OPS)
def test_shape_op_forward(name, rng):
    fn, reference = SHAPE_OPS[name]
    x = rng.standard_normal((2, 3, 4, 5))
    np.testing.assert_allclose(fn(gf.tensor(x, device="numpy", dtype=np.float64)).numpy(),
                               reference(x), rtol=1e-12)


@pytest.mark.parametrize("name", SHAPE_OPS)
def test_shape_op_gradient(name, rng):
    gradcheck(SHAPE_OPS[name][0], [rng.standard_normal((2, 3, 4, 5))])


def test_concat_of_distinct_tensors_gradient(rng):
    gradcheck(lambda a, b: ops.concat([a, b], axis=-1),
              [rng.standard_normal((2, 3)), rng.standard_normal((2, 5))])


def test_shape_op_errors():
    x = gf.zeros((2, 3), device="numpy")
    with pytest.raises(gf.ShapeError, match="not a permutation"):
        ops.transpose(x, (0, 0))
    with pytest.raises(gf.ShapeError, match=r"input 1 has shape \(3, 3\)"):
        ops.concat([x, gf.zeros((3, 3), device="numpy")], axis=1)
    with pytest.raises(gf.ShapeError, match="pad"):
        ops.pad(x, [(1, -1)])


@pytest.mark.gpu
@pytest.mark.parametrize("name", SHAPE_OPS)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 5, 17, 19)], ids=str)
def test_shape_op_cuda_matches_numpy(name, shape, rng):
    assert_backends_match(SHAPE_OPS[name][0], [rng.standard_normal(shape)], rtol=1e-6)


@pytest.mark.gpu
def test_concat_distinct_cuda(rng):
    assert_backends_match(lambda a, b: ops.concat([a, b], axis=0),
                          [rng.standard_normal((2, 7, 3)), rng.standard_normal((5, 7, 3))], rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [0, 1, 3])
def test_concat_of_many_inputs_cuda(rng, axis):
    # 70 inputs: three launches of concat_inputs (32 a launch), widths 1 to 5, one empty.
    widths = [int(w) for w in rng.integers(1, 6, 70)]
    widths[40] = 0
    shapes = []
    for w in widths:
        shape = [3, 4, 5, 6]
        shape[axis] = w
        shapes.append(tuple(shape))
    arrays = [rng.standard_normal(s) for s in shapes]
    got = ops.concat([gf.tensor(a, device="cuda") for a in arrays], axis=axis).numpy()
    np.testing.assert_array_equal(got, np.concatenate(arrays, axis=axis).astype(np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("widths", [(64, 64), (5, 64, 3), (1, 1)], ids=str)
def test_concat_of_segments_longer_than_a_piece_cuda(rng, widths):
    # SqueezeNet's concatenations: each input's rows of one image are 55 x 55 x width
    # values, many pieces of CONCAT_PIECE with a short last one; odd widths put the
    # segments off 16-byte alignment (the copy goes 4 bytes at a time there).
    arrays = [rng.standard_normal((3, w, 55, 55)) for w in widths]
    got = ops.concat([gf.tensor(a, device="cuda") for a in arrays], axis=1).numpy()
    np.testing.assert_array_equal(got, np.concatenate(arrays, axis=1).astype(np.float32))
