"""The gate stage's probe windows: while the gate is off, a few requests draft one token now and then,
so acceptance that rose while nothing drafted reopens the gate (control/policy/adaptive/gate_stage.py)."""

import numpy as np

from control.goodput.optimizer import Choice, Constraints
from control.plan import compile_plan
from control.policy import StepView
from control.policy.adaptive.gate_stage import PROBE_BACKOFF, PROBE_REQUESTS, PROBE_STEPS, GateStage
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.uniform_steps import UniformSteps
from control.policy.base import PolicyContext
from control.policy.gate import Gate
from tests.conftest import make_profile

K = 4
EVERY = 32  # probe_every_steps of the gate under test


def _view(n, step, lag=None):
    dl = np.zeros((n, 1), dtype=np.int64) if lag is None else lag.reshape(n, 1)
    return StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 300),
                          remaining=np.full(n, 100), drafters=("draft",), max_k=K, free_kv_slots=10**6,
                          token_budget=8192, draft_lag=dl, step=step)


def _setup():
    ctx = PolicyContext.from_plan(compile_plan(make_profile(target=(2e-5, 0.2, 4.0)), max_k=K))
    stage = GateStage(Gate(None, 0.75, 4, EVERY), UniformSteps(1, K))
    return ctx, stage


def _open(stage, ctx, n, step, rate):
    return stage.open(_view(n, step), ctx.plan, ctx.cost, K, [0], lambda i: rate)


def _first_window(stage, ctx, n) -> int:
    """Close the gate at batch 2 (as a poor acceptance leaves it) and step until the first probe
    window opens it; returns that step."""
    stage.gate.retune(2)
    step = 1
    while not _open(stage, ctx, n, step, 0.05):
        step += 1
    return step


def test_an_off_gate_opens_probe_windows_backing_off_while_they_leave_it_off():
    ctx, stage = _setup()
    n = 40
    stage.gate.retune(2)  # closed at batch 2, as a poor acceptance leaves it
    opened = [step for step in range(1, 40 * EVERY) if _open(stage, ctx, n, step, 0.05)]
    assert not stage.gate.on
    # off from the first step: a window of PROBE_STEPS steps EVERY steps later, then each interval
    # doubled up to 2^PROBE_BACKOFF x, and nothing in between
    starts = [s for s in opened if s - 1 not in opened]
    assert starts[0] == 1 + EVERY
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps[: PROBE_BACKOFF + 2] == [EVERY << min(j, PROBE_BACKOFF) for j in range(PROBE_BACKOFF + 2)]
    assert all(set(range(s, s + PROBE_STEPS)) == {x for x in opened if s <= x < s + EVERY} for s in starts[:-1])


def test_the_backoff_starts_over_once_the_gate_was_on():
    ctx, stage = _setup()
    stage.gate.retune(2)
    for step in range(1, 10 * EVERY):  # off, windows backing off
        _open(stage, ctx, 40, step, 0.05)
    assert stage._backoff == PROBE_BACKOFF
    for step in range(10 * EVERY, 30 * EVERY):  # acceptance rose: the next window's retune reopens it
        if _open(stage, ctx, 6, step, 0.95) and not stage.probing:
            break
    assert stage.gate.on and stage._backoff == 0


def test_a_probe_window_drafts_one_token_for_the_least_lagged_requests_and_counts_no_evidence():
    ctx, stage = _setup()
    n = 12
    step = _first_window(stage, ctx, n)
    assert stage.probing
    lag = np.arange(n)[::-1].copy()  # the last requests are the least lagged
    view = _view(n, step, lag)
    sp = StepPlan(view, np.full(n, K), d_ctx=np.zeros(n, dtype=np.int64), lag=lag)
    sp.surv = np.tile(0.9 ** np.arange(1, K + 1), (n, 1))  # (n, K)
    sp.cons = Constraints(10**6, 8192)
    sp.choice = Choice(np.zeros(n, dtype=np.int64), float(n), 10.0, 10.0)
    sp.accepted = np.zeros(n)
    b_off = stage.gate.b_off
    stage.evidence(sp, ctx.cost, [0], lambda i: 0.05)
    probed = np.flatnonzero(sp.choice.k)
    assert sp.choice.k.max() == 1 and probed.size == min(PROBE_REQUESTS, n)
    assert set(probed) == set(np.argsort(lag)[:PROBE_REQUESTS])
    assert np.allclose(sp.accepted[probed], 0.9) and sp.choice.tokens > n
    assert stage.zero_run == 0 and stage.gate.b_off == b_off  # no evidence counted


def test_probed_acceptance_that_now_pays_reopens_the_gate_at_the_window_end():
    ctx, stage = _setup()
    n = 6
    step = _first_window(stage, ctx, n)
    for _ in range(PROBE_STEPS - 1):  # the window's steps: the probes' outcomes raised the pooled rate
        step += 1
        assert _open(stage, ctx, n, step, 0.95)
    assert _open(stage, ctx, n, step + 1, 0.95)  # window over: retuned at 0.95, b_off above the batch
    assert stage.gate.on and not stage.probing and stage.gate.b_off > n


def test_without_a_rise_the_gate_stays_off_after_the_window():
    ctx, stage = _setup()
    n = 40
    step = _first_window(stage, ctx, n)
    for _ in range(PROBE_STEPS - 1):
        step += 1
        _open(stage, ctx, n, step, 0.05)
    assert not _open(stage, ctx, n, step + 1, 0.05) and not stage.gate.on


def test_while_the_gate_is_off_the_pooled_evidence_ages_back_to_the_prior():
    """A gate closed on poor acceptance sees nothing while it is off but its probes. The pooled rates
    must age with those steps as they do with drafting ones: frozen at the closing rate, a prompt
    mix whose acceptance rose during a busy phase (an H100 trace: 0.35 while light, 0.9 while busy)
    kept the gate shut through every busy phase, 1.22x the latency of a fixed k = 2."""
    from control.policy import StepOutcome, build_policy

    plan = compile_plan(make_profile(target=(2e-5, 0.2, 4.0), acceptance={"draft": 0.8, "ngram": 0.4}),
                        max_k=K, drafters=["draft"])
    pol = build_policy("adaptive", plan)
    prior = pol.pooled_rate(0)
    n = 8
    for step in range(1, 200):  # every draft rejected: the pooled rate falls
        view = _view(n, step)
        d = pol.decide(view)
        pol.observe(StepOutcome(slots=view.slots, request_ids=view.request_ids, drafter=np.zeros(n, dtype=np.int64),
                                ctx_lens=view.ctx_lens, drafted=d.k, verified=d.k, accepted=np.zeros(n, dtype=np.int64),
                                verify_ms=8.0, draft_ms=1.0, total_ms=9.0, draft_passes=int(d.k.max(initial=0)),
                                step=step))
    pol.flush()
    low = pol.pooled_rate(0)
    assert low < prior - 0.3
    pol.gate_stage.gate.retune(1)  # closed above one request
    reopened = None
    for step in range(200, 3000):  # no outcomes reach the policy (probe windows open now and then)
        pol.decide(_view(n, step))
        if pol.gate_stage.gate.on:
            reopened = step
            break
    # the evidence aged towards the prior until the pooled rate paid again at this batch
    assert reopened is not None and pol.pooled_rate(0) > 2 * low
