"""Which drafter new requests' draft state is built for, on the CPU pairs' exact replays: adaptive
prefills the favourite draft model while it is the likeliest best, so exploring it charges new
requests no catch-up of their prompt that n-gram is spared (docs/decisions.md, 2026-11-27)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from control.bench.replay import ReplayRecord, replay_run, tokens_per_s
from control.profile import load_profile
from tests.conftest import Observing

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "control" / "bench" / "data"
PROFILES = ROOT / "profiles" / "cpu"


class Recording(Observing):
    """Observing that also keeps each decision's draft-prefill flag and each outcome's drafters."""

    def __init__(self, inner) -> None:
        self.prefills: list[bool] = []
        self.outcomes: list[tuple[np.ndarray, np.ndarray]] = []  # (drafter (n,), drafted (n,) bool) per step
        super().__init__(inner, lambda o: self.outcomes.append((o.drafter.copy(), o.verified > 0)))

    def decide(self, view):
        d = self.inner.decide(view)
        self.prefills.append(bool(d.prefill_draft))
        return d


def _run(record, profile, batch, seed):
    box = {}

    def wrap(policy):
        box["rec"] = Recording(policy)
        return box["rec"]

    return tokens_per_s(replay_run(record, profile, "adaptive", batch, seed=seed, wrap=wrap)), box["rec"]


def test_the_full_pair_keeps_the_draft_model_that_pays():
    """Full pair, batch 16, policy seed 7: with every new request's draft state built by catch-up,
    exploration priced draft-tiny (the best fixed configuration's drafter) at its catch-up, n-gram at
    none, and the run settled on n-gram at 0.952x the best fixed configuration. With draft-tiny
    prefilled while it is likeliest best, it drafts most of the second half."""
    record = ReplayRecord.load(DATA / "replay-stdlib-full.npz")
    clock = load_profile(PROFILES / "stdlib-full.yaml")
    best = tokens_per_s(replay_run(record, clock, "fixed:4@draft-tiny", 16))
    got, rec = _run(record, clock, 16, seed=7)
    tiny = record.drafters.index("draft-tiny")
    half = rec.outcomes[len(rec.outcomes) // 2:]
    on_tiny = sum(int(((d == tiny) & spec).sum()) for d, spec in half)
    drafted = sum(int(spec.sum()) for _, spec in half)
    assert on_tiny >= 0.7 * drafted, (on_tiny, drafted)
    assert got >= 0.99 * best, got / best
    assert np.mean(rec.prefills) > 0.5


@pytest.mark.parametrize("batch", [4, 32])
def test_the_quick_pair_hardly_prefills_a_draft_model(batch):
    """Quick pair: its draft models cost more per token than its target and n-gram is the best
    drafter at every batch, so new requests prefill no draft model's state (prefilling the first
    wave alone cost 5% of tokens per second at batch 32), but in the rare step where exploration
    draws the draft model likeliest best."""
    record = ReplayRecord.load(DATA / "replay-stdlib-quick.npz")
    clock = load_profile(PROFILES / "stdlib-quick.yaml")
    _, rec = _run(record, clock, batch, seed=0)
    assert not rec.prefills[0]  # the first wave: the profile's best drafter is n-gram
    assert sum(rec.prefills) <= 0.01 * len(rec.prefills)
