"""OpenAI request models (our own pydantic models: the maintained protocol packages pull in vLLM or
torch with CUDA) and the response / error bodies.

Unknown fields are refused (a misspelt ``max_tokens`` must not pass silently); fields OpenAI defines
that this server cannot honour are accepted only at their neutral value and refused otherwise.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from control.triton.llm_request import MAX_WORD_CHARS

MAX_STOP_WORDS = 4  # as OpenAI
# OpenAI's request fields for what this server does not do (tools, response formats, audio, stored
# completions, reasoning options): refused as such, not as unknown (a client reading "see the OpenAI
# API reference" would find them there)
OPENAI_NOT_SERVED = frozenset({
    "tools", "tool_choice", "functions", "function_call", "response_format", "audio", "modalities", "prediction",
    "reasoning_effort", "service_tier", "web_search_options", "metadata", "verbosity", "prompt_cache_key",
    "safety_identifier"})
MAX_SEED = 2**63 - 1
MAX_TOKEN_ID = 2**31 - 1  # token ids travel as INT32
UNION_TAGS = frozenset({"int", "float", "str", "bool", "none"})
# a union member's tag in pydantic's error locations, as the error names it to the user
TAG_WORDS = {"str": "a string", "list[str]": "a list of strings", "list[constrained-int]": "a list of token ids",
             "list[TextPart]": "a list of text parts", "int": "an integer", "float": "a number", "bool": "true or false",
             "none": "null"}
DEFAULT_MAX_TOKENS = 16  # OpenAI's completions default
UNAVAILABLE = 503
# seconds a 503 (model server restarting or draining) asks a client to wait before it retries: the
# supervisor restarts a dead tritonserver in about 13 s on the CPU pair, so the openai client's two
# default retries at this spacing span a restart, where its own 0.5-8 s backoff gives up first
RETRY_AFTER_S = 10


class OpenAIError(Exception):
    """A request error answered in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def headers(self) -> dict[str, str] | None:
        """``Retry-After`` on a 503: the server is restarting or draining, not refusing the request."""
        return retry_after(self.status)

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        if self.status == 404:
            kind = "not_found_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


def retry_after(status: int) -> dict[str, str] | None:
    """The headers a response with ``status`` carries for a client's retry (None: none)."""
    return {"Retry-After": str(RETRY_AFTER_S)} if status == UNAVAILABLE else None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


Number = StrictInt | StrictFloat
TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]


class Sampling(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = Field(default=1, ge=1, le=1, description="only 1 is supported")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Number = Field(default=0, description="only 0 is supported")
    frequency_penalty: Number = Field(default=0, description="only 0 is supported")
    logit_bias: dict[str, Any] | None = Field(default=None, max_length=0)
    user: StrictStr | None = None
    # vLLM's and SGLang's extensions that their benchmark clients send (`vllm bench serve` sends
    # repetition_penalty 1.0 on every completion, and ignore_eos with --ignore-eos)
    ignore_eos: StrictBool = Field(default=False, description="generate max_tokens even past the end token")
    top_k: StrictInt | None = Field(default=None, ge=-1, description="sample from the k likeliest tokens (-1, 0: all)")
    repetition_penalty: Number = Field(default=1, description="only 1 is supported")
    min_tokens: StrictInt = Field(default=0, description="only 0 is supported")
    spec_decode_metrics: StrictBool | None = Field(
        default=None, description="add metrics.speculative_decoding to this response (default: the deployment's)")

    @model_validator(mode="after")
    def _checks(self):
        words = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(words) > MAX_STOP_WORDS:
            raise ValueError(f"stop: at most {MAX_STOP_WORDS} sequences are accepted (got {len(words)})")
        if any(not w for w in words):
            raise ValueError("stop: sequences must be non-empty strings")
        longest = max(map(len, words), default=0)
        if longest > MAX_WORD_CHARS:  # the llm model's limit, checked here to name the OpenAI field
            raise ValueError(f"stop: a sequence of {longest} characters; at most {MAX_WORD_CHARS} are accepted")
        for name, neutral in (("presence_penalty", 0), ("frequency_penalty", 0), ("repetition_penalty", 1)):
            if getattr(self, name) != neutral:
                raise ValueError(f"{name} = {getattr(self, name)!r}: penalties are not supported; only {neutral} is "
                                 "accepted")
        if self.min_tokens != 0:
            raise ValueError(f"min_tokens = {self.min_tokens!r}: minimum lengths are not supported; only 0 is accepted "
                             "(for a fixed output length send ignore_eos: true with max_tokens)")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def stop_words(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Sampling):
    prompt: StrictStr | list[StrictStr] | list[TokenId]
    echo: StrictBool = Field(default=False, description="only false is supported")
    logprobs: None = Field(default=None, description="not supported")
    best_of: StrictInt | None = Field(default=None, ge=1, le=1, description="only 1 is supported")
    suffix: None = Field(default=None, description="not supported")

    @model_validator(mode="after")
    def _one_prompt(self):
        if self.echo:
            raise ValueError("echo: true is not supported; only false is accepted")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise ValueError(f"prompt: one prompt per request is accepted (got {len(self.prompt)}); send one "
                                 "request per prompt")
            self.prompt = self.prompt[0]
        if not self.prompt:  # whitespace is text: a model continues "\n\n" like any prompt
            raise ValueError("prompt is empty: give the text (or token ids) to continue")
        return self


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool = Field(default=False, description="only false is supported")
    top_logprobs: None = Field(default=None, description="not supported")
    store: StrictBool = Field(default=False, description="only false: this server stores no completions")
    parallel_tool_calls: StrictBool | None = Field(default=None, description="no effect: no tools are served")

    @model_validator(mode="after")
    def _chat_checks(self):
        if self.logprobs:
            raise ValueError("logprobs: true is not supported; only false is accepted")
        if self.store:
            raise ValueError("store: true is not supported (this server stores no completions); only false is accepted")
        if self.max_completion_tokens is not None and self.max_tokens is not None \
                and self.max_completion_tokens != self.max_tokens:
            raise ValueError("give max_completion_tokens or max_tokens, not two different values")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _is_branch(part) -> bool:
    """A union member's tag in a pydantic error location (``int``, ``list[str]``, ...), not a field name."""
    return isinstance(part, str) and (part in UNION_TAGS or "[" in part)


def _union_message(errors: list[dict], raw_loc: tuple, loc: str, shown: str) -> tuple[str, str]:
    """A value no member of a union accepts: the member whose shape it has, where one of them failed
    only on an item's value (``[-1]`` as token ids), else every member, in words. The ``param`` stays
    the field's."""
    field = raw_loc[:[i for i, p in enumerate(raw_loc) if _is_branch(p)][0]]  # the location up to the first tag
    tried = [e for e in errors if tuple(e.get("loc", ()))[:len(field)] == field and len(e["loc"]) > len(field)
             and _is_branch(e["loc"][len(field)])]
    for e in tried:  # a member that took the shape and refused one item's value names that item
        if len(e["loc"]) > len(field) + 1 and not str(e.get("type", "")).endswith("_type"):
            where = ".".join(str(p) for p in e["loc"] if not _is_branch(p))
            got = repr(e.get("input"))
            return f"{where} = {got[:60]}: {e.get('msg', 'invalid').removeprefix('Value error, ')}", loc
    tags = dict.fromkeys(str(e["loc"][len(field)]) for e in tried)
    return f"{loc} = {shown}: wrong type; accepted: {' or '.join(TAG_WORDS.get(t, t) for t in tags)}", loc


def validation_message(err) -> tuple[str, str | None]:
    """(one line naming the first bad field, its value and what is accepted; the field's name)."""
    errors = err.errors()
    first = errors[0]
    raw_loc = first.get("loc", ())
    loc = ".".join(str(p) for p in raw_loc if not _is_branch(p))
    shown = repr(first.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    if first.get("type") == "extra_forbidden":
        if str(raw_loc[0] if raw_loc else "") in OPENAI_NOT_SERVED:
            return (f"{loc}: not supported by this server (it serves plain text generation: no tools, response "
                    "formats, audio, stored completions or reasoning options); leave the field out"), loc
        return f"{loc}: unknown field; see the OpenAI API reference for the accepted fields", loc
    if first.get("type") == "missing":
        return f"{loc} is required", loc
    if any(_is_branch(p) for p in raw_loc):
        return _union_message(errors, raw_loc, loc, shown)
    msg = first.get("msg", "invalid").removeprefix("Value error, ")
    return (f"{loc} = {shown}: {msg}" if loc else msg), (loc or None)
