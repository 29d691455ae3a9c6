"""Model errors through the real server are errors, not successes: an engine failure mid-generation
reaches the client as an error after the tokens it already had and is counted as failed on Triton's
metrics port; a refused request gets its error through its response sender and counts in
``specctl_requests_total{outcome="rejected"}``."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
import tritonclient.grpc.aio as aio

from control.clients.triton import GenParams, grpc_generate, model_stats, stream_generate
from tests.e2e.conftest import DELIVER_FAULT_PREFIX, FAULT_PREFIX
from tests.e2e.prompts import PROMPTS

pytestmark = pytest.mark.e2e

METRICS_REFRESH_S = 5.0  # Triton refreshes some counters on its own schedule


def _counter(text: str, name: str, **labels: str) -> float:
    """Sum of ``name`` over the series of model llm whose labels include ``labels``."""
    total = 0.0
    for m in re.finditer(rf'^{name}\{{([^}}]*)\}} (\S+)$', text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if got.get("model") == "llm" and all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _metrics(dep) -> str:
    return httpx.get(dep.metrics_url, timeout=5).text


def _wait_counter(dep, name: str, at_least: float, **labels: str) -> float:
    deadline = time.monotonic() + METRICS_REFRESH_S
    while True:
        v = _counter(_metrics(dep), name, **labels)
        if v >= at_least or time.monotonic() > deadline:
            return v
        time.sleep(0.2)


def _stream(dep, prompt, params: GenParams):
    async def run():
        client = aio.InferenceServerClient(dep.grpc_url)
        try:
            return await asyncio.wait_for(stream_generate(client, prompt, params), 60)
        finally:
            await client.close()

    return asyncio.run(run())


def test_an_engine_failure_mid_generation_is_an_error_counted_as_failed(deployment, reference):
    prompt = list(FAULT_PREFIX) + reference.loaded.encode(PROMPTS[0])
    before_text, before = _metrics(deployment), model_stats(deployment.http_url)
    failed0 = _counter(before_text, "specctl_requests_total", outcome="failed")
    res = _stream(deployment, prompt, GenParams(max_tokens=48))
    assert res.token_ids, "the fault fires only after the request's first tokens"
    assert len(res.token_ids) < 48
    assert res.error is not None and "the engine failed while running this request" in res.error, res.error
    assert "InjectedFault" in res.error and "retry it" in res.error
    assert _wait_counter(deployment, "specctl_requests_total", failed0 + 1, outcome="failed") == failed0 + 1
    after = model_stats(deployment.http_url)
    assert after["failed"] == before["failed"] + 1 and after["step_errors"] == before["step_errors"] + 1
    assert after["kv_slots_in_use"] == 0 and after["active_requests"] == 0
    nv = _counter(_metrics(deployment), "nv_inference_request_failure") - _counter(before_text, "nv_inference_request_failure")
    print(f"\nengine failure after {len(res.token_ids)} tokens: specctl_requests_total{{outcome=failed}} +1, "
          f"nv_inference_request_failure +{nv:.0f} (the Python backend counts a decoupled request when execute() returns)")
    # The engine loop survived its failed step: the next request is served in full.
    assert len(grpc_generate(deployment.grpc_url, PROMPTS[1], GenParams(max_tokens=8)).token_ids) == 8


def test_an_engine_failure_over_http_is_a_server_error_naming_it(deployment, reference):
    prompt = list(FAULT_PREFIX) + reference.loaded.encode(PROMPTS[2])
    r = httpx.post(f"{deployment.http_url}/v2/models/llm/generate", json={"input_ids": prompt, "max_tokens": 16},
                   timeout=60)
    assert r.status_code >= 400 and "the engine failed while running this request" in r.json()["error"], r.text


def test_a_delivery_failure_ends_that_request_alone_and_the_loop_goes_on(deployment, reference):
    faulty = list(DELIVER_FAULT_PREFIX) + reference.loaded.encode(PROMPTS[0])
    before = model_stats(deployment.http_url)

    async def run():
        client = aio.InferenceServerClient(deployment.grpc_url)
        try:
            jobs = [stream_generate(client, p, GenParams(max_tokens=24)) for p in (PROMPTS[1], faulty, PROMPTS[2])]
            return await asyncio.wait_for(asyncio.gather(*jobs), 60)
        finally:
            await client.close()

    ok1, bad, ok2 = asyncio.run(run())
    assert bad.token_ids and len(bad.token_ids) < 24, "the fault fires from the request's second delivery on"
    assert bad.error is not None and "the server failed while answering this request" in bad.error, bad.error
    assert "InjectedFault" in bad.error and "retry it" in bad.error
    # the requests beside it in the same steps are served in full, token for token
    assert [ok1.token_ids, ok2.token_ids] == reference([PROMPTS[1], PROMPTS[2]], 24)
    after = model_stats(deployment.http_url)
    assert after["failed"] == before["failed"] + 1 and after["step_errors"] == before["step_errors"]
    assert after["kv_slots_in_use"] == 0 and after["active_requests"] == 0
    deadline = time.monotonic() + 5.0  # nothing in flight: the loop waits, and its stats say so
    while after["loop"]["phase"] != "idle" and time.monotonic() < deadline:
        time.sleep(0.05)
        after = model_stats(deployment.http_url)
    assert after["loop"]["alive"] and after["loop"]["phase"] == "idle", after["loop"]


def test_refused_grpc_requests_count_as_rejected(deployment):
    bodies = [GenParams(max_tokens=0), GenParams(max_tokens=4, top_p=0.0), GenParams(max_tokens=4, policy="bogus"),
              GenParams(max_tokens=4, temperature=-1.0)]
    before = _counter(_metrics(deployment), "specctl_requests_total", outcome="rejected")
    for params in bodies:
        res = _stream(deployment, PROMPTS[3], params)
        assert res.error is not None and res.token_ids == [], res
        assert "Failed to process" not in res.error and "At:" not in res.error, res.error  # the model's words alone
    after = _wait_counter(deployment, "specctl_requests_total", before + len(bodies), outcome="rejected")
    assert after == before + len(bodies)


def test_a_stream_cancelled_mid_generation_is_counted_as_cancelled_with_its_tokens(deployment):
    """The client's task is cancelled; ``stream_generate`` stops the request by its id (its default),
    which the model counts as cancelled, and in its stats as stopped."""
    stopped0 = model_stats(deployment.http_url)["stopped"]
    text0 = _metrics(deployment)
    cancelled0 = _counter(text0, "specctl_requests_total", outcome="cancelled")
    completed0 = _counter(text0, "specctl_requests_total", outcome="completed")
    tokens0 = _counter(text0, "specctl_generated_tokens_total")

    async def run():
        client = aio.InferenceServerClient(deployment.grpc_url)
        got, chunks = asyncio.Event(), []

        def on_chunk(res):
            chunks.append(len(res.token_ids))
            if len(chunks) >= 3:
                got.set()

        task = asyncio.create_task(stream_generate(client, PROMPTS[3], GenParams(max_tokens=900), on_chunk=on_chunk))
        await asyncio.wait_for(got.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()
        return chunks[-1]  # res.token_ids: every token received so far

    received = asyncio.run(run())
    assert _wait_counter(deployment, "specctl_requests_total", cancelled0 + 1, outcome="cancelled") == cancelled0 + 1
    text = _metrics(deployment)
    assert _counter(text, "specctl_requests_total", outcome="completed") == completed0
    generated = _counter(text, "specctl_generated_tokens_total") - tokens0
    assert received <= generated < 900  # what it got, and what was generated before the cancel took hold
    assert model_stats(deployment.http_url)["stopped"] == stopped0 + 1

