"""Entropy-coding tables of a trained entropy bottleneck, computed the same on every machine.

Per latent channel c the tables hold (CompressAI's ``update()``, in integers):

``medians[c]``
    the channel's median, the middle learned quantile (float32, exactly the
    model's value): latents are coded as the integers q = round(y - median)
    and decoded as y_hat = q + median, as the model's evaluation path
    rounds them.
``low[c] <= 0 <= high[c]``
    the integer support [low, high] of q: low = -ceil(median - quantile_low)
    and high = ceil(quantile_high - median) from the outer learned quantiles
    (each tail outside them holds ``tail_mass / 2`` = 5e-10 of the density),
    each side capped at :data:`MAX_OFFSET`.
``frequencies[c]``
    L + 2 cumulative counts (a CDF) over the alphabet of L + 1 symbols,
    L = high - low + 1: symbol k < L is the integer low + k, symbol L the
    *escape*. The mass of integer v is the density's mass of the bin
    [median + v - 1/2, median + v + 1/2]; the escape's is both tails
    together. Masses are quantised to ``2**precision`` (16 bits) with every
    symbol at least 1, so every value stays codable.

Escape (values outside the support): the escape symbol is coded in place of
the value, then the distance d past the support (d = q - high > 0 above it,
d = q - low < 0 below it) is written as an Elias-gamma code of the zigzag
number n = 2d - 1 (d > 0) or -2d (d < 0) in a raw bit section after the
entropy-coded payload (see :mod:`gdnflow.codec.format`). A well-trained
bottleneck escapes about once per 10^9 values; the mechanism keeps a
badly trained or diverged model correct rather than efficient.

Determinism: the encoder and decoder must build bit-identical tables, on any
machine. The density is therefore evaluated here in float64 from the
checkpoint's parameters with only +, -, *, / and rounding, which IEEE 754
specifies exactly: NumPy's own ``exp``, ``log``, ``tanh`` and BLAS matmuls
pick CPU-specific SIMD code paths that may differ in the last bit, which
could move a frequency across a rounding boundary. ``exp`` and ``log1p``
below are a fixed range reduction and polynomial; the 3x3 "matmuls" of the
density are explicit sums in a fixed order; the normaliser is ``math.fsum``
(exactly rounded). The tables are a pure function of the parameters,
addressed by :func:`model_id` (a hash of the parameters); their own
:meth:`CodingTables.digest` goes into each file's header so that a reader
whose tables differ (another gdnflow version) refuses the file.
"""
import dataclasses
import hashlib
import math

import numpy as np

#: Bits of the quantised CDFs: every symbol's frequency is an integer >= 1 of 2**16.
PRECISION = 16
#: Largest |low| and |high| of a support: a channel of at most 2 * 1024 + 1
#: integers (beyond them, the escape), which keeps every alphabet far below
#: 2**PRECISION symbols.
MAX_OFFSET = 1024
#: Prefix of the tables' digest: a change to how tables are built must change it.
TABLES_VERSION = b"gdnflow-codec-tables-1"

# ------------------------------------------------- bit-reproducible math --
# ln 2 split for Cody-Waite range reduction (fdlibm's constants): k * LN2_HI
# is exact for |k| < 2^11, so x - k ln 2 loses nothing.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
# exp(r) for |r| <= ln(2)/2 by its Taylor polynomial of degree 13: the
# remainder is below 4e-18 relative. Coefficients 1/k!, highest first.
_EXP_COEFFICIENTS = tuple(1.0 / math.factorial(k) for k in range(13, -1, -1))
# log1p(t) = 2 atanh(z), z = t / (2 + t) <= 1/3 for t in [0, 1]: 18 odd terms
# of atanh's series leave less than 1e-17. Coefficients 1/(2n+1), highest first.
_ATANH_COEFFICIENTS = tuple(1.0 / (2 * n + 1) for n in range(17, -1, -1))


def exact_exp(x):
    """e**x of a float64 array with IEEE-exact operations only (the same bits on any machine).

    Relative error below 1e-15; x is clipped to [-745, 709] (0 and a large
    finite value beyond).
    """
    x = np.clip(np.asarray(x, np.float64), -745.0, 709.0)
    k = np.rint(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = np.full_like(r, _EXP_COEFFICIENTS[0])
    for c in _EXP_COEFFICIENTS[1:]:
        p = p * r + c            # two operations: NumPy never fuses them into an FMA
    return np.ldexp(p, k.astype(np.int32))


def exact_log1p(t):
    """log(1 + t) for t in [0, 1] (float64), IEEE-exact operations only; relative error < 1e-15."""
    t = np.asarray(t, np.float64)
    z = t / (2.0 + t)
    w = z * z
    s = np.full_like(z, _ATANH_COEFFICIENTS[0])
    for c in _ATANH_COEFFICIENTS[1:]:
        s = s * w + c
    return 2.0 * z * s


def exact_softplus(x):
    """log(1 + e**x) = max(x, 0) + log1p(e**-|x|), from the two functions above."""
    x = np.asarray(x, np.float64)
    return np.maximum(x, 0.0) + exact_log1p(exact_exp(-np.abs(x)))


def exact_tanh(x):
    """tanh(x) = sign(x) (1 - e) / (1 + e), e = e**(-2|x|): absolute error below 1e-15."""
    x = np.asarray(x, np.float64)
    e = exact_exp(-2.0 * np.abs(x))
    return np.sign(x) * ((1.0 - e) / (1.0 + e))


def exact_sigmoid(x):
    """1 / (1 + e**-x), from :func:`exact_exp`."""
    return 1.0 / (1.0 + exact_exp(-np.asarray(x, np.float64)))


# ------------------------------------------------------------ model id --
def model_id(arrays):
    """SHA-256 of a model's parameters and buffers: 32 bytes naming exactly these weights.

    ``arrays``: a module (its ``state_dict()``) or {dotted name: array}, as
    a checkpoint's ``parameters`` and ``buffers`` merged. Names are hashed in
    sorted order with each array's little-endian dtype, shape and bytes, so
    the same weights give the same id from a model on any device or from
    its checkpoint file.
    """
    if hasattr(arrays, "state_dict"):
        arrays = arrays.state_dict()
    digest = hashlib.sha256(b"gdnflow-model-id-1")
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.digest()


# ------------------------------------------------------------- density --
def cdf_logits(matrices, biases, factors, x):
    """The entropy bottleneck's CDF logits c(x) in float64, bit-reproducibly.

    ``matrices[k]`` (C, r', r) before softplus, ``biases[k]`` (C, r', 1),
    ``factors[k]`` (C, r', 1) before tanh (one fewer than matrices); ``x``
    (C, 1, K). The chain of :class:`~gdnflow.models.entropy_bottleneck.EntropyBottleneck`
    (module docstring there), with each (C, r', r) @ (C, r, K) product
    summed over r in a fixed order.
    """
    f = np.asarray(x, np.float64)
    for k, matrix in enumerate(matrices):
        weights = exact_softplus(matrix)
        g = weights[:, :, 0:1] * f[:, 0:1, :]
        for j in range(1, weights.shape[2]):
            g = g + weights[:, :, j:j + 1] * f[:, j:j + 1, :]
        g = g + np.asarray(biases[k], np.float64)
        if k < len(factors):
            g = g + exact_tanh(factors[k]) * exact_tanh(g)
        f = g
    return f


def quantize_pmf(masses, precision=PRECISION):
    """Integer frequencies (int64) of ``masses``: each >= 1, summing to exactly ``2**precision``.

    Each symbol gets 1 plus the floor of its share of the remaining
    2**precision - n; what the floors leave is given, one each, to the
    symbols of largest fractional part (ties: the lower index). Integer
    arithmetic after one exactly rounded division per symbol:
    deterministic.
    """
    masses = np.asarray(masses, np.float64)
    n, total = len(masses), 1 << precision
    if n < 1 or n > total:
        raise ValueError(f"quantize_pmf: {n} symbols do not fit {precision}-bit frequencies")
    if not np.all(np.isfinite(masses)) or np.any(masses < 0):
        raise ValueError("quantize_pmf: masses must be finite and non-negative")
    norm = math.fsum(masses.tolist())
    if norm <= 0:
        masses, norm = np.ones(n), float(n)      # no information: uniform
    scaled = masses / norm * (total - n)
    floors = np.floor(scaled)
    frequencies = 1 + floors.astype(np.int64)
    left = total - int(frequencies.sum())
    if left > 0:
        order = np.argsort(-(scaled - floors), kind="stable")
        frequencies[order[:left]] += 1
    while left < 0:
        # Only reachable by rounding in the division: take from the largest.
        frequencies[int(np.argmax(frequencies))] -= 1
        left += 1
    return frequencies


# -------------------------------------------------------------- tables --
@dataclasses.dataclass(frozen=True, eq=False)
class CodingTables:
    """Per-channel coding tables of an entropy bottleneck (see the module docstring).

    Fields: ``medians`` float32 (C,); ``low``, ``high`` int64 (C,), the
    supports; ``cdfs``: a tuple of C int64 arrays, ``cdfs[c]`` of length
    L_c + 2 rising from 0 to ``2**precision`` (symbol k has frequency
    ``cdfs[c][k+1] - cdfs[c][k]``; the last symbol is the escape);
    ``precision``; ``model_id`` (32 bytes, :func:`model_id` of the weights
    the tables come from).
    """

    medians: np.ndarray
    low: np.ndarray
    high: np.ndarray
    cdfs: tuple
    precision: int
    model_id: bytes

    @property
    def channels(self):
        """C, the number of latent channels."""
        return len(self.medians)

    def frequencies(self, channel):
        """Integer frequencies (L + 1,) of ``channel``'s symbols, the escape last."""
        return np.diff(self.cdfs[channel])

    def probabilities(self, channel):
        """``frequencies(channel) / 2**precision`` as float64: exactly representable values."""
        return self.frequencies(channel) / float(1 << self.precision)

    def digest(self):
        """32-byte SHA-256 of everything the coder uses: precision, medians, supports, CDFs."""
        h = hashlib.sha256(TABLES_VERSION)
        h.update(np.array([self.precision, self.channels], "<i8").tobytes())
        h.update(np.asarray(self.medians, "<f4").tobytes())
        for c in range(self.channels):
            h.update(np.array([self.low[c], self.high[c]], "<i8").tobytes())
            h.update(np.asarray(self.cdfs[c], "<i8").tobytes())
        return h.digest()


def bottleneck_arrays(arrays, prefix="entropy_bottleneck."):
    """(matrices, biases, factors, quantiles) as NumPy arrays from a state dict.

    ``arrays``: {dotted name: array} of a model (``model.state_dict()``, or a
    checkpoint's parameters), whose entropy bottleneck sits under ``prefix``.
    """
    def listed(kind):
        out, k = [], 0
        while f"{prefix}{kind}.{k}" in arrays:
            out.append(np.asarray(arrays[f"{prefix}{kind}.{k}"]))
            k += 1
        return out

    matrices, biases, factors = listed("matrices"), listed("biases"), listed("factors")
    key = f"{prefix}quantiles"
    if not matrices or key not in arrays:
        raise KeyError(f"no entropy bottleneck under {prefix!r} (expected {prefix}matrices.0 "
                       f"... and {key})")
    return matrices, biases, factors, np.asarray(arrays[key])


def build_tables(arrays, precision=PRECISION, prefix="entropy_bottleneck."):
    """The :class:`CodingTables` of the entropy bottleneck in ``arrays`` (a model or a state dict).

    Raises ValueError if the quantiles or the density are not finite (a
    diverged model).
    """
    if hasattr(arrays, "state_dict"):
        arrays = arrays.state_dict()
    matrices, biases, factors, quantiles = bottleneck_arrays(arrays, prefix)
    if not np.all(np.isfinite(quantiles)):
        raise ValueError("the entropy bottleneck's quantiles are not finite (a diverged model?)")
    medians32 = np.asarray(quantiles[:, 0, 1], np.float32)
    q = np.asarray(quantiles, np.float64)[:, 0, :]
    medians = medians32.astype(np.float64)
    low = -np.clip(np.ceil(medians - q[:, 0]), 0, MAX_OFFSET).astype(np.int64)
    high = np.clip(np.ceil(q[:, 2] - medians), 0, MAX_OFFSET).astype(np.int64)
    lengths = high - low + 1
    # Bin edges median + v -/+ 1/2 for v = low ... high: L + 1 edges per
    # channel on a common grid (longer channels' extra edges are unused).
    steps = np.arange(int(lengths.max()) + 1, dtype=np.float64)
    edges = (medians + low - 0.5)[:, None] + steps[None, :]
    logits = cdf_logits(matrices, biases, factors, edges[:, None, :])[:, 0, :]
    if not np.all(np.isfinite(logits)):
        raise ValueError("the entropy bottleneck's density is not finite (a diverged model?)")
    cdfs = []
    for c in range(len(medians)):
        lo, hi = logits[c, :lengths[c]], logits[c, 1:lengths[c] + 1]
        # The mass of each bin, taken in the tail where it is small (the sign trick).
        sign = np.where(lo + hi > 0, -1.0, 1.0)
        masses = np.abs(exact_sigmoid(sign * hi) - exact_sigmoid(sign * lo))
        tails = exact_sigmoid(logits[c, 0]) + exact_sigmoid(-logits[c, lengths[c]])
        frequencies = quantize_pmf(np.append(masses, tails), precision)
        cdfs.append(np.concatenate([[0], np.cumsum(frequencies)]).astype(np.int64))
    return CodingTables(medians=medians32, low=low, high=high, cdfs=tuple(cdfs),
                        precision=int(precision), model_id=model_id(arrays))
