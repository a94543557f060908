"""The padded input as row-flattened stride phases: every tap of a convolution is a slice.

For a convolution of stride (sh, sw), tap (i, j) reads the padded input at
rows ``p*sh + i*dh`` and columns ``q*sw + j*dw``: rows of the residue
``r = i*dh mod sh``, starting at phase row ``a = i*dh // sh`` (columns
likewise, ``s`` and ``b``). Split the padded input into its sh*sw phases
``padded[:, :, r::sh, s::sw]``, each stored with the same row width ``Wq``
and flattened: then the tap's input for every output pixel (p, q) is

    phase[r, s][a*Wq + b + p*Wq + q]

one contiguous run of ``OH*Wq`` values per channel, starting at ``a*Wq + b``.
An output computed on that run is ``OH x Wq``; its last ``Wq - OW``
columns read past the row's end (into the next row) and are cut off. That
costs ``Wq / OW - 1`` extra work (a few percent on images) and saves the
strided gather of im2col: the column matrix is built by contiguous copies
(:func:`run_product`).
"""
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided


@dataclass(frozen=True)
class TapGroup:
    """The taps of one phase (r, s): kernel rows ``rows`` at phase rows a0, a0 + a_step, ...
    and kernel columns ``columns`` at phase columns b0, b0 + b_step, ..."""

    r: int
    s: int
    rows: tuple
    columns: tuple
    a0: int
    a_step: int
    b0: int
    b_step: int


def _axis_taps(k, dilation, stride):
    """[(residue, kernel indices, first phase offset, offset step)] along one axis.

    Kernel indices of one residue are evenly spaced, so their phase offsets are too.
    """
    taps = []
    for residue in range(stride):
        indices = tuple(i for i in range(k) if (i * dilation) % stride == residue)
        if indices:
            offsets = [i * dilation // stride for i in indices]
            step = offsets[1] - offsets[0] if len(offsets) > 1 else 0
            taps.append((residue, indices, offsets[0], step))
    return taps


def tap_groups(g):
    """The :class:`TapGroup` of each phase that some tap of geometry ``g`` reads."""
    (sh, sw), (dh, dw) = g.stride, g.dilation
    return [TapGroup(r, s, rows, columns, a0, a_step, b0, b_step)
            for r, rows, a0, a_step in _axis_taps(g.kh, dh, sh)
            for s, columns, b0, b_step in _axis_taps(g.kw, dw, sw)]


def _first_inside(residue, stride, before):
    """(a, i): the first phase index a whose padded position residue + a*stride lies in x
    (``before`` zeros precede x), and that position in x, i."""
    a = max(0, -(-(before - residue) // stride))
    return a, residue + a * stride - before


def row_phases(g, x):
    """(phases [N, sh, sw, C_in, (Hq + 1)*Wq], Wq): x zero-padded by ``g.padding``, split
    into its stride phases, each Hq x Wq (zeros past the padded input) plus one spare
    zero row, so that every tap's run of OH*Wq values lies inside its phase."""
    (sh, sw) = g.stride
    top, bottom, left, right = g.padding
    hq, wq = -(-(g.h + top + bottom) // sh), -(-(g.w + left + right) // sw)
    phases = np.zeros((g.n, sh, sw, g.c_in, hq + 1, wq), x.dtype)
    for r in range(sh):
        # Phase row a is padded row r + a*sh, x's row r + a*sh - top: x rows first, first + sh, ...
        a, first_row = _first_inside(r, sh, top)
        for s in range(sw):
            b, first_column = _first_inside(s, sw, left)
            rows = x[:, :, first_row::sh, first_column::sw]
            phases[:, r, s, :, a:a + rows.shape[2], b:b + rows.shape[3]] = rows
    return phases.reshape(g.n, sh, sw, g.c_in, (hq + 1) * wq), wq


#: Column-matrix elements built per block of output positions (24 MB of float32): one
#: reused buffer instead of a whole-image matrix (250 MB on the codec's widest layer,
#: whose fresh pages cost as much to fault in as the copy itself). Below glibc's largest
#: mmap threshold (32 MB) the buffer comes from the heap without fresh pages (64 MB
#: blocks measured 1.3x slower on the codec, one thread); the larger the block, the fewer
#: BLAS calls, each of which waits for a descheduled BLAS thread when the cores are
#: shared (16 MB blocks measured up to 1.7x slower than 64 MB ones at load 3).
BLOCK_ELEMENTS = 6 << 20


@dataclass(frozen=True)
class TapRun:
    """The taps of one group as a strided view: the input of tap (a, b) of the group for
    output position u (of the run) is ``source[n, c, start + a*row_step + b*column_step
    + u]``, a < rows, b < columns."""

    source: np.ndarray      # [N, C, flat]
    start: int
    row_step: int
    column_step: int
    rows: int
    columns: int

    def view(self, first, length):
        """[N, C, rows, columns, length]: the taps' inputs for run positions first.."""
        item = self.source.itemsize
        strides = self.source.strides
        return as_strided(self.source[:, :, self.start + first:], (
            self.source.shape[0], self.source.shape[1], self.rows, self.columns, length),
            (strides[0], strides[1], self.row_step * item, self.column_step * item, item),
            writeable=False)


def forward_runs(g, phases, wq):
    """The :class:`TapRun` of each tap group of the forward, in :func:`tap_weights`' order."""
    return [TapRun(phases[:, t.r, t.s], t.a0 * wq + t.b0, t.a_step * wq, t.b_step,
                   len(t.rows), len(t.columns)) for t in tap_groups(g)]


def run_product(weights, runs, length, block_elements=BLOCK_ELEMENTS):
    """[N, C_out, length]: weights [C_out, K] @ the column matrix [K, length] of ``runs``
    (K ordered run by run, then channel, row, column), one block of positions at a time.

    Summed as one product per block over all K, as im2col's one GEMM does.
    """
    n = runs[0].source.shape[0]
    k = weights.shape[1]
    out = np.empty((n, weights.shape[0], length), weights.dtype)
    block = min(length, max(1, block_elements // k))
    buffer = np.empty((n, k, block), weights.dtype)
    for first in range(0, length, block):
        size = min(block, length - first)
        columns = buffer[:, :, :size]
        row = 0
        for run in runs:
            view = run.view(first, size)
            count = view.shape[1] * run.rows * run.columns
            columns[:, row:row + count].reshape(view.shape)[...] = view
            row += count
        out[:, :, first:first + size] = np.matmul(weights, columns)
    return out


def tap_weights(g, w):
    """w [C_out, C_in, kh, kw] as [C_out, K], K in the order of :func:`forward_runs`
    (tap group, then channel, kernel row, kernel column)."""
    return np.concatenate([w[:, :, list(t.rows)][:, :, :, list(t.columns)].reshape(g.c_out, -1)
                           for t in tap_groups(g)], axis=1)


def crop_rows(g, y_rows, wq):
    """[N, C, OH*Wq] computed on phase rows -> [N, C, OH, OW] contiguous (the run's
    spill past each row cut off)."""
    y = y_rows.reshape(g.n, -1, g.oh, wq)
    return y if wq == g.ow else np.ascontiguousarray(y[:, :, :, :g.ow])


def forward_rows(g, x, w, block_elements=BLOCK_ELEMENTS):
    """y [N, C_out, OH, OW] of an ungrouped convolution: one product per block of output
    rows with the column matrix of the row phases (``block_elements``: the block's size)."""
    phases, wq = row_phases(g, x)
    y = run_product(tap_weights(g, w), forward_runs(g, phases, wq), g.oh * wq, block_elements)
    return crop_rows(g, y, wq)


def backward_data_rows(g, gy, w, block_elements=BLOCK_ELEMENTS):
    """gx [N, C_in, H, W] of an ungrouped convolution: each stride phase of the padded gx
    as one product over the taps that write it, on gy zero-padded and row-flattened.

    gx_padded[r + A*sh, s + B*sw] = sum over the taps (i, j) of phase (r, s) and over o of
    w[o, :, i, j] * gy[o, A - a_i, B - b_j]: a correlation of gy with the phase's taps,
    read at decreasing offsets. gy's rows get ``amax`` zero rows above and zeros to width
    ``wg`` (past the last tap's reach), so runs of ``Hq*wg`` read only gy or zeros.
    """
    (sh, sw) = g.stride
    top, bottom, left, right = g.padding
    hq, wq = -(-(g.h + top + bottom) // sh), -(-(g.w + left + right) // sw)
    amax = (g.kh - 1) * g.dilation[0] // sh
    bmax = (g.kw - 1) * g.dilation[1] // sw
    wg = max(wq, g.ow + bmax)
    padded = np.zeros((g.n, g.c_out, hq + amax + 1, wg), gy.dtype)
    padded[:, :, amax:amax + g.oh, bmax:bmax + g.ow] = gy
    source = padded.reshape(g.n, g.c_out, -1)
    gx = np.zeros(g.x_shape, gy.dtype)
    for t in tap_groups(g):
        run = TapRun(source, (amax - t.a0) * wg + bmax - t.b0, -t.a_step * wg, -t.b_step,
                     len(t.rows), len(t.columns))
        weights = w[:, :, list(t.rows)][:, :, :, list(t.columns)].transpose(1, 0, 2, 3)
        phase = run_product(weights.reshape(g.c_in, -1), [run], hq * wg, block_elements)
        phase = phase.reshape(g.n, g.c_in, hq, wg)
        a, first_row = _first_inside(t.r, sh, top)
        b, first_column = _first_inside(t.s, sw, left)
        target = gx[:, :, first_row::sh, first_column::sw]
        target[...] = phase[:, :, a:a + target.shape[2], b:b + target.shape[3]]
    return gx
