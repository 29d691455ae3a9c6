"""One-step-stale decisions: the wrapper delays what the policy learns by exactly one step."""

import numpy as np

from control.plan import compile_plan
from control.policy import StepOutcome, StepView, build_policy
from control.policy.adaptive import AdaptivePolicy
from control.policy.base import PolicyContext
from control.policy.stale import OneStepStale
from tests.conftest import make_profile


def _plan():
    # n-gram lookup: reports no confidences, so a draft that stops short of the k asked is a rejection
    return compile_plan(make_profile(), max_k=8, drafters=["ngram"])


def _view(step, rids, ctx=1500, k_cap=None):
    n = len(rids)
    return StepView.build(slots=np.arange(n), request_ids=np.asarray(rids), ctx_lens=np.full(n, ctx + step),
                          remaining=np.full(n, 500), drafters=("ngram",), max_k=8, free_kv_slots=10**6,
                          token_budget=10**6, step=step, k_cap=k_cap)


def _outcome(view, k, drafted, accepted):
    return StepOutcome(slots=view.slots, request_ids=view.request_ids, drafter=np.zeros(view.n, dtype=np.int64),
                       ctx_lens=view.ctx_lens, drafted=drafted, verified=drafted, accepted=accepted,
                       verify_ms=10.0, draft_ms=2.0, total_ms=12.0, draft_passes=int(k.max()),
                       draft_ctx_tokens=int(view.ctx_lens.sum()), draft_batched_tokens=int(drafted.sum()),
                       step=view.step)


def test_the_decision_after_an_outcome_is_the_one_made_without_it():
    plan = _plan()
    # a full decision every step: what one step of staleness changes, not what the fast path holds
    fresh, stale, unaware = (AdaptivePolicy(PolicyContext.from_plan(plan), seed=3, refresh_every=1) for _ in range(3))
    stale = OneStepStale(stale)
    v0 = _view(0, [10, 11, 12, 13])
    d0 = [p.decide(v0) for p in (fresh, stale, unaware)]
    assert all(np.array_equal(d.k, d0[0].k) for d in d0)
    k = d0[0].k
    # every draft accepted, and request 13's drafter stopped short of the k asked (a rejection there)
    assert k[3] >= 3
    drafted = k.copy()
    drafted[3] = k[3] - 1
    o0 = _outcome(v0, k, drafted, drafted.copy())
    fresh.observe(o0)
    stale.observe(o0)
    v1 = _view(1, [10, 11, 12, 13], k_cap=[8, 8, 8, 1])  # request 13 now capped below what it drafted
    d_fresh, d_stale, d_unaware = fresh.decide(v1), stale.decide(v1), unaware.decide(v1)
    assert np.array_equal(d_stale.k, d_unaware.k) and d_stale.predicted_step_ms == d_unaware.predicted_step_ms
    assert not np.array_equal(d_fresh.k, d_stale.k)  # the outcome moved the fresh policy's choice
    # right after that decision the stale policy has learned step 0 exactly as the fresh one did,
    # the stopped-short draft counted against the k asked at step 0, not the k asked at step 1
    np.testing.assert_array_equal(stale.inner.pos[0].trials, fresh.pos[0].trials)
    np.testing.assert_array_equal(stale.inner.pos[0].succ, fresh.pos[0].succ)
    np.testing.assert_array_equal(stale.inner.req[0].t[:4], fresh.req[0].t[:4])


def test_a_held_outcome_does_not_land_on_the_request_that_takes_its_slot():
    stale = OneStepStale(build_policy("adaptive", _plan(), seed=3))
    v0 = _view(0, [10, 11])
    k = stale.decide(v0).k
    stale.observe(_outcome(v0, k, k, k))
    stale.decide(_view(1, [10, 99]))  # request 11 left; request 99 took slot 1
    req = stale.inner.req[0]
    assert req.t[1] == 0.0 and req.s[1] == 0.0  # the new request starts from the prior
    assert req.t[0] > 0.0  # request 10's outcome arrived after the decision
    assert stale.inner.pos[0].trials[0] > 0.0


def test_flush_delivers_the_last_outcome_and_the_wrapper_names_itself():
    stale = OneStepStale(build_policy("adaptive", _plan(), seed=3))
    assert stale.name == "adaptive+stale"
    v0 = _view(0, [10])
    k = stale.decide(v0).k
    stale.observe(_outcome(v0, k, k, k))
    assert stale.inner.pos[0].trials.sum() == 0.0
    stale.flush()
    assert stale.inner.pos[0].trials.sum() > 0.0


def test_the_stale_benchmark_runs_both_variants_on_the_same_requests(tmp_path, capsys):
    import json

    from benchmarks.stale_decisions import main
    from control.bench.simrun import WARMUP_SHARE

    out = tmp_path / "stale.json"
    assert main(["--workload", "poisson:in=256,out=64", "--loads", "0.5", "--requests", "60", "--seeds", "1",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1
    fresh, stale = rows[0]["fresh"], rows[0]["stale"]
    assert fresh["policy"] == "adaptive" and stale["policy"] == "adaptive+stale"
    # both complete the same requests of the measured window (arrivals past the ramp-up)
    assert fresh["extra"]["completed"] == stale["extra"]["completed"] >= int(60 * (1 - WARMUP_SHARE))
    assert rows[0]["goodput_ratio"] == stale["goodput_tok_s"] / fresh["goodput_tok_s"]
    assert "bar (within 1% of fresh)" in capsys.readouterr().out


def test_the_stale_benchmark_names_a_missing_profile(capsys):
    from benchmarks.stale_decisions import main

    assert main(["--profile", "no/such/profile.yaml"]) == 2
    assert "profile 'no/such/profile.yaml' not found" in capsys.readouterr().err


def test_adaptive_wants_fresh_decisions_only_while_its_drafter_bandit_is_young():
    from control.policy.adaptive.policy import FRESH_EPOCHS

    one = build_policy("adaptive", _plan(), seed=3)
    assert one.bandit is None and not one.wants_fresh()  # one drafter: nothing to settle
    several = build_policy("adaptive", compile_plan(make_profile(), max_k=8), seed=3)
    assert several.bandit is not None and several.wants_fresh()
    several.bandit.epoch = FRESH_EPOCHS
    assert several.wants_fresh()
    several.bandit.epoch = FRESH_EPOCHS + 1
    assert not several.wants_fresh()


def test_a_stale_wrapper_decides_fresh_while_the_policy_asks_for_it():
    class Asking:
        name = "asking"

        def __init__(self):
            self.fresh, self.seen = True, []

        def wants_fresh(self):
            return self.fresh

        def decide(self, view):
            self.seen.append(("decide", view.step))
            return build_policy("none", _plan()).decide(view)

        def observe(self, outcome):
            self.seen.append(("observe", outcome.step))

    inner = Asking()
    stale = OneStepStale(inner)
    for step in range(4):
        inner.fresh = step < 2
        v = _view(step, [10])
        stale.decide(v)
        k = np.zeros(1, dtype=np.int64)
        stale.observe(_outcome(v, k, k, k))
    # step 1 (fresh) decided after step 0's outcome; from step 2 on each outcome arrives after the next decision
    assert inner.seen == [("decide", 0), ("observe", 0), ("decide", 1), ("decide", 2), ("observe", 1),
                          ("decide", 3), ("observe", 2)]


def test_a_held_outcome_split_at_a_reused_slot_keeps_each_rows_lookup():
    """On the quick pair's replay (three drafters, n-gram lookups in every view, slots reused at
    once): a held outcome split at the reused slots carries each part's own lookups
    (``ngram_avail``, ``ngram_match``); before, the parts kept the whole step's and adaptive's lookup
    rates refused the shapes."""
    from pathlib import Path

    from control.bench.replay import ReplayRecord, replay_run, tokens_per_s
    from control.profile import load_profile
    from tests.conftest import Observing

    root = Path(__file__).resolve().parents[2]
    record = ReplayRecord.load(root / "control" / "bench" / "data" / "replay-stdlib-quick.npz")
    profile = load_profile(root / "profiles" / "cpu" / "stdlib-quick.yaml")
    seen = []

    def see(o):
        seen.append((o.n, o.ngram_avail.shape[0], o.ngram_match.shape[0]))

    res = replay_run(record, profile, "adaptive", 4, rows=np.arange(48),
                     wrap=lambda p: OneStepStale(Observing(p, see)))
    assert tokens_per_s(res) > 0
    assert all(n == a == m for n, a, m in seen)
    assert len({n for n, _, _ in seen}) > 1  # split outcomes (and smaller batches) were delivered
