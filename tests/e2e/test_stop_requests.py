"""Stop requests through the real server: a request with ``stop`` true and the id of a request in
flight ends it (tensorrtllm_backend's ``stop`` input), on the same stream, from another connection,
and through the upstream-shaped aliases; the stream then ends normally, with no gRPC cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aio
from tritonclient.utils import InferenceServerException

from control.clients.triton import GenParams, grpc_inputs, model_stats, stop_inputs, stream_generate
from tests.e2e.prompts import PROMPTS
from tests.e2e.stop_client import stream_then_stop
from tests.e2e.test_upstream_clients import upstream_inputs

pytestmark = pytest.mark.e2e

LONG = 900  # tokens a stopped request would take seconds to generate
SETTLE_S = 10.0


def _settled(url: str, before: dict) -> dict:
    """Stats once the stopped requests have left (no active request, no KV slot held)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        s = model_stats(url)
        if (s["active_requests"], s["kv_slots_in_use"]) == (0, 0) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def _deltas(before: dict, after: dict) -> tuple[int, int, int]:
    return tuple(after[k] - before[k] for k in ("cancelled", "stopped", "completed"))


def test_a_stop_on_the_same_stream_ends_the_request(deployment):
    before = model_stats(deployment.http_url)
    results = stream_then_stop(deployment.grpc_url, "llm", grpc_inputs(PROMPTS[0], GenParams(max_tokens=LONG)),
                                stop_inputs(), "stop-same-stream")
    after = _settled(deployment.http_url, before)
    assert (after["active_requests"], after["kv_slots_in_use"]) == (0, 0), after
    assert _deltas(before, after) == (1, 1, 0), after
    tokens = sum(len(r.as_numpy("output_ids") if r.as_numpy("output_ids") is not None else []) for r in results)
    assert 0 < tokens < LONG


def test_the_aliases_forward_a_stop_to_every_row_of_the_request(deployment):
    before = model_stats(deployment.http_url)
    stop = grpcclient.InferInput("stop", [1, 1], "BOOL")
    stop.set_data_from_numpy(np.ones((1, 1), dtype=bool))
    stream_then_stop(deployment.grpc_url, "tensorrt_llm_bls",
                      upstream_inputs(PROMPTS[:2], LONG, stream=True, exclude_input=True), [stop], "stop-bls", after=4)
    after = _settled(deployment.http_url, before)
    assert _deltas(before, after) == (2, 2, 0), after


def _stop(url: str, rid: str) -> list:
    """A stop request for ``rid`` on a stream of its own: its responses (or errors)."""
    async def run():
        client = aio.InferenceServerClient(url)

        async def one():
            yield {"model_name": "llm", "inputs": stop_inputs(), "request_id": rid}

        try:
            return [err or r async for r, err in client.stream_infer(one())]
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(run(), 30))


def test_a_stop_from_another_connection_ends_the_stream_with_its_final_response(deployment):
    before = model_stats(deployment.http_url)
    answers: list = []

    def on_chunk(res):
        if len(res.chunk_times) == 3:  # (a blocking call in the event loop: this stream waits meanwhile)
            answers.extend(_stop_in_thread(deployment.grpc_url, "stop-elsewhere"))

    async def run():
        client = aio.InferenceServerClient(deployment.grpc_url)
        try:
            return await asyncio.wait_for(stream_generate(client, PROMPTS[1], GenParams(max_tokens=LONG),
                                                          request_id="stop-elsewhere", on_chunk=on_chunk), 60)
        finally:
            await client.close()

    res = asyncio.run(run())
    assert res.error is None and 0 < len(res.token_ids) < LONG  # ended by its final response, early
    assert len(answers) == 1 and not isinstance(answers[0], InferenceServerException), answers
    assert _deltas(before, _settled(deployment.http_url, before)) == (1, 1, 0)


def _stop_in_thread(url: str, rid: str) -> list:
    out: list = []
    t = threading.Thread(target=lambda: out.extend(_stop(url, rid)))
    t.start()
    t.join(30)
    return out


def test_a_stop_needs_an_id_and_one_for_no_request_changes_nothing(deployment):
    before = model_stats(deployment.http_url)
    r = httpx.post(f"{deployment.http_url}/v2/models/llm/generate", json={"stop": True}, timeout=10)
    assert r.status_code == 400 and "stop = true needs the id of the request to stop" in r.text, r.text
    answers = _stop(deployment.grpc_url, "nobody")
    assert len(answers) == 1 and not isinstance(answers[0], InferenceServerException), answers  # not an error
    time.sleep(0.2)
    after = model_stats(deployment.http_url)
    assert _deltas(before, after) == (0, 0, 0) and after["requests"] == before["requests"]


def test_a_stopped_request_that_does_not_stream_gets_its_answer_so_far(deployment, reference):
    before = model_stats(deployment.http_url)

    async def run():
        client = aio.InferenceServerClient(deployment.grpc_url)

        async def requests():
            yield {"model_name": "llm", "inputs": grpc_inputs(PROMPTS[2], GenParams(max_tokens=LONG), stream=False),
                   "request_id": "stop-whole"}
            while model_stats(deployment.http_url)["generated"] - before["generated"] < 8:
                await asyncio.sleep(0.02)
            yield {"model_name": "llm", "inputs": stop_inputs(), "request_id": "stop-whole"}

        try:
            return [err or r async for r, err in client.stream_infer(requests())]
        finally:
            await client.close()

    got = asyncio.run(asyncio.wait_for(run(), 60))
    assert not [r for r in got if isinstance(r, InferenceServerException)], got
    answer = [r for r in got if r.as_numpy("output_ids") is not None]
    assert len(answer) == 1  # the stop's own response holds nothing
    ids = answer[0].as_numpy("output_ids").tolist()
    assert 8 <= len(ids) < LONG
    assert ids == reference([PROMPTS[2]], len(ids))[0]  # the answer so far, token for token
    assert answer[0].as_numpy("text_output")[0].decode() == reference.loaded.decode(ids)
    assert _deltas(before, _settled(deployment.http_url, before)) == (1, 1, 0)
