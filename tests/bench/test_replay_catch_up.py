"""One drafter building each new request's draft state by catch-up (adaptive on draft-tiny alone: no
bandit, no draft prefill, so the run is the same for every policy seed) on the CPU pair's exact
replays at batch 32. The new requests' first decisions must not swing the batch's draft lengths
(docs/decisions.md, 2026-11-27, stop 38), and waiting saves no catch-up: a request that stays on its
drafter drafts at once where its remaining life repays the catch-up
(``control/policy/adaptive/optimise.py``; docs/decisions.md, stop 41)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from control.bench.replay import ReplayRecord, fixed_configs, replay_run, tokens_per_s
from control.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "control" / "bench" / "data"


def _clock():
    return load_profile(ROOT / "profiles" / "cpu" / "stdlib-full.yaml")


def test_no_request_waits_to_catch_up_on_the_one_drafter_it_stays_on():
    """Full record, batch 32: charged its catch-up on its first token, a lagging request got k = 0 at
    66 of the 332 decisions for lagging requests (held for the steps to the next full decision)."""
    record = ReplayRecord.load(DATA / "replay-stdlib-full.npz")
    tiny = record.drafters.index("draft-tiny")
    waited = []

    def wrap(policy):
        decide = policy.decide

        def counted(view):
            d = decide(view)
            lagging = view.draft_lag[:, tiny] > 0  # (n,) bool
            waited.append(int(np.count_nonzero(lagging & (d.k == 0))))
            return d

        policy.decide = counted
        return policy

    replay_run(record, _clock(), "adaptive@draft-tiny", 32, wrap=wrap)
    assert sum(waited) == 0


def test_catching_up_at_once_pays_on_the_held_out_record_at_batch_32():
    """Held-out record, batch 32, against the best fixed k on draft-tiny: 1.0020 while new requests
    waited, 1.0117 catching up at once."""
    record = ReplayRecord.load(DATA / "replay-stdlib-full-s11.npz")
    clock = _clock()
    best = max(tokens_per_s(replay_run(record, clock, spec, 32)) for spec in fixed_configs(record)
               if spec.endswith("@draft-tiny"))
    got = tokens_per_s(replay_run(record, clock, "adaptive@draft-tiny", 32))
    assert got >= 1.008 * best, got / best


def test_one_drafter_with_catch_up_keeps_up_with_the_best_fixed_k_at_batch_32():
    """adaptive on draft-tiny alone (no bandit, no draft prefill: deterministic) against its best
    fixed k. A new request deferring its catch-up took a pace of one token per step and with it about
    4x the others' token value; the batch then swung between k = 1 for all but the newcomers and k = 6,
    0.982x of fixed k = 3. Starting its pace from the batch's: 0.996x."""
    record = ReplayRecord.load(DATA / "replay-stdlib-full.npz")
    clock = _clock()
    best = tokens_per_s(replay_run(record, clock, "fixed:3@draft-tiny", 32))
    got = tokens_per_s(replay_run(record, clock, "adaptive@draft-tiny", 32))
    assert got >= 0.99 * best, got / best
