"""Issue 19's bad-input sweep on the paths users reach: HTTP through the front end (KServe generate for
``llm`` and both aliases, OpenAI completions and chat) and gRPC through tritonclient. Every case gets
a 4xx (gRPC: an error) naming the field; none gets a 5xx, an internal error or a server path; the
server serves on afterwards."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from control.clients.triton import GenParams, grpc_generate
from control.triton.llm_request import INPUTS, LIST_INPUTS
from tests.e2e.test_bad_requests import LONG
from tests.e2e.test_strict_requests import GENERATED, GRPC_BAD, HTTP_BAD, JSON_LAYER, grpc_stream_errors

pytestmark = pytest.mark.e2e

ISSUE_HTTP_GRPC_CASES = 212
X = {"text_input": "def f(", "max_tokens": 4}
# (generate body, the field its error must name), beyond tests/e2e/test_strict_requests.py's lists.
MORE_GENERATE = [
    ({"text_input": "", "max_tokens": 5}, "text_input"),
    ({"text_input": None}, "text_input"),
    ({"text_input": ["a", "b"]}, "text_input"),
    ({"text_input": 5}, "text_input"),
    ({"text_input": "x", "max_tokens": -3}, "max_tokens"),
    ({"text_input": "x", "max_tokens": 1.5}, "max_tokens"),
    ({"text_input": "x", "max_tokens": True}, "max_tokens"),
    ({"text_input": LONG, "max_tokens": 5}, "max_tokens"),
    ({**X, "policy": "bogus"}, "policy"),
    ({**X, "policy": "fixed:2"}, "policy"),
    ({**X, "policy": 3}, "policy"),
    ({**X, "top_p": 0.0}, "top_p"),
    ({**X, "top_p": "1"}, "top_p"),
    ({**X, "end_id": 10**6}, "end_id"),
    ({**X, "random_seed": 2**64}, "random_seed"),
    ({**X, "random_seed": 1.5}, "random_seed"),
    ({**X, "temperature": 1e39}, "temperature"),  # finite in JSON, infinite as FP32
    ({**X, "temperature": None}, "temperature"),
    ({**X, "top_k": 2**40}, "top_k"),
    ({**X, "num_draft_tokens": 99_999_999_999}, "num_draft_tokens"),
    ({**X, "stop_words": [1, 2]}, "stop_words[0]"),
    ({**X, "bad_words": "w" * 5000}, "bad_words"),
    ({**X, "exclude_input_in_output": 1}, "exclude_input_in_output"),
    ({**X, "return_perf_metrics": "true"}, "return_perf_metrics"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": "1 2 3"}, "input_ids"),
    ({"input_ids": [1.5]}, "input_ids[0]"),
    ({"input_ids": [1, None]}, "input_ids[1]"),
    ({"input_ids": [10**6]}, "input_ids[0]"),
    ({"stats": "yes"}, "stats"),
]
GENERATE_CASES = HTTP_BAD + JSON_LAYER + MORE_GENERATE
MODELS = ("llm", "ensemble", "tensorrt_llm_bls")

COMPLETION = {"model": "llm", "prompt": "def f(", "max_tokens": 4}
CHAT = {"model": "llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
_SAMPLING = [  # (field, bad value) for both OpenAI routes
    ("max_tokens", "8"), ("max_tokens", -1), ("max_tokens", 0), ("max_tokens", True), ("max_tokens", 1.5),
    ("max_tokens", 10**6), ("temperature", "hot"), ("temperature", -0.1), ("temperature", 3), ("temperature", True),
    ("top_p", 0), ("top_p", 1.5), ("top_p", "x"), ("seed", -1), ("seed", "1"), ("seed", 2**70), ("seed", 1.0),
    ("stop", 5), ("stop", [1]), ("stop", ["a"] * 5), ("stop", [""]), ("n", 2), ("n", 0), ("n", "1"),
    ("stream", "yes"), ("stream", 1), ("stream_options", {"include_usage": True}), ("presence_penalty", 0.5),
    ("frequency_penalty", -1), ("logit_bias", {"1": 5}), ("user", 5), ("spec_decode_metrics", "yes"),
    ("model", 5), ("max_tokenz", 4),
]
OPENAI_CASES = (
    [("/v1/completions", {**COMPLETION, f: v}, f) for f, v in _SAMPLING]
    + [("/v1/chat/completions", {**CHAT, f: v}, f) for f, v in _SAMPLING]
    + [("/v1/completions", {**COMPLETION, "prompt": p}, "prompt")
       for p in (5, [], "", [1, -1], [1, 2**40], ["a", "b"], {"a": 1}, [[1, 2]], None)]
    + [("/v1/completions", {**COMPLETION, f: v}, f)
       for f, v in (("echo", True), ("best_of", 2), ("suffix", "x"), ("logprobs", 1))]
    + [("/v1/completions", {k: v for k, v in COMPLETION.items() if k != "model"}, "model")]
    + [("/v1/chat/completions", {**CHAT, "messages": m}, "messages")
       for m in ([], "hi", [{"role": "bogus", "content": "x"}], [{"role": "user"}], [{"role": "user", "content": 5}],
                 [{"role": "user", "content": [{"type": "image", "text": "x"}]}],
                 [{"role": "user", "content": "x", "extra": 1}])]
    + [("/v1/chat/completions", {**CHAT, f: v}, f)
       for f, v in (("max_completion_tokens", 0), ("max_completion_tokens", "4"), ("max_completion_tokens", 9),
                    ("logprobs", True), ("top_logprobs", 2))]
)


def _tensor(dtype: str, vals: list) -> np.ndarray | None:
    """``vals`` as a tensor of ``dtype``; None when they do not fit it."""
    if dtype == "BYTES":
        return np.array([x.encode() for x in vals], dtype=object) if all(isinstance(x, str) for x in vals) else None
    if dtype == "BOOL":
        return np.array(vals, dtype=np.bool_) if all(isinstance(x, bool) for x in vals) else None
    number = int if dtype != "FP32" else int | float
    if not vals or any(isinstance(x, bool) or not isinstance(x, number) for x in vals):
        return None
    npt = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32}[dtype]
    info = np.finfo(npt) if dtype == "FP32" else np.iinfo(npt)
    return np.array(vals, dtype=npt) if all(info.min <= x <= info.max for x in vals) else None


def _grpc_inputs(body: dict) -> dict[str, np.ndarray] | None:
    """A generate body as the llm model's typed tensors; None when a value has no such tensor (a
    string for a number, an integer beyond the dtype): those exist only in JSON. A misspelt field
    goes as an INT32 input, which Triton refuses by name."""
    out = {}
    for name, v in body.items():
        t = _tensor(INPUTS.get(name, "INT32"), v if name in LIST_INPUTS and isinstance(v, list) else [v])
        if t is None:
            return None
        out[name] = t
    return out


GRPC_MORE = [(t, f) for body, f in HTTP_BAD + MORE_GENERATE if (t := _grpc_inputs(body)) is not None]


def _named(error: str, field: str, run_dir) -> bool:
    return (field in error and "internal error" not in error and "Traceback" not in error and ".py(" not in error
            and str(run_dir) not in error)


def test_the_sweep_covers_the_issue_s_212_http_and_grpc_cases():
    http = len(GENERATE_CASES) * len(MODELS) + len(OPENAI_CASES)
    grpc = len(GRPC_MORE) + len(GRPC_BAD) + len(GENERATED) * len(MODELS)
    print(f"\nbad-input sweep: {http} HTTP cases through the front end, {grpc} gRPC cases through tritonclient")
    assert http >= ISSUE_HTTP_GRPC_CASES and grpc >= ISSUE_HTTP_GRPC_CASES // 2


@pytest.mark.parametrize("model", MODELS)
def test_generate_through_the_front_end(frontend, deployment, model):
    bad = []
    for body, field in GENERATE_CASES:
        r = httpx.post(f"{frontend.url}/v2/models/{model}/generate", json=body, timeout=60)
        error = r.json().get("error", "") if r.headers.get("content-type", "").startswith("application/json") else ""
        clean = "Failed to process" not in error and "At:" not in error  # the model's words, not Triton's wrapper
        if not (400 <= r.status_code < 500 and isinstance(error, str) and _named(error, field, deployment.run_dir)
                and clean):
            bad.append(f"{str(body)[:80]} -> {r.status_code} {r.text[:200]}")
    assert not bad, f"{len(bad)} of {len(GENERATE_CASES)}:\n" + "\n".join(bad[:10])
    assert grpc_generate(deployment.grpc_url, "def f(", GenParams(max_tokens=4)).token_ids


def test_openai_routes(frontend, deployment):
    bad = []
    for path, body, field in OPENAI_CASES:
        r = httpx.post(f"{frontend.url}{path}", json=body, timeout=60)
        err = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
        message = err.get("message", "") if isinstance(err, dict) else ""
        if not (400 <= r.status_code < 500 and _named(message, field, deployment.run_dir)
                and "Failed to process" not in message):
            bad.append(f"{path} {str(body)[:80]} -> {r.status_code} {r.text[:200]}")
    assert not bad, f"{len(bad)} of {len(OPENAI_CASES)}:\n" + "\n".join(bad[:10])
    r = httpx.post(f"{frontend.url}/v1/completions", json=COMPLETION, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_grpc_through_tritonclient(deployment):
    bad = []
    for inputs, field in GRPC_MORE:
        errors = grpc_stream_errors(deployment, inputs)
        ok = errors and isinstance(errors[0], InferenceServerException) and _named(str(errors[0]), field,
                                                                                   deployment.run_dir)
        if not ok:
            bad.append(f"{field}: {errors[:1]}")
    assert not bad, f"{len(bad)} of {len(GRPC_MORE)}:\n" + "\n".join(bad[:10])
    assert grpc_generate(deployment.grpc_url, "def f(", GenParams(max_tokens=4)).token_ids
