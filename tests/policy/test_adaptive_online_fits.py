"""What adaptive learns online from step outcomes: the target cost refit (prompt chunks included) and
the drafter's confidence calibration."""

from __future__ import annotations

import numpy as np

from control.plan import compile_plan
from control.policy import StepView, build_policy
from tests.conftest import make_profile


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
