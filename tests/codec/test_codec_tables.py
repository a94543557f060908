"""Coding tables: bit-reproducible math, quantised PMFs, determinism, agreement
with the model's own density, and the model id."""
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.codec import tables as T
from gdnflow.io.checkpoint import load_checkpoint


def test_exact_math_matches_numpy(rng):
    x = np.concatenate([rng.uniform(-745, 709, 20000), rng.normal(0, 3, 20000), [0.0, -0.0]])
    assert np.max(np.abs(T.exact_exp(x) / np.exp(x) - 1)) < 2e-14
    t = np.concatenate([rng.uniform(0, 1, 20000), [0.0, 1e-300, 1e-12, 1.0]])
    assert np.allclose(T.exact_log1p(t), np.log1p(t), rtol=1e-15, atol=0)
    y = rng.normal(0, 5, 20000)
    assert np.max(np.abs(T.exact_tanh(y) - np.tanh(y))) < 1e-15
    assert np.allclose(T.exact_softplus(y), np.logaddexp(0, y), rtol=1e-14, atol=1e-300)
    assert np.allclose(T.exact_sigmoid(y), 1 / (1 + np.exp(-y)), rtol=1e-14, atol=0)


def test_quantize_pmf_sums_exactly_and_keeps_every_symbol(rng):
    for masses in (rng.dirichlet(np.full(40, 0.2)), np.r_[1.0, np.zeros(30)], np.zeros(5),
                   np.r_[1e-30, 1.0, 1e-12], rng.uniform(0, 1, 3000)):
        frequencies = T.quantize_pmf(masses, 16)
        assert frequencies.sum() == 1 << 16 and frequencies.min() >= 1
    # 1 + floor(share of 65534) = 49151 and 16384, fractions .5 and .5: the one
    # count left goes to the lower index (a tie).
    assert T.quantize_pmf(np.r_[0.75, 0.25], 16).tolist() == [49152, 16384]
    assert T.quantize_pmf(np.r_[0.2, 0.7, 0.1], 16).tolist() == [13108, 45874, 6554]
    with pytest.raises(ValueError):
        T.quantize_pmf([0.5, np.nan])


def fixed_bottleneck_state(channels=3):
    """Entropy-bottleneck parameters from closed-form arithmetic (no random generator):
    a golden input whose tables must never change."""
    widths = (1, 3, 3, 3, 3, 1)
    state = {}
    for k in range(5):
        shape = (channels, widths[k + 1], widths[k])
        state[f"entropy_bottleneck.matrices.{k}"] = (
            np.sin(np.arange(np.prod(shape)) * 0.7 + k).reshape(shape) - 0.5).astype(np.float32)
        state[f"entropy_bottleneck.biases.{k}"] = (
            np.cos(np.arange(channels * widths[k + 1]) * 1.3 + k)
            .reshape(channels, widths[k + 1], 1)).astype(np.float32)
        if k < 4:
            state[f"entropy_bottleneck.factors.{k}"] = (
                np.sin(np.arange(channels * widths[k + 1]) * 2.1 - k)
                .reshape(channels, widths[k + 1], 1)).astype(np.float32)
    medians = np.float32([0.25, -0.4, 0.0])
    state["entropy_bottleneck.quantiles"] = np.stack(
        [medians - np.float32([3.2, 5.5, 1.1]), medians, medians + np.float32([2.7, 6.1, 0.9])],
        axis=1)[:, None, :].astype(np.float32)
    return state


def test_golden_tables_are_the_same_on_every_machine():
    """The digest of tables built from fixed parameters: it changes only if the way
    tables are built changes (then TABLES_VERSION must change too, and old files
    are refused by their header's digest)."""
    tables = T.build_tables(fixed_bottleneck_state())
    assert tables.low.tolist() == [-4, -6, -2] and tables.high.tolist() == [3, 7, 1]
    assert [int(f) for f in tables.frequencies(2)] == GOLDEN_FREQUENCIES_2
    assert tables.digest().hex()[:32] == GOLDEN_DIGEST


GOLDEN_FREQUENCIES_2 = [142, 701, 3097, 10589, 51007]
GOLDEN_DIGEST = "ef6a60bda8dbe47b6eec353b34c29868"


def test_tables_are_deterministic_and_addressed_by_the_weights(model, checkpoint):
    first, second = T.build_tables(model), T.build_tables(model)
    assert first.digest() == second.digest()
    saved = load_checkpoint(checkpoint)
    arrays = {**saved["parameters"], **saved["buffers"]}
    from_file = T.build_tables(arrays)
    assert from_file.digest() == first.digest()
    assert from_file.model_id == first.model_id == T.model_id(model) == T.model_id(arrays)
    changed = dict(arrays)
    changed["g_s.0.bias"] = changed["g_s.0.bias"] + np.float32(1e-3)
    assert T.model_id(changed) != first.model_id


def test_tables_follow_the_models_density(model):
    tables = T.build_tables(model)
    eb = model.entropy_bottleneck
    quantiles = eb.quantiles.numpy()[:, 0, :]
    assert np.array_equal(tables.medians, quantiles[:, 1])
    for c in range(tables.channels):
        assert tables.low[c] <= 0 <= tables.high[c]
        assert tables.low[c] <= quantiles[c, 0] - quantiles[c, 1] + 0.5
        assert tables.high[c] >= quantiles[c, 2] - quantiles[c, 1] - 0.5
        cdf = tables.cdfs[c]
        assert cdf[0] == 0 and cdf[-1] == 1 << tables.precision and np.all(np.diff(cdf) >= 1)
    # The model's float32 likelihoods at median + v, v over the support of channel 0.
    c = 0
    v = np.arange(tables.low[c], tables.high[c] + 1)
    values = np.tile((tables.medians[:, None] + v[None, :]).astype(np.float32)[:, None, :], 1)
    with gf.no_grad():
        p = eb.likelihood(gf.tensor(values, device="numpy")).numpy()[c, 0]
    frequencies = tables.frequencies(c)
    share = frequencies[:-1] / 2.0 ** tables.precision
    # Quantisation moves each mass by at most about (alphabet size) / 2^16, plus float32 error.
    assert np.max(np.abs(share - p)) < (len(frequencies) + 2) / 2.0 ** 16
    assert math.isclose(frequencies[-1] / 2.0 ** 16, 1 - p.sum(),
                        abs_tol=len(frequencies) / 2.0 ** 16)


def test_diverged_model_is_refused(model):
    state = model.state_dict()
    state["entropy_bottleneck.quantiles"][0, 0, 1] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        T.build_tables(state)
