"""The simulator served by the same ``llm`` model as the reference engine and TensorRT-LLM (``executor:
sim``), through a real Triton server: streamed synthetic tokens, concurrency, stats, refused input."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import tritonclient.grpc.aio as aio
import yaml

from control.clients.triton import GenParams, RequestError, grpc_generate, model_stats, stream_generate
from control.executors.sim.executor import synthetic_tokens
from control.triton.repo import render_llm_model
from control.triton.server import TritonServer, free_server_ports
from control.triton.sim_host import SIM_VOCAB, decode_synthetic
from tests.conftest import make_profile

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("sim-host")
    profile = work / "profile.yaml"
    profile.write_text(yaml.safe_dump(make_profile().to_dict()))
    params = {"executor": "sim", "profile": profile, "policy": "fixed:3", "max_k": 4, "max_batch": 4,
              "sim_requests": 64}
    repo = render_llm_model(work / "repo", params)
    srv = TritonServer(repo, work / "run", **free_server_ports(), pythonpath=[str(ROOT)],
                       extra_args=["--exit-timeout-secs=5"])
    srv.start(timeout_s=240)
    try:
        yield srv
    finally:
        srv.stop()


def test_the_simulator_streams_through_the_llm_model(sim_server):
    first = grpc_generate(sim_server.grpc_url, "hello", GenParams(max_tokens=9))
    want = list(synthetic_tokens(0, 0, 9, SIM_VOCAB))  # the model's first request has id 0
    assert first.token_ids == want and first.text == decode_synthetic(want)
    assert len(first.chunk_times) >= 2 and first.drafted > 0 and 0 <= first.accepted <= first.drafted

    async def run():
        client = aio.InferenceServerClient(sim_server.grpc_url)
        try:
            return await asyncio.gather(*(stream_generate(client, f"prompt {i}", GenParams(max_tokens=6 + i))
                                          for i in range(4)))
        finally:
            await client.close()

    results = asyncio.run(asyncio.wait_for(run(), 60))
    rids = set()
    for i, r in enumerate(results):
        assert r.error is None and len(r.token_ids) == 6 + i
        rid = next(j for j in range(1, 5) if list(synthetic_tokens(j, 0, 6 + i, SIM_VOCAB)) == r.token_ids)
        rids.add(rid)
    assert rids == {1, 2, 3, 4}
    st = model_stats(sim_server.http_url)
    assert st["executor"] == "sim" and st["capabilities"]["virtual_clock"] and st["capabilities"]["name"] == "sim"
    assert st["capabilities"]["k_scope"] == "per_request" and st["policy"] == "fixed:3"
    assert st["completed"] == 5 and st["active_requests"] == 0 and st["virtual_clock_s"] > 0
    assert st["drafted"] >= first.drafted and st["steps"] > 0


def test_bad_input_is_refused_and_the_model_keeps_serving(sim_server):
    with pytest.raises(RequestError, match=f"token ids must be 0..{SIM_VOCAB - 1}"):
        grpc_generate(sim_server.grpc_url, [5, SIM_VOCAB], GenParams(max_tokens=4))
    assert len(grpc_generate(sim_server.grpc_url, [5, 6], GenParams(max_tokens=4)).token_ids) == 4
