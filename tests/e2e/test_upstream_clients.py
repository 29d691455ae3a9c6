"""Requests shaped as tensorrtllm_backend's clients send them (``end_to_end_grpc_client.py``: batched
``[1, 1]`` tensors, ``[1, N]`` stop words, the default extra inputs, model ``ensemble`` or
``tensorrt_llm_bls``) get the same answers as our ``llm`` model's ``[1]``-shaped requests."""

from __future__ import annotations

import queue

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from control.clients.triton import GenParams, grpc_generate
from tests.e2e.prompts import PROMPTS

pytestmark = pytest.mark.e2e

ALIASES = ("ensemble", "tensorrt_llm_bls")
PERF = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
        "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "acceptance_rate",
        "total_accepted_draft_tokens", "total_draft_tokens")


def upstream_inputs(prompts: list[str], max_tokens: int, *, stream: bool, exclude_input: bool = False,
                    beam_width: int = 1, stop_words: list[str] | None = None, perf: bool = False, pad_id: int | None = 2):
    """The tensors upstream's client builds: every value as a [B, 1] array (stop words [B, N])."""
    b = len(prompts)
    arrays = {"text_input": np.array([[p] for p in prompts], dtype=object),
              "max_tokens": np.full((b, 1), max_tokens, dtype=np.int32),
              "stream": np.full((b, 1), stream, dtype=bool),
              "beam_width": np.full((b, 1), beam_width, dtype=np.int32),
              "temperature": np.zeros((b, 1), dtype=np.float32),  # greedy, to compare with the reference
              "exclude_input_in_output": np.full((b, 1), exclude_input, dtype=bool)}
    if pad_id is not None:
        arrays["pad_id"] = np.full((b, 1), pad_id, dtype=np.int32)
    if stop_words:
        arrays["stop_words"] = np.array([stop_words] * b, dtype=object)
    if perf:
        arrays["return_perf_metrics"] = np.ones((b, 1), dtype=bool)
    tensors = []
    for name, a in arrays.items():
        t = grpcclient.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        t.set_data_from_numpy(a)
        tensors.append(t)
    return tensors


def run_stream(url: str, model: str, inputs, outputs: list[str]) -> list:
    """What upstream's client does: open a stream, send, close it (waits for the final response)."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put(error or result))
    client.async_stream_infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
    client.stop_stream()
    client.close()
    return [got.get_nowait() for _ in range(got.qsize())]


def texts_by_row(results, batch: int) -> list[str]:
    out = [""] * batch
    for r in results:
        assert not isinstance(r, InferenceServerException), r
        b = 0 if r.as_numpy("batch_index") is None else int(r.as_numpy("batch_index")[0][0])
        out[b] += r.as_numpy("text_output")[0].decode()
    return out


@pytest.mark.parametrize("model", ALIASES)
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_request_equals_llm_output(deployment, model, stream):
    prompt = PROMPTS[0]
    ours = grpc_generate(deployment.grpc_url, prompt, GenParams(max_tokens=12))
    res = run_stream(deployment.grpc_url, model, upstream_inputs([prompt], 12, stream=stream, exclude_input=False),
                     ["text_output"])
    text = texts_by_row(res, 1)[0]
    # Upstream's default output repeats the prompt unless streaming or exclude_input_in_output is set.
    assert text == (ours.text if stream else prompt + ours.text)
    if stream:
        assert len(res) > 1  # it streamed


def test_exclude_input_in_output_and_stop_words(deployment):
    prompt = PROMPTS[3]
    full = grpc_generate(deployment.grpc_url, prompt, GenParams(max_tokens=16)).text
    res = run_stream(deployment.grpc_url, "ensemble", upstream_inputs([prompt], 16, stream=False, exclude_input=True),
                     ["text_output"])
    assert texts_by_row(res, 1)[0] == full
    word = full[3:6]
    stopped = run_stream(deployment.grpc_url, "ensemble",
                         upstream_inputs([prompt], 16, stream=False, exclude_input=True, stop_words=[word, "zzqq"]),
                         ["text_output"])
    text = texts_by_row(stopped, 1)[0]
    assert word in text and len(text) < len(full) and full.startswith(text)


def test_batched_inputs_come_back_by_batch_index(deployment):
    prompts = [PROMPTS[1], PROMPTS[2]]
    want = [grpc_generate(deployment.grpc_url, p, GenParams(max_tokens=8)).text for p in prompts]
    res = run_stream(deployment.grpc_url, "tensorrt_llm_bls",
                     upstream_inputs(prompts, 8, stream=True, exclude_input=True), ["text_output", "batch_index"])
    assert texts_by_row(res, 2) == want


def test_perf_metrics_and_draft_counts_under_upstream_names(deployment):
    res = run_stream(deployment.grpc_url, "ensemble", upstream_inputs([PROMPTS[4]], 16, stream=False, perf=True),
                     ["text_output", *PERF])
    (r,) = res
    v = {n: int(r.as_numpy(n)[0][0]) if n != "acceptance_rate" else float(r.as_numpy(n)[0][0]) for n in PERF}
    assert v["arrival_time_ns"] <= v["first_token_time_ns"] <= v["last_token_time_ns"]
    assert 0 <= v["total_accepted_draft_tokens"] <= v["total_draft_tokens"]
    if v["total_draft_tokens"]:
        assert v["acceptance_rate"] == pytest.approx(v["total_accepted_draft_tokens"] / v["total_draft_tokens"], 1e-5)


def test_beam_width_above_one_is_refused_by_name(deployment):
    (err,) = run_stream(deployment.grpc_url, "ensemble", upstream_inputs([PROMPTS[0]], 4, stream=False, beam_width=2),
                        ["text_output"])
    assert isinstance(err, InferenceServerException) and "beam_width = 2" in str(err)


def test_docs_curl_body_to_ensemble_generate(deployment):
    body = {"text_input": PROMPTS[5], "max_tokens": 10, "bad_words": "", "stop_words": ""}
    r = httpx.post(f"{deployment.http_url}/v2/models/ensemble/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    ours = grpc_generate(deployment.grpc_url, PROMPTS[5], GenParams(max_tokens=10))
    assert r.json()["text_output"] == ours.text and r.json()["output_ids"] == ours.token_ids


def test_generate_stream_on_an_alias_streams_every_token(deployment):
    import json

    ours = grpc_generate(deployment.grpc_url, PROMPTS[7], GenParams(max_tokens=10))
    body = {"text_input": PROMPTS[7], "max_tokens": 10, "stream": True}
    events = []
    with httpx.stream("POST", f"{deployment.http_url}/v2/models/tensorrt_llm_bls/generate_stream", json=body,
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert all("error" not in e for e in events), events
    assert "".join(e["text_output"] for e in events) == ours.text
    ids = [i for e in events for i in (e["output_ids"] if isinstance(e["output_ids"], list) else [e["output_ids"]])]
    assert ids == ours.token_ids and len(events) > 1  # streamed, every token once
