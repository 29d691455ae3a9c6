"""The telemetry an agent aggregates validates against specctl.telemetry/v1 and carries exact counts."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from pydantic import ValidationError

from control.agent import TelemetryWindow
from control.agent.wire import MAX_SAMPLES, TelemetryBatch
from control.policy.types import StepOutcome, position_counts

DRAFTERS = ("draft", "ngram")


def _outcomes(rng, steps=300, n=12, max_k=6):
    for s in range(steps):
        k = rng.integers(0, max_k + 1, size=n)
        drafter = rng.integers(0, 2, size=n)
        run = np.cumprod(rng.random((n, max_k)) < 0.7, axis=1).sum(axis=1)
        accepted = np.minimum(run, k)
        yield k, StepOutcome(
            slots=np.arange(n), request_ids=np.arange(n) + s * n, drafter=drafter, ctx_lens=rng.integers(100, 900, size=n),
            drafted=k, verified=k, accepted=accepted, draft_ms=1.0, verify_ms=5.0 + s % 3, total_ms=6.5 + s % 3,
            draft_passes=int(k.max()), draft_ctx_tokens=100, draft_batched_tokens=int(k.sum()),
            finished=np.array([s], dtype=np.int64) if s % 10 == 0 else np.zeros(0, dtype=np.int64))


def _window(max_samples, drafter_of=None, capacity=4096):
    rng = np.random.default_rng(1)
    w = TelemetryWindow(DRAFTERS, max_samples=max_samples, started=0.0, rng=random.Random(0), capacity=capacity,
                        step_capacity=16)
    trials = np.zeros((2, 16), dtype=np.int64)
    succ = np.zeros((2, 16), dtype=np.int64)
    k_hist = np.zeros(17, dtype=np.int64)
    per_step = []
    for s, (k, o) in enumerate(_outcomes(rng)):
        if drafter_of is not None:
            o.drafter[:] = drafter_of(s)
        w.on_decide(k)
        w.on_outcome(o, predicted_ms=6.0 if s % 2 else float("nan"))
        k_hist += np.bincount(k, minlength=17)
        for d in range(2):
            sel = o.drafter == d
            t, a = position_counts(o.verified[sel], o.accepted[sel], 16)
            trials[d] += t
            succ[d] += a
        spec = o.drafted > 0
        used = np.unique(o.drafter[spec])
        per_step.append((o.n, int(o.ctx_lens.sum()), int(o.verified.sum()) + o.n, int(o.drafted.sum()),
                         int(o.accepted.sum()), int(used[0]) if used.size == 1 else -1))
    w.closed_at = 2.0
    return w, trials, succ, k_hist, per_step


def test_window_samples_carry_each_steps_features():
    # Steps alternate between one drafter for everyone and a mix; all 300 steps fit in the sample.
    w, _, _, _, per_step = _window(1000, drafter_of=lambda s: 1 if s % 3 == 0 else np.arange(12) % 2, capacity=8)
    doc = w.to_payload(source="llm-0", seq=1, plan_version=3, plan_id="abc:3", dropped_windows=0, dropped_steps=0)
    s = TelemetryBatch.model_validate(doc).samples
    got = list(zip(s.batch, s.ctx_tokens, s.verify_tokens, s.drafted, s.accepted, strict=True))
    assert got == [p[:5] for p in per_step]
    names = [d["name"] for d in doc["drafters"]]
    assert [names[i] if i >= 0 else None for i in s.drafter] == [DRAFTERS[p[5]] if p[5] >= 0 else None for p in per_step]
    assert s.predicted_ms[:4] == [None, 6.0, None, 6.0]
    # A drafter the service does not know is left out, and its steps name no drafter.
    doc = w.to_payload(source="llm-0", seq=2, plan_version=3, plan_id="abc:3", dropped_windows=0, dropped_steps=0,
                       known={"draft"})
    assert [d["name"] for d in doc["drafters"]] == ["draft"]
    assert all(d in (-1, 0) for d in doc["samples"]["drafter"])


def test_window_counts_match_chain_trials_and_validate():
    w, trials, succ, k_hist, _ = _window(64)
    steps = 300
    doc = w.to_payload(source="llm-0", seq=1, plan_version=3, plan_id="abc:3", dropped_windows=0, dropped_steps=0)
    batch = TelemetryBatch.model_validate(json.loads(json.dumps(doc)))  # survives the wire
    assert batch.steps == steps == 300
    assert batch.k_hist == k_hist.tolist()
    assert batch.predicted_steps == 150
    assert batch.finished == 30
    assert batch.samples is not None and batch.samples.n == 64  # reservoir capped at max_samples
    for d in batch.drafters:
        i = DRAFTERS.index(d.name)
        n = len(d.position_trials)
        assert d.position_trials == trials[i, :n].tolist() and not trials[i, n:].any()
        assert d.position_accepted == succ[i, :n].tolist()
    assert {d.name for d in batch.drafters} == set(DRAFTERS)
    assert abs(batch.window_s - 2.0) < 1e-9


def _doc(**over):
    doc = {"schema": "specctl.telemetry/v1", "source": "a", "seq": 1, "plan_version": 1, "window_s": 1.0, "steps": 10,
           "spec_steps": 5, "request_steps": 40, "ctx_tokens": 4000, "max_batch": 4, "k_hist": [20, 10, 10],
           "measured_ms_sum": 50.0,
           "drafters": [{"name": "draft", "requests": 20, "drafted": 30, "verified": 30, "accepted": 20,
                         "position_trials": [20, 10], "position_accepted": [15, 5]}]}
    doc.update(over)
    return doc


@pytest.mark.parametrize("change, words", [
    ({"spec_steps": 11}, "spec_steps = 11 exceeds steps = 10"),
    ({"measured_ms_sum": float("nan")}, "measured_ms_sum"),
    ({"source": "bad name with spaces"}, "source"),
    ({"schema": "specctl.telemetry/v0"}, "schema"),
    ({"extra": 1}, "extra"),
    ({"drafters": [{"name": "draft", "requests": 1, "drafted": 3, "verified": 3, "accepted": 1,
                    "position_trials": [2, 3], "position_accepted": [1, 0]}]}, "position 2 has 3 trials"),
    ({"drafters": [{"name": "draft", "requests": 1, "drafted": 3, "verified": 3, "accepted": 1,
                    "position_trials": [2], "position_accepted": [3]}]}, "accepted 3 of 2 trials"),
    ({"samples": {c: [1] * (MAX_SAMPLES + 1) for c in ("batch", "ctx_tokens", "verify_tokens", "verify_ms", "draft_ms",
                                                        "total_ms", "predicted_ms", "draft_passes", "draft_ctx_tokens",
                                                        "draft_batched_tokens", "drafter", "drafted", "accepted")}},
     "4096"),
])
def test_bad_documents_are_rejected_with_the_reason(change, words):
    TelemetryBatch.model_validate(_doc())  # the base document is valid
    with pytest.raises(ValidationError) as e:
        TelemetryBatch.model_validate(_doc(**change))
    assert words in str(e.value)


def test_a_draft_that_stops_short_counts_a_rejection_for_drafters_without_confidence_cuts():
    # Three requests ask k = 4: one drafts 2 and both are accepted (stopped short), one drafts 0
    # (no match at all), one drafts 4 and has 1 accepted (an ordinary rejection at position 2).
    w = TelemetryWindow(DRAFTERS, max_samples=8, started=0.0, rng=random.Random(0))
    k = np.array([4, 4, 4])
    for drafter in (0, 1):
        w.on_decide(k)
        w.on_outcome(StepOutcome(
            slots=np.arange(3), request_ids=np.arange(3) + 3 * drafter, drafter=np.full(3, drafter),
            ctx_lens=np.full(3, 100), drafted=np.array([2, 0, 4]), verified=np.array([2, 0, 4]),
            accepted=np.array([2, 0, 1]), draft_ms=1.0, verify_ms=5.0, total_ms=6.5, draft_passes=4,
            draft_ctx_tokens=300, draft_batched_tokens=6, finished=np.zeros(0, dtype=np.int64)), predicted_ms=6.0)
    w.closed_at = 1.0
    kw = dict(source="llm-0", seq=1, plan_version=1, plan_id="p:1", dropped_windows=0, dropped_steps=0)
    plain = {d["name"]: d for d in w.to_payload(**kw)["drafters"]}
    marked = {d["name"]: d for d in TelemetryBatch.model_validate(
        w.to_payload(**kw, short_rejects={"ngram"})).model_dump()["drafters"]}
    # what was drafted alone: positions 1 and 2 tried by the two drafting requests; position 1 accepted
    # by both, position 2 by the one that stopped short
    assert plain["ngram"]["position_trials"] == [2, 2] and plain["ngram"]["position_accepted"] == [2, 1]
    # the short stops add a failed trial at position 1 (drafted nothing) and at position 3 (drafted 2)
    assert marked["ngram"]["position_trials"] == [3, 2, 1] and marked["ngram"]["position_accepted"] == [2, 1, 0]
    assert marked["ngram"]["drafted"] == plain["ngram"]["drafted"] == 6
    # a drafter with confidence cuts (not named) keeps counting only what it drafted
    assert marked["draft"]["position_trials"] == plain["draft"]["position_trials"] == [2, 2]
