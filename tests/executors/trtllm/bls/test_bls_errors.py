"""Bad requests get a clear Triton error while the server keeps serving; an engine failure ends only
the request it belongs to; client cancellation frees the request's place in the batch."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.executors.trtllm.bls.client import Generation, Stream, generate, http_post, inputs
from tests.executors.trtllm.bls.engines import greedy


def _raw(url: str, model: str, ins: list[grpcclient.InferInput]) -> str | None:
    """Send hand-made inputs on a stream of their own; the error text, or None if it succeeded."""
    s = Stream(url)
    try:
        s.results["x"] = Generation()
        s.client.async_stream_infer(model, ins, request_id="x", enable_empty_final_response=True)
        s.wait(1, timeout=30)
        return s.errors[0] if s.errors else None
    finally:
        s.close()


def _tensor(name: str, value, dtype: str) -> grpcclient.InferInput:
    a = np.asarray(value, dtype={"INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "BOOL": bool}[dtype])
    t = grpcclient.InferInput(name, list(a.shape), dtype)
    t.set_data_from_numpy(a)
    return t


PROMPT = [5, 9, 3, 17, 22]


@pytest.mark.parametrize(("ins", "says"), [
    pytest.param([_tensor("max_tokens", [8], "INT32")], "input_ids", id="missing-input_ids"),
    pytest.param([_tensor("input_ids", PROMPT, "INT32")], "max_tokens", id="missing-max_tokens"),
    pytest.param(inputs(PROMPT, 0), "max_tokens = 0: send an integer >= 1", id="max_tokens-0"),
    pytest.param(inputs(PROMPT, -3), "max_tokens = -3", id="max_tokens-negative"),
    pytest.param(inputs(PROMPT, 8, ids_dtype="INT64"), "'input_ids' data-type is 'INT64', but model 'specctl_bls' "
                 "expects 'INT32'", id="input_ids-int64"),
    pytest.param(inputs(PROMPT, 8, ids_dtype="FP32"), "'input_ids' data-type is 'FP32'", id="input_ids-fp32"),
    pytest.param([_tensor("input_ids", PROMPT, "INT32"), _tensor("max_tokens", [8.0], "FP32")], "max_tokens",
                 id="max_tokens-fp32"),
    pytest.param([_tensor("input_ids", [PROMPT], "INT32"), _tensor("max_tokens", [8], "INT32")], "input_ids",
                 id="input_ids-2d"),
    pytest.param(inputs([], 8), "input_ids is empty", id="input_ids-empty"),
    pytest.param(inputs([4, -1, 7], 8), "input_ids holds -1", id="negative-token"),
    pytest.param(inputs(PROMPT, 8, num_draft_tokens=9), "num_draft_tokens 9 must be in 0..4", id="k-over-max"),
    pytest.param(inputs(PROMPT, 8, num_draft_tokens=-1), "num_draft_tokens -1", id="k-negative"),
    pytest.param(inputs([3, 5000, 8], 8), "token id 5000, outside the vocabulary", id="token-outside-vocab"),
])
def test_bad_request_gets_a_clear_error_and_the_server_keeps_serving(triton, target, ins, says):
    err = _raw(triton.grpc_url, "specctl_bls", ins)
    assert err is not None and says in err, err
    assert "\n" not in err.strip()
    ok = generate(triton.grpc_url, "specctl_bls", PROMPT, 6)
    assert ok.error is None and ok.tokens == greedy(target, PROMPT, 6)


def test_an_engine_failure_ends_only_its_request(triton, target, tokenizer):
    """A request the engines reject (token outside the vocabulary) shares steps with good ones."""
    good = [tokenizer.encode(t).ids for t in ("speculative decoding", "batch sizes", "the target")]
    s = Stream(triton.grpc_url)
    try:
        gens = [s.send("specctl_bls", str(i), p, 25) for i, p in enumerate(good)]
        bad = generate(triton.grpc_url, "specctl_bls", [3, 4, 4000], 25)
        s.wait(len(good))
        assert not s.errors, s.errors
    finally:
        s.close()
    assert bad.error is not None and "outside the vocabulary" in bad.error and "tensorrt_llm" in bad.error
    for p, g in zip(good, gens, strict=True):
        assert g.tokens == greedy(target, p, 25)


def test_http_bad_requests_get_400_with_the_reason(triton):
    url = f"{triton.http_url}/v2/models/specctl_bls/generate"
    code, body = http_post(url, {"input_ids": PROMPT, "max_tokens": 0, "stream": False})
    assert code == 400 and "max_tokens = 0" in json.loads(body)["error"], body
    code, body = http_post(url, {"max_tokens": 4, "stream": False})
    assert code == 400 and "input_ids" in json.loads(body)["error"], body
    # Triton's own JSON parsing answers this one (500, its message); the server goes on serving.
    code, body = http_post(url, {"input_ids": "not tokens", "max_tokens": 4, "stream": False})
    assert code >= 400 and "Unable to parse" in json.loads(body)["error"], body
    code, body = http_post(url, {"input_ids": PROMPT, "max_tokens": 3, "stream": False})
    assert code == 200, body


def _target_inferences(url: str) -> int:
    c = grpcclient.InferenceServerClient(url)
    try:
        return int(c.get_inference_statistics(model_name="tensorrt_llm").model_stats[0].inference_count)
    finally:
        c.close()


def test_client_cancellation_frees_the_request(triton, target, tokenizer):
    """specctl_bls_fixed holds at most 2 requests: after its two long streams are cancelled, new
    requests get in, and the target stops working for the cancelled ones."""
    long_prompts = [tokenizer.encode(t).ids for t in ("the controller chooses", "drafting costs more")]
    n_long = 3000  # at most 4 tokens a step (fixed:3): >= 750 target calls each if cancellation were ignored
    streams = [Stream(triton.grpc_url) for _ in long_prompts]
    gens = [s.send("specctl_bls_fixed", "long", p, n_long) for s, p in zip(streams, long_prompts, strict=True)]
    deadline = time.monotonic() + 30
    while not all(len(g.chunks) >= 2 for g in gens):
        assert time.monotonic() < deadline, "the long requests did not start streaming"
        time.sleep(0.005)
    full = generate(triton.grpc_url, "specctl_bls_fixed", PROMPT, 4)
    assert full.error is not None and "max_batch" in full.error  # both places are taken
    before = _target_inferences(triton.grpc_url)
    for s in streams:
        s.close(cancel=True)
    # The places come free within a few cancellation checks (50 ms each), not after 3000 tokens.
    start = time.monotonic()
    while True:
        got = generate(triton.grpc_url, "specctl_bls_fixed", PROMPT, 6)
        if got.error is None:
            break
        assert "max_batch" in got.error, got.error
        assert time.monotonic() - start < 30, "cancelled requests still hold their places"
        time.sleep(0.05)
    assert got.tokens == greedy(target, PROMPT, 6)
    used = _target_inferences(triton.grpc_url) - before
    assert used < 300, f"the target served {used} calls after the cancellation"
    # Nothing keeps calling the target for the cancelled requests.
    settled = _target_inferences(triton.grpc_url)
    time.sleep(0.3)
    assert _target_inferences(triton.grpc_url) == settled


@pytest.fixture(autouse=True)
def _server_alive(triton):
    yield
    assert triton.alive(), f"tritonserver died: {triton.log_tail()}"
