"""Requests through their life: admission limits, EOS inside an accepted draft, max_tokens inside a
draft, stop and bad words, per-request draft caps, cancellation (KV freed at once), streaming,
concurrent producers, and a clear error for bad input."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from control.errors import ConfigError
from control.executors.base import Executor, FinishReason, SamplingParams
from control.policy.types import Decision
from tests.executors.reference.conftest import Recorder, greedy, make_engine, make_policy, plain_reference


class Always:
    """k for everyone every step, drafter 0, ignoring every cap (the engine must enforce them)."""

    name = "always"

    def __init__(self, k: int) -> None:
        self.k = k

    def decide(self, view):
        return Decision(np.full(view.n, self.k), np.zeros(view.n, dtype=np.int64))

    def observe(self, outcome):
        pass


@pytest.fixture(scope="module")
def copy_drafters(loaded):
    return {"copy": loaded.target}


@pytest.fixture(scope="module")
def ref0(loaded, prompts):
    return plain_reference(loaded, [prompts[0]], [greedy(30, ignore_eos=True)])[0]


def test_engine_satisfies_the_protocol(loaded):
    assert isinstance(make_engine(loaded), Executor)


def test_eos_inside_an_accepted_draft(loaded, prompts, copy_drafters, ref0):
    """EOS = the 4th generated token: it arrives as an accepted draft token of the first decode step
    (first token from prefill, then drafts 2..6); output stops before it, the rest is dropped."""
    eos = ref0[3]
    assert eos not in ref0[:3]
    rec = Recorder(Always(5))
    eng = make_engine(loaded, rec, drafters=copy_drafters, eos_token_id=eos)
    res = eng.generate([prompts[0]], greedy(30))[0]
    assert res.token_ids == ref0[:3]
    assert res.finish_reason == FinishReason.stop
    assert rec.outcomes[0].accepted[0] == 5  # the EOS was inside the accepted span
    assert eng.running == 0 and eng.pool.free_slots == eng.max_batch


def test_per_request_end_id(loaded, prompts, copy_drafters, ref0):
    eng = make_engine(loaded, Always(5), drafters=copy_drafters)
    a, b = eng.generate([prompts[0]] * 2, [greedy(30, end_id=ref0[4]), greedy(30, ignore_eos=True)])
    assert a.token_ids == ref0[: ref0.index(ref0[4])] and a.finish_reason == FinishReason.stop
    assert b.token_ids == ref0 and b.finish_reason == FinishReason.length


def test_max_tokens_inside_a_draft(loaded, prompts, copy_drafters, ref0):
    rec = Recorder(Always(6))
    eng = make_engine(loaded, rec, drafters=copy_drafters)
    res = eng.generate([prompts[0]], greedy(4, ignore_eos=True))[0]
    assert res.token_ids == ref0[:4]
    assert res.finish_reason == FinishReason.length
    assert int(rec.outcomes[0].verified[0]) == 2  # capped at remaining - 1 = 3 - 1, not the policy's 6


def test_stop_words_and_bad_words(loaded, prompts, copy_drafters, ref0):
    stop = (ref0[6], ref0[7])
    first = next(i for i in range(1, len(ref0)) if (ref0[i - 1], ref0[i]) == stop)
    eng = make_engine(loaded, Always(4), drafters=copy_drafters)
    res = eng.generate([prompts[0]], greedy(30, ignore_eos=True, stop_words=[list(stop)]))[0]
    assert res.token_ids == ref0[: first + 1] and res.finish_reason == FinishReason.stop
    # A banned token never appears; speculative and plain decoding agree under the ban.
    params = greedy(25, ignore_eos=True, bad_words=[[ref0[2]], [ref0[4], ref0[5]]])
    spec = make_engine(loaded, Always(4), drafters=copy_drafters).generate([prompts[0]], params)[0].token_ids
    plain = plain_reference(loaded, [prompts[0]], [params])[0]
    assert spec == plain
    assert ref0[2] not in plain and plain[:2] == ref0[:2]
    assert all((a, b) != (ref0[4], ref0[5]) for a, b in zip(plain, plain[1:], strict=False))


def test_num_draft_tokens_caps_each_request(loaded, prompts):
    rec = Recorder(Always(6))
    eng = make_engine(loaded, rec)
    capped = eng.add_request(prompts[1], greedy(12, num_draft_tokens=2))
    off = eng.add_request(prompts[2], greedy(12, num_draft_tokens=0))
    free = eng.add_request(prompts[3], greedy(12))
    while eng.has_work():
        eng.step()
    by_rid = {capped: 2, off: 0, free: 6}
    for o in rec.outcomes:
        for rid, v in zip(o.request_ids, o.verified, strict=True):
            assert v <= by_rid[int(rid)]
    assert max(int(v) for o in rec.outcomes for rid, v in zip(o.request_ids, o.verified, strict=True) if rid == free) > 2


def test_admission_respects_max_batch_and_token_budget(loaded, prompts):
    eng = make_engine(loaded, max_batch=2, token_budget=12)
    for p in prompts[:5]:
        eng.add_request(p, greedy(3))
    seen = []
    while eng.has_work():
        eng.step()
        st = eng.last_stats
        seen.append((st.running, st.prefill_tokens, st.prefill_requests))
    assert max(r for r, _, _ in seen) == 2
    for _, tokens, reqs in seen:  # a prompt alone may exceed the budget; two together never do
        assert reqs <= 1 or tokens <= 12


def test_cancel_frees_kv_at_once(loaded, prompts):
    eng = make_engine(loaded, make_policy("fixed:3"), max_batch=2)
    a = eng.add_request(prompts[0], greedy(40, ignore_eos=True), stream=True)
    b = eng.add_request(prompts[1], greedy(40, ignore_eos=True))
    waiting = eng.add_request(prompts[2], greedy(40, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng.running == 2 and len(eng.waiting) == 1
    free_before = eng.free_kv_slots
    assert eng.cancel(a) is True
    assert eng.running == 1 and eng.pool.free_slots == 1  # freed before the next step
    assert eng.free_kv_slots > free_before
    assert eng.cancel(waiting) is True and len(eng.waiting) == 0
    assert eng.cancel(a) is False and eng.cancel(12345) is False
    outs = eng.step()
    cancelled = {o.request_id: o for o in outs if o.finish_reason == FinishReason.cancelled}
    assert set(cancelled) == {a, waiting}
    streamed = list(eng.stream(a, timeout=1))
    assert streamed[-1].finished and streamed[-1].finish_reason == FinishReason.cancelled
    while eng.has_work():
        eng.step()
    assert eng.running == 0 and eng.pool.free_slots == 2 and b not in eng._reqs


def test_producers_on_other_threads_and_streams(loaded, prompts):
    """A loop thread steps while other threads add, stream and cancel requests."""
    eng = make_engine(loaded, make_policy("adaptive"), max_batch=3)
    stop = threading.Event()
    errors = []

    def loop():
        try:
            while not stop.is_set():
                if not eng.has_work():
                    stop.wait(0.001)
                    continue
                eng.step()
        except Exception as e:  # surfaced by the assertion below
            errors.append(e)

    t = threading.Thread(target=loop)
    t.start()
    results = {}

    def client(i):
        rid = eng.add_request(prompts[i], greedy(10 + i, ignore_eos=True), stream=True)
        toks = []
        for out in eng.stream(rid, timeout=30):
            toks += out.new_token_ids
            if i == 5 and len(toks) >= 3:
                eng.cancel(rid)
        results[i] = (toks, out.finish_reason)

    clients = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for c in clients:
        c.start()
    for c in clients:
        c.join(60)
    stop.set()
    t.join(10)
    assert not errors
    refs = plain_reference(loaded, prompts, [greedy(10 + i, ignore_eos=True) for i in range(len(prompts))])
    for i, (toks, reason) in results.items():
        if i == 5:
            assert reason == FinishReason.cancelled and toks == refs[i][: len(toks)]
        else:
            assert toks == refs[i] and reason == FinishReason.length
    assert len(results) == len(prompts) and eng.running == 0


@pytest.mark.parametrize(("prompt", "params", "message"), [
    ([], None, "prompt is empty"),
    ([1] * 250, greedy(10), "exceeds the engine's max sequence length 256"),
    ([1] * 300, greedy(1), "exceeds the engine's max sequence length"),
    ([5, 100000], None, "outside the vocabulary"),
    ([5, -1], None, "outside the vocabulary"),
    ([[1, 2]], None, "flat sequence"),
    ("abc", None, "integer token ids"),
    ([5], SamplingParams(max_tokens=0), "max_tokens = 0"),
    ([5], SamplingParams(temperature=-1.0), "temperature"),
    ([5], SamplingParams(temperature=float("nan")), "temperature"),
    ([5], SamplingParams(top_p=0.0), "top_p"),
    ([5], SamplingParams(top_k=-2), "top_k"),
    ([5], SamplingParams(random_seed=-1), "random_seed"),
    ([5], SamplingParams(num_draft_tokens=-1), "num_draft_tokens"),
    ([5], SamplingParams(end_id=100000), "end_id = 100000"),
    ([5], SamplingParams(stop_words=[[99999]]), "outside the vocabulary"),
])
def test_bad_requests_get_one_line_errors_and_leave_the_engine_unharmed(loaded, prompts, prompt, params, message):
    eng = make_engine(loaded)
    ok = eng.add_request(prompts[0], greedy(5))
    with pytest.raises(ConfigError, match=message) as e:
        eng.add_request(prompt, params)
    assert "\n" not in str(e.value)
    while eng.has_work():
        eng.step()
    assert eng.running == 0 and ok not in eng._reqs


def test_bad_word_lists_are_rejected_when_built():
    with pytest.raises(ConfigError, match="token-id sequences"):
        SamplingParams(stop_words="END")
    with pytest.raises(ConfigError, match="empty"):
        SamplingParams(bad_words=[[]])
    assert SamplingParams(stop_words=[5, [6, 7]]).stop_words == ((5,), (6, 7))


def test_stream_needs_stream_flag(loaded, prompts):
    eng = make_engine(loaded)
    rid = eng.add_request(prompts[0], greedy(3))
    with pytest.raises(ConfigError, match="stream=True"):
        next(eng.stream(rid))


def test_policy_swap_at_run_time(loaded, prompts):
    eng = make_engine(loaded)
    rid = eng.add_request(prompts[4], greedy(20, ignore_eos=True))
    toks = []
    for i in range(40):
        if i == 3:
            eng.set_policy(make_policy("fixed:4"))
        toks += [t for o in eng.step() for t in o.new_token_ids]
        if not eng.has_work():
            break
    assert toks == plain_reference(loaded, [prompts[4]], [greedy(20, ignore_eos=True)])[0]
    assert eng.last_stats.step > 0 and rid not in eng._reqs


class Broken:
    """A policy that fails in one of its calls."""

    name = "broken"

    def __init__(self, where: str) -> None:
        self.where = where

    def decide(self, view):
        if self.where == "decide":
            raise RuntimeError("boom")
        if self.where == "shape":
            return Decision(np.ones(view.n + 1, dtype=np.int64), np.zeros(view.n + 1, dtype=np.int64))
        if self.where == "type":
            return {"k": [3] * view.n}
        return Decision(np.full(view.n, 3), np.zeros(view.n, dtype=np.int64))

    def prune(self, view, decision, drafted, confidence):
        if self.where == "prune":
            raise KeyError("prune")
        return drafted

    def observe(self, outcome):
        if self.where == "observe":
            raise ValueError("observe")


@pytest.mark.parametrize("where", ["decide", "shape", "type", "prune", "observe"])
def test_a_failing_policy_does_not_fail_requests(loaded, prompts, where, caplog):
    eng = make_engine(loaded, Broken(where))
    res = eng.generate(prompts[:3], greedy(10))
    assert [r.token_ids for r in res] == plain_reference(loaded, prompts[:3], [greedy(10)] * 3)
    assert eng.policy_errors > 0
    assert eng.last_policy_error.startswith({"shape": "decide", "type": "decide"}.get(where, where))
    assert "policy 'broken' failed" in caplog.text


def test_the_loop_time_between_decode_steps_reaches_the_policy(loaded, prompts):
    """What the driver does between steps (a server delivering outputs) is reported with the next
    step's outcome, attributed to the batch size of the step before; a step that left nothing
    decoding reports nothing (the wait after it may be idle time)."""
    import time

    rec = Recorder(Always(2))
    eng = make_engine(loaded, rec)
    for p in prompts[:3]:
        eng.add_request(p, greedy(12, ignore_eos=True))
    sizes = []
    while eng.has_work():
        eng.step()
        sizes.append(eng.last_stats.decode_batch)
        time.sleep(0.02)
    outs = list(rec.outcomes)
    assert np.isnan(outs[0].prev_loop_ms)  # nothing before the first decode step
    measured = [o for o in outs[1:] if np.isfinite(o.prev_loop_ms)]
    assert len(measured) == len(outs) - 1
    assert all(o.prev_loop_ms >= 20.0 for o in measured)
    decode_sizes = [s for s in sizes if s]
    assert [o.prev_loop_requests for o in measured] == decode_sizes[:-1]
    eng.add_request(prompts[0], greedy(4, ignore_eos=True))
    time.sleep(0.05)
    rec.outcomes.clear()
    while not rec.outcomes:  # the previous decode step finished everything: the gap was idle, not loop work
        eng.step()
    assert np.isnan(rec.outcomes[0].prev_loop_ms)
