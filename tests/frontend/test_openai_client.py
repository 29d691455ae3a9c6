"""The official ``openai`` client against the front end of a real deployment (Triton on the quick pair)."""

from __future__ import annotations

import httpx
import openai
import pytest

from control.clients.triton import GenParams, http_generate
from control.frontend.chat import plain_template
from tests.e2e.prompts import PROMPTS

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
N = 24


def kserve(dep, prompt: str, n: int = N, **kw) -> str:
    """Greedy text from Triton's own KServe generate endpoint (no front end)."""
    return http_generate(dep.http_url, prompt, GenParams(max_tokens=n, **kw)).text


def test_models_lists_the_served_model(oai):
    assert [m.id for m in oai.models.list().data] == ["llm"]
    assert oai.models.retrieve("llm").id == "llm"


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_completion_greedy_equals_kserve_and_reference(oai, deployment, reference, prompt):
    r = oai.completions.create(model="llm", prompt=prompt, max_tokens=N, temperature=0)
    ids = reference([prompt], N)[0]
    assert r.choices[0].text == kserve(deployment, prompt) == reference.loaded.decode(ids)
    assert r.usage.completion_tokens == len(ids)
    assert r.usage.prompt_tokens == len(reference.loaded.encode(prompt))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason == ("length" if len(ids) == N else "stop")


def test_completion_streaming_with_usage(oai, deployment):
    prompt = PROMPTS[2]
    chunks = list(oai.completions.create(model="llm", prompt=prompt, max_tokens=N, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == kserve(deployment, prompt)
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) > 1  # it streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_sync_and_streaming_equal_kserve_on_the_plain_template(oai, deployment):
    msgs = [{"role": "system", "content": "Python code."}, {"role": "user", "content": "def main():"}]
    want = kserve(deployment, plain_template([(m["role"], m["content"]) for m in msgs]))
    r = oai.chat.completions.create(model="llm", messages=msgs, max_tokens=N, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    assert r.usage.completion_tokens > 0
    chunks = list(oai.chat.completions.create(model="llm", messages=msgs, max_tokens=N, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_stop_sequence_is_left_out(oai, deployment):
    prompt = PROMPTS[2]
    full = kserve(deployment, prompt, 32)
    starts = [i for i in range(4, len(full) - 3) if full[i:i + 3].strip() and full.index(full[i:i + 3]) == i]
    assert starts, full
    stop = full[starts[0]:starts[0] + 3]
    want = full[:full.index(stop)]
    r = oai.completions.create(model="llm", prompt=prompt, max_tokens=32, temperature=0, stop=[stop])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    s = oai.completions.create(model="llm", prompt=prompt, max_tokens=32, temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == want


def test_seeded_sampling_repeats(oai, policy):
    policy("none")  # seeded sampling under speculation is not yet reproducible (issue 19); the seed must arrive
    kw = {"model": "llm", "prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0.9, "seed": 1234}
    first = oai.completions.create(**kw).choices[0].text
    assert first == oai.completions.create(**kw).choices[0].text
    assert first != oai.completions.create(**{**kw, "seed": 99}).choices[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_speculative_metrics_in_vllm_shape(oai, policy, stream):
    policy("fixed:3")
    kw = {"model": "llm", "prompt": PROMPTS[3], "max_tokens": 40, "temperature": 0,
          "extra_body": {"spec_decode_metrics": True}}
    if stream:
        chunks = list(oai.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        m = chunks[-1].model_extra["metrics"]["speculative_decoding"]
        assert all("metrics" not in (c.model_extra or {}) for c in chunks[:-1])
    else:
        m = oai.completions.create(**kw).model_extra["metrics"]["speculative_decoding"]
    hist = m["acceptance_histogram"]
    assert m["num_spec_tokens"] == 8 and len(hist) == 9 and sum(hist) == m["num_spec_steps"] > 0
    assert m["num_draft_tokens"] == sum(m["per_step_drafted"]) and max(m["per_step_drafted"]) <= 3
    assert 0 <= m["num_accepted_draft_tokens"] <= m["num_draft_tokens"]
    assert sum(j * c for j, c in enumerate(hist)) == m["num_accepted_draft_tokens"]
    assert m["mean_acceptance_length"] == pytest.approx(1 + m["num_accepted_draft_tokens"] / m["num_spec_steps"])
    assert m["draft_acceptance_rate"] == pytest.approx(m["num_accepted_draft_tokens"] / m["num_draft_tokens"])
    plain = oai.completions.create(model="llm", prompt=PROMPTS[3], max_tokens=4, temperature=0)
    assert "metrics" not in (plain.model_extra or {})  # opt-in


@pytest.mark.parametrize(("kwargs", "status", "param", "words"), [
    ({"n": 2}, 400, "n", "less than or equal to 1"),
    ({"temperature": 5}, 400, "temperature", "temperature = 5"),
    ({"max_tokens": 0}, 400, "max_tokens", "max_tokens = 0"),
    ({"extra_body": {"max_tokenz": 5}}, 400, "max_tokenz", "unknown field"),
    ({"model": "gpt-4"}, 404, "model", "'gpt-4' does not exist"),
    ({"max_tokens": 100000}, 400, None, "max_tokens = 100000"),  # refused by the model's own limit
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, None, "at most 4"),
    ({"prompt": [1, 2, 10**12]}, 400, "prompt", "prompt"),
    ({"prompt": [1, 2, 100000]}, 400, None, "100000"),  # beyond the vocabulary: refused by the model
])
def test_bad_requests_get_openai_errors(oai, kwargs, status, param, words):
    kw = {"model": "llm", "prompt": "x = 1", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as e:
        oai.completions.create(**kw)
    assert e.value.status_code == status
    err = e.value.body
    assert set(err) >= {"message", "type", "param", "code"}, err  # the client unwraps {"error": {...}}
    assert words in err["message"] and (param is None or err["param"] == param)


def test_bad_chat_and_malformed_json(oai, frontend):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="llm", messages=[{"role": "robot", "content": "hi"}])
    assert "messages.0.role" in e.value.body["message"]
    r = httpx.post(f"{frontend.url}/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "error" in r.json() and r.json()["error"]["message"]


def _sse_docs(r: httpx.Response) -> list[dict]:
    import json

    lines = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize(("client", "route"), [("vllm", "completions"), ("vllm", "chat/completions"),
                                              ("sglang", "completions")])
def test_the_request_shapes_of_vllm_and_sglang_benchmarks_are_served(frontend, client, route):
    """The bodies `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py, with --ignore-eos:
    the completions one always carries repetition_penalty 1.0 and logprobs null) and SGLang's
    bench_serving (python/sglang/bench_serving.py: best_of 1, ignore_eos by default) send."""
    if client == "sglang":
        body = {"model": "llm", "prompt": PROMPTS[1], "temperature": 0.0, "best_of": 1, "max_tokens": 24,
                "stream": True, "ignore_eos": True}
    elif route == "completions":
        body = {"model": "llm", "prompt": PROMPTS[1], "repetition_penalty": 1.0, "max_tokens": 24, "logprobs": None}
    else:
        body = {"model": "llm", "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPTS[1]}]}],
                "max_completion_tokens": 24}
    if client == "vllm":
        body |= {"stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    r = httpx.post(f"{frontend.url}/v1/{route}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    docs = _sse_docs(r)
    if client == "vllm":
        assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 24
        docs = docs[:-1]
    assert all(d["choices"] for d in docs)  # SGLang's client reads choices[0] of every chunk
    assert docs[-1]["choices"][0]["finish_reason"] == "length"
