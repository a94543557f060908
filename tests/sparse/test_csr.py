"""CSR filters with input offsets: a hand-checked case, retargeting, round trips."""
import numpy as np
import pytest

from gdnflow.errors import ShapeError
from gdnflow.sparse.csr import CSRWeight, tap_offsets, to_csr


def _tiny_weight():
    w = np.zeros((2, 2, 2, 2), np.float32)
    w[0, 0, 0, 1] = 1.0
    w[0, 1, 1, 0] = 2.0
    w[1, 0, 1, 1] = 3.0
    return w


def test_offsets_of_a_hand_checked_filter():
    # Padded input 4 x 5: offset = c*20 + i*5 + j.
    csr = to_csr(_tiny_weight(), (4, 5))
    assert csr.row_ptr.tolist() == [0, 2, 3]
    assert csr.offsets.tolist() == [0 * 20 + 0 * 5 + 1, 1 * 20 + 1 * 5 + 0, 0 * 20 + 1 * 5 + 1]
    assert csr.values.tolist() == [1.0, 2.0, 3.0]
    assert csr.rows.tolist() == [0, 0, 1]
    assert (csr.row_ptr.dtype, csr.offsets.dtype, csr.values.dtype) == (
        np.int32, np.int32, np.float32)
    assert csr.nnz == 3 and csr.density == 3 / 16


def test_dilation_scales_the_tap_offsets():
    # offset = c*Hp*Wp + i*dh*Wp + j*dw with dilation 2 on a 4 x 5 padded input.
    csr = to_csr(_tiny_weight(), (4, 5), dilation=2)
    assert csr.offsets.tolist() == [2, 20 + 10, 10 + 2]


def test_offsets_index_the_padded_input():
    # Reading a padded input at offset + p*Wp + q gives the tap each entry names.
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4, 3, 3)) * (rng.random((3, 4, 3, 3)) < 0.4)
    xp = rng.standard_normal((4, 7, 8))
    csr = to_csr(w, xp.shape[1:])
    for k in range(csr.nnz):
        c, i, j = csr.channel[k], csr.tap_row[k], csr.tap_col[k]
        assert xp.flat[csr.offsets[k] + 2 * 8 + 3] == xp[c, 2 + i, 3 + j]


def test_retarget_and_round_trip():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((5, 3, 3, 2)) * (rng.random((5, 3, 3, 2)) < 0.3)).astype(np.float32)
    csr = to_csr(w, (6, 6))
    other = csr.retarget((9, 4))
    assert other.offsets.tolist() == tap_offsets(csr.channel, csr.tap_row, csr.tap_col,
                                                 (9, 4)).tolist()
    assert csr.retarget((6, 6)) is csr and csr.retarget((9, 4)) is other
    np.testing.assert_array_equal(other.to_dense(), w)
    np.testing.assert_array_equal(csr.with_values(2 * csr.values).to_dense(), 2 * w)
    # Offsets increase along each row: rows are sorted by (c, i, j).
    for o in range(5):
        row = csr.offsets[csr.row_ptr[o]:csr.row_ptr[o + 1]]
        assert np.all(np.diff(row) > 0)


def test_mask_keeps_entries_that_are_zero():
    w = _tiny_weight()
    mask = w != 0
    w[0, 0, 0, 1] = 0.0                 # kept by the mask, value happens to be 0
    csr = to_csr(w, (4, 5), mask=mask)
    assert csr.nnz == 3 and csr.values[0] == 0.0


def test_empty_rows_and_empty_filter():
    w = np.zeros((3, 2, 3, 3), np.float32)
    w[2, 1, 2, 2] = 5.0
    csr = to_csr(w, (5, 5))
    assert csr.row_ptr.tolist() == [0, 0, 0, 1]
    empty = to_csr(np.zeros((4, 2, 3, 3)), (5, 5))
    assert empty.nnz == 0 and empty.row_ptr.tolist() == [0] * 5


def test_bad_inputs_are_refused():
    with pytest.raises(ShapeError, match="C_out, C_in, kh, kw"):
        to_csr(np.zeros((3, 3, 3)), (5, 5))
    with pytest.raises(ShapeError, match="smaller than the dilated"):
        to_csr(_tiny_weight(), (1, 5))
    with pytest.raises(ShapeError, match="mask shape"):
        to_csr(_tiny_weight(), (4, 5), mask=np.ones((2, 2, 2, 1)))
    with pytest.raises(ValueError, match="exceed int32"):
        tap_offsets([70000], [0], [0], (200, 200))
    assert isinstance(to_csr(_tiny_weight(), (4, 5)), CSRWeight)
