"""Greedy speculative output equals plain greedy output token for token: every drafter, several k,
real policies and a chaos policy, mixed batches with requests arriving and finishing mid-run."""

from __future__ import annotations

import pytest

from control.executors.reference.drafters import SelfSpec
from tests.executors.reference.conftest import (
    ChaosPolicy,
    Recorder,
    greedy,
    make_engine,
    make_policy,
    plain_reference,
    run_schedule,
)

MAX_TOKENS = [24, 9, 31, 16, 5, 27, 12, 20]  # requests finish at different steps
ARRIVALS = [0, 0, 0, 1, 3, 4, 9, 15]  # and arrive mid-run


@pytest.fixture(scope="module")
def reference(loaded, prompts):
    return plain_reference(loaded, prompts, [greedy(m) for m in MAX_TOKENS])


def schedule(prompts, params=None):
    return [(a, i, p, params[i] if params else greedy(m))
            for i, (a, p, m) in enumerate(zip(ARRIVALS, prompts, MAX_TOKENS, strict=True))]


def first_difference(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def assert_same(out, reference):
    for i, ref in enumerate(reference):
        got, reason = out[i]
        assert got == ref, f"request {i}: speculative output diverged at token {first_difference(got, ref)}"
        assert reason is not None


@pytest.mark.parametrize("drafter", ["draft-small", "draft-tiny", "ngram", "self-spec"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_fixed_k_every_drafter_mixed_batches(loaded, prompts, reference, drafter, k):
    rec = Recorder(make_policy(f"fixed:{k}", default_drafter=drafter, names=("draft-small", "draft-tiny", "ngram", "self-spec")))
    eng = make_engine(loaded, rec, default_drafter=drafter)
    out = run_schedule(eng, schedule(prompts), check=lambda e: e.pool.check(e.pool.in_use.nonzero()[0], e.n_tok))
    assert_same(out, reference)
    drafted = sum(int(o.verified.sum()) for o in rec.outcomes)
    accepted = sum(int(o.accepted.sum()) for o in rec.outcomes)
    assert drafted > 0
    assert max(int(o.verified.max()) for o in rec.outcomes) <= k
    if drafter in ("draft-small", "self-spec"):  # a truncated copy / the target itself: they agree often
        assert accepted / drafted > 0.2
    assert max(o.n for o in rec.outcomes) == 4  # batches were full at times


def test_self_speculation_with_a_window_covering_the_context_accepts_nearly_everything(loaded, prompts, reference):
    """Sink + window >= context: the draft is the target itself (fused attention instead of the
    invariant path, so a near-tie may still disagree)."""
    rec = Recorder(make_policy("fixed:4", default_drafter="wide", names=("wide",)))
    eng = make_engine(loaded, rec, drafters={"wide": SelfSpec(0, 256)})
    out = run_schedule(eng, schedule(prompts))
    assert_same(out, reference)
    drafted = sum(int(o.verified.sum()) for o in rec.outcomes)
    assert sum(int(o.accepted.sum()) for o in rec.outcomes) >= 0.95 * drafted > 0


def test_copy_of_target_accepts_everything(loaded, prompts, reference):
    """A draft identical to the target (batch invariant too) proposes exactly the target's tokens:
    every draft token is accepted, so every step ends with the bonus-token catch-up."""
    drafters = {"copy": loaded.target}
    rec = Recorder(make_policy("fixed:4", default_drafter="copy", names=("copy",)))
    eng = make_engine(loaded, rec, drafters=drafters)
    out = run_schedule(eng, schedule(prompts))
    assert_same(out, reference)
    for o in rec.outcomes:
        assert (o.accepted == o.verified).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chaos_policy(loaded, prompts, reference, seed):
    """Random k, drafter, confidence cut and draft-prefill every step: drafter switches and gaps in
    speculation leave the draft caches behind; each must catch up before it drafts again."""
    rec = Recorder(ChaosPolicy(seed))
    eng = make_engine(loaded, rec)
    out = run_schedule(eng, schedule(prompts), check=lambda e: e.pool.check(e.pool.in_use.nonzero()[0], e.n_tok))
    assert_same(out, reference)
    lags = [int(v.draft_lag.max()) for v in rec.views if v.n]
    assert max(lags) > 5  # large catch-ups happened


@pytest.mark.parametrize("spec", ["adaptive", "specserve", "turbospec", "smartspec", "hf-heuristic"])
def test_real_policies(loaded, prompts, reference, spec):
    rec = Recorder(make_policy(spec))
    eng = make_engine(loaded, rec)
    out = run_schedule(eng, schedule(prompts))
    assert_same(out, reference)
    assert sum(int(o.verified.sum()) for o in rec.outcomes) > 0


def test_greedy_lossless_next_to_sampled_requests(loaded, prompts, reference):
    """Sampled requests in the same batch (rejection sampling on their rows) leave greedy ones exact."""
    params = [greedy(m) if i % 2 == 0 else greedy(m, temperature=0.9, top_p=0.95, random_seed=i)
              for i, m in enumerate(MAX_TOKENS)]
    eng = make_engine(loaded, ChaosPolicy(7))
    out = run_schedule(eng, schedule(prompts, params))
    for i in range(0, len(prompts), 2):
        assert out[i][0] == reference[i]
    for i in range(1, len(prompts), 2):
        assert len(out[i][0]) <= MAX_TOKENS[i]


def test_batch_of_one_plain_equals_packed_plain(loaded, prompts, reference):
    """Plain decoding packed with other requests equals plain decoding alone (batch invariance)."""
    eng = make_engine(loaded, max_batch=8)
    out = run_schedule(eng, schedule(prompts))
    assert_same(out, reference)


def test_engine_driven_by_the_agent(loaded, prompts, reference):
    """The in-process agent (control/agent/, default plan, no service) as the engine's policy."""
    from control.agent import Agent
    from tests.executors.reference.conftest import tiny_profile

    eng = make_engine(loaded)
    agent = Agent(tiny_profile(), policy="fixed:3", drafters=eng.drafter_names, max_k=6)
    rec = Recorder(agent)
    eng.set_policy(rec)
    out = run_schedule(eng, schedule(prompts))
    assert_same(out, reference)
    assert eng.policy_errors == 0
    assert sum(int(o.verified.sum()) for o in rec.outcomes) > 0


@pytest.mark.parametrize("spec", ["adaptive", "chaos"])
def test_policy_off_the_critical_path(loaded, prompts, reference, spec):
    """overlap_policy: the worker decides step t+1 during step t from a predicted view and observes
    step t-1's outcome just before; output stays lossless and nearly every step uses a prepared decision."""
    import threading

    inner = ChaosPolicy(3) if spec == "chaos" else make_policy(spec)
    threads: list[str] = []

    class Where(Recorder):
        def decide(self, view):
            threads.append(threading.current_thread().name)
            return super().decide(view)

    rec = Where(inner)
    eng = make_engine(loaded, rec, overlap_policy=True)
    out = run_schedule(eng, schedule(prompts))
    assert_same(out, reference)
    assert eng.policy_errors == 0
    worker = eng.policy_worker
    eng.close()  # collects the job the drained engine left in flight and ends the worker's thread
    worker.thread.join(5)
    assert not worker.thread.is_alive()
    assert 0 < worker.cpu_ms <= worker.busy_ms + 1  # CPU time within wall time (clock granularity)
    assert worker.wait_ms >= 0
    decode_steps = eng.step_no
    assert worker.jobs >= decode_steps - 3  # a job per decode step (none before the first)
    assert threads.count("policy-worker") == worker.jobs
    assert len(threads) - worker.jobs <= 2  # decided on the engine thread: the first step (and one after a drain)
    assert worker.used >= decode_steps - 3  # and the steps decoded with the prepared decision
    # observe sees every outcome but the last step's, one step late: after the decision that follows it
    assert len(rec.outcomes) >= decode_steps - 2
    steps_seen = [o.step for o in rec.outcomes]
    assert steps_seen == sorted(steps_seen)
    assert sum(int(o.verified.sum()) for o in rec.outcomes) > 0


def test_a_policy_that_wants_fresh_decisions_is_decided_on_the_loop_until_it_stops(loaded, prompts, reference):
    """overlap_policy with a policy whose ``wants_fresh`` holds for its first outcomes: those steps
    give the worker nothing and decide on the engine thread, each after observing the step before;
    then the worker takes over, one step stale. Every outcome is observed once, in order."""
    import threading

    fresh_for = 6
    events: list[tuple[str, int, str]] = []  # (call, step, thread)

    class FreshFirst(Recorder):
        def wants_fresh(self):
            return len(self.outcomes) < fresh_for

        def decide(self, view):
            events.append(("decide", view.step, threading.current_thread().name))
            return super().decide(view)

        def observe(self, outcome):
            events.append(("observe", outcome.step, threading.current_thread().name))
            super().observe(outcome)

    rec = FreshFirst(ChaosPolicy(5))
    eng = make_engine(loaded, rec, overlap_policy=True)
    out = run_schedule(eng, schedule(prompts))
    assert_same(out, reference)
    assert eng.policy_errors == 0
    worker = eng.policy_worker
    eng.close()
    steps = [o.step for o in rec.outcomes]
    assert steps == sorted(set(steps)) and len(steps) >= eng.step_no - 2  # once each, in order
    decides = [(step, thread) for call, step, thread in events if call == "decide"]
    seen: set[int] = set()
    fresh_steps = 0
    for call, step, thread in events:
        if call == "observe":
            seen.add(step)
        elif len(seen) < fresh_for:  # the fresh phase: on the loop, every earlier decode step known
            fresh_steps += 1
            assert thread != "policy-worker" and {s for s in steps if s < step} <= seen, (step, sorted(seen))
    assert fresh_steps >= fresh_for and eng.calls.fresh_steps >= fresh_for - 1
    assert worker.jobs > 0 and worker.used > 0  # then prepared a step ahead
    assert sum(t == "policy-worker" for _, t in decides) == worker.jobs


def test_overlap_policy_must_be_a_bool():
    from control.errors import ConfigError
    from control.executors.reference.engine import EngineConfig

    with pytest.raises(ConfigError, match="overlap_policy"):
        EngineConfig(overlap_policy="yes").validate()


@pytest.mark.parametrize("drafter", ["ngram", "draft-tiny"])
def test_the_lookup_is_scored_against_the_committed_tokens_whatever_drafts(loaded, prompts, drafter):
    """``StepOutcome.ngram_match``: a request that drafted its whole lookup scores what the target
    accepted of it, and one on a draft model scores its lookup within the tokens the step committed;
    unscored (-1) exactly where the lookup proposed nothing or the request stopped in the step."""
    import numpy as np

    rec = Recorder(make_policy("fixed:6", default_drafter=drafter, names=("draft-small", "draft-tiny", "ngram", "self-spec")))
    run_schedule(make_engine(loaded, rec, default_drafter=drafter), schedule(prompts))
    scored = 0
    for o in rec.outcomes:
        m, a = o.ngram_match, o.ngram_avail  # (n,), (n,)
        live = ~np.isin(o.request_ids, o.finished)  # (n,) bool
        assert ((m == -1) == ((a == 0) | ~live)).all()
        assert (m <= np.minimum(a, o.accepted + 1)).all()
        if drafter == "ngram":
            whole = live & (a > 0) & (o.verified == a)  # (n,) bool: drafted the whole lookup
            assert (m[whole] == o.accepted[whole]).all()
            scored += int(whole.sum())
        else:
            scored += int((m > 0).sum())
    assert scored > 0
