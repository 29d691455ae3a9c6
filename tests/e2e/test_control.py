"""The control plane through the real Triton model: plans reach the agent inside the llm model and
change the k requests see; the service can die mid-load without failing a request; its API is
fuzzed with the data plane attached; writes need the token."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import tritonclient.grpc.aio as aio

from control.clients.triton import GenParams, grpc_generate, model_stats, stream_generate
from tests.e2e.conftest import AUTH
from tests.e2e.prompts import PROMPTS, many

pytestmark = pytest.mark.e2e


def test_a_published_plan_reaches_the_agent_within_1s_and_changes_k(deployment, policy):
    # Under fixed:3 every decode step drafts up to 3 tokens; under none, nothing is drafted.
    assert policy("fixed:3") < 1.0
    spec = grpc_generate(deployment.grpc_url, PROMPTS[0], GenParams(max_tokens=30))
    st = model_stats(deployment.http_url)
    assert st["agent"]["policy"] == "fixed:3" and st["agent"]["plan_source"] == "service"
    assert spec.drafted > 0
    steps_with_drafts = len(spec.chunk_times) - 1  # the first response is the prefill's token
    assert spec.drafted <= 3 * steps_with_drafts
    assert max(st["last_k"]) <= 3
    assert policy("none") < 1.0
    plain = grpc_generate(deployment.grpc_url, PROMPTS[0], GenParams(max_tokens=30))
    assert plain.drafted == 0
    assert plain.token_ids == spec.token_ids  # lossless either way
    assert model_stats(deployment.http_url)["agent"]["policy"] == "none"
    # the deployment left --overlap-policy at auto: the quick pair's short passes keep the policy inline
    assert deployment.cfg.overlap_policy is None and deployment.overlap_policy is False
    assert st["overlap_policy"] is False


def test_per_request_num_draft_tokens_caps_k(deployment, policy):
    policy("fixed:3")
    capped = grpc_generate(deployment.grpc_url, PROMPTS[1], GenParams(max_tokens=30, num_draft_tokens=1))
    assert 0 < capped.drafted <= len(capped.chunk_times) - 1
    off = grpc_generate(deployment.grpc_url, PROMPTS[1], GenParams(max_tokens=30, policy="none"))
    assert off.drafted == 0 and off.token_ids == capped.token_ids


def test_overrides_without_the_token_get_401(deployment):
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
        r = httpx.put(f"{deployment.control_url}/v1/overrides", json={"policy": "none"}, headers=headers, timeout=5)
        assert r.status_code == 401
    assert httpx.get(f"{deployment.control_url}/v1/overrides", timeout=5).json().get("policy") is None


@pytest.mark.slow
def test_service_api_fuzzed_with_the_data_plane_attached_never_5xx(deployment):
    from tests.service.test_fuzz import _fuzz

    try:
        problems, seen = _fuzz(deployment.control_url, AUTH, examples=8)
        assert not problems, "\n".join(problems[:10])
        problems, _ = _fuzz(deployment.control_url, {}, examples=3)
        assert not problems, "\n".join(problems[:10])
    finally:
        httpx.put(f"{deployment.control_url}/v1/overrides", json={}, headers=AUTH, timeout=5).raise_for_status()
    assert httpx.get(f"{deployment.control_url}/healthz", timeout=5).status_code == 200
    assert grpc_generate(deployment.grpc_url, PROMPTS[0], GenParams(max_tokens=8)).token_ids


@pytest.mark.slow
def test_killing_the_service_mid_load_fails_no_request_and_the_agent_resubscribes(deployment, reference):
    prompts = many(24)
    want = reference(prompts, 60)
    before = model_stats(deployment.http_url)
    subs_before = before["agent"]["subscriptions"]

    async def load():
        client = aio.InferenceServerClient(deployment.grpc_url)

        async def one(i: int, p: str):
            await asyncio.sleep(0.15 * i)  # arrivals spread over ~3.5 s
            return await stream_generate(client, p, GenParams(max_tokens=60))

        async def chaos():
            await asyncio.sleep(0.8)
            deployment.kill_service()  # SIGKILL: no goodbye to the agent
            await asyncio.sleep(1.5)
            deployment.start_service()

        try:
            res = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)), chaos())
        finally:
            await client.close()
        return res[:-1]

    results = asyncio.run(asyncio.wait_for(load(), 180))
    assert [r.error for r in results] == [None] * len(prompts)
    assert [r.token_ids for r in results] == want
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        agent = model_stats(deployment.http_url)["agent"]
        if agent["connected"] and agent["subscriptions"] > subs_before:
            break
        time.sleep(0.1)
    assert agent["connected"] and agent["subscriptions"] > subs_before, agent
    st = model_stats(deployment.http_url)
    assert st["failed"] == before["failed"] and st["kv_slots_in_use"] == 0
