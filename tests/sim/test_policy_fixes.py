"""Behaviour behind the changes to shared code made for the simulator bar (see the commit messages):
the depth-aware request-level optimiser and adaptive's amortised catch-up."""

from __future__ import annotations

import numpy as np

from control.goodput.acceptance import chain_survival
from control.goodput.optimizer import Constraints, admit_slots, uniform_curve
from control.plan import compile_plan
from control.policy import StepView, build_policy
from tests.conftest import make_profile


def test_admit_slots_is_never_worse_than_the_best_uniform_k():
    """Draft passes cost a fixed amount per depth; admitting in plain survival order reached deep
    slots of easy requests first and lost to a uniform k = 1 by a wide margin."""
    rng = np.random.default_rng(0)
    cost = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1)).step_cost(["draft"])
    for _ in range(40):
        n = int(rng.integers(1, 120))
        ctx = rng.integers(100, 3000, size=n).astype(np.float64)
        surv = chain_survival(rng.beta(6, 2, size=n), 8)
        cap = np.full(n, 8)
        choice = admit_slots(cost, ctx, surv, cap, Constraints())
        curve = uniform_curve(cost, ctx, surv, cap, Constraints())
        best_uniform = float(np.max(curve.tokens / curve.step_ms))
        assert choice.tokens / choice.step_ms >= best_uniform * (1 - 1e-9)
        # the reported prediction is the cost model's own for the chosen k
        assert np.isclose(choice.step_ms, cost.step_ms(ctx, choice.k))


def test_adaptive_catches_up_a_lagging_draft_when_the_request_has_long_to_run():
    prof = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1))
    plan = compile_plan(prof, max_k=8)
    n = 16
    ctx = np.full(n, 1200)
    lag = np.zeros((n, 1), dtype=np.int64)
    lag[:, 0] = ctx  # the draft never saw these prompts (its prefill was skipped)

    def decide(remaining):
        pol = build_policy("adaptive", plan)
        view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=ctx,
                              remaining=np.full(n, remaining), drafters=("draft",), max_k=8,
                              free_kv_slots=10**6, token_budget=8192, draft_lag=lag, step=1)
        return pol.decide(view)

    assert decide(400).k.sum() > 0  # the re-prefill pays for itself over 400 more tokens
    assert decide(4).k.sum() == 0  # ... but not over 4


def test_adaptive_refit_counts_prompt_chunks_mixed_into_the_verify_pass():
    """With chunked prefill the verify pass also computes prompt tokens; the online refit must see
    them as features, or it blames decode tokens for their time and stops speculating."""
    from control.policy.types import StepOutcome

    prof = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1))
    truth = prof.step_cost(["draft"]).target
    pol = build_policy("adaptive", compile_plan(prof, max_k=8))
    rng = np.random.default_rng(3)
    for step in range(200):
        n = int(rng.integers(4, 64))
        ctx = rng.integers(100, 3000, size=n)
        k = rng.integers(0, 5, size=n)
        chunk = int(rng.integers(0, 4000)) if step % 2 else 0
        prior = int(rng.integers(0, 8000)) if chunk else 0
        t = truth.predict(float(ctx.sum()) + prior, float((k + 1).sum()) + chunk)
        pol.observe(StepOutcome(slots=np.arange(n), request_ids=np.arange(n) + 1000 * step, drafter=np.zeros(n, dtype=np.int64),
                                ctx_lens=ctx, drafted=k, verified=k, accepted=np.minimum(k, 1), verify_ms=t,
                                total_ms=t, step=step, prefill_tokens=chunk, prefill_ctx_tokens=prior))
    assert abs(pol.cost.target.b - truth.b) / truth.b < 0.05


def test_adaptive_cuts_long_context_drafts_later_than_short_ones():
    """A long-context request pays its KV read every step it stays: its own goodput is below the
    batch's, so its confidence cut is lower than the batch-level cut; a short one's is higher."""
    from control.goodput.optimizer import confidence_cuts

    # a draft whose cost does not grow with context (as a sink+window draft's), so both kinds draft
    prof = make_profile(target=(5e-5, 0.0105, 5.0), draft=(0.0, 0.0013, 1.1))
    plan = compile_plan(prof, max_k=8, drafters=["draft"])
    pol = build_policy("adaptive", plan)
    n = 16
    ctx = np.where(np.arange(n) < 4, 60000, 300)
    view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=ctx, remaining=np.full(n, 300),
                          drafters=("draft",), max_k=8, free_kv_slots=10**7, token_budget=8192, step=1)
    d = pol.decide(view)
    assert d.conf_cut is not None and d.k.sum() > 0
    from control.goodput.optimizer import Choice

    cost = prof.step_cost(["draft"])
    choice = Choice(d.k, d.predicted_tokens, d.predicted_step_ms, cost.plain_ms(ctx))
    batch_cut = confidence_cuts(cost, ctx, choice, np.zeros(n, dtype=np.int64))
    long, short = (np.arange(n) < 4) & (d.k > 0), (np.arange(n) >= 4) & (d.k > 0)
    assert long.any() and short.any()
    assert np.all(d.conf_cut[long] < batch_cut[long])
    assert np.all(d.conf_cut[short] > batch_cut[short])


def test_adaptive_values_tokens_of_long_context_requests_by_their_residence_cost():
    """An accepted token of a request that reads 60k tokens of KV every step frees more future step
    time than one of a 300-token request. Drafting for the long ones costs more too (the draft reads
    their context); valued per step alike, their tokens lost and they never drafted, which
    under-drafted long contexts on the simulator's Mooncake runs (docs/sim-results.md)."""
    prof = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1))
    plan = compile_plan(prof, max_k=8, drafters=["draft"])
    n = 16
    long = np.arange(n) < 4
    ctx = np.where(long, 60000, 300)
    view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=ctx, remaining=np.full(n, 300),
                          drafters=("draft",), max_k=8, free_kv_slots=10**7, token_budget=8192, step=1)
    d = build_policy("adaptive", plan).decide(view)
    assert d.k[long].min() >= 1 and d.k[~long].min() >= 1
    # the prediction stays in plain tokens: n bonus tokens plus expected accepted drafts, below n + sum k
    assert n < d.predicted_tokens < n + d.k.sum()


def test_adaptive_calibrates_an_under_confident_drafter_before_cutting():
    """Two policies see the same outcomes (every drafted token accepted); one drafter's running
    confidence fell to 0.6 ** 8 = 0.017 over eight tokens, the other's stayed 1. The cut is in
    calibrated survival, so the raw cut handed to the executor for the under-confident drafter is
    well below the other's (uncalibrated, it stopped drafts that would have been accepted)."""
    from control.policy.types import StepOutcome

    prof = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1))
    plan = compile_plan(prof, max_k=8, drafters=["draft"])
    n, k = 8, 8

    def view(step):
        return StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 500),
                              remaining=np.full(n, 400), drafters=("draft",), max_k=8, free_kv_slots=10**6,
                              token_budget=8192, step=step)

    def trained(c):
        pol = build_policy("adaptive", plan)
        pol.decide(view(1))
        conf = np.full((n, 8), np.nan)
        conf[:, :k] = c
        for step in range(2, 60):
            pol.observe(StepOutcome(slots=np.arange(n), request_ids=np.arange(n), drafter=np.zeros(n, dtype=np.int64),
                                    ctx_lens=np.full(n, 500), drafted=np.full(n, k), verified=np.full(n, k),
                                    accepted=np.full(n, k), confidence=conf, verify_ms=8.0, draft_ms=2.0,
                                    total_ms=10.0, step=step))
        return pol.decide(view(60)).conf_cut

    calibrated, under = trained(1.0), trained(0.6)
    assert calibrated is not None and under is not None and calibrated.max() > 0
    assert np.all(under < 0.7 * calibrated)


def test_adaptive_gives_drafts_to_the_requests_that_move_slowest():
    """An accepted token of a request making ~1.3 tokens a step saves it most of a step; one of a
    request making ~4 saves a quarter of one, while the draft passes it adds hold up the whole batch.
    Mean latency follows request-steps, so with their pace known adaptive shifts its drafting from
    the fast requests toward the slow ones (judged from the same acceptance estimates either way)."""
    from control.policy.types import StepOutcome

    prof = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1))
    plan = compile_plan(prof, max_k=8, drafters=["draft"])
    pol = build_policy("adaptive", plan)
    n = 16
    slow = np.arange(n) >= 8
    slots, rids, ctx = np.arange(n), np.arange(n) + 100, np.full(n, 400)
    for step in range(1, 13):
        view = StepView.build(slots=slots, request_ids=rids, ctx_lens=ctx + 3 * step, remaining=np.full(n, 300),
                              drafters=("draft",), max_k=8, free_kv_slots=10**7, token_budget=8192, step=step)
        k = pol.decide(view).k
        acc = np.where(slow, np.minimum(k, int(step % 3 == 0)), k)  # slow: a third of first drafts
        pol.observe(StepOutcome(slots=slots, request_ids=rids, drafter=np.zeros(n, dtype=np.int64), ctx_lens=view.ctx_lens,
                                drafted=k, verified=k, accepted=acc, verify_ms=20.0, total_ms=25.0, step=step))
    view = StepView.build(slots=slots, request_ids=rids, ctx_lens=ctx + 40, remaining=np.full(n, 300),
                          drafters=("draft",), max_k=8, free_kv_slots=10**7, token_budget=8192, step=13)
    paced = pol.decide(view).k
    assert np.all(pol._pace[slots[slow]] < pol._pace[slots[~slow]])
    pol._pace[:] = np.nan  # the same estimates, no pace: every token valued alike
    plain = pol.decide(view).k
    assert paced[~slow].sum() < plain[~slow].sum() and paced[slow].sum() >= plain[slow].sum(), (paced, plain)
    assert paced[slow].sum() / paced.sum() > plain[slow].sum() / plain.sum()
