"""The on/off gate and the drafter bandit."""

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from control.policy.bandit import DrafterBandit
from control.policy.gate import Gate
from tests.policy.test_drafter_rates import measure


def test_gate_makes_O1_transitions_when_batch_oscillates_around_the_threshold():
    for dwell in (0, 16):
        g = Gate(b_off=32, b_on_ratio=0.75, min_dwell_steps=dwell, probe_every_steps=10**9)
        for step in range(10_000):
            g.update(31 if step % 2 else 33, step)  # flips across b_off every step
        assert g.transitions == 1 and not g.on
        # a gate without hysteresis would flip ~10,000 times; ours only turns on again below b_on
        for step in range(10_000, 10_100):
            g.update(23, step)
        assert g.on and g.transitions == 2


def test_gate_respects_min_dwell_and_never_turns_off_without_threshold():
    g = Gate(b_off=10, min_dwell_steps=5, probe_every_steps=10**9)
    assert g.update(11, 0) is False  # off at once (first switch)
    assert g.update(1, 2) is False  # still dwelling
    assert g.update(1, 5) is True
    never = Gate(b_off=None)
    assert all(never.update(b, s) for s, b in enumerate(range(1, 5000)))


def test_gate_retune_moves_thresholds_and_probes_are_periodic():
    g = Gate(b_off=16, probe_every_steps=100)
    assert [s for s in range(1, 450) if g.probe_due(s)] == [100, 200, 300, 400]
    g.retune(64)
    assert g.b_off == 64 and g.b_on == 48


def _stationary_instance(seed, n=12, m=3):
    rng = np.random.default_rng(seed)
    means = rng.uniform(0.5, 2.0, (n, m))
    cap = np.array([5, 5, 4])
    cols = np.repeat(np.arange(m), cap)
    r, c = linear_sum_assignment(means[:, cols], maximize=True)
    best = means[r, cols[c]].sum()
    return rng, means, cap, best


def _run_bandit(seed, T):
    rng, means, cap, best = _stationary_instance(seed)
    random_regret = best - means.mean(axis=1).sum()
    n = means.shape[0]
    b = DrafterBandit(3, cap, explore_slots=24, chunk_slots=6, switch_cost_weight=0.0, seed=seed)
    slots = np.arange(n)
    regret = np.zeros(T)
    for t in range(T):
        a = b.assign(slots)
        assert (np.bincount(a, minlength=3) <= cap).all()
        reward = means[slots, a] + 0.3 * rng.standard_normal(n)
        b.update(slots, a, reward)
        regret[t] = best - means[slots, a].sum()
    return np.cumsum(regret), random_regret


def test_bandit_regret_grows_sublinearly_on_a_stationary_instance():
    T = 6000
    for seed in range(3):
        cum, random_regret = _run_bandit(seed, T)
        # average regret per slot keeps falling: late slots cost far less than early ones
        early = cum[T // 8] / (T // 8)
        late = (cum[-1] - cum[T // 2]) / (T - T // 2)
        assert late < 0.35 * early
        # and the total is far below what uniform random assignment would cost
        assert cum[-1] < 0.25 * random_regret * T


def test_bandit_prefers_not_switching_when_switching_is_costly():
    n, m = 8, 2
    slots = np.arange(n)
    b = DrafterBandit(m, None, explore_slots=4, chunk_slots=4, switch_cost_weight=1.0, seed=0)
    # learn that drafter 1 is marginally better for everyone
    for _ in range(200):
        a = b.assign(slots, np.zeros((n, m)))
        b.update(slots, a, np.where(a == 1, 1.05, 1.0))
    before = b.switches
    for _ in range(400):
        a = b.assign(slots, np.full((n, m), 10.0))  # a switch costs more than it could ever gain
        b.update(slots, a, np.where(a == 1, 1.05, 1.0))
    exploit_switches = b.switches - before
    # exploration stages still switch (that is the point of them), exploitation stages do not
    cheap = DrafterBandit(m, None, explore_slots=4, chunk_slots=4, switch_cost_weight=0.0, seed=0)
    for _ in range(200):
        a = cheap.assign(slots, np.zeros((n, m)))
        cheap.update(slots, a, np.where(a == 1, 1.05, 1.0))
    before_cheap = cheap.switches
    for _ in range(400):
        a = cheap.assign(slots, np.full((n, m), 10.0))
        cheap.update(slots, a, np.where(a == 1, 1.05, 1.0))
    assert exploit_switches < cheap.switches - before_cheap


def test_bandit_estimates_shrink_a_requests_few_rewards_to_the_drafters_pooled_mean():
    """With ``prior_slots``, a request's estimate on a drafter weighs the pooled mean as that many
    rewards: a lucky streak of two does not outrank a drafter that is better on the whole, while a long
    record of the request's own does; without it (SPIN) the request's plain mean is its estimate."""
    b = DrafterBandit(2, None, explore_slots=4, chunk_slots=4, seed=0)
    pool = np.arange(400)
    b.update(pool, np.zeros(400, dtype=np.int64), np.full(400, 1.6))  # drafter 0: 1.6 over many requests
    b.update(pool, np.ones(400, dtype=np.int64), np.full(400, 1.2))  # drafter 1: 1.2
    slots = np.array([500, 501])
    for _ in range(2):  # request 500: two lucky steps on drafter 1
        b.update(slots[:1], np.array([1]), np.array([2.0]))
    for _ in range(64):  # request 501: drafter 1 is really better for it
        b.update(slots[1:], np.array([1]), np.array([2.0]))
    plain = b.estimates(slots)  # (2, 2)
    assert plain[0, 1] == 2.0 and plain[0, 1] > plain[0, 0]  # SPIN: the lucky streak wins
    b.prior_slots = 8.0
    est = b.estimates(slots)
    assert est[0, 0] == plain[0, 0] and est[0, 1] < est[0, 0]  # the pooled mean wins over two steps
    assert est[1, 1] > est[1, 0]  # 64 steps of its own outweigh the prior
    assert est[0, 1] == (2 * 2.0 + 8.0 * b.pool_sum[1] / b.pool_cnt[1]) / (2 + 8.0)


def test_bandit_explores_with_the_given_probabilities_and_only_allowed_drafters():
    b = DrafterBandit(3, None, explore_slots=8, chunk_slots=1, seed=0)
    b.explore_p = np.array([0.0, 0.9, 0.1])
    slots = np.arange(200)
    counts = np.zeros(3)
    for _ in range(8):
        assert b.draws_next()
        counts += np.bincount(b.assign(slots), minlength=3)
    assert counts[0] == 0 and counts[1] > 5 * counts[2] > 0
    # a drafter the executor does not run is never drawn, whatever its probability
    b2 = DrafterBandit(3, None, explore_slots=8, chunk_slots=1, seed=0)
    b2.explore_p = np.array([0.0, 0.9, 0.1])
    a = b2.assign(slots, allowed=np.array([True, False, True]))
    assert set(np.unique(a)) == {2}


def _adaptive_two_drafters(acceptance, n=4):
    from control.plan import compile_plan
    from control.policy import StepView, build_policy
    from tests.conftest import make_profile

    pol = build_policy("adaptive", compile_plan(make_profile(acceptance=acceptance), max_k=8))
    view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 300),
                          remaining=np.full(n, 100), drafters=("draft", "ngram"), max_k=8, free_kv_slots=10**6,
                          token_budget=8192, draft_lag=np.zeros((n, 2), dtype=np.int64), step=1)
    pol.decide(view)
    return pol, view


def _explore(pol, view, allowed):
    """The drafter-choice stage's exploration probabilities, as adaptive asks for them."""
    return pol.choice.explore_probs(view, allowed, pol._to_exec, pol.cost)


def test_adaptive_explores_a_drafter_in_proportion_to_its_chance_of_being_best():
    allowed = np.array([True, True])
    pol, view = _adaptive_two_drafters({"draft": 0.75, "ngram": 0.6})
    rival = _explore(pol, view, allowed)
    assert np.isclose(rival.sum(), 1.0) and 0.1 < rival[1] < 0.9  # a plausible rival is explored
    pol, view = _adaptive_two_drafters({"draft": 0.75, "ngram": 0.05})
    assert _explore(pol, view, allowed)[1] < 0.05  # a drafter the profile rates hopeless is not
    # measurements move it: the rival measured at 0.2 beside the draft model at 0.75 is dropped
    pol, view = _adaptive_two_drafters({"draft": 0.75, "ngram": 0.6})
    for _ in range(20):  # taking turns, 120 requests of 5 steps in all
        measure(pol.choice, 0, lambda p: 0.75, requests=2, steps=5)
        measure(pol.choice, 1, lambda p: 0.2, requests=4, steps=5)
    assert _explore(pol, view, allowed)[1] < 0.05
    # ... and measured at 0.95 it wins
    for _ in range(20):
        measure(pol.choice, 0, lambda p: 0.75, requests=2, steps=5)
        measure(pol.choice, 1, lambda p: 0.95, requests=4, steps=5)
    assert _explore(pol, view, allowed)[1] > 0.9
    assert _explore(pol, view, np.array([True, False]))[1] == 0.0  # not run by the executor


def test_adaptive_exploration_weighs_a_drafters_evidence_by_request_steps_not_positions(monkeypatch):
    """The draft model measured at a chain rate of 2/3 over 120 positions: from 40 drafts of 8 tokens
    (two accepted, the third rejected) that is 40 pieces of evidence, from 120 one-token drafts 120. With
    n-gram the favourite (measured at 0.5), the draft model measured by few long drafts is explored more,
    and as favourite (measured at 0.8) its lead is less sure. Both over 40 requests, the evidence kept
    whole (no decay). (4,096 draws: smooth probabilities.)"""
    import control.policy.adaptive.drafter_rates as drafter_rates
    import control.policy.adaptive.drafters as drafters

    monkeypatch.setattr(drafters, "THOMPSON_SAMPLES", 4096)
    monkeypatch.setattr(drafter_rates, "POSITION_DECAY", 1.0)
    allowed = np.array([True, True])

    def p_draft(successes, trials):
        pol, view = _adaptive_two_drafters({"draft": 0.75, "ngram": 0.6})
        pol.choice.prices = None  # exact prices: the acceptance evidence alone
        measure(pol.choice, 1, lambda p: 0.5, requests=40, steps=10)
        per_request = len(trials) // 40
        slot, yes = np.array([0]), np.array([True])
        for j, (s, t) in enumerate(zip(successes, trials, strict=True)):
            if j % per_request == 0:
                pol.choice.reset(slot)
            pol.choice.learn(slot, np.array([0]), np.array([s]), np.array([t]), yes, np.array([s]))
        return _explore(pol, view, allowed)[0], tuple(pol.choice.evidence.counts[:2, 0].sum(axis=1))

    deep, deep_totals = p_draft([2] * 40, [3] * 40)
    shallow, shallow_totals = p_draft((np.arange(120) % 3 != 0).astype(int), [1] * 120)
    assert deep_totals == shallow_totals == (80.0, 120.0)
    assert deep > 1.3 * shallow > 0  # (counted by positions tried, the two would be equal)
    lead_deep, _ = p_draft([4] * 40, [5] * 40)
    lead_shallow, _ = p_draft((np.arange(200) % 5 != 0).astype(int), [1] * 200)
    assert 0.5 < lead_deep < lead_shallow


def test_adaptive_ignores_outcomes_of_a_drafter_it_does_not_know():
    """An executor may draft with a drafter the plan lacks (its drafter index maps to -1): those
    outcomes must not be credited to another drafter's acceptance or bandit arm."""
    from control.plan import compile_plan
    from control.policy import StepOutcome, StepView, build_policy
    from tests.conftest import make_profile

    pol = build_policy("adaptive", compile_plan(make_profile(), max_k=4))
    n = 6
    view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 100),
                          remaining=np.full(n, 50), drafters=("other", "draft", "ngram"), max_k=4,
                          free_kv_slots=10**6, token_budget=4096, draft_lag=np.zeros((n, 3), dtype=np.int64), step=1)
    pol.decide(view)
    before = [p.trials.copy() for p in pol.pos]
    k = np.full(n, 3)
    pol.observe(StepOutcome(slots=view.slots, request_ids=view.request_ids, drafter=np.zeros(n, dtype=np.int64),
                            ctx_lens=view.ctx_lens, drafted=k, verified=k, accepted=np.full(n, 2), verify_ms=10.0,
                            draft_ms=2.0, total_ms=12.0, draft_passes=3, draft_ctx_tokens=600, draft_batched_tokens=18,
                            step=1))
    assert all((p.trials == b).all() for p, b in zip(pol.pos, before, strict=True))
    assert pol.bandit.pool_cnt.sum() == 0


def test_adaptive_exploration_counts_the_catch_up_a_draft_model_needs():
    """Moving requests onto a draft model that has not run on them recomputes their whole context
    there: a batch out of sync with the draft explores it less than the same batch in sync."""
    from control.plan import compile_plan
    from control.policy import StepView, build_policy
    from tests.conftest import make_profile

    prof = make_profile(draft=(2.5e-6, 0.02, 1.0), acceptance={"draft": 0.75, "ngram": 0.6})
    pol = build_policy("adaptive", compile_plan(prof, max_k=8))
    n = 4

    def view(lag):
        dl = np.zeros((n, 2), dtype=np.int64)
        dl[:, 0] = lag
        return StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 300),
                              remaining=np.full(n, 100), drafters=("draft", "ngram"), max_k=8, free_kv_slots=10**6,
                              token_budget=8192, draft_lag=dl, step=1)

    pol.decide(view(0))
    allowed = np.array([True, True])
    in_sync = np.mean([_explore(pol, view(0), allowed)[0] for _ in range(40)])
    behind = np.mean([_explore(pol, view(300), allowed)[0] for _ in range(40)])
    assert in_sync > behind + 0.08, (in_sync, behind)


def _two_draft_models_profile(small_c, tiny_c):
    from control.profile import parse_profile

    models = {"target": {"a_ms_per_ctx_token": 2e-5, "b_ms_per_batched_token": 0.02, "c_ms": 6.0}}
    drafters = []
    for name, c in (("small", small_c), ("tiny", tiny_c)):
        models[name] = {"a_ms_per_ctx_token": 2.5e-6, "b_ms_per_batched_token": 0.003, "c_ms": c}
        drafters.append({"name": name, "kind": "draft_model", "model": name})
    return parse_profile({"schema": "specctl.profile/v1", "sku": "test", "pair": "t+2", "source": "roofline",
                          "models": models, "drafters": drafters, "acceptance": {"small": 0.7, "tiny": 0.7},
                          "limits": {"max_batch": 32}})


def test_adaptive_prefills_the_draft_model_it_drafts_with():
    """New requests prefill the state of the draft model adaptive expects to use: the profile's best
    before any step, then the one that drafted for most requests last step. The executor's default
    (-1) is kept when that is the plan's default drafter."""
    from control.plan import compile_plan
    from control.policy import StepView, build_policy

    def policy(small_c, tiny_c):
        return build_policy("adaptive", compile_plan(_two_draft_models_profile(small_c, tiny_c), max_k=6,
                                                     default_drafter="small"))

    n = 6
    # the executor lists its drafters in another order than the plan: indices are the executor's
    view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 200),
                          remaining=np.full(n, 100), drafters=("tiny", "small"), max_k=6, free_kv_slots=10**6,
                          token_budget=8192, draft_lag=np.zeros((n, 2), dtype=np.int64), step=1)
    cheap_tiny = policy(2.0, 0.2)
    d = cheap_tiny.decide(view)
    assert d.prefill_drafter == 0  # tiny, in the executor's order
    same = policy(0.2, 0.2)
    assert same.decide(view).prefill_drafter in (-1, 1)  # small: the default either way
    # what ran decides from then on
    ran_small = np.array([0, 0, 0, 0, 1, 1])  # plan indices: small for four requests, tiny for two
    cheap_tiny.choice.note_favourite(_ran(view, ran_small, np.full(n, 2)))
    assert cheap_tiny.prefill_drafter() == 1
    cheap_tiny.choice.note_favourite(_ran(view, ran_small, np.array([0, 0, 0, 0, 3, 3])))  # only k > 0 counts
    assert cheap_tiny.prefill_drafter() == 0


def _ran(view, d_ctx, k):
    """A step plan in which requests drafted ``k`` tokens on plan drafters ``d_ctx``."""
    from control.goodput.optimizer import Choice
    from control.policy.adaptive.step_plan import StepPlan

    sp = StepPlan(view, k, d_ctx=d_ctx, uniform=bool((d_ctx == d_ctx[0]).all()))
    sp.choice = Choice(k, 0.0, 1.0, 1.0)
    return sp


def test_adaptive_counts_an_n_gram_draft_that_stops_short_as_a_rejection():
    """An n-gram lookup drafts fewer tokens than asked when its match runs out (or none without a
    match). For the optimiser, which asks for k, the skipped position is a rejection: counting only
    what was drafted gave n-gram the per-position rates of its long matches, and adaptive drifted to
    it live while its realised acceptance fell to 0.4. A lookup that found nothing drafted nothing and
    verified nothing: no trial (counting it as a rejection made n-gram look worst at the start of
    every request, where it has no text to match yet). A draft model cut short by the policy's own
    confidence cut is not penalised."""
    from control.plan import compile_plan
    from control.policy import StepOutcome, StepView, build_policy
    from tests.conftest import make_profile

    pol = build_policy("adaptive", compile_plan(make_profile(acceptance={"draft": 0.7, "ngram": 0.7}), max_k=6))
    n = 8
    view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 100),
                          remaining=np.full(n, 50), drafters=("draft", "ngram"), max_k=6, free_kv_slots=10**6,
                          token_budget=4096, draft_lag=np.zeros((n, 2), dtype=np.int64), step=1)
    d = pol.decide(view)
    assert d.k.max() > 1
    asked = d.k
    ng, dm = pol.ctx.drafters.index("ngram"), pol.ctx.drafters.index("draft")

    def outcome(drafter_ctx, drafted, step):
        exec_idx = np.full(n, ("draft", "ngram").index(pol.ctx.drafters[drafter_ctx]))
        return StepOutcome(slots=view.slots, request_ids=view.request_ids, drafter=exec_idx, ctx_lens=view.ctx_lens,
                           drafted=drafted, verified=drafted, accepted=drafted, verify_ms=10.0, draft_ms=0.1,
                           total_ms=10.1, step=step)

    # half the requests found no match, the rest matched one token less than asked, all accepted
    short = np.where(np.arange(n) % 2 == 0, 0, np.maximum(asked - 1, 0))
    before = pol.pos[ng].totals
    pol.observe(outcome(ng, short, 1))
    s, t = (a - b for a, b in zip(pol.pos[ng].totals, before, strict=True))
    # one failure where a draft stopped short after proposing something; none for an empty lookup
    assert t == short.sum() + np.count_nonzero((asked > short) & (short > 0))
    assert np.count_nonzero((asked > short) & (short > 0)) > 0 and np.count_nonzero(short == 0) > 0
    assert s == short.sum()
    # the same short drafts from a draft model with confidences (a confidence cut) count no failure
    pol.decide(view)
    before = pol.pos[dm].totals
    pol.observe(outcome(dm, short, 2))
    s, t = (a - b for a, b in zip(pol.pos[dm].totals, before, strict=True))
    assert t == s == short.sum()


def test_adaptive_keeps_the_gate_open_when_only_the_requests_own_rates_say_k_0():
    """At light load one request whose own acceptance is poor gets k = 0 step after step. That says
    nothing about the batch size while the drafter's pooled rate still pays there, so the gate must
    not close (it did, at batch 1-2, until the next probe). When the pooled rate does not pay either,
    the run of zeros still closes it."""
    from control.plan import compile_plan
    from control.policy import StepOutcome, StepView, build_policy
    from tests.conftest import make_profile

    def run(history: float):
        plan = compile_plan(make_profile(draft=(2.5e-6, 0.003, 3.0), acceptance={"draft": 0.8, "ngram": 0.4}), max_k=6,
                            drafters=["draft"])
        pol = build_policy("adaptive", plan)
        step = 1

        def step_with(slots, rids, accepted_frac):
            nonlocal step
            n = slots.size
            view = StepView.build(slots=slots, request_ids=rids, ctx_lens=np.full(n, 200), remaining=np.full(n, 200),
                                  drafters=("draft",), max_k=6, free_kv_slots=10**6, token_budget=4096, step=step)
            d = pol.decide(view)
            k = d.k
            acc = np.floor(k * accepted_frac).astype(np.int64)
            verify_ms, draft_ms = 8.0 + 0.1 * float(k.sum()), 1.0 + 0.3 * float(k.max(initial=0))
            pol.observe(StepOutcome(slots=slots, request_ids=rids, drafter=np.zeros(n, dtype=np.int64),
                                    ctx_lens=view.ctx_lens, drafted=k, verified=k, accepted=acc, verify_ms=verify_ms,
                                    draft_ms=draft_ms, total_ms=verify_ms + draft_ms, draft_passes=int(k.max(initial=0)),
                                    draft_ctx_tokens=int(200 * n), draft_batched_tokens=int(k.sum()), step=step))
            step += 1
            return d

        for _ in range(60):  # many requests before it: the pooled rate follows their acceptance
            step_with(np.arange(8), np.arange(8), history)
        lone = np.array([8]), np.array([100])
        # a request whose drafts are all rejected: its first positions' failures against the curve's
        # there (its shift, ``RequestBeta.reference``) take it to k = 0 within 240 steps
        ks = [step_with(*lone, 0.0).k[0] for _ in range(240)]
        return pol, ks

    pol, ks = run(history=1.0)
    assert ks[-1] == 0  # its own rate says k = 0 ...
    assert pol.gate.b_off > 2  # ... but the gate stays open for batches the pooled rate pays at
    pol, ks = run(history=0.0)
    assert ks[-1] == 0 and pol.gate.b_off <= 1  # nothing pays at the pooled rate either: the gate closes


def _clock(b):
    return b.epoch, b.exploring, b.t_stage


def test_bandit_clock_counts_steps_however_often_it_is_consulted():
    """Consulted every step, or every ``every`` steps with the held steps passed to ``advance``, the
    bandit is at the same place of its stages at each consultation (exploration lasts as many
    steps), and a chunk whose boundary fell between two consultations draws anew at the next."""
    slots = np.arange(6)
    for every in (3, 8, 13):
        ref = DrafterBandit(3, None, explore_slots=32, chunk_slots=8, seed=0)
        held = DrafterBandit(3, None, explore_slots=32, chunk_slots=8, seed=0)
        last, draws = None, 0
        for step in range(600):
            if step % every == 0:
                if step:
                    held.advance(every - 1)
                assert _clock(held) == _clock(ref), (every, step)
                # a new chunk or stage began since the last consultation: exactly then it draws or matches
                assert held.boundary_next() == (ref._chunk() != last), (every, step)
                draws += held.draws_next()
                last = ref._chunk()
                held.assign(slots)
            ref.assign(slots)
        assert ref.epoch >= 5 and draws >= 600 // 40
    # an exploitation stage shorter than the held steps is passed over, not stretched
    b = DrafterBandit(2, None, explore_slots=4, chunk_slots=4, seed=0)
    b.assign(slots)
    b.advance(3 + 2)  # the rest of exploration, and epoch 1's 2-step exploitation
    assert b.exploring and b.epoch == 2 and b.draws_next()


def test_bandit_puts_the_whole_batch_on_the_owners_drafter_while_exploiting():
    """``assign(whole=d)``: while exploring the draws go on as before; while exploiting every request
    gets d (a newcomer too), where the matching would have followed each request's rewards."""
    slots = np.arange(4)
    b = DrafterBandit(3, None, explore_slots=4, chunk_slots=2, seed=0)
    ref = DrafterBandit(3, None, explore_slots=4, chunk_slots=2, seed=0)
    for _ in range(4):  # exploration: the same draws with or without ``whole``
        assert (b.assign(slots, whole=1) == ref.assign(slots)).all()
    assert not b.exploring
    b.update(slots, np.zeros(4, dtype=np.int64), np.full(4, 3.0))  # rewards favour drafter 0 ...
    ref.update(slots, np.zeros(4, dtype=np.int64), np.full(4, 3.0))
    assert (ref.assign(slots) == 0).all()  # ... which the matching follows
    assert (b.assign(slots, whole=2) == 2).all()
    b.reset(np.array([3]))
    assert (b.assign(slots, whole=2) == 2).all() and (b.assigned[slots] == 2).all()


def test_while_exploring_a_step_s_draft_model_is_the_likeliest_best_not_the_most_drawn():
    """One draft model per step: outside exploration the most used one; while the bandit explores, the
    drawn model its posterior makes likeliest best (the favourite on a near tie), so a first step whose
    draws favour the worse model does not put every request on it and leave the other behind."""
    from control.plan import compile_plan
    from control.policy import build_policy
    from control.policy.adaptive.drafters import EXPLORE_TIE

    pol = build_policy("adaptive", compile_plan(_two_draft_models_profile(2.0, 0.2), max_k=6, default_drafter="small"))
    choice, bandit = pol.choice, pol.bandit
    drawn = np.array([0, 0, 0, 1])  # plan indices: small drawn for three requests, tiny for one
    bandit.exploring, bandit.explore_p = True, np.array([0.3, 0.7])
    choice.fav = 0
    assert choice._one_model_per_step(drawn).tolist() == [1, 1, 1, 1]  # tiny, likeliest best
    bandit.explore_p = np.array([0.5 - EXPLORE_TIE / 4, 0.5 + EXPLORE_TIE / 4])
    assert choice._one_model_per_step(drawn).tolist() == [0, 0, 0, 0]  # a near tie: the favourite stays
    choice.fav = 1
    assert choice._one_model_per_step(np.array([0, 0, 0, 0])).tolist() == [0, 0, 0, 0]  # only drawn models
    bandit.exploring = False
    bandit.explore_p = np.array([0.3, 0.7])
    assert choice._one_model_per_step(drawn).tolist() == [0, 0, 0, 0]  # exploiting: the most used


def test_a_draft_model_still_unmeasured_after_an_epoch_drafts_for_the_requests_drawn_for_it():
    """From the second epoch, consolidation no longer takes an unmeasured model's draws away: with
    the favourite likelier best in every step, the other model would never draft, its rewards would
    stay empty and exploitation would never pick it (the full pair's replay, batch 4, seed 10: draft-
    tiny, the best model, untried for nine epochs, 0.84x the best fixed configuration)."""
    from control.plan import compile_plan
    from control.policy import build_policy
    from control.policy.adaptive.probes import PROBE_TRIALS

    pol = build_policy("adaptive", compile_plan(_two_draft_models_profile(2.0, 0.2), max_k=6, default_drafter="small"))
    choice, bandit = pol.choice, pol.bandit
    drawn = np.array([0, 0, 0, 1])
    bandit.exploring, bandit.explore_p, choice.fav = True, np.array([0.8, 0.2]), 0
    choice.pos[0].trials[0] = PROBE_TRIALS  # small measured, tiny never drafted
    assert choice._one_model_per_step(drawn).tolist() == [0, 0, 0, 0]  # the first epoch: one model
    bandit.epoch = 2
    assert choice._one_model_per_step(drawn).tolist() == [0, 0, 0, 1]  # tiny keeps its draw
    choice.pos[1].trials[0] = PROBE_TRIALS  # measured now: one model per step again
    assert choice._one_model_per_step(drawn).tolist() == [0, 0, 0, 0]


def test_adaptive_drafter_state_says_what_the_choice_rests_on():
    """The stats' view of the drafter choice: the profile's favourite before any step, each drafter's
    chain-rate posterior and evidence, and after an exploiting decision the goodput it modelled,
    highest for the drafter it chose."""
    from control.plan import compile_plan
    from control.policy import StepView, build_policy

    pol = build_policy("adaptive", compile_plan(_two_draft_models_profile(2.0, 0.2), max_k=6, default_drafter="small"))
    state = pol.drafter_state()
    assert state["favourite"] == "tiny" and state["stage"] == "exploring" and state["exploit"] is None
    assert state["lookups_scored"] is False  # no outcome yet
    assert set(state["drafters"]) == {"small", "tiny"}
    assert state["drafters"]["tiny"]["chain_rate"] == 0.7 and state["drafters"]["tiny"]["request_steps"] == 0
    assert state["drafters"]["tiny"]["value"] is None  # no exploiting decision yet
    measure(pol.choice, 0, lambda p: 0.9, requests=40, steps=10)  # small measured at 0.9
    n = 4
    view = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 200),
                          remaining=np.full(n, 100), drafters=("small", "tiny"), max_k=6, free_kv_slots=10**6,
                          token_budget=8192, draft_lag=np.zeros((n, 2), dtype=np.int64), step=1)
    best = pol.choice.exploit_best(view, np.array([True, True]), pol._to_exec, pol.cost)
    state = pol.drafter_state()
    small, tiny = state["drafters"]["small"], state["drafters"]["tiny"]
    assert 150 < small["request_steps"] < 400  # decayed by POSITION_DECAY a step
    assert 0.85 < small["chain_rate"] < 0.9 and small["sd"] < tiny["sd"]
    values = [small["value"], tiny["value"]]
    assert min(values) > 0 and int(np.argmax(values)) == best
    one = build_policy("adaptive", compile_plan(_two_draft_models_profile(2.0, 0.2), max_k=6, drafters=["tiny"]))
    assert one.drafter_state() is None  # nothing to choose


def test_bandit_draws_the_requests_it_is_told_are_in_sync_with_their_own_probabilities():
    """``assign(sync_rows=...)`` draws the flagged requests with ``sync_p``, the rest with ``explore_p``,
    at a chunk's start and when a flagged request's drafter falls to ``keep_p`` mid-chunk; while
    exploiting an (n,) ``whole`` puts each request on its own drafter."""
    slots = np.arange(10)
    rows = slots < 4
    b = DrafterBandit(3, None, explore_slots=8, chunk_slots=4, seed=0)
    b.explore_p, b.sync_p, b.keep_p = np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 0.0]), 0.1
    a = b.assign(slots, sync_rows=rows)
    assert (a[rows] == 1).all() and (a[~rows] == 2).all()
    b.sync_p = np.array([1.0, 0.0, 0.0])  # mid-chunk: the flagged requests' drafter is now a long shot
    a = b.assign(slots, sync_rows=rows)
    assert (a[rows] == 0).all() and (a[~rows] == 2).all()
    plain = DrafterBandit(3, None, explore_slots=8, chunk_slots=4, seed=0)  # no rows: explore_p for all
    plain.explore_p, plain.sync_p = b.explore_p, np.array([0.0, 1.0, 0.0])
    assert (plain.assign(slots) == 2).all()
    b.advance(8 - b.t_stage)  # to the exploitation stage
    assert not b.exploring
    each = np.where(rows, 1, 2)
    assert (b.assign(slots, whole=each) == each).all() and (b.assigned[slots] == each).all()


def _lagging_batch_view(n, lag_rows, lag=300):
    """A batch of n requests whose first ``lag_rows`` lag the draft model by ``lag`` tokens (the rest in sync)."""
    from control.policy import StepView

    dl = np.zeros((n, 2), dtype=np.int64)
    dl[:lag_rows, 0] = lag
    return StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 300),
                          remaining=np.full(n, 100), drafters=("draft", "ngram"), max_k=8, free_kv_slots=10**6,
                          token_budget=8192, draft_lag=dl, step=1)


def test_adaptive_prices_the_requests_in_sync_with_the_draft_model_apart_from_those_behind():
    """A batch that drafted with n-gram lags the draft model by whole contexts, and moving it there
    would pay their catch-up; new requests prefilled on the draft model pay none. Priced with the
    batch, they stayed on n-gram and so fell behind too: a batch-16 replay stayed on n-gram for its
    whole run at 0.961 of the best fixed configuration (docs/decisions.md, 2026-11-29 (stop 59)).
    The requests in sync are priced with their own catch-up: they draw the draft model more often,
    while exploiting they move to it where the rest stay, and new requests keep prefilling it."""
    from control.plan import compile_plan
    from control.policy import build_policy
    from tests.conftest import make_profile

    prof = make_profile(draft=(2.5e-6, 0.02, 1.0), acceptance={"draft": 0.9, "ngram": 0.6})
    pol = build_policy("adaptive", compile_plan(prof, max_k=8))
    n = 8
    pol.decide(_lagging_batch_view(n, 0))
    ch, allowed = pol.choice, np.array([True, True])
    assert ch.fav == 0  # the draft model is the favourite
    view = _lagging_batch_view(n, n - 2)
    batch_p, sync_p = np.zeros(2), np.zeros(2)
    for _ in range(40):
        batch_p += ch.explore_probs(view, allowed, pol._to_exec, pol.cost) / 40
        sync_p += ch.sync_p / 40
    assert (ch.sync_rows == (np.arange(n) >= n - 2)).all()
    assert sync_p[0] > batch_p[0] + 0.08, (sync_p, batch_p)
    whole = ch.exploit_best(view, allowed, pol._to_exec, pol.cost)
    assert whole == 1 and ch.exploit_sync == 0, (whole, ch.exploit_sync)  # n-gram for the batch, the draft for the cohort
    assert pol.drafter_state()["in_sync"] == {"requests": 2, "drafter": "draft"}
    # every request in sync, or none: no cohort, the batch's own choice (a lone request in sync
    # could not pay for the draft model's passes beside a batch on n-gram)
    for lagging in (0, n):
        p = ch.explore_probs(_lagging_batch_view(n, lagging), allowed, pol._to_exec, pol.cost)
        assert ch.sync_rows is None and ch.sync_p is p and pol.drafter_state()["in_sync"] is None


def _two_models_view(n, ctx, lag_small, lag_tiny):
    """A batch of n requests on plan drafters (small, tiny) with per-request lags ``lag_small``, ``lag_tiny`` (n,)."""
    from control.policy import StepView

    return StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, ctx),
                          remaining=np.full(n, 100), drafters=("small", "tiny"), max_k=6, free_kv_slots=10**6,
                          token_budget=8192, draft_lag=np.stack([lag_small, lag_tiny], axis=1).astype(np.int64), step=1)


def test_adaptive_moves_a_batch_to_the_draft_model_it_would_choose_in_sync_as_the_batch_turns_over():
    """A batch settled on one draft model lags another by whole contexts, so it stays where it is for
    the catch-up alone, and new requests prefilled on its model kept it there: with a plan from a
    stale profile a batch-16 replay stayed on draft-small at 0.90 of draft-tiny's best fixed k
    (docs/decisions.md, 2026-11-29 (stop 60)). When a request in sync with both would draft faster on
    the other by the margin, new requests prefill that one, those in sync with it draft there while
    the rest stay (two models in a step), and with no lead the batch's model stays the target."""
    from control.plan import compile_plan
    from control.policy import build_policy

    n, ctx = 8, 1000
    none, behind = np.zeros(n, dtype=np.int64), np.full(n, ctx)
    allowed = np.array([True, True])
    for small_c, moves in ((0.2, False), (0.5, True)):  # the same per pass, or tiny cheaper (kept below)
        pol = build_policy("adaptive", compile_plan(_two_draft_models_profile(small_c, 0.2), max_k=6,
                                                    default_drafter="small"))
        pol.decide(_two_models_view(n, ctx, none, none))
        ch = pol.choice
        ch.fav, pol.bandit.exploring = 0, False  # the batch drafts on small and lags tiny; exploiting
        whole = ch.exploit_best(_two_models_view(n, ctx, none, behind), allowed, pol._to_exec, pol.cost)
        assert whole == 0, ch._last_values  # the catch-up keeps the batch on small
        assert ch.target == (1 if moves else -1)
        ch.note_favourite(_ran(_two_models_view(n, ctx, none, behind), np.zeros(n, dtype=np.int64), np.full(n, 2)))
        assert ch.fav == 0 and ch.new_in_sync
        assert pol.prefill_drafter() == ch.newcomer() == (1 if moves else 0)  # the executor lists them as the plan
        assert pol.drafter_state()["target"] == ("tiny" if moves else None)
    # the batch turning over: two new requests prefilled on tiny lag small
    new = np.arange(n) >= n - 2
    view = _two_models_view(n, ctx, np.where(new, ctx, 0), np.where(new, 0, ctx))
    assert ch.exploit_best(view, allowed, pol._to_exec, pol.cost) == 0 and ch.target == 1
    assert (ch.sync_rows == new).all() and ch.exploit_sync == 1
    assert ch._one_model_per_step(np.where(new, 1, 0)).tolist() == [0] * (n - 2) + [1, 1]  # two models
    ch.sync_rows = None
    assert ch._one_model_per_step(np.where(new, 1, 0)).tolist() == [0] * n  # no cohort: the most used


def test_a_lookup_the_executor_scores_is_not_explored_and_takes_a_batch_only_by_a_margin():
    """Where every step scores the lookup (``StepOutcome.ngram_match``), drafting on it teaches
    nothing: exploration draws n-gram only where it beats the draft model at the posterior means, and
    a batch on the draft model moves to it only by ``LEAVE_MARGIN`` (its requests would fall out of
    sync with the model); one already on n-gram stays while n-gram is ahead at all."""
    from control.policy.adaptive.drafters import LEAVE_MARGIN

    allowed = np.array([True, True])
    pol, view = _adaptive_two_drafters({"draft": 0.8, "ngram": 0.55})
    assert 0.1 < _explore(pol, view, allowed)[1] < 0.9  # a plausible rival while it must be tried
    pol.choice.lookups_scored = True
    assert _explore(pol, view, allowed)[1] == 0.0  # worse at the means: never drawn
    for _ in range(20):  # scored at 0.95 it wins at the means, and is drawn where no model's draw beats it
        measure(pol.choice, 0, lambda p: 0.75, requests=2, steps=5)
        measure(pol.choice, 1, lambda p: 0.95, requests=4, steps=5)
    assert _explore(pol, view, allowed)[1] > 0.9
    ch = pol.choice
    ch.exploit = 0  # the batch on the draft model
    below, above = 1.0 + 0.5 * LEAVE_MARGIN, 1.0 + 2.0 * LEAVE_MARGIN
    assert ch._stay_off_lookup(np.array([1.0, below]), 1, allowed) == 0
    assert ch._stay_off_lookup(np.array([1.0, above]), 1, allowed) == 1
    ch.exploit = 1  # already on n-gram
    assert ch._stay_off_lookup(np.array([1.0, 1.001]), 1, allowed) == 1
    ch.exploit, ch.lookups_scored = 0, False  # unscored, n-gram is learned only by drafting on it
    assert ch._stay_off_lookup(np.array([1.0, below]), 1, allowed) == 1


def test_adaptive_prices_new_requests_as_if_prefilled_on_the_favourite(monkeypatch):
    """No prefill pass builds a new request's draft state (short prompts): it lags the draft model by its
    whole context until its first draft pass there catches up. While new requests count in sync with the
    favourite (``new_in_sync``), exploration prices them as if prefilled there, as likely to draw the
    draft model as a batch in sync; once they do not, their catch-up is priced and the draft model is
    drawn less. A request that drafted there before and fell behind is priced at its lag either way.
    (4,096 draws, so the chances are read to about 0.01.)"""
    import control.policy.adaptive.drafters as drafters
    from control.plan import compile_plan
    from control.policy import StepView, build_policy
    from tests.conftest import make_profile

    monkeypatch.setattr(drafters, "THOMPSON_SAMPLES", 4096)
    pol = build_policy("adaptive", compile_plan(make_profile(), max_k=8))
    n = 8

    def view(lag, ctx=300):
        dl = np.zeros((n, 2), dtype=np.int64)
        dl[:, 0] = lag
        return StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, ctx),
                              remaining=np.full(n, 100), drafters=("draft", "ngram"), max_k=8, free_kv_slots=10**6,
                              token_budget=8192, draft_lag=dl, step=1)

    assert not pol.decide(view(0)).prefill_draft
    ch, allowed = pol.choice, np.array([True, True])
    assert ch.new_in_sync and ch.fav == 0

    def p_draft(v):
        return ch.explore_probs(v, allowed, pol._to_exec, pol.cost)[0]

    in_sync = p_draft(view(0))
    assert abs(p_draft(view(300)) - in_sync) < 0.04  # new: priced as if prefilled
    assert p_draft(view(290)) < in_sync - 0.1  # drafted there once: its lag is real
    ch.new_in_sync = False
    assert p_draft(view(300)) < in_sync - 0.1



def test_drafter_state_writes_nothing_the_decisions_read():
    """The stats thread reads ``drafter_state`` while the engine thread decides, so the read must write no
    state the decisions read, the posteriors' caches included: a cache written from the stats thread once
    met the engine thread half-built (``AttributeError`` in decide) and could leave a stale posterior."""
    import pickle

    from control.plan import compile_plan
    from control.policy import build_policy

    pol = build_policy("adaptive", compile_plan(_two_draft_models_profile(2.0, 0.2), max_k=6, default_drafter="small"))
    for fresh in (True, False):  # before any posterior, and with evidence newer than the cached ones
        before = pickle.dumps(pol.choice)
        state = pol.drafter_state()
        assert pickle.dumps(pol.choice) == before
        assert state["drafters"]["small"]["chain_rate"] == (0.7 if fresh else pytest.approx(0.89, abs=0.02))
        pol.choice.explore_probs(_two_models_view(4, 200, np.zeros(4), np.zeros(4)), np.array([True, True]),
                                 pol._to_exec, pol.cost)
        measure(pol.choice, 0, lambda p: 0.9, requests=40, steps=10)
        pol.choice.prices.observe(0, 3.0, 2.0)
