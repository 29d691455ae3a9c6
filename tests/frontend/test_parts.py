"""The front end's parts without a server: limits, stop trimming, speculative metrics, chat templates,
request validation."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from control.frontend.chat import ChatTemplate, plain_template
from control.frontend.limits import BodyLimits, check_body, json_depth
from control.frontend.protocol import ChatRequest, CompletionRequest, validation_message
from control.frontend.specmetrics import SpecTracker
from control.frontend.text import StopTrimmer, TokenCounter


@pytest.mark.parametrize(("raw", "depth"), [
    (b"", 0), (b"1", 0), (b"[]", 1), (b'{"a": [1, {"b": 2}]}', 3),
    (b'{"a": "[[[[{{{{"}', 1), (b'{"a": "\\"[[[["}', 1), (b"[" * 5000 + b"]" * 5000, 5000),
])
def test_json_depth_skips_strings(raw, depth):
    assert json_depth(raw) == depth


def test_check_body_refuses_form_multipart_and_depth():
    lim = BodyLimits(max_body_bytes=100, max_json_depth=3)
    assert check_body("application/x-www-form-urlencoded", b"a=1", lim)[0] == 415
    assert check_body("multipart/form-data", b"", lim)[0] == 415
    status, body = check_body("application/json", b"[[[[1]]]]", lim)
    assert status == 400 and "nested 4 deep; at most 3" in json.loads(body)["error"]["message"]
    assert check_body("application/json", b"[[[1]]]", lim) is None
    assert check_body("", b'{"x": 1}', lim) is None  # no content type: still checked, and fine
    # binary tensors: only the JSON header (its length in Inference-Header-Content-Length) is checked
    assert check_body("application/octet-stream", b"[[[[" + b"\x00[[[[[", lim, json_prefix_len=2) is None
    assert check_body("application/octet-stream", b"[[[[[[[[", lim, json_prefix_len=8)[0] == 400


@pytest.mark.parametrize("pieces", [["abc STOP def"], ["abc S", "TO", "P def"], ["abc ST", "OP"], ["a", "b", "c", " ", "STOP"]])
def test_stop_trimmer_never_releases_the_stop_sequence(pieces):
    t = StopTrimmer(["STOP", "XYZ"])
    out = "".join(t.feed(p) for p in pieces) + t.finish()
    assert out == "abc " and t.stopped


def test_stop_trimmer_releases_everything_without_a_stop():
    t = StopTrimmer(["STOP"])
    out = [t.feed(p) for p in ("hello ", "ST", "world")]
    assert out[1] == "" or "ST" not in out[1]  # a possible start of STOP is held back
    assert "".join(out) + t.finish() == "hello STworld" and not t.stopped
    assert StopTrimmer([]).feed("x") == "x"


def test_spec_tracker_builds_vllm_payload_from_running_totals():
    t = SpecTracker(num_spec_tokens=4)
    for drafted, accepted in [(0, 0), (3, 3), (6, 4), (6, 4), (9, 4), (13, 8)]:  # prefill, 4 spec steps, 1 plain
        t.update(drafted, accepted)
    m = t.payload()
    assert m["per_step_drafted"] == [3, 3, 3, 4] and m["per_step_accepted"] == [3, 1, 0, 4]
    assert m["acceptance_histogram"] == [1, 1, 0, 1, 1] and m["num_spec_steps"] == 4
    assert (m["num_draft_tokens"], m["num_accepted_draft_tokens"]) == (13, 8)
    assert m["mean_acceptance_length"] == pytest.approx(3.0) and m["draft_acceptance_rate"] == pytest.approx(8 / 13)
    empty = SpecTracker(num_spec_tokens=2).payload()
    assert empty["acceptance_histogram"] == [0, 0, 0] and empty["mean_acceptance_length"] == 1.0
    assert empty["draft_acceptance_rate"] == 0.0


def test_chat_templates(tmp_path):
    msgs = [("system", "S"), ("user", "U")]
    assert plain_template(msgs) == "system: S\nuser: U\nassistant:"
    assert ChatTemplate.from_tokenizer_dir(tmp_path).render(msgs) == plain_template(msgs)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>",
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}"}))
    tpl = ChatTemplate.from_tokenizer_dir(tmp_path)
    assert tpl.kind == "tokenizer" and tpl.render(msgs) == "<s>[system]S[user]U[assistant]"


def test_chat_template_is_sandboxed(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ messages.__class__.__mro__[1].__subclasses__() }}"}))
    with pytest.raises(Exception, match="unsafe|attribute"):
        ChatTemplate.from_tokenizer_dir(tmp_path).render([("user", "x")])


def test_token_counter_matches_the_model(quick_engines):
    from control.executors.reference.loader import load_engine_dir

    loaded = load_engine_dir(quick_engines)
    c = TokenCounter(quick_engines / "target")
    for text in ("def parse(", "naïve café\n"):
        assert c.count(text) == len(loaded.encode(text))
    assert c.count([5, 6, 7]) == 3


@pytest.mark.parametrize(("body", "words"), [
    ({"model": "llm", "prompt": "x", "n": 3}, "n = 3"),
    ({"model": "llm", "prompt": "x", "temperature": "hot"}, "temperature = 'hot'"),
    ({"model": "llm", "prompt": "x", "max_tokens": True}, "max_tokens = True"),
    ({"model": "llm", "prompt": ["a", "b"]}, "one prompt per request"),
    ({"model": "llm", "prompt": ""}, "prompt is empty"),
    ({"model": "llm", "prompt": "x", "echo": True}, "echo"),
    ({"model": "llm", "prompt": "x", "stream_options": {"include_usage": True}}, "only allowed when stream"),
    ({"model": "llm", "prompt": "x", "top_p": 0}, "top_p = 0"),
    ({"model": "llm", "prompt": "x", "seed": -1}, "seed = -1"),
    ({"prompt": "x"}, "model is required"),
    ({"model": "llm", "prompt": "x", "frequency_penalty": 0.5}, "frequency_penalty = 0.5: penalties are not supported"),
    ({"model": "llm", "prompt": "x", "presence_penalty": -1}, "presence_penalty = -1: penalties are not supported"),
    ({"model": "llm", "prompt": "x", "stop": ["ok", "y" * 2000]}, "stop: a sequence of 2000 characters; at most 1024"),
    ({"model": "llm", "prompt": "x", "repetition_penalty": 1.3}, "repetition_penalty = 1.3: penalties are not supported; "
                                                                  "only 1 is accepted"),
    ({"model": "llm", "prompt": "x", "min_tokens": 4}, "min_tokens = 4: minimum lengths are not supported; only 0 "
                                                        "is accepted (for a fixed output length send ignore_eos"),
    ({"model": "llm", "prompt": "x", "top_k": -2}, "top_k = -2"),
    ({"model": "llm", "prompt": "x", "ignore_eos": "yes"}, "ignore_eos = 'yes'"),
    # a union: the member whose shape the value has names the bad item; else every member, in words
    ({"model": "llm", "prompt": [5, -1]}, "prompt.1 = -1: Input should be greater than or equal to 0"),
    ({"model": "llm", "prompt": None}, "accepted: a string or a list of strings or a list of token ids"),
    ({"model": "llm", "prompt": "x", "stop": [1]}, "stop = [1]: wrong type; accepted: a string or a list of strings"),
])
def test_completion_validation_names_the_field(body, words):
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate_json(json.dumps(body))
    assert words in validation_message(e.value)[0]


def test_chat_content_of_another_part_type_names_the_part():
    body = {"model": "llm", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}
    with pytest.raises(ValidationError) as e:
        ChatRequest.model_validate_json(json.dumps(body))
    assert validation_message(e.value) == ("messages.0.content.0.type = 'image_url': Input should be 'text'",
                                           "messages.0.content")


@pytest.mark.parametrize(("extra", "words"), [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools: not supported by this server"),
    ({"response_format": {"type": "json_object"}}, "response_format: not supported by this server"),
    ({"metadata": {"a": "b"}}, "metadata: not supported by this server"),
    ({"store": True}, "store: true is not supported"),
    ({"max_tokenz": 3}, "max_tokenz: unknown field; see the OpenAI API reference"),
])
def test_openai_fields_not_served_are_named_as_such_and_typos_as_unknown(extra, words):
    body = {"model": "llm", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(ValidationError) as e:
        ChatRequest.model_validate_json(json.dumps(body))
    assert words in validation_message(e.value)[0]


def test_neutral_openai_fields_are_accepted():
    r = ChatRequest.model_validate({"model": "llm", "messages": [{"role": "user", "content": "hi"}], "store": False,
                                    "parallel_tool_calls": True, "logprobs": False, "n": 1})
    assert r.store is False and r.messages[0].text == "hi"


def test_chat_request_accepts_text_parts_and_max_completion_tokens():
    r = ChatRequest.model_validate({"model": "llm", "max_completion_tokens": 9, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert r.max_tokens == 9 and r.messages[0].text == "ab"
    assert CompletionRequest.model_validate({"model": "llm", "prompt": ["only"]}).prompt == "only"
    assert CompletionRequest.model_validate({"model": "llm", "prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    assert CompletionRequest.model_validate({"model": "llm", "prompt": "\n\n "}).prompt == "\n\n "  # whitespace is text


def test_a_failed_grpc_channel_reads_as_its_status_and_details_not_the_repr():
    import grpc
    from grpc.aio import AioRpcError, Metadata

    from control.clients.triton import StreamBroken
    from control.frontend.backend import _error

    e = AioRpcError(grpc.StatusCode.UNAVAILABLE, Metadata(), Metadata(), details="Stream removed (Socket closed)",
                    debug_error_string="UNAVAILABLE:Stream removed (Socket closed)")
    text = StreamBroken(e).channel_text()
    assert text == "StatusCode.UNAVAILABLE: Stream removed (Socket closed)"
    err = _error(text)
    assert err.status == 503
    assert "not reachable (StatusCode.UNAVAILABLE: Stream removed (Socket closed)); retry" in err.message
    assert "AioRpcError" not in err.message and "debug_error_string" not in err.message
    assert StreamBroken(ConnectionResetError("peer reset")).channel_text() == "ConnectionResetError: peer reset"
    assert StreamBroken(None).channel_text() == ""  # the server ended the stream: no channel fault


def test_vllm_extensions_reach_the_model_inputs():
    from control.clients.triton import grpc_inputs
    from control.frontend.openai_routes import ServedModel, _job

    class Count:
        def count(self, prompt):
            return 1

    served = ServedModel("llm", 8, False, 16, Count(), plain_template, 0)
    req = CompletionRequest.model_validate({"model": "llm", "prompt": "x", "ignore_eos": True, "top_k": 5,
                                            "repetition_penalty": 1.0, "min_tokens": 0, "temperature": 0.5})
    p = _job("text_completion", req, served, "x", 16).params
    assert (p.ignore_eos, p.top_k) == (True, 5)
    sent = {t.name(): t for t in grpc_inputs("x", p)}
    assert "ignore_eos" in sent and "top_k" in sent
    off = _job("text_completion", CompletionRequest.model_validate({"model": "llm", "prompt": "x", "top_k": -1}),
               served, "x", 16).params
    assert (off.ignore_eos, off.top_k) == (False, None)
    assert not {"ignore_eos", "top_k"} & {t.name() for t in grpc_inputs("x", off)}


def test_work_is_cancelled_when_the_client_goes_and_kept_when_it_stays():
    import asyncio

    from control.frontend.connection import while_connected

    class Client:
        def __init__(self, leaves_after_s: float) -> None:
            self.leaves_after_s = leaves_after_s

        async def receive(self):
            await asyncio.sleep(self.leaves_after_s)
            return {"type": "http.disconnect"}

    cancelled = []

    async def work(s: float):
        try:
            await asyncio.sleep(s)
            return "answer"
        except asyncio.CancelledError:
            cancelled.append(s)
            raise

    async def both():
        gone = await while_connected(Client(0.01), work(5.0))
        stays = await while_connected(Client(5.0), work(0.01))
        return gone, stays

    gone, stays = asyncio.run(asyncio.wait_for(both(), 3))
    assert gone == (False, None) and cancelled == [5.0]  # the generation's task got the cancel
    assert stays == (True, "answer")


def test_a_request_ended_by_a_drain_is_a_503_on_both_apis():
    """A stopping server's message (the llm model's drain) is no fault of the request: OpenAI routes and
    the KServe proxy answer 503 with ``Retry-After``, so a client or load balancer retries elsewhere or
later; a refusal stays 400."""
    import asyncio

    import httpx

    from control.frontend.backend import _error
    from control.frontend.protocol import RETRY_AFTER_S
    from control.frontend.proxy import _model_error
    from control.triton.llm_request import STOPPING

    ended = f"{STOPPING}: this request ended after 12 tokens; retry it"
    assert _error(ended).status == 503 and _error(ended).message == ended
    assert _error("max_tokens = 0: must be >= 1").status == 400
    wrapped = f"Failed to process the request(s) for model 'llm_0_0', message: {ended}"
    for text, status in ((wrapped, 503), ("top_p = 1.5: must be in (0, 1]", 400)):
        r = httpx.Response(400, json={"error": text})
        out = asyncio.run(_model_error(r))
        assert out.status_code == status, text
        assert out.headers.get("retry-after") == (str(RETRY_AFTER_S) if status == 503 else None), text
    assert _error(ended).headers() == {"Retry-After": str(RETRY_AFTER_S)}
    assert _error("max_tokens = 0: must be >= 1").headers() is None
    assert b"Failed to process" not in asyncio.run(_model_error(httpx.Response(400, json={"error": wrapped}))).body


def test_only_a_non_streamed_generate_of_the_llm_models_gets_a_stop_id_and_the_model_reads_it():
    from control.errors import ConfigError
    from control.frontend.proxy import _forward
    from control.triton.llm_request import (
        STOP_ID_PARAMETER,
        check_generate_body,
        check_parameters,
        request_key,
    )

    body = json.dumps({"text_input": "hi", "max_tokens": 4}).encode()
    fwd = _forward("models/llm/versions/1/generate", body)
    doc = json.loads(fwd.body)
    assert fwd.stop_id.startswith("kserve-") and doc[STOP_ID_PARAMETER] == fwd.stop_id
    assert {k: v for k, v in doc.items() if k != STOP_ID_PARAMETER} == json.loads(body)
    check_generate_body(doc, stream_endpoint=False)  # the model accepts what the proxy sends
    assert _forward("models/ensemble/generate", body).stop_id != fwd.stop_id  # one id per request
    for path in ("models/llm/generate_stream", "models/other/generate", "models/llm/infer"):
        assert _forward(path, body) == type(fwd)(body)  # as it came
    for control in ({"stop": True}, {"stats": True}):  # no generation to stop
        raw = json.dumps(control).encode()
        assert _forward("models/llm/generate", raw) == type(fwd)(raw)
    with pytest.raises(ConfigError, match="max_tokens"):
        _forward("models/llm/generate", json.dumps({"text_input": "hi", "max_tokens": "4"}).encode())
    # the model knows the request by its Triton id first, then by the stop id
    params = json.dumps({STOP_ID_PARAMETER: "kserve-1", "timeout": 5})
    check_parameters(params)
    assert request_key("", params) == "kserve-1" and request_key("grpc-7", params) == "grpc-7"
    assert request_key("", None) == "" and request_key("", json.dumps({STOP_ID_PARAMETER: 5})) == ""
