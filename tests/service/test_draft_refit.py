"""The service's refit of a draft model whose passes carry a per-request term: caught-up tokens are
read at their own price, and the refreshed profile keeps that price apart from a drafted token's."""

from __future__ import annotations

import numpy as np
import pytest

from control.agent.wire import TelemetryBatch
from control.service.estimates import CostRefit
from tests.conftest import make_profile

PROFILE_DRAFT = (2.0e-6, 0.002, 0.8, 0.006)  # a, b (a caught-up token), c, d (per request and pass)
SLOWER = 1.5  # the live machine's a, b and c over the profile's; its per-request term as profiled
N_SAMPLES = 200


def _batch(rng: np.random.Generator, profile) -> TelemetryBatch:
    """One window of sampled steps, every one drafting with the draft model; about a third of them
    carry a lagging request's catch-up in the first pass."""
    a, b, c, d = PROFILE_DRAFT
    n = N_SAMPLES
    batch = rng.integers(1, 32, n)
    k = rng.integers(1, 6, n)  # every request of a step drafts k tokens in k passes
    drafted = batch * k
    caught = np.where(rng.random(n) < 0.35, rng.integers(16, 400, n), 0)
    draft_ctx = batch * k * rng.integers(200, 1500, n)
    ms = SLOWER * (a * draft_ctx + b * (drafted + caught) + c * k) + d * drafted
    t = profile.models["target"]  # the target's steps as profiled
    ctx, verify = batch * 800, batch * (k + 1)
    total = t.a_ms_per_ctx_token * ctx + t.b_ms_per_batched_token * verify + t.c_ms + profile.overhead_ms + ms
    doc = {
        "schema": "specctl.telemetry/v1", "source": "agent-0", "seq": 1, "plan_version": 1, "window_s": 1.0,
        "steps": n, "spec_steps": n, "request_steps": int(batch.sum()), "max_batch": int(batch.max()),
        "drafters": [{"name": "draft", "requests": int(batch.sum()), "drafted": int(drafted.sum()),
                      "verified": int(drafted.sum()), "accepted": 0}],
        "samples": {
            "batch": batch.tolist(), "ctx_tokens": ctx.tolist(), "verify_tokens": verify.tolist(),
            "verify_ms": [0.0] * n, "draft_ms": ms.tolist(), "total_ms": total.tolist(), "predicted_ms": [None] * n,
            "draft_passes": k.tolist(), "draft_ctx_tokens": draft_ctx.tolist(),
            "draft_batched_tokens": (drafted + caught).tolist(), "drafter": [0] * n, "drafted": drafted.tolist(),
            "accepted": [0] * n,
        },
    }
    return TelemetryBatch.model_validate(doc)


def test_a_refit_draft_keeps_its_per_request_term_apart_from_a_caught_up_tokens_price():
    profile = make_profile(draft=PROFILE_DRAFT)
    refit = CostRefit(profile)
    rng = np.random.default_rng(0)
    for _ in range(3):
        refit.add(_batch(rng, profile))
    refit.refit()
    assert "draft" in refit.refitted
    got = refit.profile().models["draft"]
    a, b, c, d = PROFILE_DRAFT
    assert got.d_ms_per_request == pytest.approx(d)
    assert got.b_ms_per_batched_token == pytest.approx(SLOWER * b, rel=0.01)
    assert got.c_ms == pytest.approx(SLOWER * c, rel=0.01)
    # the refit predicts fresh steps, catch-ups included, as they ran
    fresh = _batch(rng, profile)
    pred, meas = refit.predict_total(fresh)
    assert np.allclose(pred, meas, rtol=0.01)
