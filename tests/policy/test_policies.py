"""Policies: valid decisions on any view, and the behaviour each one promises."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.errors import ConfigError
from control.plan import GateParams, compile_plan
from control.policy import StepOutcome, StepView, build_policy, parse_policy_spec
from tests.conftest import make_profile

LIVE = ["none", "fixed:0", "fixed:3", "fixed:16", "smartspec", "turbospec", "specserve", "hf-heuristic",
        "static-schedule", "static-schedule:1=4,8=2,32=1", "static-schedule:maxconc=8", "adaptive"]
DRAFTERS = ("draft", "ngram")


def _view(rng, n, step=1, max_k=8, ctx=None, lag=None, rid0=0, drafters=DRAFTERS, **kw):
    return StepView.build(
        slots=np.arange(n), request_ids=np.arange(n) + rid0,
        ctx_lens=rng.integers(16, 4000, n) if ctx is None else np.broadcast_to(ctx, n),
        remaining=rng.integers(1, 200, n), k_cap=rng.integers(0, max_k + 1, n), drafters=drafters, max_k=max_k,
        free_kv_slots=kw.pop("free_kv_slots", 10**6), token_budget=kw.pop("token_budget", 10**6), step=step,
        draft_lag=lag, **kw)


def _outcome(view, d, accepted, conf=None):
    k = d.k
    return StepOutcome(slots=view.slots, request_ids=view.request_ids, drafter=d.drafter, ctx_lens=view.ctx_lens,
                       drafted=k, verified=k, accepted=np.minimum(accepted, k), confidence=conf,
                       verify_ms=10.0, draft_ms=2.0, total_ms=12.0, draft_passes=int(k.max(initial=0)),
                       draft_ctx_tokens=int(view.ctx_lens.sum()), draft_batched_tokens=int(k.sum()), step=view.step)


@pytest.fixture(scope="module")
def plan():
    return compile_plan(make_profile(), max_k=8)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(0, 300), budget=st.integers(0, 3000))
def test_every_policy_returns_a_valid_decision(seed, n, budget):
    plan = compile_plan(make_profile(), max_k=8)
    rng = np.random.default_rng(seed)
    for spec in LIVE:
        pol = build_policy(spec, plan, seed=seed)
        for step in range(3):
            v = _view(rng, n, step=step, free_kv_slots=budget, token_budget=n + budget)
            d = pol.decide(v)
            cap = np.maximum(np.minimum(np.minimum(v.k_cap, v.remaining - 1), 8), 0)
            assert d.k.shape == (n,) and d.drafter.shape == (n,), spec
            assert (d.k >= 0).all() and (d.k <= cap).all(), spec
            assert ((d.drafter >= 0) & (d.drafter < len(DRAFTERS))).all(), spec
            if spec not in ("none", "fixed:0", "fixed:3", "fixed:16", "hf-heuristic") and not spec.startswith("static"):
                assert d.k.sum() <= budget, spec  # goodput policies respect KV slots and token budget
            if d.conf_cut is not None:
                assert d.conf_cut.shape == (n,) and ((d.conf_cut >= 0) & (d.conf_cut <= 1)).all()
            pol.observe(_outcome(v, d, rng.integers(0, 9, n)))


def test_force_off_plan_turns_every_policy_off():
    plan = compile_plan(make_profile(), max_k=8, force_off=True)
    rng = np.random.default_rng(0)
    for spec in LIVE:
        d = build_policy(spec, plan).decide(_view(rng, 16))
        assert d.k.max() == 0, spec


def test_unknown_policy_names_are_rejected_with_the_accepted_list():
    for bad in ("bogus", "fixed", "fixed:x", "fixed:99", "adaptive:3", "static-schedule:1=x", ""):
        with pytest.raises(ConfigError, match="accepted|fixed needs|above the limit|BATCH=K|empty"):
            parse_policy_spec(bad)


def test_a_policy_with_a_drafter_attached_says_where_drafters_go():
    with pytest.raises(ConfigError, match="policy 'fixed:3@draft-tiny': a policy names no drafter; give 'fixed:3'"):
        parse_policy_spec("fixed:3@draft-tiny")


def test_hf_heuristic_grows_by_two_on_full_acceptance_and_shrinks_by_one_otherwise(plan):
    pol = build_policy("hf-heuristic", plan)
    v = StepView.build(slots=[0, 1], request_ids=[1, 2], ctx_lens=[100, 100], remaining=[100, 100],
                       drafters=DRAFTERS, max_k=8, free_kv_slots=10**6, token_budget=10**6)
    d = pol.decide(v)
    assert list(d.k) == [5, 5]
    pol.observe(_outcome(v, d, np.array([5, 2])))
    assert list(pol.decide(v).k) == [7, 4]
    for _ in range(10):
        d = pol.decide(v)
        pol.observe(_outcome(v, d, np.array([8, 0])))
    assert list(pol.decide(v).k) == [8, 1]


def test_static_schedule_uses_tensorrt_llm_lookup(plan):
    pol = build_policy("static-schedule:4=4,8=2,32=1", plan)
    rng = np.random.default_rng(1)
    for n, want in ((1, 4), (4, 4), (5, 2), (32, 1), (33, 0)):
        v = _view(rng, n)
        v.k_cap[:] = 8
        v.remaining[:] = 100
        assert pol.decide(v).k.max() == want
    mc = build_policy("static-schedule:maxconc=8", plan)
    assert mc.decide(_view(rng, 9)).k.max() == 0


def test_turbospec_records_disable_threshold_skips_prefill_and_resets(plan):
    pol = build_policy("turbospec", plan)
    big = StepView.build(slots=np.arange(400), request_ids=np.arange(400), ctx_lens=np.full(400, 100),
                         remaining=np.full(400, 100), drafters=DRAFTERS, max_k=8, free_kv_slots=0, token_budget=10**6)
    d = pol.decide(big)  # no free KV slots: k = 0, threshold recorded at 400
    assert d.k.max() == 0 and pol.disable_batch_size == 400
    bigger = StepView.build(slots=np.arange(401), request_ids=np.arange(401), ctx_lens=np.full(401, 100),
                            remaining=np.full(401, 100), drafters=DRAFTERS, max_k=8, free_kv_slots=10**6, token_budget=10**6)
    skipped = [pol.decide(bigger).prefill_draft for _ in range(pol.RESET_STEPS)]
    assert not any(skipped[:-1])
    assert pol.disable_batch_size == float("inf")  # reset after RESET_STEPS skips
    assert pol.decide(bigger).prefill_draft


def test_smartspec_stops_draft_prefill_when_most_steps_do_not_speculate(plan):
    pol = build_policy("smartspec", plan)
    v = StepView.build(slots=np.arange(8), request_ids=np.arange(8), ctx_lens=np.full(8, 100),
                       remaining=np.full(8, 100), drafters=DRAFTERS, max_k=8, free_kv_slots=0, token_budget=10**6)
    for _ in range(20):
        d = pol.decide(v)
    assert d.k.max() == 0 and not d.prefill_draft


def test_adaptive_gives_longer_drafts_to_requests_that_accept_more(plan):
    pol = build_policy("adaptive", plan)
    rng = np.random.default_rng(2)
    v = StepView.build(slots=[0, 1], request_ids=[10, 11], ctx_lens=[500, 500], remaining=[500, 500],
                       drafters=DRAFTERS, max_k=8, free_kv_slots=10**6, token_budget=10**6)
    for step in range(60):
        v.step = step
        d = pol.decide(v)
        pol.observe(_outcome(v, d, np.array([8, 0])))  # request 10 accepts everything, 11 nothing
    d = pol.decide(v)
    assert d.k[0] > d.k[1]
    assert d.k[0] >= 4
    # a new request in slot 1 starts from the prior again, not from its predecessor's record
    v2 = StepView.build(slots=[0, 1], request_ids=[10, 12], ctx_lens=[500, 500], remaining=[500, 500],
                        drafters=DRAFTERS, max_k=8, free_kv_slots=10**6, token_budget=10**6, step=61)
    assert pol.decide(v2).k[1] > d.k[1]
    del rng


def test_adaptive_is_context_aware_at_large_batch():
    """With KV-dominated costs, long contexts keep speculation alive at a batch where short ones stop."""
    plan = compile_plan(make_profile(target=(4e-5, 0.04, 7.0), draft=(2e-6, 0.004, 0.9), max_batch=512),
                        max_k=8, gate=GateParams(b_off=None))
    rng = np.random.default_rng(3)
    short = build_policy("adaptive", plan).decide(_view(rng, 256, ctx=200))
    long_ = build_policy("adaptive", plan).decide(_view(rng, 256, ctx=30000))
    smart_long = build_policy("smartspec", plan).decide(_view(rng, 256, ctx=30000))
    assert long_.k.sum() > short.k.sum()
    assert long_.k.sum() > 0 and smart_long.k.sum() > 0  # the optimiser is context aware in both


def test_adaptive_lets_one_request_a_step_catch_up_beyond_the_catchup_limit():
    """Requests whose draft is further behind than the limit stay plain, but the least behind of them:
    its draft state is built by nothing else (a long prompt whose draft was not prefilled), so it
    would never draft; one catch-up a step bounds the step's by one request's lag."""
    plan = compile_plan(make_profile(), max_k=8, gate=GateParams(max_catchup_tokens=100))
    pol = build_policy("adaptive", plan)
    lag = np.array([[0], [5000], [3000], [50]])
    v = StepView.build(slots=np.arange(4), request_ids=np.arange(1, 5), ctx_lens=[500, 5000, 3000, 500],
                       remaining=[300] * 4, drafters=("draft",), max_k=8, free_kv_slots=10**6, token_budget=10**6,
                       draft_lag=lag)
    d = pol.decide(v)
    assert d.k[1] == 0 and d.k[0] > 0 and d.k[2] > 0


def test_adaptive_gate_switches_off_above_threshold_and_prefills_no_draft_state_while_off():
    plan = compile_plan(make_profile(), max_k=8, gate=GateParams(b_off=32, min_dwell_steps=0, probe_every_steps=10**6))
    pol = build_policy("adaptive", plan)
    rng = np.random.default_rng(4)
    d = pol.decide(_view(rng, 64, step=1))
    assert d.k.max() == 0 and not d.prefill_draft
    d = pol.decide(_view(rng, 40, step=2))  # between b_on (24) and b_off: stays off
    assert d.k.max() == 0 and not d.prefill_draft
    d = pol.decide(_view(rng, 8, step=3))
    assert d.k.max() > 0  # on again


def test_draft_state_is_prefilled_only_by_a_policy_that_drafts_with_a_model_and_prices_no_catch_up():
    """A fixed k on a draft model prefills its state; on n-gram there is none to build (prefilling
    the draft model it never runs was pure cost); adaptive with one drafter builds it by catch-up,
    which it prices."""
    plan = compile_plan(make_profile(), max_k=8)
    view = _view(np.random.default_rng(0), 4, step=1)
    assert build_policy("fixed:3", plan).decide(view).prefill_draft
    on_ngram = compile_plan(make_profile(), max_k=8, default_drafter="ngram")
    assert not build_policy("fixed:3", on_ngram).decide(view).prefill_draft
    assert not build_policy("none", plan).decide(view).prefill_draft
    one = compile_plan(make_profile(), max_k=8, drafters=["draft"])
    d = build_policy("adaptive", one).decide(_view(np.random.default_rng(0), 4, step=1, drafters=("draft",)))
    assert d.k.max() > 0 and not d.prefill_draft


def test_adaptive_with_one_drafter_prefills_long_prompts_while_its_gate_is_on():
    """Short prompts build the draft state by catch-up; prompts over the catch-up limit (this
    iteration's, or any while most of the batch's contexts are over it) prefill it, unless the gate
    is off and nothing drafts."""
    one = compile_plan(make_profile(), max_k=8, drafters=["draft"])
    limit = one.gate.max_catchup_tokens
    rng = np.random.default_rng(0)

    def prefills(ctx, prefill_tokens=0, plan=one, n=4):
        pol = build_policy("adaptive", plan)
        return pol.decide(_view(rng, n, step=1, ctx=ctx, drafters=("draft",), prefill_tokens=prefill_tokens)).prefill_draft

    assert not prefills(1000) and not prefills(1000, prefill_tokens=limit)
    assert prefills(1000, prefill_tokens=limit + 1)
    assert prefills(np.array([limit + 500, limit + 900, limit * 3, 800]))
    assert not prefills(np.array([limit + 500, 700, 900, 800]))  # one long context is not a long-context phase
    off = compile_plan(make_profile(), max_k=8, drafters=["draft"], gate=GateParams(b_off=2, probe_every_steps=10**6))
    assert not prefills(limit * 2, prefill_tokens=limit * 2, plan=off, n=8)


def test_adaptive_among_drafters_counts_new_requests_in_sync_with_the_draft_model_only_while_it_is_likeliest_best(
        monkeypatch):
    """Beside n-gram, new requests are priced as if they had prefilled the draft model's state while the
    profile (before any step) or the exploration's draws make it the likeliest best drafter; where n-gram
    is (a draft model slower per token than the target, as on the quick CPU pair) they are not. Either way
    no prefill pass runs for short prompts: a request builds the state by catch-up where it drafts.
    (4,096 draws: the draft model is best in 57% of them, which 32 draws can miss.)"""
    import control.policy.adaptive.drafters as drafters

    monkeypatch.setattr(drafters, "THOMPSON_SAMPLES", 4096)
    view = _view(np.random.default_rng(0), 4, step=1)
    model_best = build_policy("adaptive", compile_plan(make_profile(), max_k=8))
    d = model_best.decide(view)
    assert model_best.choice.new_in_sync and model_best.drafter_state()["new_in_sync"]
    assert not d.prefill_draft and d.prefill_drafter == DRAFTERS.index("draft")
    slow_draft = make_profile(draft=(2.5e-5, 0.08, 6.0), acceptance={"draft": 0.7, "ngram": 0.7})
    ngram_best = build_policy("adaptive", compile_plan(slow_draft, max_k=8))
    assert not ngram_best.decide(view).prefill_draft
    assert not ngram_best.choice.new_in_sync


def test_specserve_prunes_unlikely_tails():
    # verification tokens cost real time here (compute-bound target), so unlikely tails are not worth it
    plan = compile_plan(make_profile(target=(1e-6, 1.0, 5.0)), max_k=8)
    pol = build_policy("specserve", plan)
    v = StepView.build(slots=[0, 1], request_ids=[1, 2], ctx_lens=[500, 500], remaining=[100, 100],
                       drafters=DRAFTERS, max_k=8, free_kv_slots=10**6, token_budget=10**6)
    d = pol.decide(v)
    conf = np.full((2, 8), np.nan)
    conf[0, :5] = 0.99
    conf[1, :5] = [0.9, 0.05, 0.9, 0.9, 0.9]
    keep = pol.prune(v, d, np.array([5, 5]), conf)
    assert keep[0] == 5 and keep[1] <= 1


def test_adaptive_runs_one_draft_model_per_step_while_ngram_mixes_freely():
    """Two draft models in one batch pay both models' per-pass costs: whatever the bandit draws, a
    step's model-drafted requests share one model; n-gram requests keep their drafter. The one
    exception: after the first epoch, a model still unmeasured keeps the requests drawn for it."""
    from control.profile import parse_profile

    doc = make_profile().model_dump(mode="json", by_alias=True)
    doc["models"]["tiny"] = {"a_ms_per_ctx_token": 1e-6, "b_ms_per_batched_token": 0.001, "c_ms": 0.4}
    doc["drafters"].append({"name": "tiny", "kind": "draft_model", "model": "tiny"})
    doc["acceptance"]["tiny"] = 0.68  # close to draft's 0.7: the bandit explores both
    profile = parse_profile(doc)
    pol = build_policy("adaptive", compile_plan(profile, max_k=6))
    drafters = tuple(pol.ctx.drafters)
    models = {i for i, d in enumerate(drafters) if d != "ngram"}
    rng = np.random.default_rng(0)
    mixed_models = 0
    for step in range(1, 200):
        view = _view(rng, 12, step=step, ctx=500, drafters=drafters, rid0=1000 * (step // 40))
        d = pol.decide(view)
        unmeasured = set(np.flatnonzero(pol.choice._unmeasured()).tolist()) if pol.bandit.epoch > 1 else set()
        used = {int(x) for x, k in zip(d.drafter, d.k, strict=True) if k > 0}
        mixed_models += len(used & models) > 1 and not (used & unmeasured)
        pol.observe(_outcome(view, d, rng.integers(0, 7, 12)))
    assert mixed_models == 0
    assert pol.bandit.switches > 0  # the bandit did explore across drafters


def test_adaptive_drafts_longer_once_it_sees_the_loop_cost_every_step_carries(plan):
    """The loop's time per request-step outside the forward passes (a server delivering outputs) is a
    cost that fewer steps save: once measured, the policy's cost model carries it and the same batch
    gets drafts at least as long, and longer in total."""
    from dataclasses import replace

    from control.policy.adaptive import AdaptivePolicy
    from control.policy.adaptive.refit import REFIT_EVERY
    from control.policy.base import PolicyContext

    def run(loop_ms):  # a full decision every step: the refit's effect, not the fast path's, is under test
        pol = AdaptivePolicy(PolicyContext.from_plan(plan), refresh_every=1)
        v = StepView.build(slots=np.arange(6), request_ids=np.arange(6), ctx_lens=[300] * 6, remaining=[400] * 6,
                           drafters=("draft",), max_k=8, free_kv_slots=10**6, token_budget=10**6)
        for step in range(REFIT_EVERY + 1):
            v.step = step
            d = pol.decide(v)
            o = _outcome(v, d, np.full(6, 2))
            pol.observe(replace(o, drafter=np.zeros(6, dtype=np.int64), prev_loop_ms=loop_ms,
                                prev_loop_requests=6 if np.isfinite(loop_ms) else 0))
        v.step = REFIT_EVERY + 1
        return pol, pol.decide(v)

    base_pol, base = run(float("nan"))
    pol, d = run(6 * 3.0)  # 3 ms per request-step
    assert base_pol.cost.target.d == plan.profile.models["target"].d_ms_per_request
    assert pol.cost.target.d + pol.cost.overhead_ms > base_pol.cost.target.d + 2.0
    assert (d.k >= base.k).all() and d.k.sum() > base.k.sum()


def test_adaptive_stops_counting_new_requests_in_sync_once_the_batch_drafts_mostly_on_n_gram():
    """Exploiting, new requests count in sync with the draft model only while at least half of the batch
    drafts on it: once the matching puts most requests on n-gram, most of them would never draft there."""
    from control.goodput.optimizer import Choice
    from control.policy.adaptive.step_plan import StepPlan

    pol = build_policy("adaptive", compile_plan(make_profile(), max_k=8))
    view = _view(np.random.default_rng(0), 6, step=1)
    pol.decide(view)
    pol.choice.bandit.exploring = False

    def ran(d_ctx, k):
        sp = StepPlan(view, k, d_ctx=d_ctx, uniform=bool((d_ctx == d_ctx[0]).all()))
        sp.choice = Choice(k, 0.0, 1.0, 1.0)
        pol.choice.note_favourite(sp)
        assert not pol.wants_draft_prefill(view)  # short prompts: no prefill pass either way
        return pol.choice.new_in_sync

    draft, ngram = DRAFTERS.index("draft"), DRAFTERS.index("ngram")
    assert ran(np.array([draft] * 4 + [ngram] * 2), np.full(6, 3))
    assert not ran(np.array([draft] * 2 + [ngram] * 4), np.full(6, 3))
    assert not ran(np.array([draft] * 4 + [ngram] * 2), np.array([3, 0, 0, 0, 3, 3]))  # only k > 0 counts
    assert ran(np.full(6, draft), np.full(6, 2))
    assert not ran(np.full(6, draft), np.zeros(6, dtype=np.int64))  # nobody drafts: no prefill
