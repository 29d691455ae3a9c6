"""Adaptive's drafter bandit on the full CPU pair's exact replay (``control/bench/data/
replay-stdlib-full.npz`` with the committed profile, so it runs without models): at batch 16 its
best drafter, draft-tiny, must not lose the batch to n-gram for good."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from control.bench.replay import ReplayRecord, replay_run, tokens_per_s
from control.profile import load_profile
from tests.conftest import Observing, late_share_on

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "control" / "bench" / "data" / "replay-stdlib-full.npz"
PROFILE = ROOT / "profiles" / "cpu" / "stdlib-full.yaml"
BATCH = 16
BEST = "fixed:4@draft-tiny"  # the best fixed configuration at batch 16 (docs/validation.md)


@pytest.fixture(scope="module")
def record():
    return ReplayRecord.load(RECORD)


def test_the_bandit_keeps_the_batch_on_the_draft_model_that_pays(record):
    """Policy seed 0 used to settle on n-gram halfway (0.965x the best fixed configuration): a
    request on n-gram whose lookup found nothing taught the bandit nothing, so n-gram's reward counted
    its matches alone and looked better than draft-tiny's, and the matching kept on n-gram the
    requests whose first rewards there were luckiest; once the batch was there, draft-tiny's catch-up
    kept it there. Now such a step earns a plain step's reward and a request's few rewards are shrunk
    to the drafter's pooled mean (docs/decisions.md, 2026-11-26), and exploitation no longer matches
    requests on their rewards (next test): draft-tiny drafts for most of the second half of the run."""
    profile = load_profile(PROFILE)
    best = tokens_per_s(replay_run(record, profile, BEST, BATCH))
    got, on_tiny = late_share_on(record, profile, "adaptive", BATCH, "draft-tiny", seed=0)
    assert on_tiny >= 0.7, on_tiny
    assert got >= 0.98 * best, got / best


def test_exploitation_keeps_the_batch_on_one_drafter(record):
    """The matching split the batch between draft-tiny and n-gram on per-request rewards that charge
    each request an even share of the draft model's passes: moving one request off the model saves
    less than that share, and the mixed steps (20-58% of them over policy seeds 0-3) cost more than
    either drafter alone (0.996x the best fixed configuration). Exploitation now puts the whole batch on
    the drafter with the best modelled goodput; steps mix drafters only while exploring."""
    profile = load_profile(PROFILE)
    best = tokens_per_s(replay_run(record, profile, BEST, BATCH))
    ratios, mixed = [], []
    for seed in range(4):
        steps = []

        def see(outcome, steps=steps):
            steps.append(np.unique(outcome.drafter[outcome.drafted > 0]).size > 1)

        ratios.append(tokens_per_s(replay_run(record, profile, "adaptive", BATCH, seed=seed,
                                              wrap=lambda p, see=see: Observing(p, see))) / best)
        mixed.append(np.mean(steps))
    assert np.mean(ratios) >= 0.999, np.round(ratios, 4)
    assert max(mixed) <= 0.12, np.round(mixed, 3)


def test_a_batch_that_settled_on_n_gram_moves_to_the_draft_model_through_its_new_requests(record):
    """In another arrival order (``benchmarks/replay_bar.py --orders 2``'s second, permutation seed 101)
    policy seed 2 put half the batch on n-gram in its first steps, when draft-tiny's estimate was at
    its lowest. Moving the batch back would re-prefill every context on draft-tiny, more than the
    rest of those requests could repay, so the batch stayed on n-gram for the whole run (0.961 of the
    best fixed configuration): new requests were priced with it and so never caught up either. Now
    the requests in sync with draft-tiny choose for themselves (docs/decisions.md, 2026-11-29 (stop
    59)): new requests prefill it and draft with it, and the batch follows as the old ones finish."""
    profile = load_profile(PROFILE)
    rows = np.random.default_rng(101).permutation(record.n)
    best = tokens_per_s(replay_run(record, profile, "fixed:3@draft-tiny", BATCH, rows=rows))
    got, on_tiny = late_share_on(record, profile, "adaptive", BATCH, "draft-tiny", seed=2, rows=rows)
    assert on_tiny >= 0.9, on_tiny
    assert got >= 0.99 * best, got / best


def test_a_batch_planned_on_the_worse_draft_model_moves_to_the_better_one_as_it_turns_over(record):
    """Planned from a profile whose draft prices were timed under load (draft-small's per-token work
    at 0.25 ms against 0.44), adaptive started on draft-small and its new requests prefilled it;
    draft-tiny, better on the clock the run keeps, was charged the whole batch's catch-up, so the
    batch stayed on draft-small (policy seeds 0-3: 0.899-0.962 of the best fixed configuration, none
    of them on draft-tiny). Now new requests prefill the model a request in sync with both would draft
    faster on, and the batch moves over as its old requests finish (docs/decisions.md, 2026-11-29
    (stop 60))."""
    data = ROOT / "control" / "bench" / "data"
    clock = load_profile(data / "profile-avx2-stdlib-full.yaml")
    stale = load_profile(data / "profile-avx2-stdlib-full-bare-loaded.yaml")
    best = tokens_per_s(replay_run(record, clock, BEST, BATCH))
    runs = [late_share_on(record, clock, "adaptive", BATCH, "draft-tiny", seed=seed, plan_profile=stale)
            for seed in range(4)]
    ratios = [got / best for got, _ in runs]
    moved = sum(on_tiny >= 0.9 for _, on_tiny in runs)
    assert moved >= 3, [round(on, 3) for _, on in runs]
    assert np.mean(ratios) >= 0.975, np.round(ratios, 4)
