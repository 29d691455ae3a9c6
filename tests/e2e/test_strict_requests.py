"""Bad input over HTTP and gRPC: every request is refused with a 4xx naming the field, Triton counts it
as a failure, the server keeps serving; the model's custom metrics count what it served."""

from __future__ import annotations

import re
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from control.clients.triton import GenParams, grpc_generate
from control.errors import ConfigError
from control.triton.llm_request import check_generate_body
from tests.e2e.prompts import PROMPTS

pytestmark = pytest.mark.e2e

X = {"text_input": "def f(", "max_tokens": 4}
# (body, the field its error must name): JSON Triton's layer hands to the model.
HTTP_BAD = [
    ({**X, "max_tokns": 4}, "max_tokns"),
    ({**X, "temprature": 0.5}, "temprature"),
    ({**X, "policy": "fixed:" + "9" * 5000}, "policy"),
    ({**X, "policy": "fixed:99999999999999999999"}, "policy"),
    ({**X, "policy": "static-schedule:maxconc=x"}, "policy"),
    ({**X, "beam_width": 2}, "beam_width"),
    ({**X, "num_return_sequences": 3}, "num_return_sequences"),
    ({**X, "return_log_probs": True}, "return_log_probs"),
    ({**X, "return_generation_logits": True}, "return_generation_logits"),
    ({**X, "repetition_penalty": 1.3}, "repetition_penalty"),
    ({**X, "min_tokens": 5}, "min_tokens"),
    ({**X, "pad_id": -1}, "pad_id"),
    ({**X, "end_id": -5}, "end_id"),
    ({**X, "max_tokens": 0}, "max_tokens"),
    ({**X, "max_tokens": 10**6}, "max_tokens"),
    ({**X, "top_p": 1.5}, "top_p"),
    ({**X, "temperature": -0.1}, "temperature"),
    ({**X, "top_k": -2}, "top_k"),
    ({**X, "num_draft_tokens": -1}, "num_draft_tokens"),
    ({**X, "stop_words": ["w"] * 100}, "stop_words"),
    ({**X, "stop_words": ["w" * 5000]}, "stop_words"),
    ({"input_ids": [5, -3], "max_tokens": 4}, "input_ids[1]"),
    ({"input_ids": [2**31 - 1], "max_tokens": 4}, "input_ids[0]"),
    ({"max_tokens": 4}, "text_input"),
    ({"text_input": "", "max_tokens": 4}, "text_input"),
    ({"text_input": "x" * (1 << 17), "max_tokens": 4}, "text_input"),
]
# Shown to check_generate_body: Triton's JSON layer would answer these with an unnamed 500, truncate
# them to int32 or stream on generate; a front end that proxies Triton's HTTP calls check_generate_body.
JSON_LAYER = [
    ({**X, "max_tokens": "8"}, "max_tokens"),
    ({**X, "max_tokens": 4294967301}, "max_tokens"),
    ({"input_ids": [1099511627776], "max_tokens": 3}, "input_ids[0]"),
    ({**X, "temperature": "hot"}, "temperature"),
    ({**X, "random_seed": -1}, "random_seed"),
    ({**X, "top_k": 1e40}, "top_k"),
    ({**X, "stream": True}, "stream"),
    ({**X, "stream": "yes"}, "stream"),
    ({**X, "max_tokns": 4}, "max_tokns"),
]


def _rejected(dep) -> float:
    """Requests refused by every model (an alias refuses a misspelt field itself, the rest in llm)."""
    text = httpx.get(dep.metrics_url, timeout=5).text
    return sum(float(v) for labels, v in re.findall(r'^specctl_requests_total\{([^}]*)\} (\S+)$', text, re.M)
               if 'outcome="rejected"' in labels)


@pytest.mark.parametrize("model", ["llm", "ensemble"])
def test_http_bad_input_sweep(deployment, model):
    before = _rejected(deployment)
    for body, field in HTTP_BAD:
        r = httpx.post(f"{deployment.http_url}/v2/models/{model}/generate", json=body, timeout=30)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text[:300])
        error = r.json()["error"]
        assert field in error and "internal error" not in error and "ValueError" not in error, (body, error[:300])
        assert ".py(" not in error and str(deployment.run_dir) not in error, error  # no server paths
    # Every rejection counted once, by the model that refused it.
    assert _rejected(deployment) == before + len(HTTP_BAD)
    assert grpc_generate(deployment.grpc_url, PROMPTS[0], GenParams(max_tokens=4)).token_ids


def grpc_stream_errors(dep, inputs: dict[str, np.ndarray], model: str = "llm") -> list:
    """What one streamed gRPC request with these input tensors got per response (error or None)."""
    client = grpcclient.InferenceServerClient(dep.grpc_url)
    tensors = []
    for name, a in inputs.items():
        t = grpcclient.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        t.set_data_from_numpy(a)
        tensors.append(t)
    errors: list = []
    client.start_stream(callback=lambda result, error: errors.append(error))
    client.async_stream_infer(model, tensors)
    client.stop_stream()
    client.close()
    return errors


def _grpc_error(dep, inputs: dict[str, np.ndarray], model: str = "llm") -> str:
    errors = grpc_stream_errors(dep, inputs, model)
    assert errors and isinstance(errors[0], InferenceServerException), errors
    return str(errors[0])


def _s(v: str) -> np.ndarray:
    return np.array([v.encode()], dtype=object)


GRPC_BAD = [
    ({"text_input": _s("x"), "max_tokens": np.array([5.0], dtype=np.float32)}, "max_tokens"),  # Triton: dtype
    ({"text_input": _s("x"), "max_tokns": np.array([5], dtype=np.int32)}, "max_tokns"),  # Triton: unknown input
    ({"text_input": _s("x"), "max_tokens": np.array([2**31 - 1], dtype=np.int32)}, "max_tokens"),
    ({"text_input": _s("x"), "random_seed": np.array([2**64 - 1], dtype=np.uint64)}, "random_seed"),
    ({"input_ids": np.array([7, 2**31 - 1], dtype=np.int32)}, "input_ids[1]"),
    ({"text_input": _s("x"), "beam_width": np.array([4], dtype=np.int32)}, "beam_width"),
    ({"text_input": _s("x"), "policy": _s("fixed:" + "7" * 5000)}, "policy"),
    ({"text_input": np.array([b"\xff" * (1 << 17)], dtype=object)}, "text_input"),
    ({"text_input": _s("x"), "stop_words": np.array([b"a"] * 200, dtype=object)}, "stop_words"),
    ({"text_input": _s("x"), "temperature": np.array([np.inf], dtype=np.float32)}, "temperature"),
]


def test_grpc_bad_input_sweep(deployment):
    for inputs, field in GRPC_BAD:
        error = _grpc_error(deployment, inputs)
        assert field in error and "internal error" not in error, (field, error[:300])
    assert grpc_generate(deployment.grpc_url, PROMPTS[1], GenParams(max_tokens=4)).token_ids


@pytest.mark.parametrize(("body", "field"), JSON_LAYER, ids=[f for _, f in JSON_LAYER])
def test_generate_body_check_names_what_tritons_json_layer_would_not(body, field):
    with pytest.raises(ConfigError) as e:
        check_generate_body(body, stream_endpoint=False)
    assert field in str(e.value)


def test_generate_body_check_passes_good_bodies():
    check_generate_body({**X, "stream": True, "stop_words": ["a", "b"], "random_seed": 2**64 - 1}, stream_endpoint=True)
    check_generate_body({"input_ids": [1, 2, 3], "max_tokens": 3, "temperature": 0}, stream_endpoint=False)


def test_huge_prompt_is_refused_by_size_without_delaying_others(deployment):
    big = "x" * (10 << 20)
    errors: list[str] = []

    def send():
        r = httpx.post(f"{deployment.http_url}/v2/models/llm/generate", json={"text_input": big, "max_tokens": 4},
                       timeout=60)
        errors.append(r.json().get("error", ""))

    t0 = time.monotonic()
    assert len(grpc_generate(deployment.grpc_url, PROMPTS[2], GenParams(max_tokens=32)).token_ids) == 32
    alone_s = time.monotonic() - t0
    threads = [threading.Thread(target=send) for _ in range(3)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    small = grpc_generate(deployment.grpc_url, PROMPTS[2], GenParams(max_tokens=32))
    small_s = time.monotonic() - t0
    for t in threads:
        t.join(60)
    assert len(small.token_ids) == 32
    assert len(errors) == 3 and all(f"text_input is {10 << 20} bytes" in e for e in errors), errors
    print(f"\n32-token request beside three 10 MB prompts: {small_s:.2f} s (alone {alone_s:.2f} s)")
    assert small_s < alone_s + 0.5  # before: 21.6 s behind three tokenisations of 10 MB


def _metric(text: str, name: str) -> float:
    m = re.search(rf'^{name}\{{model="llm"[^}}]*\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_custom_metrics_count_tokens_drafts_and_latency(deployment):
    names = ("specctl_generated_tokens_total", "specctl_draft_tokens_total", "specctl_accepted_draft_tokens_total",
             "specctl_generation_latency_seconds_count", "specctl_time_to_first_token_seconds_count")
    before = httpx.get(deployment.metrics_url, timeout=5).text
    res = grpc_generate(deployment.grpc_url, PROMPTS[6], GenParams(max_tokens=24))
    deadline = time.monotonic() + 5
    while True:  # Triton's metrics endpoint refreshes on its own schedule
        after = httpx.get(deployment.metrics_url, timeout=5).text
        delta = {n: _metric(after, n) - _metric(before, n) for n in names}
        if delta["specctl_generation_latency_seconds_count"] >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert delta["specctl_generated_tokens_total"] == len(res.token_ids)
    assert delta["specctl_draft_tokens_total"] == res.drafted
    assert delta["specctl_accepted_draft_tokens_total"] == res.accepted
    assert delta["specctl_generation_latency_seconds_count"] == 1
    assert delta["specctl_time_to_first_token_seconds_count"] == 1
    assert "# TYPE specctl_generation_latency_seconds histogram" in after


def _generated_cases() -> list[tuple[str, np.ndarray]]:
    """(input name, a value the model must refuse) for every numeric and flag input of the contract."""
    from control.triton.llm_request import NEUTRAL, SCALARS

    cases = []
    for name, (kind, lo, _hi) in SCALARS.items():
        if kind == "int" and name != "random_seed":
            cases += [(name, np.array([lo - 1], dtype=np.int32)), (name, np.array([3, 4], dtype=np.int32))]
        elif kind == "float":
            cases += [(name, np.array([v], dtype=np.float32)) for v in (np.nan, np.inf, -np.inf, lo - 1)]
    cases.append(("max_tokens", np.array([2**31 - 1], dtype=np.int32)))
    for name, neutral in NEUTRAL.items():
        if isinstance(neutral, bool):
            cases.append((name, np.array([True])))
        elif isinstance(neutral, int):
            cases += [(name, np.array([neutral + 2], dtype=np.int32)), (name, np.array([-7], dtype=np.int32))]
        else:
            cases += [(name, np.array([v], dtype=np.float32)) for v in (neutral + 0.5, np.nan)]
    for name in ("stream", "exclude_input_in_output", "return_perf_metrics", "stats"):
        cases.append((name, np.array([True, False])))
    return cases


GENERATED = _generated_cases()


@pytest.mark.parametrize("model", ["llm", "ensemble", "tensorrt_llm_bls"])
def test_grpc_generated_sweep_over_every_input(deployment, model):
    batched = model != "llm"
    for name, value in GENERATED:
        inputs = {"text_input": _s("def f("), name: value}
        if batched:  # upstream's shapes: a leading batch dimension of 1
            inputs = {n: a[None, ...] for n, a in inputs.items()}
        error = _grpc_error(deployment, inputs, model)
        assert name in error and "internal error" not in error and ".py(" not in error, (model, name, value, error[:300])
    assert len(GENERATED) >= 40
    assert grpc_generate(deployment.grpc_url, PROMPTS[3], GenParams(max_tokens=4)).token_ids
