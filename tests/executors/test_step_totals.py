"""``StepTotals``: an executor's IterationStats added up, as the Triton host reports them."""

from __future__ import annotations

import pytest

from control.executors.base import IterationStats, StepTotals


def test_totals_add_times_every_step_and_verification_on_decode_steps_only():
    t = StepTotals()
    t.add(IterationStats(prefill_requests=2, prefill_tokens=300, prefill_ms=4.0, total_ms=5.0, policy_ms=0.5))
    t.add(IterationStats(decode_batch=2, drafted=6, verified=5, accepted=3, generated=5, draft_ms=1.5,
                         verify_ms=2.0, policy_ms=0.25, total_ms=4.0, k=[3, 3]))
    t.add(IterationStats(decode_batch=2, verified=0, accepted=0, generated=2, verify_ms=1.0, total_ms=1.25, k=[0, 0]))
    assert (t.steps, t.decode_steps, t.spec_steps) == (3, 2, 1)
    s = t.sums
    assert (s.verified, s.accepted) == (5, 3)
    assert s.total_ms == pytest.approx(10.25) and s.policy_ms == pytest.approx(0.75)
    assert (s.prefill_ms, s.draft_ms, s.verify_ms) == (4.0, 1.5, 3.0)


def test_a_prefill_iteration_reporting_verification_does_not_count_it():
    t = StepTotals()
    t.add(IterationStats(decode_batch=0, verified=4, accepted=2, total_ms=1.0, k=[4]))
    assert (t.sums.verified, t.sums.accepted, t.decode_steps, t.spec_steps) == (0, 0, 0, 0)
