"""Replays under a stale profile: the policy's plan from one profile, the replay's clock from another."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.bench.replay import ReplayRecord, replay_run, tokens_per_s
from control.profile import load_profile, parse_profile

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "control" / "bench" / "data" / "replay-stdlib-full.npz"
PROFILE = ROOT / "profiles" / "cpu" / "stdlib-full.yaml"
BATCH = 16
BEST = "fixed:4@draft-tiny"  # the best fixed configuration at batch 16 (docs/validation.md)
OVERPRICED = 1.4  # the stale plan's draft-model prices over the clock's


@pytest.fixture(scope="module")
def record():
    return ReplayRecord.load(RECORD)


def overpriced(profile, factor: float):
    """``profile`` with every draft model's pass times scaled by ``factor`` (the target's kept)."""
    doc = profile.model_dump(mode="json", by_alias=True)
    for name, m in doc["models"].items():
        if name != "target":
            for term in ("a_ms_per_ctx_token", "b_ms_per_batched_token", "c_ms"):
                m[term] *= factor
    return parse_profile(doc)


def test_the_plan_comes_from_the_plan_profile_and_the_clock_from_the_other(record):
    """A fixed configuration needs no prices: the same tokens per second whatever the plan's profile;
    the clock's prices set it (draft passes priced higher: fewer tokens per second)."""
    clock = load_profile(PROFILE)
    same = tokens_per_s(replay_run(record, clock, "fixed:3@draft-tiny", 4))
    assert tokens_per_s(replay_run(record, clock, "fixed:3@draft-tiny", 4, plan_profile=overpriced(clock, 2.0))) == same
    assert tokens_per_s(replay_run(record, overpriced(clock, 2.0), "fixed:3@draft-tiny", 4)) < same
