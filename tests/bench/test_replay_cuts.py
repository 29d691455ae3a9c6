"""Confidence cuts on the full CPU pair's exact replay, one drafter (adaptive on draft-tiny alone: no
bandit, no draft prefill, so the run is the same for every policy seed): a cut must pay for the
accepted tokens it stops (docs/decisions.md, 2026-11-27, stop 40)."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.bench.replay import ReplayRecord, replay_run, tokens_per_s
from control.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("batch", "best", "floor"), [(4, "fixed:6@draft-tiny", 1.0), (16, "fixed:4@draft-tiny", 1.01),
                                                      (32, "fixed:3@draft-tiny", 1.0)])
def test_cuts_read_at_each_requests_lift_pay_for_what_they_stop(batch, best, floor):
    """Read off the pooled calibration map alone, the cuts stopped the drafts of requests that accept
    more than the pool at confidences where the pool's drafts fail: 0.9992 / 1.0024 / 0.9957x the best
    fixed k at batch 4 / 16 / 32. Read at each such request's lift: 1.0017 / 1.0146 / 1.0025."""
    record = ReplayRecord.load(ROOT / "control" / "bench" / "data" / "replay-stdlib-full.npz")
    clock = load_profile(ROOT / "profiles" / "cpu" / "stdlib-full.yaml")
    fixed = tokens_per_s(replay_run(record, clock, best, batch))
    got = tokens_per_s(replay_run(record, clock, "adaptive@draft-tiny", batch))
    assert got >= floor * fixed, got / fixed
