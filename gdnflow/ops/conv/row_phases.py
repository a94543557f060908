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
(:func:`tap_columns`), and depthwise taps are plain slices.
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


def row_phases(g, x):
    """(phases [N, sh, sw, C_in, (Hq + 1)*Wq], Wq): x zero-padded by ``g.padding``, split
    into its stride phases, each Hq x Wq (zeros past the padded input) plus one spare
    zero row, so that every tap's run of OH*Wq values lies inside its phase."""
    (sh, sw) = g.stride
    top, bottom, left, right = g.padding
    height, width = g.h + top + bottom, g.w + left + right
    hq, wq = -(-height // sh), -(-width // sw)
    phases = np.zeros((g.n, sh, sw, g.c_in, hq + 1, wq), x.dtype)
    if (sh, sw) == (1, 1):
        phases[:, 0, 0, :, top:top + g.h, left:left + g.w] = x
    else:
        padded = np.zeros((g.n, g.c_in, height, width), x.dtype)
        padded[:, :, top:top + g.h, left:left + g.w] = x
        for r in range(sh):
            for s in range(sw):
                phase = padded[:, :, r::sh, s::sw]
                phases[:, r, s, :, :phase.shape[2], :phase.shape[3]] = phase
    return phases.reshape(g.n, sh, sw, g.c_in, (hq + 1) * wq), wq


def tap_columns(g, phases, wq):
    """[N, K, OH*Wq]: the column matrix on row-flattened phases, K = C_in*kh*kw ordered
    (tap group, channel, kernel row, kernel column) as :func:`tap_weights` orders w.

    One contiguous copy per tap group: its channels and taps are a strided view
    of the phase.
    """
    length = g.oh * wq
    groups = tap_groups(g)
    columns = np.empty((g.n, g.c_in * g.kh * g.kw, length), phases.dtype)
    k = 0
    for t in groups:
        phase = phases[:, t.r, t.s]                       # [N, C, (Hq + 1)*Wq]
        item = phase.itemsize
        start = phase[:, :, t.a0 * wq + t.b0:]
        view = as_strided(start, (g.n, g.c_in, len(t.rows), len(t.columns), length),
                          (phase.strides[0], phase.strides[1], t.a_step * wq * item,
                           t.b_step * item, item), writeable=False)
        rows = g.c_in * len(t.rows) * len(t.columns)
        columns[:, k:k + rows].reshape(view.shape)[...] = view
        k += rows
    return columns


def tap_weights(g, w):
    """w [C_out, C_in, kh, kw] as [C_out, K] in :func:`tap_columns`' order of K."""
    return np.concatenate([w[:, :, list(t.rows)][:, :, :, list(t.columns)].reshape(g.c_out, -1)
                           for t in tap_groups(g)], axis=1)


def crop_rows(g, y_rows, wq):
    """[N, C, OH*Wq] computed on phase rows -> [N, C, OH, OW] contiguous (the run's
    spill past each row cut off)."""
    y = y_rows.reshape(g.n, -1, g.oh, wq)
    return y if wq == g.ow else np.ascontiguousarray(y[:, :, :, :g.ow])


def tap_slices(g, phases, wq):
    """Yield (kernel row i, kernel column j, [N, C_in, OH*Wq] view): each tap's input."""
    length = g.oh * wq
    for t in tap_groups(g):
        for ai, i in enumerate(t.rows):
            for bj, j in enumerate(t.columns):
                start = (t.a0 + ai * t.a_step) * wq + t.b0 + bj * t.b_step
                yield i, j, phases[:, t.r, t.s, :, start:start + length]
