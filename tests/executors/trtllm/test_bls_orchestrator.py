"""The BLS per-step orchestrator over stand-in tensorrtllm models backed by the reference Llama.

Greedy speculative output must equal non-speculative greedy output token for token; k must follow
the plan per step; streaming must hold with many concurrent requests.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from control.errors import SpecctlError
from control.executors.reference.model import LlamaConfig, LlamaForCausalLM
from control.executors.trtllm.orchestrator import SpecOrchestrator, ngram_propose
from control.executors.trtllm.reference_driver import ReferenceEngineClient, ReferenceTrtllmModel
from control.executors.trtllm.tensors import generate_request, output_tokens, verify_request
from control.plan import compile_plan, schedule_lookup
from control.policy import build_policy
from tests.conftest import make_profile

VOCAB = 48
EOS = 0


def _model(seed: int, noise_from: LlamaForCausalLM | None = None, noise: float = 0.0) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).double()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
        if noise_from is not None:
            for p, q in zip(m.parameters(), noise_from.parameters(), strict=True):
                p.copy_(q + noise * torch.randn_like(q))
    return m.eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: intra-op threads only add contention on a shared 2-core machine (25 s -> 0.5 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models():
    target = _model(0)
    draft = _model(1, noise_from=target, noise=0.08)  # agrees with the target often, not always
    return target, draft


@pytest.fixture
def client(models):
    target, draft = models
    return ReferenceEngineClient({"tensorrt_llm": ReferenceTrtllmModel(target),
                                  "tensorrt_llm_draft": ReferenceTrtllmModel(draft)})


@torch.no_grad()
def greedy(model: LlamaForCausalLM, prompt, n: int, end_id: int | None = None) -> list[int]:
    """Plain greedy decoding through the dense training path (independent of the packed KV path)."""
    seq = list(prompt)
    out = []
    for _ in range(n):
        tok = int(model.forward_train(torch.tensor([seq]))[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
        if end_id is not None and tok == end_id:
            break
    return out


def _plan():
    return compile_plan(make_profile(), max_k=4)


def _prompts(n: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, size=int(rng.integers(3, 9))).tolist() for _ in range(n)]


class Collector:
    def __init__(self, orch=None) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.done: dict[int, int] = {}
        self.final_stats: dict[int, tuple[int, int] | None] = {}
        self.orch = orch
        self.lock = threading.Lock()

    def sink(self, rid: int):
        def f(new: np.ndarray, finished: bool) -> None:
            with self.lock:
                assert rid not in self.done, f"request {rid} got tokens after it finished"
                self.tokens.setdefault(rid, []).extend(int(t) for t in new)
                if finished:
                    self.done[rid] = self.done.get(rid, 0) + 1
                    if self.orch is not None:
                        self.final_stats[rid] = self.orch.stats(rid)
        return f


@pytest.mark.parametrize("drafter", ["draft_target", "ngram"])
def test_greedy_output_equals_non_speculative(models, client, drafter):
    target, _ = models
    plan = _plan()
    orch = SpecOrchestrator(build_policy("fixed:4", plan), client, drafter=drafter, max_k=4, record=True)
    col = Collector(orch)
    prompts = _prompts(5)
    lens = [6, 11, 16, 9, 14]
    for rid, (p, n) in enumerate(zip(prompts, lens, strict=True)):
        orch.add(rid, p, n, col.sink(rid))
    orch.run_until_idle(200)
    for rid, (p, n) in enumerate(zip(prompts, lens, strict=True)):
        assert col.tokens[rid] == greedy(target, p, n), f"request {rid} diverged from plain greedy decoding"
        assert col.done[rid] == 1
    drafted = sum(int(h.drafted.sum()) for h in orch.history)
    accepted = sum(int(h.accepted.sum()) for h in orch.history)
    assert drafted > 0 and 0 < accepted < drafted  # speculation happened, with real rejections
    # Per-request totals (what the BLS returns as total_draft_tokens / total_accepted_draft_tokens).
    assert sum(s[0] for s in col.final_stats.values()) == drafted
    assert sum(s[1] for s in col.final_stats.values()) == accepted
    steps = len(orch.history)
    assert steps < max(lens)  # accepted drafts saved target steps


def test_k_follows_the_plan_per_step(models, client):
    plan = _plan()
    sched = {1: 4, 2: 3, 4: 2, 6: 1}
    policy = build_policy("static-schedule:1=4,2=3,4=2,6=1", plan)
    orch = SpecOrchestrator(policy, client, drafter="draft_target", max_k=4, record=True)
    col = Collector()
    prompts = _prompts(8, seed=3)
    lens = [4, 6, 8, 10, 12, 14, 16, 18]  # requests leave one by one, so the batch size walks down
    caps = [4, 4, 1, 4, 0, 4, 4, 2]  # per-request num_draft_tokens
    for rid, (p, n, c) in enumerate(zip(prompts, lens, caps, strict=True)):
        orch.add(rid, p, n, col.sink(rid), num_draft_tokens=c)
    remaining = dict(enumerate(lens))
    orch.run_until_idle(200)
    seen_batches = set()
    for h in orch.history:
        n = h.request_ids.size
        seen_batches.add(n)
        for rid, k, d in zip(h.request_ids, h.k_decided, h.drafted, strict=True):
            want = min(schedule_lookup(sched, n), caps[rid], remaining[rid] - 1)
            assert k == max(want, 0), f"step {h.step}: batch {n}, request {rid}: k {k}, plan says {want}"
            assert d == k  # the draft engine was asked for exactly k tokens (no EOS in this test)
        for rid, e in zip(h.request_ids, h.emitted, strict=True):
            remaining[rid] -= int(e)
    assert {8, 1} <= seen_batches and len(seen_batches) >= 4  # the schedule was exercised across batch sizes


def test_many_concurrent_streaming_requests(models, client):
    target, _ = models
    plan = _plan()
    orch = SpecOrchestrator(build_policy("adaptive", plan), client, drafter="draft_target", max_k=4, max_batch=64)
    col = Collector()
    prompts = _prompts(24, seed=11)
    lens = [3 + (i % 7) * 2 for i in range(24)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop():
        try:
            while not stop.is_set():
                if orch.step() == 0:
                    stop.wait(0.001)
        except BaseException as e:  # surfaced below
            errors.append(e)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    adders = []
    for w in range(4):  # clients arrive from several threads while the loop runs
        def add(w=w):
            for rid in range(w, 24, 4):
                orch.add(rid, prompts[rid], lens[rid], col.sink(rid))
        adders.append(threading.Thread(target=add))
    for a in adders:
        a.start()
    for a in adders:
        a.join(10)
    deadline = threading.Event()
    for _ in range(3000):
        with col.lock:
            if len(col.done) == 24:
                break
        deadline.wait(0.01)
    stop.set()
    t.join(10)
    assert not t.is_alive() and not errors, errors
    assert len(col.done) == 24 and set(col.done.values()) == {1}
    for rid in range(24):
        assert col.tokens[rid] == greedy(target, prompts[rid], lens[rid]), f"request {rid} diverged"


def test_end_id_cancel_and_bad_input(models, client):
    target, _ = models
    plan = _plan()
    orch = SpecOrchestrator(build_policy("fixed:3", plan), client, max_k=4)
    col = Collector()
    prompt = _prompts(1, seed=5)[0]
    ref = greedy(target, prompt, 12)
    end = ref[4]  # pretend the 5th generated token is EOS
    orch.add(1, prompt, 12, col.sink(1), end_id=end)
    orch.add(2, prompt, 50, col.sink(2))
    orch.step()
    assert orch.cancel(2) and not orch.cancel(99)
    orch.run_until_idle(50)
    assert col.tokens[1] == greedy(target, prompt, 12, end_id=end)
    assert col.tokens[1][-1] == end and col.done == {1: 1, 2: 1}
    assert len(col.tokens[2]) < 50
    with pytest.raises(SpecctlError, match="empty"):
        orch.add(3, [], 5, col.sink(3))
    with pytest.raises(SpecctlError, match="num_draft_tokens 9"):
        orch.add(3, [1, 2], 5, col.sink(3), num_draft_tokens=9)
    orch.add(4, [1, 2], 5, col.sink(4))
    with pytest.raises(SpecctlError, match="already in flight"):
        orch.add(4, [1, 2], 5, col.sink(4))


def test_stand_in_models_keep_tensorrtllm_semantics(models):
    target, _ = models
    m = ReferenceTrtllmModel(target)
    prompt = np.array([5, 9, 3, 17])
    plain = output_tokens(m(generate_request(prompt, 6)))
    assert plain.tolist() == greedy(target, prompt.tolist(), 6)
    # All-correct drafts are all accepted and the bonus token follows; a wrong token cuts there.
    good = m(verify_request(prompt, plain[:4]))
    assert output_tokens(good).tolist() == plain[:5].tolist()
    bad = plain[:4].copy()
    bad[2] = (bad[2] + 1) % VOCAB
    assert output_tokens(m(verify_request(prompt, bad))).tolist() == plain[:3].tolist()
    # Without exclude_input_in_output the prompt comes back too, as the tensorrtllm backend does.
    req = generate_request(prompt, 2)
    req["exclude_input_in_output"] = np.array([[False]])
    assert output_tokens(m(req)).tolist() == prompt.tolist() + plain[:2].tolist()
    with pytest.raises(SpecctlError, match="unknown input tensor"):
        m({**generate_request(prompt, 2), "text_input": np.array([b"x"])})
    with pytest.raises(SpecctlError, match="input_lengths"):
        m({**generate_request(prompt, 2), "input_lengths": np.array([[9]], dtype=np.int32)})


def test_ngram_proposer():
    seq = np.array([1, 2, 3, 4, 9, 1, 2, 3])
    assert ngram_propose(seq, 3, 3).tolist() == [4, 9, 1]
    assert ngram_propose(seq, 1, 2).tolist() == [4]
    assert ngram_propose(np.array([1, 2, 3]), 2, 3).tolist() == []
    assert ngram_propose(seq, 0, 3).tolist() == []


class ViewLog:
    """Wraps a policy; keeps each step's (request id, n-gram proposal in the view, remaining) and drafted."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.views: list[tuple[np.ndarray, np.ndarray | None, np.ndarray]] = []
        self.drafted: list[np.ndarray] = []
        self.outcomes: list = []

    def decide(self, view):
        self.views.append((view.request_ids.copy(), None if view.ngram_avail is None else view.ngram_avail.copy(),
                           view.remaining.copy()))
        return self.inner.decide(view)

    def observe(self, outcome) -> None:
        self.drafted.append(outcome.drafted.copy())
        self.outcomes.append(outcome)
        self.inner.observe(outcome)


@pytest.mark.parametrize("drafter", ["draft_target", "ngram"])
def test_the_view_carries_what_the_ngram_lookup_proposes(client, drafter):
    """With n-gram drafting each step's view holds the lookup's proposal at max_k per request, and a
    draft of k there is min(k, it) tokens; a draft model's views carry none."""
    k = 3
    log = ViewLog(build_policy(f"fixed:{k}", _plan()))
    orch = SpecOrchestrator(log, client, drafter=drafter, max_k=4)
    rng = np.random.default_rng(11)
    for rid in range(4):  # short repeating prompts: lookups that match, run short and find nothing
        orch.add(rid, rng.integers(1, 6, size=int(rng.integers(2, 9))).tolist(), 12, Collector().sink(rid))
    orch.run_until_idle(200)
    assert log.views and len(log.views) == len(log.drafted)
    if drafter != "ngram":
        assert all(avail is None for _, avail, _ in log.views)
        assert all(o.ngram_match is None for o in log.outcomes)
        return
    seen, whole = set(), 0
    for (_, avail, rem), drafted, o in zip(log.views, log.drafted, log.outcomes, strict=True):
        assert avail is not None and ((avail >= 0) & (avail <= 4)).all()
        assert drafted.tolist() == np.minimum(np.minimum(k, rem - 1), avail).tolist()
        seen.update(avail.tolist())
        # the lookup scored against the tokens the step appended: a draft of the whole lookup scores
        # what the target accepted of it; none where it proposed nothing or the request left
        live = ~np.isin(o.request_ids, o.finished)  # (n,) bool
        m = o.ngram_match  # (n,)
        assert ((m == -1) == ((avail == 0) | ~live)).all()
        assert (m <= np.minimum(avail, o.accepted + 1)).all()
        full = live & (avail > 0) & (drafted == avail)  # (n,) bool
        assert (m[full] == o.accepted[full]).all()
        whole += int(full.sum())
    assert 0 in seen and len(seen) > 2 and whole > 0
