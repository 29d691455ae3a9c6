"""Every bad request gets a Triton error naming the value and what is accepted; the server keeps serving."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import tritonclient.grpc as g
import tritonclient.grpc.aio as aio

from control.clients.triton import GenParams, grpc_generate, model_stats
from tests.e2e.conftest import MAX_TOKENS_LIMIT
from tests.e2e.prompts import PROMPTS

pytestmark = pytest.mark.e2e

LONG = "def f(x):\n    return x\n" * 400  # far more tokens than the quick target's 1024 positions

BAD = [
    ({"max_tokens": 5}, "text_input is missing"),
    ({"text_input": "", "max_tokens": 5}, "text_input is empty"),
    ({"text_input": "x", "max_tokens": 0}, "max_tokens = 0: must be >= 1"),
    ({"text_input": "x", "max_tokens": -3}, "max_tokens = -3: must be >= 1"),
    ({"text_input": "x", "max_tokens": MAX_TOKENS_LIMIT + 1}, f"must be 1..{MAX_TOKENS_LIMIT} on this deployment"),
    ({"text_input": "x", "max_tokens": 5, "policy": "bogus"}, "bogus"),
    ({"text_input": "x", "max_tokens": 5, "policy": "fixed:2"}, "switch the deployment's policy with PUT /v1/overrides"),
    ({"text_input": LONG, "max_tokens": 5}, "exceeds the engine's max sequence length"),
    ({"text_input": "x", "max_tokens": 5, "top_p": 0.0}, "top_p"),
    ({"text_input": "x", "max_tokens": 5, "temperature": -1.0}, "temperature"),
    ({"text_input": "x", "max_tokens": 5, "top_k": -1}, "top_k"),
    ({"text_input": "x", "max_tokens": 5, "num_draft_tokens": -1}, "num_draft_tokens"),
    ({"text_input": "x", "max_tokens": 5, "end_id": 10**6}, "end_id"),
]


@pytest.mark.parametrize(("body", "message"), BAD, ids=[m[:30] for _, m in BAD])
def test_bad_http_request_is_rejected_with_its_message(deployment, body, message):
    r = httpx.post(f"{deployment.http_url}/v2/models/llm/generate", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]


def test_a_whitespace_prompt_is_text(deployment):
    """Found with the openai client: "\n\n\n" was refused as an empty prompt; it is three tokens."""
    r = httpx.post(f"{deployment.http_url}/v2/models/llm/generate", json={"text_input": "\n\n\n", "max_tokens": 3},
                   timeout=30)
    assert r.status_code == 200, r.text


def test_wrong_json_type_is_refused_by_triton_and_the_model_keeps_serving(deployment):
    # Triton's HTTP frontend parses the JSON against the config's dtypes before the model sees it,
    # and answers 500 (its choice, not ours) with its own one-line message.
    r = httpx.post(f"{deployment.http_url}/v2/models/llm/generate", json={"text_input": "x", "max_tokens": "five"},
                   timeout=30)
    assert r.status_code in (400, 500) and "Unable to parse" in r.json()["error"]
    assert grpc_generate(deployment.grpc_url, PROMPTS[2], GenParams(max_tokens=4)).token_ids


def test_wrong_dtype_over_grpc_is_rejected_and_others_keep_being_served(deployment):
    async def bad():
        client = aio.InferenceServerClient(deployment.grpc_url)
        t = g.InferInput("text_input", [1], "BYTES")
        t.set_data_from_numpy(np.array([b"x"], dtype=object))
        m = g.InferInput("max_tokens", [1], "FP32")
        m.set_data_from_numpy(np.array([5.0], dtype=np.float32))

        async def one():
            yield {"model_name": "llm", "inputs": [t, m]}

        try:
            async for _res, err in client.stream_infer(one()):
                return err
        finally:
            await client.close()

    before = model_stats(deployment.http_url)
    err = asyncio.run(asyncio.wait_for(bad(), 30))
    assert err is not None and "max_tokens" in str(err) and "expects 'INT32'" in str(err)
    # Good requests (and a bad one in between) still succeed; nothing leaked a KV slot.
    assert grpc_generate(deployment.grpc_url, PROMPTS[0], GenParams(max_tokens=8)).token_ids
    r = httpx.post(f"{deployment.http_url}/v2/models/llm/generate", json={"text_input": ""}, timeout=30)
    assert r.status_code == 400
    assert grpc_generate(deployment.grpc_url, PROMPTS[1], GenParams(max_tokens=8)).token_ids
    after = model_stats(deployment.http_url)
    assert after["kv_slots_in_use"] == 0 and after["failed"] == before["failed"]  # bad input fails no running request
    assert after["rejected"] == before["rejected"] + 1
    assert httpx.get(f"{deployment.http_url}/v2/health/ready", timeout=5).status_code == 200
