"""The oracle: with known outcomes its choice has the best realised goodput."""

from __future__ import annotations

import itertools

import numpy as np

from control.goodput.optimizer import Constraints
from control.policy.oracle import hindsight_k, realised_goodput
from tests.conftest import make_profile


def _step(rng, n, K):
    ctx = rng.integers(50, 4000, size=n).astype(np.float64)
    L = rng.geometric(0.35, size=n) - 1
    return ctx, np.minimum(L, K)


def test_oracle_beats_every_uniform_k_and_random_choices():
    rng = np.random.default_rng(0)
    cost = make_profile().step_cost(["draft"])
    K = 8
    for _ in range(30):
        n = int(rng.integers(1, 60))
        ctx, L = _step(rng, n, K)
        cap = np.full(n, K)
        k, d = hindsight_k(cost, ctx, L[:, None], cap)
        g = realised_goodput(cost, ctx, k, L)
        assert np.all(k <= L)  # drafting past the accepted run only costs
        for u in range(K + 1):
            assert g >= realised_goodput(cost, ctx, np.full(n, u), L) - 1e-12
        for _ in range(50):
            assert g >= realised_goodput(cost, ctx, rng.integers(0, K + 1, size=n), L) - 1e-12


def test_oracle_is_exact_on_small_steps():
    rng = np.random.default_rng(1)
    cost = make_profile(draft=(2e-5, 0.01, 0.8)).step_cost(["draft"])
    for _ in range(20):
        n, K = 3, 4
        ctx, L = _step(rng, n, K)
        lag = rng.integers(0, 300, size=n)
        k, _ = hindsight_k(cost, ctx, L[:, None], np.full(n, K), lag=lag[:, None])
        g = realised_goodput(cost, ctx, k, L, lag=lag)
        best = max(realised_goodput(cost, ctx, np.array(c), L, lag=lag)
                   for c in itertools.product(range(K + 1), repeat=n))
        assert abs(g - best) < 1e-12


def test_oracle_respects_budget_and_slo():
    cost = make_profile().step_cost(["draft"])
    n = 20
    ctx = np.full(n, 500.0)
    L = np.full(n, 6)
    cons = Constraints(free_kv_slots=30, token_budget=n + 25, slo_tpot_ms=None)
    k, _ = hindsight_k(cost, ctx, L[:, None], np.full(n, 8), cons)
    assert k.sum() <= 25
    plain = cost.plain_ms(ctx)
    slo = plain * 1.3
    k2, _ = hindsight_k(cost, ctx, L[:, None], np.full(n, 8), Constraints(slo_tpot_ms=slo))
    assert cost.step_ms(ctx, k2) <= slo


def test_oracle_picks_per_request_drafters():
    prof = make_profile(draft=(2.5e-6, 0.003, 0.1))  # a cheap draft model: both drafters pay
    cost = prof.step_cost(["draft", "ngram"])
    n = 10
    ctx = np.full(n, 800.0)
    L = np.zeros((n, 2), dtype=np.int64)
    L[:5, 0] = 5  # the draft model is right for the first half
    L[5:, 1] = 5  # prompt lookup for the second
    k, d = hindsight_k(cost, ctx, L, np.full(n, 8))
    assert np.all(d[:5] == 0) and np.all(d[5:] == 1)
    assert np.all(k == 5)
    g = realised_goodput(cost, ctx, k, L[np.arange(n), d], d)
    for single in (0, 1):
        dd = np.full(n, single)
        assert g > realised_goodput(cost, ctx, np.full(n, 5), L[:, single], dd)
