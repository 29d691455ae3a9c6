"""Properties of the goodput optimiser that would catch real mistakes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.goodput.acceptance import chain_survival, expected_from_survival
from control.goodput.optimizer import (
    Constraints,
    admit_parametric,
    admit_slots,
    best_uniform_k,
    confidence_cuts,
    uniform_curve,
)
from control.plan import k_by_batch
from tests.conftest import make_profile

# Short context: per-pass overhead and per-token compute dominate (the usual small-context regime).
SHORT = make_profile(target=(1e-6, 0.04, 7.0), draft=(1e-7, 0.004, 0.9))
# KV-dominated: attention reads dominate (long contexts, MagicDec's regime); a sink+window drafter
# would be cheaper still, but even a plain draft model shows the effect.
LONG = make_profile(target=(4e-5, 0.04, 7.0), draft=(2e-6, 0.004, 0.9))


def _cost(profile, drafters=("draft",)):
    return profile.step_cost(list(drafters))


def _uniform_best(profile, batch, ctx, acc, max_k=8, **cons):
    cost = _cost(profile)
    surv = chain_survival(np.full(batch, acc), max_k)
    return best_uniform_k(cost, np.full(batch, ctx), surv, np.full(batch, max_k), Constraints(**cons))


@settings(max_examples=40, deadline=None)
@given(acc=st.floats(0.05, 0.95), ctx=st.sampled_from([128, 512, 1024]))
def test_short_context_k_non_increasing_in_batch(acc, ctx):
    ks = [int(_uniform_best(SHORT, b, ctx, acc).k.max(initial=0)) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert all(x >= y for x, y in zip(ks, ks[1:], strict=False)), ks


@settings(max_examples=40, deadline=None)
@given(batch=st.sampled_from([1, 4, 16, 64, 256]), ctx=st.sampled_from([128, 1024, 8192]))
def test_k_non_decreasing_in_acceptance(batch, ctx):
    for profile in (SHORT, LONG):
        ks = [int(_uniform_best(profile, batch, ctx, a).k.max(initial=0)) for a in np.linspace(0.05, 0.95, 19)]
        assert all(x <= y for x, y in zip(ks, ks[1:], strict=False)), ks


def test_long_context_keeps_speculation_at_large_batch():
    """MagicDec: with KV-dominated costs the optimum at large batch is larger than at short context,
    and k can grow with batch size (the per-pass overhead gets amortised, the KV term does not)."""
    acc = 0.7
    short_k = int(_uniform_best(LONG, 256, 256, acc).k.max())
    long_k = int(_uniform_best(LONG, 256, 32768, acc).k.max())
    assert long_k > short_k
    ks = k_by_batch(LONG.step_cost(["draft"]), 32768, acc, 8, 256)
    assert ks[-1] >= ks[0]
    assert (ks > 0).all()


def test_unimodal_early_stop_matches_full_scan():
    rng = np.random.default_rng(0)
    for _ in range(200):
        b = int(rng.integers(1, 200))
        ctx = rng.integers(64, 16000, b)
        acc = rng.uniform(0.05, 0.95)
        cost = _cost(SHORT if rng.random() < 0.5 else LONG)
        surv = chain_survival(np.full(b, acc), 8)
        cap = np.full(b, 8)
        fast = best_uniform_k(cost, ctx, surv, cap, Constraints(), early_stop=True)
        full = uniform_curve(cost, ctx, surv, cap, Constraints())
        assert int(fast.k.max(initial=0)) == full.best


def _random_batch(rng, n, K=8):
    ctx = rng.integers(64, 20000, n).astype(float)
    rates = rng.uniform(0.05, 0.97, n)
    decay = rng.uniform(0.8, 1.0)
    surv = np.cumprod(rates[:, None] * decay ** np.arange(K)[None, :], axis=1)
    cap = rng.integers(0, K + 1, n)
    return ctx, surv, cap


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 96), two=st.booleans())
def test_request_level_never_predicts_less_than_step_level(seed, n, two):
    rng = np.random.default_rng(seed)
    ctx, surv, cap = _random_batch(rng, n)
    profile = LONG if rng.random() < 0.5 else SHORT
    cost = _cost(profile, ("draft", "ngram") if two else ("draft",))
    drafter = rng.integers(0, 2, n) if two else None
    lag = rng.integers(0, 50, n) * (rng.random(n) < 0.3)
    cons = Constraints(free_kv_slots=int(rng.integers(0, 8 * n + 1)), token_budget=int(n + rng.integers(0, 8 * n + 1)))
    step = best_uniform_k(cost, ctx, surv, cap, cons, drafter=drafter, lag=lag, early_stop=False)
    sorted_scan = admit_slots(cost, ctx, surv, cap, cons, drafter=drafter, lag=lag)
    warm = float(rng.uniform(0.1, 20.0))
    for req in (sorted_scan, admit_parametric(cost, ctx, surv, cap, cons, drafter, lag),
                admit_parametric(cost, ctx, surv, cap, cons, drafter, lag, g0=warm)):
        assert req.goodput >= step.goodput * (1 - 1e-9)
        # the prediction it reports is the cost model's and the survival model's for the k it returns
        assert req.step_ms == pytest.approx(cost.step_ms(ctx, req.k, drafter, lag))
        assert req.tokens == pytest.approx(float(expected_from_survival(surv, req.k).sum()))
        assert (req.k <= cap).all() and (req.k >= 0).all()
        assert req.k.sum() <= cons.free_kv_slots and n + req.k.sum() <= cons.token_budget
    unconstrained = Constraints()
    exact = admit_parametric(cost, ctx, surv, cap, unconstrained, drafter, lag)
    assert exact.goodput >= admit_slots(cost, ctx, surv, cap, unconstrained, drafter, lag).goodput * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 64), slo=st.floats(5.0, 40.0), q=st.sampled_from([None, 0.9, 0.99]))
def test_no_slo_infeasible_choice_is_returned(seed, n, slo, q):
    rng = np.random.default_rng(seed)
    ctx, surv, cap = _random_batch(rng, n)
    profile = make_profile(target=(4e-6, 0.04, 7.0), resid=float(rng.uniform(0, 2)))
    cost = _cost(profile)
    cons = Constraints(slo_tpot_ms=slo, slo_quantile=q)
    margin = cons.slo_margin_ms(cost.step_std_ms())
    for choice in (best_uniform_k(cost, ctx, surv, cap, cons), admit_slots(cost, ctx, surv, cap, cons),
                   admit_parametric(cost, ctx, surv, cap, cons)):
        if choice.k.max(initial=0) > 0:
            assert choice.step_ms + margin <= slo + 1e-9
    curve = uniform_curve(cost, ctx, surv, cap, cons)
    assert all(not f or k == 0 or t + margin <= slo + 1e-9 for k, t, f in zip(curve.k, curve.step_ms, curve.feasible, strict=True))


def test_parametric_admission_is_exactly_optimal_against_brute_force():
    import itertools

    rng = np.random.default_rng(6)
    for profile in (SHORT, LONG):
        cost = _cost(profile)
        for _ in range(40):
            n, K = 3, 3
            ctx = rng.integers(100, 30000, n).astype(float)
            surv = np.cumprod(rng.uniform(0.1, 0.99, (n, K)), axis=1)
            lag = rng.integers(0, 200, n) * (rng.random(n) < 0.5)
            best = max(
                float(expected_from_survival(surv, np.array(ks)).sum()) / cost.step_ms(ctx, np.array(ks), None, lag)
                for ks in itertools.product(range(K + 1), repeat=n)
            )
            got = admit_parametric(cost, ctx, surv, np.full(n, K), Constraints(), lag=lag)
            assert got.goodput == pytest.approx(best)


def test_admission_is_exactly_optimal_over_slot_counts_without_draft_cost():
    """With drafting already paid (verifier pruning), cost depends only on the number of slots, so
    admitting the top-S survivals is optimal; check against brute force over all k vectors."""
    import itertools

    rng = np.random.default_rng(5)
    cost = _cost(SHORT)
    for _ in range(30):
        n, K = 3, 3
        ctx = rng.integers(100, 3000, n).astype(float)
        surv = np.cumprod(rng.uniform(0.1, 0.99, (n, K)), axis=1)
        best = 0.0
        for ks in itertools.product(range(K + 1), repeat=n):
            k = np.array(ks)
            t = cost.verify_ms(ctx, k) + cost.overhead_ms
            best = max(best, float(expected_from_survival(surv, k).sum()) / t)
        got = admit_slots(cost, ctx, surv, np.full(n, K), Constraints(), draft_sunk=True)
        assert got.goodput == pytest.approx(best)


def test_confidence_cut_is_the_marginal_break_even():
    cost = _cost(SHORT)
    ctx = np.full(8, 1000.0)
    surv = chain_survival(np.full(8, 0.8), 8)
    choice = best_uniform_k(cost, ctx, surv, np.full(8, 8), Constraints())
    cut = confidence_cuts(cost, ctx, choice)
    # one more token at exactly the cut leaves goodput unchanged (to first order)
    dT = cost.target.b + cost.drafters[0].model.a * (ctx[0] + choice.k[0]) + cost.drafters[0].model.b
    assert cut[0] == pytest.approx(choice.goodput * dT)
    assert ((choice.tokens + cut[0]) / (choice.step_ms + dT)) == pytest.approx(choice.goodput)


def test_admit_parametric_at_batch_1_is_the_best_k_by_enumeration():
    """The one-request fast path must agree with the cost model's own best k, for each drafter kind."""
    from control.goodput.optimizer import admit_parametric

    rng = np.random.default_rng(0)
    for prof_args in ({}, {"target": (5e-5, 0.0105, 5.0), "draft": (1.3e-5, 0.0013, 1.1)}):
        cost = make_profile(**prof_args).step_cost(["draft", "ngram"])
        for _ in range(200):
            ctx = rng.integers(10, 3000, 1).astype(float)
            surv = chain_survival(rng.beta(3, 2, 1), 8)
            cap = rng.integers(0, 9, 1)
            d = np.array([rng.integers(0, 2)])
            c = admit_parametric(cost, ctx, surv, cap, Constraints(), drafter=d)
            good = [(1 + surv[0, :k].sum()) / cost.step_ms(ctx, np.array([k]), d) for k in range(int(cap[0]) + 1)]
            assert c.goodput >= max(good) * (1 - 1e-9) and c.k[0] <= cap[0]
            assert np.isclose(c.step_ms, cost.step_ms(ctx, c.k, d))
