"""The oracle: with known outcomes its choice has the best realised goodput."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from control.bench.simrun import SimSetup, measure_capacity, run_policy, workload_at
from control.bench.workloads import poisson
from control.goodput.optimizer import Constraints
from control.policy.oracle import hindsight_k, realised_goodput
from control.profile import load_profile
from tests.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]


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


# every fixed k (none included) is in the oracle's hindsight family, so it bounds those by construction
CAUSAL = ("smartspec", "turbospec", "specserve", "static-schedule", "hf-heuristic", "adaptive")


@pytest.mark.parametrize("pair,prompt,output,load,n", [
    # Mooncake's lengths at a quarter scale (mean 3009 +- 3950 in, 86 +- 62 out), past capacity
    ("h100/llama-3.1-8b+llama-3.2-1b", "lognormal:3000:4000", "lognormal:86:62", 1.1, 1500),
    ("a100/llama-2-7b+llama-160m", "lognormal:300:250", "lognormal:250:200", 0.9, 400),
])
def test_oracle_goodput_bounds_every_causal_policy_on_the_same_arrivals(pair, prompt, output, load, n):
    """Goodput = generated tokens per busy second, so the bound is on busy time. The step-greedy
    oracle lost to adaptive by 0.3% here (1.2% on Mooncake itself): maximising each step's own
    tokens / ms is not maximising the run's; its price rounds (Dinkelbach on the run's goodput)
    close that. At light load fixed:1 beat the priced oracle by 0.1% on ShareGPT (H100), which the
    hindsight choice among fixed k closes."""
    prof = load_profile(ROOT / f"profiles/{pair}.yaml")
    setup = SimSetup(prof, poisson(n, 1.0, prompt, output, seed=2))
    w = workload_at(setup, load * measure_capacity(setup, requests=300), n, 0)
    oracle = run_policy(setup, w, "oracle", 0)
    for p in CAUSAL:
        r = run_policy(setup, w, p, 0)
        assert r.output_tokens.sum() == oracle.output_tokens.sum()
        assert oracle.busy_s <= r.busy_s * (1 + 1e-9), (p, oracle.busy_s, r.busy_s)


def test_oracle_bounds_every_causal_policy_under_batch_expansion():
    """On vLLM's verification by batch expansion (each verified draft token re-reads its request's
    KV; the oracle's slot costs carry it), past the crossover where speculation stops paying."""
    from control.buildsys.roofline import roofline_profile

    prof = roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm")
    assert prof.step_cost().target.expanded
    setup = SimSetup(prof, poisson(400, 1.0, "lognormal:300:250", "lognormal:200:150", seed=5))
    w = workload_at(setup, 0.9 * measure_capacity(setup, requests=300), 400, 0)
    oracle = run_policy(setup, w, "oracle", 0)
    for p in ("smartspec", "turbospec", "adaptive"):
        r = run_policy(setup, w, p, 0)
        assert oracle.busy_s <= r.busy_s * (1 + 1e-9), (p, oracle.busy_s, r.busy_s)


def test_priced_oracle_is_exact_on_small_steps():
    """With a price p (tokens per ms) the oracle maximises tokens - p * step time exactly."""
    rng = np.random.default_rng(4)
    cost = make_profile(draft=(2e-5, 0.01, 0.8)).step_cost(["draft"])
    for price in (0.05, 0.5, 5.0):
        for _ in range(10):
            n, K = 3, 4
            ctx, L = _step(rng, n, K)
            k, _ = hindsight_k(cost, ctx, L[:, None], np.full(n, K), price=price)

            def val(c, ctx=ctx, L=L, price=price, n=n):
                return n + float(np.minimum(c, L).sum()) - price * cost.step_ms(ctx, np.asarray(c))

            best = max(val(np.array(c)) for c in itertools.product(range(K + 1), repeat=n))
            assert val(k) == pytest.approx(best, abs=1e-9)
