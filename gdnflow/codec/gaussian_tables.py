"""Coding tables of the Gaussian conditional: one table per scale of a fixed scale table.

The scale hyperprior codes each latent y[i] with a zero-mean Gaussian whose
standard deviation the hyper-synthesis predicts. A coder cannot have a table
per real number, so the scales are quantised to :data:`SCALE_COUNT` values
log-spaced from :data:`SCALE_MIN` to :data:`SCALE_MAX` (CompressAI's 64
scales from 0.11 to 256), and a predicted scale uses the first table scale
at or above it (:func:`scale_indexes`: scales are rounded up, never down, so
the coded density is a little wider than predicted, never narrower).

Per table scale s the integer support is [-c, c], c = ceil(:data:`TAIL_WIDTH` s):
beyond it each tail of N(0, s) holds less than 5e-10, which goes, with the
other tail, to the escape symbol (the escape mechanism of
:mod:`gdnflow.codec.tables`). The mass of integer v is the Gaussian's over
[v - 1/2, v + 1/2], evaluated as Phi((1/2 - |v|)/s) - Phi((-1/2 - |v|)/s)
(both in the left tail), and the masses are quantised to 16-bit frequencies
with :func:`~gdnflow.codec.tables.quantize_pmf`.

Determinism: these tables do not depend on the model, but encoder and decoder
must still build them bit for bit alike on any machine. The scales are
computed in decimal arithmetic (Python's ``decimal``: correctly rounded on
every platform) and rounded once to float64; the masses use
:func:`gdnflow.ops.gaussian.normal_cdf` with the IEEE-exact
:func:`~gdnflow.codec.tables.exact_exp` (only +, -, *, / otherwise).
Their :meth:`GaussianTables.digest` goes into every hyperprior file's header
through the codec's tables digest.
"""
import dataclasses
import decimal
import functools
import hashlib
import math

import numpy as np

from gdnflow.codec.tables import PRECISION, exact_exp, quantize_pmf
from gdnflow.ops.gaussian import normal_cdf

#: The fixed scale table: SCALE_COUNT scales log-spaced from SCALE_MIN to SCALE_MAX.
SCALE_MIN, SCALE_MAX, SCALE_COUNT = 0.11, 256.0, 64
#: Support half-width per unit of scale: Phi(-6.11) < 5e-10 (the entropy bottleneck's
#: tail mass, 1e-9, split over two tails).
TAIL_WIDTH = 6.11
TABLES_VERSION = b"gdnflow-gaussian-tables-1"


def scale_table():
    """The SCALE_COUNT table scales (float64, increasing): exp(linspace(ln min, ln max))."""
    with decimal.localcontext() as context:
        context.prec = 40
        low, high = decimal.Decimal(repr(SCALE_MIN)).ln(), decimal.Decimal(repr(SCALE_MAX)).ln()
        step = (high - low) / (SCALE_COUNT - 1)
        return np.array([float((low + k * step).exp()) for k in range(SCALE_COUNT)])


def scale_indexes(scales, table):
    """For each scale, the index of the first table scale >= it (0 below the table, last above).

    CompressAI's ``build_indexes``: the index is the number of table scales
    (the last one excepted) strictly below the scale.
    """
    return np.searchsorted(table[:-1], scales, side="left").astype(np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class GaussianTables:
    """One coding table per table scale (see the module docstring).

    Fields: ``scales`` float64 (S,); ``high`` int64 (S,), the supports
    [-high, high]; ``cdfs``, a tuple of S int64 arrays of length 2 high + 3
    rising from 0 to ``2**precision`` (the last symbol is the escape);
    ``precision``.
    """

    scales: np.ndarray
    high: np.ndarray
    cdfs: tuple
    precision: int

    def probabilities(self, index):
        """The symbol probabilities of table ``index`` (float64, exact multiples of 2^-precision)."""
        return np.diff(self.cdfs[index]) / float(1 << self.precision)

    def digest(self):
        """32-byte SHA-256 of the scales, supports and CDFs."""
        h = hashlib.sha256(TABLES_VERSION)
        h.update(np.array([self.precision, len(self.scales)], "<i8").tobytes())
        h.update(np.asarray(self.scales, "<f8").tobytes())
        for high, cdf in zip(self.high, self.cdfs):
            h.update(np.array([high], "<i8").tobytes())
            h.update(np.asarray(cdf, "<i8").tobytes())
        return h.digest()


@functools.lru_cache(maxsize=None)
def gaussian_tables(precision=PRECISION):
    """The :class:`GaussianTables` (built once per process: about 0.1 s)."""
    scales = scale_table()
    highs, cdfs = [], []
    for s in scales:
        high = math.ceil(TAIL_WIDTH * s)
        v = np.abs(np.arange(-high, high + 1, dtype=np.float64))
        masses = (normal_cdf((0.5 - v) / s, exp=exact_exp)
                  - normal_cdf((-0.5 - v) / s, exp=exact_exp))
        tails = 2.0 * normal_cdf(np.array([(-0.5 - high) / s]), exp=exact_exp)
        frequencies = quantize_pmf(np.append(masses, tails), precision)
        highs.append(high)
        cdfs.append(np.concatenate([[0], np.cumsum(frequencies)]).astype(np.int64))
    high = np.array(highs, np.int64)
    for array in (scales, high, *cdfs):          # shared by every caller: read-only
        array.flags.writeable = False
    return GaussianTables(scales=scales, high=high, cdfs=tuple(cdfs), precision=int(precision))
