"""Many OpenAI streams at once through the front end, and clients that go away mid-stream."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from control.clients.triton import model_stats
from tests.e2e.prompts import many

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
N = 20


def test_concurrent_streams_equal_solo_greedy(frontend, reference, policy):
    import openai

    policy("fixed:3")
    prompts = many(16)

    async def one(client, prompt):
        s = await client.completions.create(model="llm", prompt=prompt, max_tokens=N, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
        text, usage = "", None
        async for c in s:
            text += "".join(ch.text for ch in c.choices)
            usage = c.usage or usage
        return text, usage.completion_tokens

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(client, p) for p in prompts))
        finally:
            await client.close()

    got = asyncio.run(run())
    want = reference(prompts, N)
    assert [t for t, _ in got] == [reference.loaded.decode(ids) for ids in want]
    assert [n for _, n in got] == [len(ids) for ids in want]


def _settled(deployment, within_s: float = 10.0) -> dict:
    """The model's stats once no request is active and no KV slot held (asserted within ``within_s``)."""
    deadline = time.monotonic() + within_s
    while True:
        s = model_stats(deployment.http_url)
        if (s["active_requests"], s["kv_slots_in_use"]) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (s["active_requests"], s["kv_slots_in_use"]) == (0, 0), s
    return s


def test_client_leaving_mid_stream_frees_the_request(frontend, deployment):
    body = {"model": "llm", "prompt": "def main():\n", "max_tokens": 900, "temperature": 0, "stream": True}
    before = model_stats(deployment.http_url)
    for _ in range(3):
        with httpx.stream("POST", f"{frontend.url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
        # the connection is closed here, long before 900 tokens
    s = _settled(deployment)
    # cancelled on the server, not run to the end: 900 tokens would take seconds longer; by a stop
    # request with the request's id, not by cancelling the gRPC stream (control/frontend/backend.py)
    assert (s["cancelled"] - before["cancelled"], s["completed"] - before["completed"]) == (3, 0), s
    assert s["stopped"] - before["stopped"] == 3, s


def _post_and_leave(frontend, deployment, path: str, body: dict) -> None:
    """POST ``body`` and close the connection, unread, once the model has the request: however slow the
    machine, the client leaves while the answer is being generated."""
    host, port = frontend.url.removeprefix("http://").rsplit(":", 1)
    data = json.dumps(body).encode()
    head = (f"POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode()
    before = model_stats(deployment.http_url)["requests"]
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(head + data)
        deadline = time.monotonic() + 30
        while model_stats(deployment.http_url)["requests"] == before:
            assert time.monotonic() < deadline, "the request did not reach the model within 30 s"
            time.sleep(0.02)


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_client_leaving_before_a_whole_answer_frees_the_request(frontend, deployment, route):
    body = {"model": "llm", "max_tokens": 900, "temperature": 0}
    body |= {"prompt": "def main():\n"} if route == "completions" else {"messages": [{"role": "user", "content": "hi"}]}
    before = model_stats(deployment.http_url)
    for _ in range(2):
        _post_and_leave(frontend, deployment, f"v1/{route}", body)  # long before 900 tokens
    s = _settled(deployment)
    assert (s["cancelled"] - before["cancelled"], s["completed"] - before["completed"]) == (2, 0), s
    assert s["stopped"] - before["stopped"] == 2, s  # (by a stop request)
    # the front end still answers whole requests, and a client that gives up is still one that left
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{frontend.url}/v1/{route}", json=body, timeout=httpx.Timeout(60, read=0.5))
    r = httpx.post(f"{frontend.url}/v1/{route}", json=body | {"max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert _settled(deployment)["completed"] - before["completed"] == 1


@pytest.mark.parametrize("model", ["llm", "ensemble"])
def test_kserve_generate_client_leaving_before_its_answer_has_the_request_stopped(frontend, deployment, model):
    """A non-streamed KServe generate carries no request id (Triton 2.51's HTTP), so the proxy gives
    it a stop id and, when its client leaves, stops it by that id over gRPC; through the ensemble's
    forwarding too (its rows reach llm under the same id)."""
    body = {"text_input": "def main():\n", "max_tokens": 900}
    before = model_stats(deployment.http_url)
    for _ in range(2):
        _post_and_leave(frontend, deployment, f"v2/models/{model}/generate", body)  # long before 900 tokens
    s = _settled(deployment)
    assert (s["cancelled"] - before["cancelled"], s["completed"] - before["completed"]) == (2, 0), s
    assert s["stopped"] - before["stopped"] == 2, s
    assert s["generated"] - before["generated"] < 2 * 900 // 2, s  # ended early, not run out unread
    r = httpx.post(f"{frontend.url}/v2/models/{model}/generate", json=body | {"max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["text_output"], r.text  # a client that stays gets its answer
    r = httpx.post(f"{frontend.url}/v2/models/{model}/generate", json={"stop": True}, timeout=10)
    assert r.status_code == 400 and "stop = true needs the id of the request to stop" in r.text, r.text


def test_kserve_stream_client_leaving_through_the_front_end_frees_the_request(frontend, deployment):
    """The KServe proxy passes a departed client on: Triton's HTTP frontend cancels the request when
    the proxy closes its upstream stream, and the model ends it (not a stop: HTTP carries no id)."""
    body = {"text_input": "def main():\n", "max_tokens": 900, "stream": True}
    before = model_stats(deployment.http_url)
    for _ in range(3):
        with httpx.stream("POST", f"{frontend.url}/v2/models/llm/generate_stream", json=body, timeout=60) as r:
            assert r.status_code == 200
            assert next(line for line in r.iter_lines() if line.startswith("data:"))
    s = _settled(deployment)
    assert (s["cancelled"] - before["cancelled"], s["completed"] - before["completed"]) == (3, 0), s
    assert s["generated"] - before["generated"] < 3 * 900 // 2, s  # ended early, not run out unread
