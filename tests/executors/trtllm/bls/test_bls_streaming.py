"""``specctl_bls`` through a real Triton server, against stand-in ``tensorrt_llm`` /
``tensorrt_llm_draft`` models on the reference Llama: greedy output equals plain greedy decoding of
the target token for token; k follows the plan per step; many concurrent streams complete."""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
import pytest

from tests.executors.trtllm.bls.client import Stream, generate, http_post, sse_events
from tests.executors.trtllm.bls.engines import greedy

TEXTS = ["the target verifies drafts", "speculative decoding", "a cost model and the acceptance it observes",
         "greedy output equals plain greedy decoding", "batch sizes"]
FIXED_K = 3  # specctl_bls_fixed runs fixed:3
MAX_K = 4  # the recipe's max_draft_len


def prompts(tokenizer, n: int) -> list[list[int]]:
    return [tokenizer.encode(t).ids for t in itertools.islice(itertools.cycle(TEXTS), n)]


def check_steps(gen, n_tokens: int) -> None:
    """Each streamed response is one step: accepted + 1 tokens (fewer only when max_tokens cut it)."""
    assert len(gen.chunks) == len(gen.step_drafted) == len(gen.step_accepted)
    for i, (chunk, d, a) in enumerate(zip(gen.chunks, gen.step_drafted, gen.step_accepted, strict=True)):
        assert 0 <= a <= d
        if i < len(gen.chunks) - 1:
            assert len(chunk) == a + 1, f"step {i}: {len(chunk)} tokens streamed, {a} drafts accepted"
        else:
            assert 1 <= len(chunk) <= a + 1
    assert gen.totals["total_draft_tokens"] == sum(gen.step_drafted)
    assert gen.totals["total_accepted_draft_tokens"] == sum(gen.step_accepted)
    assert len(gen.tokens) == n_tokens


def test_greedy_output_equals_target_for_prompts_and_k(triton, target, tokenizer):
    """fixed:3 capped per request by num_draft_tokens: k per step = min(3, cap, remaining - 1)."""
    cases = [(p, n, cap) for (p, n), cap in itertools.product(zip(prompts(tokenizer, 3), (17, 24, 9), strict=True),
                                                             (None, 0, 1, 2, 4))]
    drafted = accepted = 0
    numbered = list(enumerate(cases))
    for pair in (numbered[j:j + 2] for j in range(0, len(numbered), 2)):  # specctl_bls_fixed: max_batch 2
        s = Stream(triton.grpc_url)
        try:
            gens = {i: s.send("specctl_bls_fixed", str(i), p, n, num_draft_tokens=cap) for i, (p, n, cap) in pair}
            s.wait(len(gens))
            assert not s.errors, s.errors
        finally:
            s.close()
        for i, (p, n, cap) in pair:
            gen = gens[i]
            assert gen.tokens == greedy(target, p, n), f"case {i} (cap {cap}) diverged from plain greedy decoding"
            check_steps(gen, n)
            remaining = n
            for d, chunk in zip(gen.step_drafted, gen.chunks, strict=True):
                want = min(FIXED_K, MAX_K if cap is None else cap, remaining - 1)
                assert d == want, f"case {i}: k {d} with {remaining} tokens to go, cap {cap}; plan says {want}"
                remaining -= len(chunk)
            drafted += sum(gen.step_drafted)
            accepted += sum(gen.step_accepted)
    assert 0 < accepted < drafted  # drafts were verified, with real rejections


def test_static_schedule_sets_k_by_batch_size_per_step(triton, tokenizer):
    """static-schedule:1=4,2=1: k = 4 alone, 1 with two requests in the step, 0 with three or more."""
    pa, pb, pc = prompts(tokenizer, 3)
    s = Stream(triton.grpc_url)
    try:
        a = s.send("specctl_bls_static", "a", pa, 200)
        _wait_first(a)
        b = s.send("specctl_bls_static", "b", pb, 40)  # >= 20 steps: room for c to join while it runs
        _wait_first(b)
        c = s.send("specctl_bls_static", "c", pc, 6)
        s.wait(3)
        assert not s.errors, s.errors
    finally:
        s.close()
    for gen, n in ((a, 200), (b, 40), (c, 6)):
        check_steps(gen, n)
    # c joined while a and b ran, and b outlives it: every step of c had three requests.
    assert c.step_drafted == [0] * len(c.chunks)
    # b: first step with a (k 1), then with a and c (k 0), then with a again (k 1), capped at the end.
    assert b.step_drafted[0] == 1 and b.step_drafted.count(0) >= len(c.chunks)
    assert set(b.step_drafted) <= {0, 1}
    # a: alone (4), with b (1), with b and c (0), with b (1, unless b and c ended together), alone (4).
    runs = [k for k, _ in itertools.groupby(_uncapped(a))]
    assert runs in ([4, 1, 0, 1, 4], [4, 1, 0, 4]), f"a's k per step ran {runs}: {a.step_drafted}"
    assert _uncapped(a).count(0) == len(c.chunks)
    assert sum(1 for k in _uncapped(a) if k in (0, 1)) == len(b.chunks)


def _uncapped(gen) -> list[int]:
    """Step k while the request had more than k + 1 tokens to go (the cap at the end is not the plan's)."""
    out, remaining = [], sum(len(c) for c in gen.chunks)
    for d, chunk in zip(gen.step_drafted, gen.chunks, strict=True):
        if remaining - 1 >= 4:
            out.append(d)
        remaining -= len(chunk)
    return out


def _wait_first(gen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not gen.chunks:
        assert time.monotonic() < deadline, "no first response"
        time.sleep(0.002)


def test_many_concurrent_streams_complete_correctly(triton, target, tokenizer):
    """24 streaming requests at once on two gRPC streams, under the rendered plan (adaptive policy)."""
    ps = prompts(tokenizer, 24)
    lens = [8 + (i * 5) % 17 for i in range(24)]
    streams = [Stream(triton.grpc_url), Stream(triton.grpc_url)]
    try:
        gens = {i: streams[i % 2].send("specctl_bls", str(i), ps[i], lens[i]) for i in range(24)}
        for s in streams:
            s.wait(12, timeout=120)
            assert not s.errors, s.errors
    finally:
        for s in streams:
            s.close()
    for i, gen in gens.items():
        assert gen.tokens == greedy(target, ps[i], lens[i]), f"request {i} diverged from plain greedy decoding"
        check_steps(gen, lens[i])
        assert gen.final and len(gen.chunks) >= 2  # streamed, not delivered at the end
    assert sum(sum(g.step_drafted) for g in gens.values()) > 0  # the controller drafted under load


def test_end_id_stops_after_it_and_non_streaming_holds_all(triton, target, tokenizer):
    p = prompts(tokenizer, 1)[0]
    ref = greedy(target, p, 20)
    end = ref[6]
    want = greedy(target, p, 20, end_id=end)
    gen = generate(triton.grpc_url, "specctl_bls", p, 20, end_id=end)
    assert gen.error is None and gen.tokens == want and gen.tokens[-1] == end
    held = generate(triton.grpc_url, "specctl_bls", p, 20, stream=False)
    assert held.error is None and len(held.chunks) == 1 and held.tokens == ref
    assert len(held.step_drafted) >= 2 and sum(held.step_drafted) == held.totals["total_draft_tokens"]


def test_ngram_drafter_is_lossless(triton, target, tokenizer):
    """specctl_bls rendered from the n-gram recipe: prompt lookup in the BLS, no draft model."""
    p = tokenizer.encode("the target the target the target verifies the target").ids
    gen = generate(triton.grpc_url, "specctl_bls_ngram", p, 30)
    assert gen.error is None
    assert gen.tokens == greedy(target, p, 30)
    check_steps(gen, 30)


def test_http_generate_and_generate_stream(triton, target, tokenizer):
    p = prompts(tokenizer, 2)[1]
    ref = greedy(target, p, 14)
    code, body = http_post(f"{triton.http_url}/v2/models/specctl_bls/generate",
                           {"input_ids": p, "max_tokens": 14, "stream": False})
    assert code == 200, body
    out = np.asarray(json.loads(body)["output_ids"]).reshape(-1).tolist()
    assert out == ref
    code, body = http_post(f"{triton.http_url}/v2/models/specctl_bls/generate_stream",
                           {"input_ids": p, "max_tokens": 14, "num_draft_tokens": 2})
    assert code == 200, body
    events = sse_events(body)
    assert len(events) >= 2 and all("error" not in e for e in events)
    tokens = [t for e in events for t in np.asarray(e["output_ids"]).reshape(-1).tolist()]
    assert tokens == ref
    assert max(k for e in events for k in np.asarray(e["step_draft_tokens"]).reshape(-1).tolist()) <= 2


@pytest.fixture(autouse=True)
def _server_alive(triton):
    yield
    assert triton.alive(), f"tritonserver died: {triton.log_tail()}"


def test_a_target_answering_k_plus_1_tokens_streams_them_all(triton, target, tokenizer):
    """specctl_bls_all (fixed:3) over a target that decodes on to request_output_len after a
    rejection: every step streams all k + 1 target tokens, and the text is plain greedy."""
    ps = prompts(tokenizer, 2)
    s = Stream(triton.grpc_url)
    try:
        gens = [s.send("specctl_bls_all", str(i), p, 30) for i, p in enumerate(ps)]
        s.wait(len(gens))
        assert not s.errors, s.errors
    finally:
        s.close()
    rejected = 0
    for p, gen in zip(ps, gens, strict=True):
        assert gen.tokens == greedy(target, p, 30)
        for i, (chunk, d, a) in enumerate(zip(gen.chunks, gen.step_drafted, gen.step_accepted, strict=True)):
            if i < len(gen.chunks) - 1:
                assert len(chunk) == d + 1, f"step {i}: {len(chunk)} tokens streamed for {d} drafts"
            rejected += int(a < d)
    assert rejected > 0  # steps where accepted + 1 and k + 1 differ
