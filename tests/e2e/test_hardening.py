"""Hardening through the real deployment: the control-plane token stays out of what Triton shows, and
policies the deployment cannot run are refused before they reach the model."""

from __future__ import annotations

import json
import stat
import time

import httpx
import pytest
import tritonclient.grpc as grpcclient

from control.clients.triton import GenParams, grpc_generate, model_stats
from tests.e2e.conftest import AUTH, MAX_BATCH, TOKEN
from tests.e2e.prompts import PROMPTS

pytestmark = pytest.mark.e2e


def test_the_model_config_never_shows_the_control_token(deployment):
    http_cfg = httpx.get(f"{deployment.http_url}/v2/models/llm/config", timeout=10)
    assert http_cfg.status_code == 200
    client = grpcclient.InferenceServerClient(deployment.grpc_url)
    try:
        grpc_cfg = client.get_model_config("llm", as_json=True)
    finally:
        client.close()
    for text in (http_cfg.text, json.dumps(grpc_cfg)):
        assert TOKEN not in text
        assert "control_token_file" in text  # the config names the file, not its content
    token_file = deployment.run_dir / "control-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.read_text().strip() == TOKEN
    # The model read the token from the file: the service accepts its telemetry (a window closes on
    # the first step a second after it opened, so requests keep coming until one is sent).
    sent0 = model_stats(deployment.http_url)["agent"]["telemetry_sent"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        grpc_generate(deployment.grpc_url, PROMPTS[0], GenParams(max_tokens=8))
        agent = model_stats(deployment.http_url)["agent"]
        if agent["telemetry_sent"] > sent0:
            break
        time.sleep(0.3)
    assert agent["telemetry_sent"] > sent0 and agent["telemetry_rejected"] == 0, json.dumps(agent)


def test_an_override_beyond_the_deployment_s_max_batch_is_refused_and_serving_goes_on(deployment):
    c = httpx.Client(base_url=deployment.control_url, timeout=10, headers=AUTH)
    overrides0 = c.get("/v1/status").json()["replans"].get("override", 0)
    for policy in ("static-schedule:maxconc=99999999999999999999", f"static-schedule:maxconc={MAX_BATCH + 1}",
                   f"static-schedule:1=4,{MAX_BATCH * 2}=1"):
        r = c.put("/v1/overrides", json={"policy": policy})
        assert r.status_code == 422, r.text
        assert "maxconc" in r.json()["detail"] or "batch size" in r.json()["detail"]
    # Nothing was published for them (the service may still replan from telemetry meanwhile).
    assert c.get("/v1/status").json()["replans"].get("override", 0) == overrides0
    assert c.get("/v1/overrides").json()["policy"] is None
    t0 = time.monotonic()
    out = grpc_generate(deployment.grpc_url, PROMPTS[1], GenParams(max_tokens=16))
    assert out.error is None and len(out.token_ids) == 16 and time.monotonic() - t0 < 30


def test_seeded_sampling_is_reproducible_with_speculation_under_load(deployment, policy):
    import asyncio

    import tritonclient.grpc.aio as aio

    from control.clients.triton import stream_generate
    from tests.e2e.prompts import many

    def seeded(seed: int, spec: str | None) -> GenParams:
        return GenParams(max_tokens=24, temperature=0.9, top_p=0.95, random_seed=seed, policy=spec)

    seeds = list(range(12))
    prompts = many(len(seeds))
    solo = [grpc_generate(deployment.grpc_url, p, seeded(s, "none")).token_ids for p, s in zip(prompts, seeds, strict=True)]
    policy("fixed:3")

    async def load():
        client = aio.InferenceServerClient(deployment.grpc_url)
        try:
            noise = [stream_generate(client, p, GenParams(max_tokens=32)) for p in many(12)]
            mine = [stream_generate(client, p, seeded(s, None)) for p, s in zip(prompts, seeds, strict=True)]
            return await asyncio.gather(*mine, *noise)
        finally:
            await client.close()

    res = asyncio.run(asyncio.wait_for(load(), 120))[: len(seeds)]
    assert [r.error for r in res] == [None] * len(seeds)
    assert sum(r.drafted for r in res) > 0  # speculation ran on the seeded requests
    same = sum(r.token_ids == want for r, want in zip(res, solo, strict=True))
    assert same == len(seeds), f"{same} of {len(seeds)} seeded requests matched their solo run"
