"""``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` over the ``llm`` model.

Defaults follow OpenAI: ``temperature`` 1, ``top_p`` 1, ``max_tokens`` 16 for completions (chat: the
deployment's ``chat_max_tokens``). Streaming answers are server-sent events ending with
``data: [DONE]``; with ``stream_options.include_usage`` a last chunk with empty ``choices`` carries
``usage``. ``metrics.speculative_decoding`` (vLLM's shape) is added to the response (streaming: to
its last chunk) when the request sets ``spec_decode_metrics`` or the deployment enables it. vLLM's
sampling extensions that benchmark clients send are taken: ``ignore_eos``, ``top_k`` (-1 or 0: off),
``repetition_penalty`` 1 and ``min_tokens`` 0.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from control.clients.triton import GenParams
from control.frontend.backend import Piece, TritonBackend
from control.frontend.chat import ChatTemplate
from control.frontend.connection import CLIENT_CLOSED, while_connected
from control.frontend.protocol import (
    DEFAULT_MAX_TOKENS,
    ChatRequest,
    CompletionRequest,
    OpenAIError,
    Sampling,
    new_id,
    now,
    usage,
    validation_message,
)
from control.frontend.specmetrics import SpecTracker
from control.frontend.text import StopTrimmer, TokenCounter

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default: sampled unless the request asks for 0


@dataclass(frozen=True)
class ServedModel:
    name: str
    max_k: int
    spec_metrics: bool  # the deployment's default for metrics.speculative_decoding
    chat_max_tokens: int
    counter: TokenCounter
    template: ChatTemplate
    created: int


@dataclass
class Job:
    """One request on its way: what to send, and how to shape the answer."""

    kind: str  # "text_completion" or "chat.completion"
    req: Sampling
    prompt: str | list[int]
    params: GenParams
    prompt_tokens: int
    metrics: bool


async def _parse(request: Request, model_cls):
    body = await request.body()
    try:
        return model_cls.model_validate_json(body or b"null")
    except ValidationError as e:
        msg, param = validation_message(e)
        raise OpenAIError(400, msg, param) from None


def _job(kind: str, req: Sampling, served: ServedModel, prompt: str | list[int], default_max: int) -> Job:
    if req.model != served.name:
        raise OpenAIError(404, f"model '{req.model}' does not exist; this server serves '{served.name}'", "model")
    params = GenParams(max_tokens=req.max_tokens or default_max,
                       temperature=float(req.temperature if req.temperature is not None else DEFAULT_TEMPERATURE),
                       top_p=float(req.top_p) if req.top_p is not None else None, random_seed=req.seed,
                       top_k=req.top_k if req.top_k and req.top_k > 0 else None,
                       stop_words=req.stop_words, ignore_eos=req.ignore_eos)
    metrics = served.spec_metrics if req.spec_decode_metrics is None else req.spec_decode_metrics
    return Job(kind, req, prompt, params, served.counter.count(prompt), metrics)


def _finish_reason(job: Job, n_tokens: int, trimmer: StopTrimmer) -> str:
    return "length" if n_tokens >= job.params.max_tokens and not trimmer.stopped else "stop"


def _choice(job: Job, text: str | None, finish: str | None, *, stream: bool) -> dict[str, Any]:
    if job.kind == "text_completion":
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    if stream:
        return {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}


async def answer(job: Job, pieces: AsyncIterator[Piece], served: ServedModel) -> dict[str, Any]:
    """The whole (non-streamed) response body."""
    trimmer, tracker, texts, n = StopTrimmer(job.params.stop_words), SpecTracker(served.max_k), [], 0
    async for p in pieces:
        texts.append(trimmer.feed(p.text))
        n += len(p.token_ids)
        tracker.update(p.drafted, p.accepted)
    texts.append(trimmer.finish())
    body = {"id": new_id("cmpl" if job.kind == "text_completion" else "chatcmpl"), "object": job.kind,
            "created": now(), "model": served.name,
            "choices": [_choice(job, "".join(texts), _finish_reason(job, n, trimmer), stream=False)],
            "usage": usage(job.prompt_tokens, n)}
    if job.metrics:
        body["metrics"] = {"speculative_decoding": tracker.payload()}
    return body


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


async def stream(job: Job, first: Piece | None, pieces: AsyncIterator[Piece], served: ServedModel) -> AsyncIterator[bytes]:
    """Server-sent events for one request; ``first`` is the response already read (errors surface early)."""
    kind = "text_completion" if job.kind == "text_completion" else "chat.completion.chunk"
    head = {"id": new_id("cmpl" if job.kind == "text_completion" else "chatcmpl"), "object": kind,
            "created": now(), "model": served.name}
    trimmer, tracker, n = StopTrimmer(job.params.stop_words), SpecTracker(served.max_k), 0
    if job.kind != "text_completion":
        yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]})

    async def all_pieces():
        if first is not None:
            yield first
        async for p in pieces:
            yield p

    try:
        async for p in all_pieces():
            n += len(p.token_ids)
            tracker.update(p.drafted, p.accepted)
            text = trimmer.feed(p.text) + (trimmer.finish() if p.final else "")
            if text:
                yield _sse({**head, "choices": [_choice(job, text, None, stream=True)]})
    except OpenAIError as e:
        yield _sse(e.body())
        yield b"data: [DONE]\n\n"
        return
    finally:
        await pieces.aclose()  # stops the request on the server if the client went away (backend.py)
    last = {**head, "choices": [_choice(job, None, _finish_reason(job, n, trimmer), stream=True)]}
    tail = [last]
    if job.req.include_usage:
        tail.append({**head, "choices": [], "usage": usage(job.prompt_tokens, n)})
    if job.metrics:
        tail[-1]["metrics"] = {"speculative_decoding": tracker.payload()}
    for doc in tail:
        yield _sse(doc)
    yield b"data: [DONE]\n\n"


async def run(job: Job, backend: TritonBackend, served: ServedModel, request: Request):
    pieces = backend.generate(job.prompt, job.params)
    if not job.req.stream:
        connected, body = await while_connected(request, answer(job, pieces, served))
        return JSONResponse(body) if connected else Response(status_code=CLIENT_CLOSED)
    # the first piece before the response starts (an error is still a status code then); a client that
    # leaves while the request waits for its first token cancels it, as one that leaves mid-stream does
    connected, first = await while_connected(request, _first_piece(pieces))
    if not connected:
        return Response(status_code=CLIENT_CLOSED)
    return StreamingResponse(stream(job, first, pieces, served), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _first_piece(pieces: AsyncIterator[Piece]) -> Piece | None:
    try:
        return await anext(pieces)
    except StopAsyncIteration:
        return None


def register(app: FastAPI, served: ServedModel) -> None:
    def backend(request: Request) -> TritonBackend:
        return request.app.state.backend

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                            "owned_by": "specctl"}]}

    @app.get("/v1/models/{name}")
    async def model(name: str) -> dict[str, Any]:
        if name != served.name:
            raise OpenAIError(404, f"model '{name}' does not exist; this server serves '{served.name}'", "model")
        return {"id": served.name, "object": "model", "created": served.created, "owned_by": "specctl"}

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest)
        job = _job("text_completion", req, served, req.prompt, DEFAULT_MAX_TOKENS)
        return await run(job, backend(request), served, request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req = await _parse(request, ChatRequest)
        prompt = served.template.render([(m.role, m.text) for m in req.messages])
        return await run(_job("chat.completion", req, served, prompt, served.chat_max_tokens), backend(request), served,
                         request)
