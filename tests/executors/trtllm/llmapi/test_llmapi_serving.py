"""The llm model on the LLM API (``executor: trtllm``) through a real Triton server, with the stand-in
``tensorrt_llm`` over tiny reference checkpoints: lossless streaming, concurrency, cancellation,
per-request errors, the reference path's validation, and k control (drafter hook, telemetry)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import tritonclient.grpc.aio as aio

from control.clients.triton import (
    GenParams,
    RequestError,
    grpc_generate,
    grpc_inputs,
    http_generate,
    model_stats,
    stop_inputs,
    stream_generate,
)
from tests.e2e.stop_client import stream_then_stop
from tests.executors.trtllm.bls.engines import CORPUS, train_tokenizer
from tests.executors.trtllm.llmapi.conftest import FAIL_TOKEN, TOKEN

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_TOKENS = 24
MODELS = ("llm", "llm_ngram")  # static draft_len_schedule (draft model) / drafter hook (n-gram)
WORDS = CORPUS.split()
TOK = train_tokenizer()


def prompt_text(i: int, n: int = 12) -> str:
    return " ".join(WORDS[(7 * i) % 40: (7 * i) % 40 + n])


def ids_of(text: str) -> list[int]:
    return [1, *TOK.encode(text).ids]  # BOS, as the stand-in's tokenizer (and TensorRT-LLM's) adds it


def decode(ids: list[int]) -> str:
    return TOK.decode(ids, skip_special_tokens=True)


def set_policy(llmapi, policy: str | None, model: str = "llm_ngram", timeout_s: float = 10.0) -> None:
    """Override the control plane's policy and wait until ``model``'s agent runs it."""
    httpx.put(f"{llmapi.control_url}/v1/overrides", json={} if policy is None else {"policy": policy}, headers=AUTH,
              timeout=5).raise_for_status()
    want = policy or "adaptive"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if model_stats(llmapi.http_url, model=model)["plan_received"]["policy"] == want:
            return
        time.sleep(0.05)
    raise AssertionError(f"{model} did not get a plan with policy {want}: {model_stats(llmapi.http_url, model=model)}")


@pytest.mark.parametrize("model", MODELS)
def test_greedy_output_equals_the_reference_engine(llmapi, reference_greedy, model):
    texts = [prompt_text(i) for i in range(3)]
    want = reference_greedy([ids_of(t) for t in texts], MAX_TOKENS)
    drafted = 0
    chunks = []
    for text, ids in zip(texts, want, strict=True):
        p = GenParams(max_tokens=MAX_TOKENS)
        streamed = grpc_generate(llmapi.grpc_url, text, p, model=model)
        by_ids = grpc_generate(llmapi.grpc_url, ids_of(text), p, model=model)
        whole = http_generate(llmapi.http_url, text, p, model=model)  # stream false: one response
        for got in (streamed, by_ids, whole):
            assert got.token_ids == ids
            assert got.text == decode(ids)
        assert sum(streamed.chunk_tokens) == len(ids) and len(whole.chunk_times) == 1
        chunks.append(len(streamed.chunk_times))
        assert 0 <= streamed.accepted <= streamed.drafted
        drafted += streamed.drafted
    # one response per run of deltas the host loop drains together: several per stream, though a
    # stalled loop on a busy machine may find a whole short stream done at once (CI saw 24 tokens in one)
    assert max(chunks) >= 2, chunks
    if model == "llm":  # TensorRT-LLM's draft model ran (the schedule's k at batch 1): speculation was on
        assert drafted > 0


def test_8_concurrent_streams_complete(llmapi, reference_greedy):
    texts = [prompt_text(i, 8 + i) for i in range(8)]
    want = reference_greedy([ids_of(t) for t in texts], 40)

    async def run():
        client = aio.InferenceServerClient(llmapi.grpc_url)
        try:
            return await asyncio.gather(*(stream_generate(client, t, GenParams(max_tokens=40), model=m)
                                          for t, m in zip(texts, MODELS * 4, strict=True)))
        finally:
            await client.close()

    results = asyncio.run(asyncio.wait_for(run(), 120))
    assert [r.error for r in results] == [None] * 8
    assert [r.token_ids for r in results] == want
    # They ran concurrently: at some first token, at least half of them were streaming (one model serving
    # its four one after another gives at most two at once). Every first token before every last one
    # says the same only on a quiet host.
    spans = [(r.ttft_s, r.latency_s) for r in results]
    streaming = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert streaming >= 4, spans


def test_cancel_mid_stream_aborts_the_request_in_the_executor(llmapi):
    before = model_stats(llmapi.http_url)

    async def run():
        client = aio.InferenceServerClient(llmapi.grpc_url)
        got = asyncio.Event()

        def on_chunk(res):
            if len(res.chunk_times) >= 3:
                got.set()

        task = asyncio.create_task(stream_generate(client, prompt_text(1), GenParams(max_tokens=400), on_chunk=on_chunk,
                                                   on_cancel="cancel"))  # Triton's own cancellation path
        await asyncio.wait_for(got.wait(), 30)
        during = model_stats(llmapi.http_url)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()
        return during, time.monotonic()

    during, cancelled_at = asyncio.run(run())
    assert during["active_requests"] == 1
    after = model_stats(llmapi.http_url)
    while after["active_requests"] and time.monotonic() - cancelled_at < 5:
        time.sleep(0.02)
        after = model_stats(llmapi.http_url)
    assert time.monotonic() - cancelled_at < 2, "the cancellation took more than 2 s to reach the model"
    assert after["active_requests"] == 0 and after["cancelled"] == before["cancelled"] + 1
    assert after["aborted"] == before["aborted"] + 1  # RequestOutput.abort() was called
    assert after["completed"] == before["completed"] and after["failed"] == before["failed"]
    assert grpc_generate(llmapi.grpc_url, prompt_text(2), GenParams(max_tokens=5)).token_ids  # it keeps serving


def test_a_stop_request_aborts_the_request_in_the_executor(llmapi):
    before = model_stats(llmapi.http_url)
    stream_then_stop(llmapi.grpc_url, "llm", grpc_inputs(prompt_text(3), GenParams(max_tokens=400)), stop_inputs(),
                      "llmapi-stop")
    after = model_stats(llmapi.http_url)
    deadline = time.monotonic() + 5
    while after["active_requests"] and time.monotonic() < deadline:
        time.sleep(0.02)
        after = model_stats(llmapi.http_url)
    assert after["active_requests"] == 0
    assert [after[k] - before[k] for k in ("cancelled", "stopped", "aborted", "completed")] == [1, 1, 1, 0], after


def test_an_error_in_one_request_fails_only_that_request(llmapi, reference_greedy):
    good = [prompt_text(i) for i in range(3)]
    want = reference_greedy([ids_of(t) for t in good], 30)
    fault = [1, FAIL_TOKEN, *ids_of(good[0])[1:]]  # the stand-in executor fails it after its first update
    too_long = ids_of(" ".join(WORDS * 3))[:500]  # within max_seq_len (8192), beyond the checkpoint's 512 positions
    before = model_stats(llmapi.http_url)

    async def run():
        client = aio.InferenceServerClient(llmapi.grpc_url)
        try:
            return await asyncio.gather(
                *(stream_generate(client, t, GenParams(max_tokens=30)) for t in good),
                stream_generate(client, fault, GenParams(max_tokens=30)),
                stream_generate(client, too_long, GenParams(max_tokens=30)))
        finally:
            await client.close()

    *ok, failed, refused = asyncio.run(asyncio.wait_for(run(), 60))
    assert [r.error for r in ok] == [None] * 3 and [r.token_ids for r in ok] == want
    assert failed.token_ids and "the engine failed while running this request" in failed.error
    assert "stand-in fault" in failed.error and "retry it" in failed.error
    assert refused.token_ids == [] and "TensorRT-LLM refused the request" in refused.error
    assert "exceeds the engine's max sequence length 512" in refused.error
    after = model_stats(llmapi.http_url)
    assert after["failed"] == before["failed"] + 2 and after["completed"] == before["completed"] + 3
    assert after["active_requests"] == 0


LONG = " ".join(WORDS) * 40  # more tokens than max_seq_len (8192)
BAD = [
    ({"max_tokens": 5}, "text_input is missing"),
    ({"text_input": "", "max_tokens": 5}, "text_input is empty"),
    ({"text_input": "x", "max_tokens": 0}, "max_tokens = 0: must be >= 1"),
    ({"text_input": "x", "max_tokens": 1025}, "must be 1..1024 on this deployment"),
    ({"text_input": "x", "max_tokens": 5, "policy": "bogus"}, "bogus"),
    ({"text_input": "x", "max_tokens": 5, "policy": "fixed:2"}, "switch the deployment's policy with PUT /v1/overrides"),
    ({"text_input": LONG, "max_tokens": 5}, "exceeds the engine's max sequence length 8192"),
    ({"text_input": "x", "max_tokens": 5, "top_p": 0.0}, "top_p"),
    ({"text_input": "x", "max_tokens": 5, "temperature": -1.0}, "temperature"),
    ({"text_input": "x", "max_tokens": 5, "top_k": -1}, "top_k"),
    ({"text_input": "x", "max_tokens": 5, "num_draft_tokens": -1}, "num_draft_tokens"),
    ({"text_input": "x", "max_tokens": 5, "end_id": 10**6}, "end_id = 1000000: must be >= 0 and <= 95"),
]


@pytest.mark.parametrize(("body", "message"), BAD, ids=[m[:30] for _, m in BAD])
def test_bad_requests_get_the_reference_paths_messages(llmapi, body, message):
    r = httpx.post(f"{llmapi.http_url}/v2/models/llm/generate", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]


def test_bad_input_ids_are_refused_and_the_model_keeps_serving(llmapi):
    with pytest.raises(RequestError, match=r"prompt token id 96 is outside the vocabulary \[0, 96\)"):
        grpc_generate(llmapi.grpc_url, [1, 5, 96], GenParams(max_tokens=4))
    assert grpc_generate(llmapi.grpc_url, [1, 5, 6], GenParams(max_tokens=4)).token_ids


def test_stop_and_bad_words_match_the_reference_engine(llmapi, reference_greedy):
    text = prompt_text(0)
    plain = reference_greedy([ids_of(text)], MAX_TOKENS)[0]
    word = decode(plain[5:6]).strip()  # a word the output produces
    stop, bad = [TOK.encode(word).ids], [TOK.encode(word).ids]
    want_stop = reference_greedy([ids_of(text)], MAX_TOKENS, stop_words=stop)[0]
    want_bad = reference_greedy([ids_of(text)], MAX_TOKENS, bad_words=bad)[0]
    assert len(want_stop) < len(plain) and want_bad != plain  # the words change the output
    for model in MODELS:
        got_stop = grpc_generate(llmapi.grpc_url, text, GenParams(max_tokens=MAX_TOKENS, stop_words=(word,)), model=model)
        got_bad = grpc_generate(llmapi.grpc_url, text, GenParams(max_tokens=MAX_TOKENS, bad_words=(word,)), model=model)
        assert got_stop.token_ids == want_stop and got_bad.token_ids == want_bad


def test_the_control_plane_sets_k_through_the_drafter_hook(llmapi, reference_greedy):
    text = " ".join(WORDS[:6] * 4)  # repeats: prompt lookup finds drafts
    want = reference_greedy([ids_of(text)], 30)[0]

    def run(**kw):
        s0 = model_stats(llmapi.http_url, model="llm_ngram")
        r = grpc_generate(llmapi.grpc_url, text, GenParams(max_tokens=30, **kw), model="llm_ngram")
        s1 = model_stats(llmapi.http_url, model="llm_ngram")
        assert r.token_ids == want
        return r, s1["hook"]["iterations"] - s0["hook"]["iterations"], s1

    try:
        set_policy(llmapi, "fixed:3")
        r, iters, st = run()
        assert st["k_control"] == "drafter-hook" and iters >= 5
        assert 0 < r.drafted <= 3 * iters  # k = 3 per iteration, fewer where the lookup found less
        capped, iters, _ = run(num_draft_tokens=1)
        assert 0 < capped.drafted <= iters and capped.drafted < r.drafted  # the request's cap reached the hook
        assert run(num_draft_tokens=0)[0].drafted == 0
        assert run(policy="none")[0].drafted == 0
        set_policy(llmapi, "none")
        assert run()[0].drafted == 0  # the plan turned speculation off in the executor
    finally:
        set_policy(llmapi, None)
    assert model_stats(llmapi.http_url, model="llm_ngram")["agent"]["steps"] > 0  # the agent saw the iterations


def test_static_schedule_acceptance_reaches_the_control_plane(llmapi):
    def draft_trials() -> float:
        return httpx.get(f"{llmapi.control_url}/v1/status", timeout=5).json()["acceptance"]["draft"]["trials"]

    before = model_stats(llmapi.http_url)
    t0 = draft_trials()
    grpc_generate(llmapi.grpc_url, prompt_text(3), GenParams(max_tokens=20))
    time.sleep(1.1)  # the agent closes a telemetry window about once a second
    grpc_generate(llmapi.grpc_url, prompt_text(4), GenParams(max_tokens=20))
    grpc_generate(llmapi.grpc_url, prompt_text(5), GenParams(max_tokens=20, num_draft_tokens=1))
    deadline = time.monotonic() + 15
    while draft_trials() <= t0 and time.monotonic() < deadline:
        time.sleep(0.1)
    status = httpx.get(f"{llmapi.control_url}/v1/status", timeout=5).json()
    assert status["acceptance"]["draft"]["trials"] > t0, status
    assert not status["telemetry"]["rejected"], status["telemetry"]
    after = model_stats(llmapi.http_url)
    assert after["k_control"] == "static-schedule" and after["metrics_to_agent"] >= before["metrics_to_agent"] + 3
    assert after["uncapped"] == before["uncapped"] + 1  # num_draft_tokens has no static-schedule equivalent
    assert after["agent"]["telemetry_sent"] >= 1
