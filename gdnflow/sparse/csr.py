"""Convolution filters in CSR form with input offsets (Park et al., ICLR 2017).

A weight ``w [C_out, C_in, kh, kw]`` becomes one CSR row per output channel.
Row ``o`` lists the non-zero ``w[o, c, i, j]`` in ascending (c, i, j) order;
instead of a column number each entry stores where its tap reads in a
zero-padded input plane stack of ``Hp x Wp`` pixels per channel::

    offset = c*Hp*Wp + i*dh*Wp + j*dw

so that output pixel (p, q) of a convolution with stride (sh, sw) is a
sparse dot product with the padded input read at shifted positions::

    y[n, o, p, q] = sum_{k in row o} values[k] * xp[n].flat[offsets[k] + p*sh*Wp + q*sw]

(``xp`` the input padded to Hp x Wp); no im2col matrix is formed.

Arrays: ``row_ptr`` int32 [C_out + 1], ``offsets`` int32 [nnz], ``values``
float32 [nnz]. The offsets depend on the padded size; :meth:`CSRWeight.retarget`
recomputes them for another one (the pattern -- which (o, c, i, j) are
non-zero -- is what stays fixed). Offsets are unique and increasing within a
row as long as Wp > (kw-1)*dw and Hp > (kh-1)*dh, which any valid
convolution's padded input satisfies.
"""
import math

import numpy as np

from gdnflow.errors import ShapeError


def _pair(value, name):
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(pair) != 2 or any(int(v) < 1 for v in pair):
        raise ValueError(f"{name} must be a positive int or a pair of them, got {value!r}")
    return int(pair[0]), int(pair[1])


def tap_offsets(channel, tap_row, tap_col, padded_size, dilation=1):
    """Offsets c*Hp*Wp + i*dh*Wp + j*dw (int32) of taps (c, i, j) in a padded input."""
    hp, wp = _pair(padded_size, "padded_size")
    dh, dw = _pair(dilation, "dilation")
    offsets = (np.asarray(channel, np.int64) * (hp * wp) + np.asarray(tap_row, np.int64) * (dh * wp)
               + np.asarray(tap_col, np.int64) * dw)
    if offsets.size and offsets.max() >= 2 ** 31:
        raise ValueError(f"CSR offsets exceed int32 for a padded input of {hp}x{wp} pixels")
    return offsets.astype(np.int32)


class CSRWeight:
    """A sparse convolution filter: CSR rows per output channel, input offsets as columns.

    Attributes: ``shape`` (C_out, C_in, kh, kw); ``padded_size`` (Hp, Wp);
    ``dilation`` (dh, dw); ``row_ptr`` int32 [C_out + 1]; ``offsets`` int32
    [nnz]; ``values`` float32 [nnz]; and the decoded pattern ``channel``,
    ``tap_row``, ``tap_col`` (int32 [nnz]: c, i, j of each entry) and
    ``rows`` (int32 [nnz]: its output channel o). Build with :func:`to_csr`.

    ``cache`` is scratch space for the backends (device copies, per-tiling
    index arrays); it is keyed by what it depends on and never invalidated,
    because a CSRWeight is not changed after construction.
    """

    def __init__(self, shape, padded_size, dilation, row_ptr, channel, tap_row, tap_col, values):
        self.shape = tuple(int(s) for s in shape)
        self.padded_size = _pair(padded_size, "padded_size")
        self.dilation = _pair(dilation, "dilation")
        self.row_ptr = np.ascontiguousarray(row_ptr, dtype=np.int32)
        self.channel = np.ascontiguousarray(channel, dtype=np.int32)
        self.tap_row = np.ascontiguousarray(tap_row, dtype=np.int32)
        self.tap_col = np.ascontiguousarray(tap_col, dtype=np.int32)
        self.values = np.ascontiguousarray(values, dtype=np.float32)
        c_out, _, kh, kw = self.shape
        hp, wp = self.padded_size
        if hp <= (kh - 1) * self.dilation[0] or wp <= (kw - 1) * self.dilation[1]:
            raise ShapeError(f"CSRWeight: padded input {hp}x{wp} is smaller than the dilated "
                             f"{kh}x{kw} kernel (dilation {self.dilation})")
        if self.row_ptr.shape != (c_out + 1,) or self.row_ptr[-1] != self.values.size:
            raise ShapeError(f"CSRWeight: row_ptr must have C_out + 1 = {c_out + 1} entries "
                             f"ending at nnz = {self.values.size}")
        self.offsets = tap_offsets(self.channel, self.tap_row, self.tap_col, self.padded_size,
                                   self.dilation)
        self.rows = np.repeat(np.arange(c_out, dtype=np.int32), np.diff(self.row_ptr))
        self.cache = {}

    @property
    def nnz(self):
        """Number of stored (non-zero) weights."""
        return int(self.values.size)

    @property
    def density(self):
        """nnz / (C_out*C_in*kh*kw): 1 - sparsity."""
        return self.nnz / max(int(np.prod(self.shape)), 1)

    def retarget(self, padded_size):
        """The same filter with offsets for another padded input size (shares the arrays)."""
        padded_size = _pair(padded_size, "padded_size")
        if padded_size == self.padded_size:
            return self
        key = ("retarget", padded_size)
        if key not in self.cache:
            self.cache[key] = CSRWeight(self.shape, padded_size, self.dilation, self.row_ptr,
                                        self.channel, self.tap_row, self.tap_col, self.values)
        return self.cache[key]

    def with_values(self, values):
        """The same pattern with other values (float32 [nnz])."""
        values = np.asarray(values, dtype=np.float32)
        if values.shape != (self.nnz,):
            raise ShapeError(f"CSRWeight.with_values: expected ({self.nnz},), got {values.shape}")
        return CSRWeight(self.shape, self.padded_size, self.dilation, self.row_ptr,
                         self.channel, self.tap_row, self.tap_col, values)

    def to_dense(self, values=None):
        """The dense [C_out, C_in, kh, kw] weight (``values`` replaces the stored ones)."""
        values = self.values if values is None else np.asarray(values)
        w = np.zeros(self.shape, dtype=values.dtype)
        w[self.rows, self.channel, self.tap_row, self.tap_col] = values
        return w

    def __repr__(self):
        return (f"CSRWeight(shape={self.shape}, nnz={self.nnz}, density={self.density:.3f}, "
                f"padded_size={self.padded_size}, dilation={self.dilation})")


def to_csr(weight, padded_size, dilation=1, mask=None):
    """The CSR form of a dense weight [C_out, C_in, kh, kw] for a padded input of ``padded_size``.

    Entries are the non-zeros of ``weight`` or, with ``mask`` (same shape),
    the positions where ``mask`` is non-zero (a pruned weight that happens
    to be exactly zero at a kept position then still has its entry).
    ``padded_size`` is (Hp, Wp) = (H + pad_top + pad_bottom, W + pad_left + pad_right).
    """
    weight = np.asarray(weight)
    if weight.ndim != 4:
        raise ShapeError(f"to_csr: expected a weight [C_out, C_in, kh, kw], got shape {weight.shape}")
    keep = weight != 0 if mask is None else np.asarray(mask) != 0
    if keep.shape != weight.shape:
        raise ShapeError(f"to_csr: mask shape {keep.shape} differs from weight shape {weight.shape}")
    # nonzero() walks the array in C order: by o, then (c, i, j) ascending,
    # which is the CSR row order with offsets increasing within a row.
    rows, channel, tap_row, tap_col = np.nonzero(keep)
    row_ptr = np.zeros(weight.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=weight.shape[0]), out=row_ptr[1:])
    return CSRWeight(weight.shape, padded_size, dilation, row_ptr, channel, tap_row, tap_col,
                     weight[rows, channel, tap_row, tap_col])


def random_csr(shape, density, padded, dilation=1, rng=None):
    """A CSRWeight with a uniformly random pattern of ``density`` and N(0, 1/fan_in) values.

    ``shape`` is [C_out, C_in, kh, kw]; round(density * size) entries are kept;
    ``padded`` is the padded input size (Hp, Wp); ``rng`` a NumPy Generator
    (default: seed 0).
    """
    rng = rng or np.random.default_rng(0)
    size = math.prod(shape)
    keep = np.zeros(size, bool)
    keep[rng.choice(size, int(round(density * size)), replace=False)] = True
    w = rng.standard_normal(size).astype(np.float32) / math.sqrt(math.prod(shape[1:]))
    return to_csr(w.reshape(shape), padded, dilation, mask=keep.reshape(shape))
