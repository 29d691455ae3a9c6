"""Accepted-length models against Monte Carlo of the acceptance processes they describe."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from control.goodput.acceptance import (
    chain_expected,
    chain_survival,
    confidence_survival,
    expected_from_survival,
    positional_expected,
    tree_batched_tokens,
    tree_expected,
)
from control.goodput.estimators import PositionRates, RequestBeta, chain_trials
from control.policy.types import position_counts

rates = st.floats(min_value=0.0, max_value=0.98)


def _simulate_chain(rng, cond_rates, k, n):
    """Generated tokens per step when position j is accepted w.p. cond_rates[j] given all before."""
    u = rng.random((n, k)) < np.asarray(cond_rates)[None, :k]
    accepted = np.where(u.all(axis=1), k, np.argmin(u, axis=1))
    return accepted + 1


@settings(max_examples=30, deadline=None)
@given(alpha=rates, k=st.integers(0, 8))
def test_chain_expected_matches_monte_carlo(alpha, k):
    rng = np.random.default_rng(0)
    n = 40_000
    mc = _simulate_chain(rng, np.full(k, alpha), k, n).mean() if k else 1.0
    pred = float(chain_expected(alpha, k))
    # 5 standard errors of the mean of a variable bounded by k + 1
    assert abs(mc - pred) <= 5 * (k + 1) / np.sqrt(n) + 1e-9


@settings(max_examples=30, deadline=None)
@given(cond=st.lists(rates, min_size=1, max_size=8), data=st.data())
def test_positional_expected_matches_monte_carlo(cond, data):
    k = data.draw(st.integers(0, len(cond)))
    rng = np.random.default_rng(1)
    n = 40_000
    mc = _simulate_chain(rng, cond, k, n).mean() if k else 1.0
    pred = float(positional_expected(np.asarray(cond), np.array(k)))
    assert abs(mc - pred) <= 5 * (k + 1) / np.sqrt(n) + 1e-9


def test_chain_is_positional_with_equal_rates():
    a = np.array([0.3, 0.7, 0.95])
    for k in range(6):
        np.testing.assert_allclose(chain_expected(a, k), expected_from_survival(chain_survival(a, 8), np.full(3, k)))
    assert chain_expected(1.0, 4) == 5.0


@settings(max_examples=25, deadline=None)
@given(heads=st.lists(st.tuples(rates, st.integers(1, 3)), min_size=1, max_size=4))
def test_tree_expected_matches_monte_carlo(heads):
    alphas = np.array([h[0] for h in heads])
    ks = np.array([h[1] for h in heads])
    rng = np.random.default_rng(2)
    n = 40_000
    # head j hits if any of its k_j independent candidates is accepted; stop at the first miss
    hit = (rng.random((n, len(heads), 3)) < alphas[None, :, None]) & (np.arange(3)[None, None, :] < ks[None, :, None])
    hit = hit.any(axis=2)
    depth = np.where(hit.all(axis=1), len(heads), np.argmin(hit, axis=1))
    mc = (depth + 1).mean()
    assert abs(mc - tree_expected(alphas, ks)) <= 5 * (len(heads) + 1) / np.sqrt(n)
    assert tree_batched_tokens(ks) == int(np.cumprod(ks).sum())


def test_confidence_survival_is_running_product_and_ignores_undrafted():
    conf = np.array([[0.9, 0.5, np.nan], [1.0, 1.0, 1.0]])
    s = confidence_survival(conf)
    np.testing.assert_allclose(s, [[0.9, 0.45, 0.0], [1.0, 1.0, 1.0]])


def test_chain_mle_estimator_is_unbiased_where_accepted_over_drafted_is_not():
    rng = np.random.default_rng(3)
    alpha, k, n = 0.6, 6, 50_000
    acc = _simulate_chain(rng, np.full(k, alpha), k, n) - 1
    verified = np.full(n, k)
    s, t = chain_trials(verified, acc)
    mle = s.sum() / t.sum()
    naive = acc.sum() / verified.sum()
    assert abs(mle - alpha) < 0.01
    assert naive < alpha - 0.1  # the naive ratio is badly biased for long drafts


def test_position_rates_recover_decaying_acceptance():
    rng = np.random.default_rng(4)
    cond = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    acc = _simulate_chain(rng, cond, 5, 30_000) - 1
    pr = PositionRates(5, prior=0.5, decay=1.0)
    pr.update(np.full(acc.size, 5), acc)
    np.testing.assert_allclose(pr.rates, cond, atol=0.02)
    trials, succ = position_counts(np.full(acc.size, 5), acc, 5)
    np.testing.assert_array_equal(trials, pr.trials.astype(int))
    np.testing.assert_array_equal(succ, pr.succ.astype(int))


def test_request_beta_starts_at_prior_and_moves_toward_own_rate():
    rb = RequestBeta(strength=8.0, capacity=4)
    slots = np.array([0, 1])
    np.testing.assert_allclose(rb.mean(slots, np.array([0.5, 0.5])), [0.5, 0.5])
    rb.update(np.array([0]), np.array([90.0]), np.array([100.0]))
    rb.update(np.array([1]), np.array([10.0]), np.array([100.0]))
    m = rb.mean(slots, np.array([0.5, 0.5]))
    assert 0.85 < m[0] < 0.9 and 0.1 < m[1] < 0.15
    rb.reset(np.array([0]))
    assert rb.mean(np.array([0]), 0.5)[0] == 0.5


def test_confidence_map_learns_a_nonlinear_calibration_and_inverts_it():
    """Survival per running confidence as measured on the CPU pair's draft model: 0.013 -> 0.39,
    0.07 -> 0.62, >= 0.45 -> 1. The map reproduces it per bin (one ratio cannot), and the raw cut
    for a survival cut lands where the measured survival crosses it."""
    from control.goodput.estimators import ConfidenceMap

    rng = np.random.default_rng(0)
    xs = np.array([0.001, 0.013, 0.073, 0.24, 0.46, 0.9])
    ys = np.array([0.2, 0.39, 0.62, 0.78, 0.98, 1.0])
    cm = ConfidenceMap()
    for _ in range(300):
        prod = xs[rng.integers(len(xs), size=64)]
        hit = rng.random(64) < np.interp(np.log10(prod), np.log10(xs), ys)
        cm.update(prod, hit)
    np.testing.assert_allclose(cm.survival(xs), ys, atol=0.08)
    assert np.all(np.diff(cm.curve()) >= 0)
    raw = cm.raw_cut(np.array([0.1, 0.5, 0.7]))
    assert raw[0] < 0.002  # every measured bin survives more than 0.1 of the time: stop almost never
    assert 0.013 < raw[1] < 0.073 and 0.073 < raw[2] < 0.24  # between the measured points around each cut
    assert np.all(np.diff(raw) >= 0)
    fresh = ConfidenceMap()  # the identity until measured: a cut maps to itself; one no bin reaches stops all
    np.testing.assert_allclose(fresh.raw_cut(np.array([0.01, 0.3])), [0.01, 0.3], rtol=0.05)
    assert fresh.raw_cut(np.array([0.99]))[0] == 1.0
    # a ratio of totals would have put the 0.5 cut at a product of about 0.5 / 4 (clipped) or worse
    assert cm.survival(np.array([0.013]))[0] > 10 * 0.013
