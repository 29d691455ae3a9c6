"""Each of ``adaptive``'s stages on its own: a step plan in, the stage's fields out."""

from dataclasses import replace

import numpy as np
import pytest

from control.goodput.estimators import ConfidenceMap, PositionRates
from control.goodput.optimizer import Choice, Constraints
from control.plan import compile_plan
from control.policy import StepOutcome, StepView
from control.policy.adaptive.cuts import confidence_cuts
from control.policy.adaptive.drafters import DrafterChoice
from control.policy.adaptive.gate_stage import GateStage
from control.policy.adaptive.optimise import (
    PACE_SMOOTHING,
    Optimiser,
    amortised_lag,
    prefix_sums,
    residence_weights,
)
from control.policy.adaptive.probes import PROBE_TRIALS, probe_unmeasured
from control.policy.adaptive.refit import REFIT_EVERY, CostRefit
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.survival import AcceptanceModel
from control.policy.adaptive.uniform_steps import UniformSteps
from control.policy.base import PolicyContext
from control.policy.gate import Gate
from tests.conftest import make_profile

K = 6


def _view(n, ctx=300, lag=None, remaining=100, drafters=("draft", "ngram"), **kw):
    dl = np.zeros((n, len(drafters)), dtype=np.int64) if lag is None else lag
    return StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.broadcast_to(ctx, (n,)).copy(),
                          remaining=np.full(n, remaining), drafters=drafters, max_k=K, free_kv_slots=10**6,
                          token_budget=8192, draft_lag=dl, **kw)


def _ctx(**prof):
    return PolicyContext.from_plan(compile_plan(make_profile(**prof), max_k=K))


def test_gate_stage_closes_after_a_dwell_of_zeros_only_when_the_pooled_rate_does_not_pay():
    ctx = _ctx()
    cost = ctx.cost
    view = _view(4)
    for pooled, closes in ((0.05, True), (0.9, False)):
        stage = GateStage(Gate(None, 0.75, 3, 10**9), UniformSteps(2, K))
        sp = StepPlan(view, np.full(4, K), lag=np.zeros(4, dtype=np.int64))
        sp.choice = Choice(np.zeros(4, dtype=np.int64), 4.0, 10.0, 10.0)
        for _ in range(3):
            stage.evidence(sp, cost, [0], lambda i, r=pooled: r)
        assert (stage.gate.b_off == 4) is closes, pooled
        assert stage.gate.b_off == (4 if closes else np.inf)


def test_gate_stage_retunes_to_the_batch_where_no_drafter_pays():
    ctx = _ctx(target=(2e-5, 0.2, 4.0))  # compute-bound: speculation stops paying at moderate batch
    stage = GateStage(Gate(None), UniformSteps(2, K))
    stage.retune(_view(8), ctx.plan, ctx.cost, K, [0], lambda i: 0.7)
    poor = stage.gate.b_off
    stage.retune(_view(8), ctx.plan, ctx.cost, K, [0], lambda i: 0.95)
    assert 1 <= poor < stage.gate.b_off  # better acceptance pays at larger batches


def test_survival_stage_ranks_requests_by_their_own_acceptance_and_falls_along_positions():
    ctx = _ctx()
    acc = AcceptanceModel(ctx.prior_positions, 8.0, 64, ctx.confidences)
    slots = np.arange(2)
    acc.req[0].update(slots, np.array([40, 2]), np.array([44, 40]))  # request 0 accepts, 1 rejects
    surv = acc.survival(_view(2), np.zeros(2, dtype=np.int64), True)  # (2, K)
    assert surv.shape == (2, K)
    assert (surv[0] > surv[1]).all()
    assert (np.diff(surv, axis=1) <= 0).all()  # survival never grows along the draft
    mixed = acc.survival(_view(2), np.array([0, 1]), False)
    np.testing.assert_array_equal(mixed[0], surv[0])  # each row from its own drafter's estimators
    assert not np.allclose(mixed[1], surv[1])


def test_a_request_is_compared_with_the_curve_at_the_positions_it_tried():
    """Two requests that each accept 80% at the first position, one drafting K deep and passing every
    later position, one drafting a single token: the short drafter is the curve's own rate at the first
    position. Against the pooled rate instead (0.9+, its deep positions counted), it read as a poor
    request and its first position far below what it accepts."""
    from control.goodput.estimators import chain_trials, request_position_survival

    ctx = _ctx()
    acc = AcceptanceModel(ctx.prior_positions, 16.0, 64, ctx.confidences)
    slots, d = np.arange(2), np.zeros(2, dtype=np.int64)
    verified = np.array([K, 1])
    for step in range(100):
        accepted = np.array([0, 0]) if step % 5 == 4 else np.array([K, 1])
        out = StepOutcome(slots=slots, request_ids=slots, drafter=d, ctx_lens=np.full(2, 300), drafted=verified,
                          verified=verified, accepted=accepted, verify_ms=10.0, step=step)
        s, t = chain_trials(verified, accepted)
        acc.learn(out, d, verified, verified > 0, s, t, True)
    first = acc.pos[0].rates[0]
    assert abs(first - 0.8) < 0.02 and acc.pooled_rate(0) > 0.9
    surv = acc.survival(_view(2), d, True)  # (2, K)
    assert abs(surv[1, 0] - first) < 0.02 and surv[0, 0] > first - 0.02
    rate = acc.req[0].mean(slots, acc.pooled_rate(0))  # (2,)
    against_pooled = request_position_survival(rate, acc.pos[0].rates, acc.pooled_rate(0))  # (2, K)
    assert against_pooled[1, 0] < first - 0.1


def test_optimiser_stage_drafts_longer_for_the_request_that_accepts_more_and_tracks_its_pace():
    ctx = _ctx()
    opt = Optimiser(64)
    view = _view(2)
    sp = StepPlan(view, np.full(2, K), d_ctx=np.zeros(2, dtype=np.int64), lag=np.zeros(2, dtype=np.int64))
    sp.surv = np.vstack([0.9 ** np.arange(1, K + 1), 0.3 ** np.arange(1, K + 1)])  # (2, K)
    sp.cons = Constraints(10**6, 8192)
    opt.run(sp, ctx.cost, None)
    k = sp.choice.k
    assert k[0] > k[1] >= 0
    np.testing.assert_allclose(sp.accepted, [sp.surv[0, : k[0]].sum(), sp.surv[1, : k[1]].sum()])
    opt.note_pace(sp)
    now = 1.0 + sp.accepted  # (2,) this step's tokens per step
    # first decision of the batch: each pace starts from this step's mean (the prior its weight took)
    np.testing.assert_allclose(opt.pace[:2], PACE_SMOOTHING * now.mean() + (1.0 - PACE_SMOOTHING) * now)
    assert opt.pace[0] > opt.pace[1]


def test_a_new_request_that_defers_its_first_draft_starts_from_the_batch_pace():
    """A request joining a batch whose paces are known, given k = 0 at its first decision (on one
    drafter, deferring its catch-up): its pace starts from the batch's mean, the prior its weight took,
    so its weight moves halfway to that of a request at one token per step. From a pace of 1 its
    token became worth about 4x the others' at the next step, the rest of the batch fell to k = 1
    and the request to k = 8 (full CPU pair, batch 32)."""
    ctx = _ctx()
    opt = Optimiser(8)
    opt.pace[:3] = 5.0  # three requests drafting at about 4 accepted tokens a step
    view = _view(4, ctx=np.full(4, 200))
    sp = StepPlan(view, np.full(4, K), d_ctx=np.zeros(4, dtype=np.int64), lag=np.zeros(4, dtype=np.int64))
    sp.pace = opt.pace[view.slots]
    sp.known = np.isfinite(sp.pace)
    sp.accepted = np.array([4.0, 4.0, 4.0, 0.0])  # the newcomer (slot 3) plain this step
    opt.note_pace(sp)
    assert opt.pace[3] == pytest.approx(PACE_SMOOTHING * 5.0 + (1.0 - PACE_SMOOTHING) * 1.0)
    np.testing.assert_allclose(opt.pace[:3], 5.0 * PACE_SMOOTHING + 5.0 * (1.0 - PACE_SMOOTHING))
    w = residence_weights(view, ctx.cost, opt.pace[view.slots], True)  # (4,)
    assert w[3] / w[0] < 2.0  # 5.0 from a pace of 1


def _lagging_plan(lag0):
    """Four requests on the draft model at 20 tokens left, the last one ``lag0`` tokens behind."""
    view = _view(4, ctx=np.full(4, 200), remaining=20)
    lag = np.array([0, 0, 0, lag0])
    sp = StepPlan(view, np.full(4, K), d_ctx=np.zeros(4, dtype=np.int64), lag=lag)
    sp.lagged = True
    sp.surv = np.tile(0.8 ** np.arange(1, K + 1), (4, 1))  # (4, K)
    sp.cons = Constraints(10**6, 8192)
    return sp


def test_a_lagging_request_that_stays_on_its_drafter_catches_up_when_its_life_repays_it():
    """Charged its amortised catch-up on its first token, a lagging request gets k = 0; where it stays
    on its drafter, waiting only grows the lag, so it drafts as in sync if its remaining life can
    repay the catch-up (the draft model's time for the lag against the tokens drafting adds), and
    while the bandit explores (it may leave after a chunk) the charge decides alone. The predicted
    step time still carries the catch-up's share (the next decision starts from its goodput)."""
    ctx = _ctx()  # draft model: 0.003 ms per token caught up
    in_sync = _lagging_plan(0)
    Optimiser(8).run(in_sync, ctx.cost, None, True)
    for stays in (False, True):
        sp = _lagging_plan(4000)  # 12 ms of catch-up
        Optimiser(8).run(sp, ctx.cost, None, stays)
        assert sp.choice.k[3] == (sp.choice.k[0] if stays else 0) and sp.choice.k[0] > 0
    np.testing.assert_array_equal(sp.choice.k, in_sync.choice.k)
    share = amortised_lag(sp.lag, sp.surv, sp.csum, sp.cap, sp.view.remaining, np.arange(4))[3]  # tokens a step
    assert sp.choice.step_ms == pytest.approx(in_sync.choice.step_ms + 0.003 * share)  # the step still pays it
    sp = _lagging_plan(8000)  # 24 ms: more than 20 tokens' worth of drafting repays
    Optimiser(8).run(sp, ctx.cost, None, True)
    assert sp.choice.k[3] == 0 and sp.choice.k[0] > 0


def test_optimiser_helpers_weights_lag_and_prefix_sums():
    ctx = _ctx()
    view = _view(3, ctx=np.array([100, 100, 100]))
    w = residence_weights(view, ctx.cost, np.array([1.0, 2.0, 4.0]), True)  # (3,)
    assert w[0] > w[1] > w[2] and w.mean() == pytest.approx(1.0)  # slow requests' tokens are worth more
    assert residence_weights(view, ctx.cost, np.full(3, 2.0), True) is None  # equal: no weights
    surv = np.full((2, K), 0.5)
    csum = prefix_sums(surv)  # (2, K+1)
    np.testing.assert_allclose(csum[0], 0.5 * np.arange(K + 1))
    lag = amortised_lag(np.array([60, 0]), surv, csum, np.array([2, 2]), np.array([40, 40]), np.arange(2))
    np.testing.assert_allclose(lag, [60 / (40 / 2.0), 0.0])  # 40 tokens at 2 a step: 20 steps share it


def test_probe_stage_gives_one_token_to_zero_k_requests_on_unmeasured_drafters_only():
    ctx = _ctx()
    pos = [PositionRates(K, prior=ctx.prior_positions[i]) for i in range(2)]
    pos[0].update(np.full(PROBE_TRIALS, 1), np.ones(PROBE_TRIALS, dtype=np.int64))  # drafter 0 measured
    view = _view(4)
    sp = StepPlan(view, np.array([K, K, K, 0]), d_ctx=np.array([0, 1, 1, 1]), lag=np.array([0, 0, 5, 0]))
    sp.surv, sp.cons = np.full((4, K), 0.5), Constraints(10**6, 8192)
    sp.choice = Choice(np.zeros(4, dtype=np.int64), 4.0, 10.0, 10.0)
    probed = probe_unmeasured(sp, pos, ctx.cost)
    # measured drafter: no probe; lagging: no probe; capped at 0: no probe
    np.testing.assert_array_equal(probed.k, [0, 1, 0, 0])
    assert probed.tokens == pytest.approx(4.5)


def _cut_plan(first: list[float]) -> tuple[StepPlan, list[ConfidenceMap], list[PositionRates]]:
    """Three requests on drafter 0 whose first-position rates are ``first``, a pool at 0.6 there, and
    a calibration map that has seen survival rise with confidence."""
    n = len(first)
    maps = [ConfidenceMap(), ConfidenceMap()]
    maps[0].update(np.repeat(np.logspace(-3.5, -0.1, 8), 40), np.tile(np.linspace(0.3, 0.95, 8) > 0.6, 40))
    pos = [PositionRates(K, prior=np.full(K, 0.6)) for _ in range(2)]
    sp = StepPlan(_view(n), np.full(n, K), d_ctx=np.zeros(n, dtype=np.int64), uniform=True)
    sp.surv = np.cumprod(np.tile(np.array(first)[:, None], (1, K)), axis=1)  # (n, K)
    sp.choice = Choice(np.full(n, 2), 6.0, 10.0, 8.0, next_cost=np.array([1.0, 2.0, 4.0][:n]))
    sp.g_value = 0.1
    return sp, maps, pos


def test_cut_stage_maps_the_marginal_cost_through_the_drafters_calibration():
    sp, maps, pos = _cut_plan([0.6, 0.6, 0.6])  # every request at the pool's rate: no lift
    cuts = confidence_cuts(sp, np.array([True, False]), maps, pos)  # (3,)
    np.testing.assert_allclose(cuts, maps[0].raw_cut(np.array([0.1, 0.2, 0.4])))
    assert (np.diff(cuts) >= 0).all()  # a dearer next token needs more confidence
    sp.weights = np.array([2.0, 1.0, 0.5])
    np.testing.assert_allclose(confidence_cuts(sp, np.array([True, False]), maps, pos),
                               maps[0].raw_cut(np.array([0.05, 0.2, 0.8])))
    assert confidence_cuts(sp, np.array([False, False]), maps, pos) is None  # nobody reports confidences


def test_cut_stage_reads_the_pooled_calibration_at_each_requests_lift():
    """A request that accepts more than the pool keeps drafting through confidences at which the
    pool's drafts stop; one that accepts less keeps the pool's cut (the same marginal cost for all)."""
    sp, maps, pos = _cut_plan([0.9, 0.6, 0.3])
    sp.choice = Choice(np.full(3, 2), 6.0, 10.0, 8.0, next_cost=np.full(3, 5.0))
    cuts = confidence_cuts(sp, np.array([True, False]), maps, pos)  # (3,)
    pool = maps[0].raw_cut(np.array([0.5]))[0]
    assert cuts[0] < cuts[1] == cuts[2] == pool
    odds = 1.0 / (0.9 / 0.1 / 1.5)  # odds(cut 0.5) / lift
    np.testing.assert_allclose(cuts[0], maps[0].raw_cut(np.array([odds / (1.0 + odds)]))[0])
    one, _, _ = _cut_plan([0.9])  # batch 1 (plain floats) agrees with the vector path
    one.choice = Choice(np.full(1, 2), 2.0, 10.0, 8.0, next_cost=np.array([5.0]))
    np.testing.assert_allclose(confidence_cuts(one, np.array([True, False]), maps, pos), cuts[:1])


def test_drafter_choice_stage_assigns_every_request_an_allowed_drafter_and_prices_rewards():
    ctx = _ctx(acceptance={"draft": 0.75, "ngram": 0.6})
    pos = [PositionRates(K, prior=ctx.prior_positions[i]) for i in range(2)]
    choice = DrafterChoice(ctx, pos, UniformSteps(2, K), seed=0)
    view = _view(6)
    to_exec = np.array([0, 1])
    sp = StepPlan(view, np.full(6, K))
    choice.assign(sp, to_exec, ctx.cost)
    assert sp.d_ctx.shape == (6,) and set(np.unique(sp.d_ctx)) <= {0, 1}
    np.testing.assert_array_equal(sp.d_exec, to_exec[sp.d_ctx])
    probs = choice.explore_probs(view, np.array([True, False]), to_exec, ctx.cost)
    np.testing.assert_array_equal(probs, [1.0, 0.0])  # a drafter the executor lacks never wins
    out = StepOutcome(slots=view.slots, request_ids=view.request_ids, drafter=np.zeros(6, dtype=np.int64),
                      ctx_lens=view.ctx_lens, drafted=np.full(6, 4), verified=np.full(6, 4),
                      accepted=np.array([0, 1, 2, 3, 4, 4]), verify_ms=10.0, step=0)
    r = choice.rewards(out, np.zeros(6, dtype=np.int64), ctx.cost)  # (6,)
    assert (np.diff(r) >= 0).all() and r[4] == r[5] and r[0] > 0  # same cost share: reward follows tokens


def test_drafter_choice_rewards_a_lookup_that_found_nothing_as_the_plain_step_it_gave():
    """The bandit learns from the requests that drafted and from those on n-gram whose lookup found
    nothing (their step was plain decoding: that is what n-gram gave them). A draft model's request
    the optimiser gave k = 0, and a request on a drafter the policy does not know, teach nothing."""
    ctx = _ctx(acceptance={"draft": 0.75, "ngram": 0.6})
    pos = [PositionRates(K, prior=ctx.prior_positions[i]) for i in range(2)]
    choice = DrafterChoice(ctx, pos, UniformSteps(2, K), seed=0)
    d_ctx = np.array([0, 0, 1, 1, 1, -1])  # draft, draft, ngram x 3, unknown
    verified = np.array([3, 0, 2, 0, 0, 0])
    avail = np.array([0, 0, 4, 0, 5, 0])  # request 4: its lookup proposed 5, the optimiser asked 0
    out = StepOutcome(slots=np.arange(6), request_ids=np.arange(6), drafter=np.maximum(d_ctx, 0),
                      ctx_lens=np.full(6, 300), drafted=verified, verified=verified,
                      accepted=np.array([2, 0, 2, 0, 0, 0]), verify_ms=10.0, step=0, ngram_avail=avail)
    spec = verified > 0
    np.testing.assert_array_equal(choice.rewarded(out, d_ctx, spec), [True, False, True, True, False, False])
    only_empty = choice.rewarded(out, d_ctx, None)  # nobody drafted: the empty lookup still teaches
    np.testing.assert_array_equal(only_empty, [False, False, False, True, False, False])
    r = choice.rewards(out, d_ctx, ctx.cost)
    assert r[3] < 1.0 < r[2]  # a plain step in a step where others verified more: below the plain rate
    assert choice.rewarded(replace(out, ngram_avail=None), d_ctx, None) is None


def test_refit_stage_rebuilds_the_cost_model_every_refit_period_from_measured_times():
    ctx = _ctx()
    refit = CostRefit(ctx.cost)
    n = 4
    rebuilt = None
    for step in range(4 * REFIT_EVERY):
        k = np.full(n, 1 + step % 4)
        out = StepOutcome(slots=np.arange(n), request_ids=np.arange(n), drafter=np.zeros(n, dtype=np.int64),
                          ctx_lens=np.full(n, 300 + 50 * (step % 7)), drafted=k, verified=k, accepted=k // 2,
                          verify_ms=3.0 * (6.0 + 0.02 * float(n + k.sum())), step=step)  # a GPU 3x slower
        got = refit.update(out, np.zeros(n, dtype=np.int64), k > 0, True, ctx.cost.verify, ctx.cost)
        assert (got is None) == ((step + 1) % REFIT_EVERY != 0)
        rebuilt = got if got is not None else rebuilt
    v = _view(n)
    assert rebuilt.verify_ms(v.ctx_lens, np.full(n, 2)) > 2.0 * ctx.cost.verify_ms(v.ctx_lens, np.full(n, 2))


def test_refit_reads_caught_up_draft_tokens_at_their_own_price():
    """A draft with a per-sequence term (host preparation per pass) folded into its token price: steps
    timed as the profile prices them, catch-ups included, leave the measured price error at zero."""
    from control.goodput.stepcost import DrafterCost

    base = _ctx().cost
    d0 = base.drafters[0]
    model = replace(d0.model, b=d0.model.b + 0.035)
    cost = replace(base, drafters=(DrafterCost(d0.name, d0.kind, model, d0.const_ms, seq_ms=0.035), *base.drafters[1:]))
    d = cost.drafters[0]
    refit = CostRefit(cost)
    rng = np.random.default_rng(2)
    for step in range(40):
        n = int(rng.integers(2, 16))
        ctx, k = rng.integers(100, 900, n), rng.integers(1, 4, n)
        lag = np.where(rng.random(n) < 0.3, ctx, 0)  # new requests catch up on their prompts
        feats = d.features(ctx, k)
        out = StepOutcome(slots=np.arange(n), request_ids=np.arange(n), drafter=np.zeros(n, dtype=np.int64),
                          ctx_lens=ctx, drafted=k, verified=k, accepted=k // 2, verify_ms=cost.verify_ms(ctx, k),
                          draft_ms=d.draft_ms(ctx, k, lag), draft_ctx_tokens=int(feats[0]),
                          draft_batched_tokens=int(feats[1] + lag.sum()), draft_passes=feats[2], step=step)
        refit.update(out, np.zeros(n, dtype=np.int64), k > 0, True, cost.verify, cost)
    mean, _ = refit.prices.posterior()
    assert abs(mean[0]) < 1e-9


def test_survival_stage_learns_several_steps_at_once_as_it_learns_them_one_by_one():
    """``learn_pooled`` over queued steps (two drafters, the second an n-gram lookup, categories,
    confidences, steps where nobody drafted, lookups scored on other drafters' steps or not at all)
    leaves the pooled estimators as ``learn`` step by step does, to rounding: the lookup's rates by
    proposal length too, their ageing with the steps included."""
    from control.goodput.estimators import chain_trials
    from control.policy.adaptive.survival import PooledRows

    ctx = _ctx()
    conf_on, lookup = np.array([True, False]), np.array([False, True])
    one, many = (AcceptanceModel(ctx.prior_positions, 8.0, 64, conf_on, lookup) for _ in range(2))
    rows = PooledRows(K)
    rng = np.random.default_rng(5)
    for step in range(12):
        n = int(rng.integers(1, 7))
        d = rng.integers(0, 2, n)
        drafted = rng.integers(0, K + 1, n) * (step % 5 != 3)  # step 3 and 8: nobody drafts
        accepted = np.minimum(rng.integers(0, K + 1, n), drafted)
        conf = np.where(np.arange(K)[None, :] < drafted[:, None], rng.uniform(0.05, 1.0, (n, K)), np.nan)
        avail = rng.integers(0, K + 3, n)
        match = None if step % 4 == 1 else np.minimum(rng.integers(-1, K + 1, n), np.minimum(avail, accepted + 1))
        out = StepOutcome(slots=np.arange(n), request_ids=np.arange(n), drafter=d, ctx_lens=np.full(n, 300),
                          drafted=drafted, verified=drafted, accepted=accepted, confidence=conf,
                          category=rng.integers(-1, 4, n), step=step, ngram_avail=avail, ngram_match=match)
        s, t = chain_trials(drafted, accepted)
        spec = drafted > 0
        if not spec.any():
            continue
        uniform = bool((d == d[0]).all())
        one.learn(out, d, drafted, spec, s, t, uniform)
        many.learn_request(out.slots, d, s, t, spec, uniform)
        rows.add(d, drafted, accepted, s, t, spec, drafted, out.category, conf, uniform, out.ngram_avail, match)
    many.learn_pooled(rows)
    np.testing.assert_allclose(many.by_avail[1]._counts, one.by_avail[1]._counts, rtol=1e-12)
    assert one.by_avail[1]._counts.any()
    for i in range(2):
        np.testing.assert_allclose(many.pos[i]._counts, one.pos[i]._counts, rtol=1e-12)
        np.testing.assert_array_equal(many.req[i].t, one.req[i].t)
    np.testing.assert_array_equal(many.cat.trials, one.cat.trials)
    np.testing.assert_allclose(many.conf[0].hits, one.conf[0].hits, rtol=1e-12)
    np.testing.assert_allclose(many.conf[0].n, one.conf[0].n, rtol=1e-12)


@pytest.mark.parametrize("share", [1.0, 0.36])
def test_refit_under_batch_expansion_learns_the_costs_the_model_charges(share):
    """A target that verifies by batch expansion, on a machine 1.5x slower than its profile: the refit
    fed the passes' measured times predicts them at other batches, contexts and depths, instead of
    folding the expansion's extra sequences into the price of a token. With copies reading the KV at
    a share of a first read's price (through L2), the refit learns that price too."""
    from dataclasses import replace

    base = _ctx().cost
    cost = replace(base, target=replace(base.target, a=2e-4, d=0.05, expanded=True, reread_share=share))
    refit = CostRefit(cost)
    rng = np.random.default_rng(0)
    rebuilt = None
    for step in range(6 * REFIT_EVERY):
        n = int(rng.integers(1, 48))
        ctx, k = rng.integers(100, 2000, n), rng.integers(0, 6, n)
        out = StepOutcome(slots=np.arange(n), request_ids=np.arange(n), drafter=np.zeros(n, dtype=np.int64),
                          ctx_lens=ctx, drafted=k, verified=k, accepted=k // 2,
                          verify_ms=1.5 * cost.verify_ms(ctx, k), step=step)
        got = refit.update(out, np.zeros(n, dtype=np.int64), k > 0, False, cost.verify, cost)
        rebuilt = got if got is not None else rebuilt
    for n, c, kk in ((4, 300, 1), (32, 1500, 4), (64, 800, 6)):
        ctx, k = np.full(n, c), np.full(n, kk)
        assert rebuilt.verify_ms(ctx, k) == pytest.approx(1.5 * cost.verify_ms(ctx, k), rel=0.02)
