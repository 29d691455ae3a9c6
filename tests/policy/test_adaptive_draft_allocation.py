"""Which requests adaptive drafts for and how far: a lagging draft's catch-up, long contexts' cuts and
token value, and the pace of each request."""

from __future__ import annotations

import numpy as np

from control.plan import compile_plan
from control.policy import StepView, build_policy
from tests.conftest import make_profile


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


def test_a_request_that_stays_on_its_drafter_catches_up_only_what_its_remaining_tokens_repay():
    """One drafter: a lagging request stays on it, so its catch-up is decided as if paid where the rest
    of its life repays it, the catch-up's share per step against what the tokens it adds are worth at
    the step's goodput. Tested in tokens times goodput (tokens^2 per ms) against ms, 16 requests with 3
    tokens left each caught up 1,200 tokens for about one accepted token apiece (the batch's modelled
    goodput 1.3 against 2.6 tokens per ms waiting)."""
    prof = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1))
    plan = compile_plan(prof, max_k=8, drafters=["draft"])
    n = 16
    ctx = np.full(n, 1200)

    def decide(remaining):
        pol = build_policy("adaptive", plan)
        view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=ctx,
                              remaining=np.full(n, remaining), drafters=("draft",), max_k=8, free_kv_slots=10**6,
                              token_budget=8192, draft_lag=ctx[:, None].copy(), step=1)
        return pol.decide(view).k.sum()

    assert decide(3) == 0 and decide(6) == 0
    assert decide(8) > 0 and decide(400) > 0


def test_a_new_request_priced_in_sync_with_its_draft_model_is_decided_as_if_its_catch_up_were_paid():
    """With several drafters a new request's catch-up on the draft model it is priced in sync with
    stands for the prefill that would have put it there: the optimiser decides it as if paid, while the
    bandit explores too, where the rest of its life repays it (12 tokens here), and by the charge alone
    where new requests do not count in sync (they wait). Over 4 tokens the catch-up costs more than the
    tokens are worth at the step's goodput, in sync or not."""
    prof = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1))
    plan = compile_plan(prof, max_k=8)
    n = 16
    ctx = np.full(n, 1200)

    def decide(remaining, in_sync):
        pol = build_policy("adaptive", plan)
        pol.choice.new_in_sync = in_sync
        view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=ctx,
                              remaining=np.full(n, remaining), drafters=("draft",), max_k=8, free_kv_slots=10**6,
                              token_budget=8192, draft_lag=ctx[:, None].copy(), step=1)
        d = pol.decide(view)
        assert pol.bandit.exploring and not d.prefill_draft
        return d.k.sum()

    assert decide(12, True) > 0 and decide(12, False) == 0
    assert decide(4, True) == 0


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


def test_adaptive_gives_drafts_to_the_requests_that_move_slowest():
    """An accepted token of a request making ~1.3 tokens a step saves it most of a step; one of a
    request making ~4 saves a quarter of one, while the tokens it sends to the target hold up the
    whole batch. Mean latency follows request-steps, so with their pace known adaptive drafts more for
    the slow requests and no more for the fast ones (judged from the same acceptance estimates either
    way). The target's per-token price makes each request's k its own choice: where the draft passes
    dominate, the whole batch drafts one k either way."""
    from control.policy.types import StepOutcome

    prof = make_profile(target=(5e-5, 0.03, 5.0), draft=(1.3e-5, 0.0013, 0.3))
    plan = compile_plan(prof, max_k=8, drafters=["draft"])
    from control.policy.adaptive import AdaptivePolicy
    from control.policy.base import PolicyContext

    pol = AdaptivePolicy(PolicyContext.from_plan(plan), refresh_every=1)  # every decision a full one
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
    assert paced[~slow].sum() <= plain[~slow].sum() and paced[slow].sum() > plain[slow].sum(), (paced, plain)
    assert paced[slow].sum() / paced.sum() > plain[slow].sum() / plain.sum()
