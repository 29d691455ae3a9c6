"""One drafter building each new request's draft state by catch-up, on the full CPU pair's exact
replay at batch 32: the new requests' first decisions must not swing the batch's draft lengths
(docs/decisions.md, 2026-11-27, stop 38)."""

from __future__ import annotations

from pathlib import Path

from control.bench.replay import ReplayRecord, replay_run, tokens_per_s
from control.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


def test_one_drafter_with_catch_up_keeps_up_with_the_best_fixed_k_at_batch_32():
    """adaptive on draft-tiny alone (no bandit, no draft prefill: deterministic) against its best
    fixed k. A new request deferring its catch-up took a pace of one token per step and with it about
    4x the others' token value; the batch then swung between k = 1 for all but the newcomers and k = 6,
    0.982x of fixed k = 3. Starting its pace from the batch's: 0.996x."""
    record = ReplayRecord.load(ROOT / "control" / "bench" / "data" / "replay-stdlib-full.npz")
    clock = load_profile(ROOT / "profiles" / "cpu" / "stdlib-full.yaml")
    best = tokens_per_s(replay_run(record, clock, "fixed:3@draft-tiny", 32))
    got = tokens_per_s(replay_run(record, clock, "adaptive@draft-tiny", 32))
    assert got >= 0.99 * best, got / best
