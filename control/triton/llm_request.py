"""The ``llm`` model's request contract: tensor names, parsing and validation, without Triton.

Names follow tensorrtllm_backend's ensemble and BLS models: ``text_input`` (or ``input_ids``),
``max_tokens``, ``stream``, ``temperature``, ``top_k``, ``top_p``, ``random_seed``, ``stop_words``,
``bad_words``, ``end_id``, ``pad_id``, ``num_draft_tokens`` (a per-request cap on the draft length),
``beam_width`` (1 only), ``num_return_sequences`` (1 only), ``exclude_input_in_output`` and the
``return_*`` flags -> ``text_output``, ``output_ids`` and the per-request speculation metrics under
our names and upstream's (``total_draft_tokens`` / ``total_accepted_draft_tokens``), and ``stop`` (a
request with ``stop`` true ends the request in flight with the same request id, as upstream's
``tensorrt_llm`` model does; see ``control/triton/stops.py``). Three additions:
``policy`` (``none`` turns speculation off for the request; the deployment's policy is switched
through the control plane), ``stats`` (a request whose ``stats`` is true gets the instance's
counters as JSON in ``text_output`` instead of text) and ``ignore_eos`` (generate ``max_tokens``
even past the end token, as TensorRT-LLM's ``SamplingParams.ignore_eos``: benchmarks' fixed lengths).

What differs from a stock TensorRT-LLM deployment (see ``triton_repo/README.md``): the ``llm`` model
takes unbatched inputs (shape ``[1]``, words ``[N]``); the ``ensemble`` and ``tensorrt_llm_bls``
models take upstream's batched shapes (``[B, 1]``, words ``[B, N]``) and forward each row to ``llm``.
Without ``exclude_input_in_output`` the output excludes the prompt (upstream's default includes it);
sampling penalties, log probs and logits are refused with a message naming the input.

``parse_request`` takes the request's tensors as a name -> numpy array mapping and raises
``ConfigError`` with one line naming the value and what is accepted. ``check_parameters`` refuses
request parameters that are not inputs (Triton's HTTP ``generate`` passes a misspelt field as one).
``check_generate_body`` checks a ``generate`` JSON body against the same contract before Triton's
JSON layer sees it (types, int32 range, unknown names), for a front end that proxies Triton's HTTP.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from control.errors import ConfigError
from control.executors.base import MAX_SEED, SamplingParams
from control.policyspec import parse_policy_spec

# Output names: ours first, then the names `specctl build` renders for the TensorRT-LLM llm config.
DRAFTED_OUTPUTS = ("drafted_tokens", "total_draft_tokens")
ACCEPTED_OUTPUTS = ("accepted_tokens", "total_accepted_draft_tokens")
# tensorrtllm_backend's per-request performance outputs (``return_perf_metrics``).
PERF_OUTPUTS = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
                "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
STOPPING = "the server is stopping"  # how a request ended or refused by a drain is told (front ends: 503)
MAX_POLICY_CHARS = 200  # longer policy names are refused before parsing
MAX_WORDS = 64  # stop or bad words per request
MAX_WORD_CHARS = 1024  # characters in one stop or bad word

# Every input of the llm model: name -> Triton dtype (as triton_repo/llm/config.pbtxt.in declares it).
INPUTS = {
    "text_input": "BYTES", "input_ids": "INT32", "max_tokens": "INT32", "stream": "BOOL",
    "temperature": "FP32", "top_k": "INT32", "top_p": "FP32", "random_seed": "UINT64",
    "stop_words": "BYTES", "bad_words": "BYTES", "end_id": "INT32", "ignore_eos": "BOOL", "pad_id": "INT32",
    "num_draft_tokens": "INT32", "beam_width": "INT32", "num_return_sequences": "INT32",
    "exclude_input_in_output": "BOOL", "return_perf_metrics": "BOOL", "return_log_probs": "BOOL",
    "return_context_logits": "BOOL", "return_generation_logits": "BOOL",
    "repetition_penalty": "FP32", "presence_penalty": "FP32", "frequency_penalty": "FP32",
    "length_penalty": "FP32", "min_tokens": "INT32", "policy": "BYTES", "stats": "BOOL", "stop": "BOOL",
}
LIST_INPUTS = ("input_ids", "stop_words", "bad_words")  # the rest hold one value
# Request parameters Triton itself uses; any other parameter is a field the model does not know.
TRITON_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output",
                     "headers")
# The id a request without a Triton request id is known by for stop requests: the front end's KServe
# proxy sets it on a non-streamed generate, whose HTTP body cannot carry a request id in Triton 2.51.
STOP_ID_PARAMETER = "specctl_stop_id"

SCALARS = {  # name -> (kind, lo, hi)
    "max_tokens": ("int", 1, None),
    "temperature": ("float", 0.0, None),
    "top_k": ("int", 0, None),
    "top_p": ("float", 0.0, 1.0),
    "random_seed": ("int", 0, MAX_SEED),
    "num_draft_tokens": ("int", 0, None),
    "end_id": ("int", 0, None),
    "pad_id": ("int", 0, None),
}
# Inputs accepted only at the value that leaves generation unchanged: name -> that value.
NEUTRAL = {"beam_width": 1, "num_return_sequences": 1, "repetition_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0, "length_penalty": 1.0, "min_tokens": 0, "return_log_probs": False,
           "return_context_logits": False, "return_generation_logits": False}
NEUTRAL_WHY = {"beam_width": "beam search is not supported", "num_return_sequences": "one sequence per request",
               "min_tokens": "minimum lengths are not supported; for a fixed output length send ignore_eos true "
                             "with max_tokens", "return_log_probs": "log probs are not returned",
               "return_context_logits": "logits are not returned", "return_generation_logits": "logits are not returned"}


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens: int = 1024  # the most tokens one request may ask for
    default_max_tokens: int = 64  # when the request gives none
    max_prompt_bytes: int = 1 << 20  # text_input longer than this is refused before tokenising
    vocab_size: int = 0  # input_ids must be below this (0: not checked here)


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    # The stop and bad words as the client sent them (those that encode to at least one token), for
    # engines that take strings (TensorRT-LLM's ``SamplingParams.stop`` / ``bad``); ``params`` holds
    # the same words as token ids.
    stop_texts: tuple[str, ...] = ()
    bad_texts: tuple[str, ...] = ()
    include_input: bool = False  # exclude_input_in_output was given as false (upstream's default output)
    prompt_text: str = ""
    perf_metrics: bool = False  # return_perf_metrics
    # The prompt text is to be tokenised off execute() (prompt_ids is empty until then).
    tokenize_later: bool = False


@dataclass(frozen=True, slots=True)
class StatsRequest:
    pass


@dataclass(frozen=True, slots=True)
class StopRequest:
    """``stop`` true: end the request in flight with the same request id (tensorrtllm_backend's
    ``stop`` input); the stop request itself is answered with one empty final response."""


def _show(v: Any, width: int = 40) -> str:
    """A value for an error message, cut to ``width`` characters."""
    r = repr(v)
    return r if len(r) <= width else r[:width] + "..."


def _scalar(name: str, arr: np.ndarray):
    a = np.asarray(arr)
    if a.size != 1:
        raise ConfigError(f"{name} must hold exactly one value (got shape {list(a.shape)})")
    v = a.reshape(-1)[0]
    if isinstance(v, bytes | np.bytes_):
        v = v.decode("utf-8", "replace")
    return v.item() if hasattr(v, "item") else v


def _number(name: str, arr: np.ndarray, kind: str, lo, hi):
    v = _scalar(name, arr)
    ok_int = isinstance(v, int) and not isinstance(v, bool)
    if kind == "int":
        if not ok_int:
            raise ConfigError(f"{name} = {_show(v)}: must be an integer >= {lo}"
                              + (f" and <= {hi}" if hi is not None else ""))
    elif not (ok_int or isinstance(v, float)) or not np.isfinite(v):
        raise ConfigError(f"{name} = {_show(v)}: must be a finite number >= {lo}")
    if v < lo or (hi is not None and v > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{name} = {v}: must be {rng}")
    return v


def _text(name: str, arr: np.ndarray) -> str:
    v = _scalar(name, arr)
    if not isinstance(v, str):
        raise ConfigError(f"{name} must be a string (got {type(v).__name__})")
    return v


def _words(name: str, arr: np.ndarray, encode: Callable[[str], list[int]]) -> tuple[list[list[int]], tuple[str, ...]]:
    """(token ids per word, the words themselves); empty words and words without tokens are dropped.

    Takes ``[N]`` (ours) or ``[1, N]`` (tensorrtllm_backend's batched shape) alike."""
    flat = np.asarray(arr, dtype=object).reshape(-1)  # [N]
    if flat.size > MAX_WORDS:
        raise ConfigError(f"{name} holds {flat.size} words: at most {MAX_WORDS}")
    out, texts = [], []
    for w in flat:
        s = w.decode("utf-8", "replace") if isinstance(w, bytes) else str(w)
        if len(s) > MAX_WORD_CHARS:
            raise ConfigError(f"{name}: a word of {len(s)} characters; at most {MAX_WORD_CHARS}")
        if s:
            ids = encode(s)
            if ids:
                out.append(ids)
                texts.append(s)
    return out, tuple(texts)


def _flag(name: str, arr: np.ndarray) -> bool:
    v = _scalar(name, arr)
    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ConfigError(f"{name} = {_show(v)}: must be true or false")


def _given(tensors: Mapping[str, np.ndarray | None], name: str) -> bool:
    v = tensors.get(name)
    return v is not None and np.asarray(v).size > 0


def check_parameters(parameters: str | Mapping[str, Any] | None) -> None:
    """Refuse request parameters that are not Triton's own (or the stop id): a field the model does not know."""
    if not parameters:
        return
    params = json.loads(parameters) if isinstance(parameters, str) else parameters
    unknown = sorted(k for k in params if k not in TRITON_PARAMETERS and k != STOP_ID_PARAMETER
                     and not k.startswith("triton_"))
    if unknown:
        name = unknown[0][:60]
        raise ConfigError(f"unknown field '{name}': the llm model accepts {', '.join(INPUTS)}")


def request_key(request_id: str, parameters: str | Mapping[str, Any] | None) -> str:
    """The id stop requests name a request by: its Triton request id, else its ``STOP_ID_PARAMETER``
    (a non-streamed HTTP generate from the front end), else "" (it cannot be stopped)."""
    if request_id or not parameters:
        return request_id or ""
    params = json.loads(parameters) if isinstance(parameters, str) else parameters
    key = params.get(STOP_ID_PARAMETER, "")
    return key if isinstance(key, str) else ""


def _neutral_inputs(tensors: Mapping[str, np.ndarray | None]) -> None:
    for name, neutral in NEUTRAL.items():
        if not _given(tensors, name):
            continue
        v = _flag(name, tensors[name]) if isinstance(neutral, bool) else _scalar(name, tensors[name])
        if isinstance(v, bool) != isinstance(neutral, bool) or v != neutral:
            why = NEUTRAL_WHY.get(name, "sampling penalties are not supported")
            raise ConfigError(f"{name} = {_show(v)}: only {str(neutral).lower()} is accepted ({why})")


def _prompt(tensors: Mapping[str, np.ndarray | None], limits: Limits, encode: Callable[[str], list[int]],
            inline_bytes: int | None = None) -> tuple[list[int] | None, str]:
    """(prompt token ids, prompt text or '' for input_ids); sizes are checked before tokenising. The ids
    are None for a text over ``inline_bytes`` bytes: the caller tokenises it later."""
    if _given(tensors, "input_ids"):
        a = np.asarray(tensors["input_ids"])
        if not np.issubdtype(a.dtype, np.integer):
            raise ConfigError(f"input_ids must be integer token ids (got {a.dtype})")
        flat = a.reshape(-1).astype(np.int64)  # [n]
        hi = (limits.vocab_size or INT32_MAX + 1) - 1
        bad = np.flatnonzero((flat < 0) | (flat > hi))
        if bad.size:
            i = int(bad[0])
            raise ConfigError(f"input_ids[{i}] = {int(flat[i])}: token ids must be 0..{hi}")
        return flat.tolist(), ""
    if tensors.get("text_input") is None:
        raise ConfigError("text_input is missing: give the prompt text (a string) or input_ids (token ids)")
    raw = np.asarray(tensors["text_input"], dtype=object).reshape(-1)
    if raw.size == 1 and isinstance(raw[0], bytes) and len(raw[0]) > limits.max_prompt_bytes:
        raise ConfigError(f"text_input is {len(raw[0])} bytes: at most {limits.max_prompt_bytes} on this deployment")
    text = _text("text_input", tensors["text_input"])
    size = len(text.encode("utf-8", "replace"))
    if size > limits.max_prompt_bytes:
        raise ConfigError(f"text_input is {size} bytes: at most {limits.max_prompt_bytes} on this deployment")
    if not text:  # whitespace is text: a model continues "\n\n" like any prompt
        raise ConfigError("text_input is empty: give the prompt text to continue")
    if inline_bytes is not None and size > inline_bytes:
        return None, text
    return encode(text), text


def _policy_cap(tensors: Mapping[str, np.ndarray | None], deployment_policy: str) -> int | None:
    """0 when the request asks for policy 'none'; None when it leaves the deployment's policy."""
    if not _given(tensors, "policy"):
        return None
    name = _text("policy", tensors["policy"]).strip()
    if not name:
        return None
    if len(name) > MAX_POLICY_CHARS:
        raise ConfigError(f"policy is {len(name)} characters long: at most {MAX_POLICY_CHARS} "
                          "(e.g. 'none' or the deployment's policy)")
    try:
        spec = str(parse_policy_spec(name))  # unknown names: ConfigError listing the accepted ones
    except ConfigError as e:
        raise ConfigError(str(e) if str(e).startswith("policy") else f"policy: {e}") from None
    except ValueError as e:  # e.g. a number too long to convert
        raise ConfigError(f"policy = {_show(name)}: not a policy name ({e})") from None
    if spec == "none":
        return 0
    if spec != deployment_policy:
        raise ConfigError(f"policy = {name!r}: a request may ask for 'none' or the deployment's policy "
                          f"'{deployment_policy}'; switch the deployment's policy with PUT /v1/overrides")
    return None


def parse_request(tensors: Mapping[str, np.ndarray | None], *, limits: Limits, encode: Callable[[str], list[int]],
                  encode_words: Callable[[str], list[int]], deployment_policy: str,
                  inline_prompt_bytes: int | None = None) -> GenerateRequest | StatsRequest | StopRequest:
    """Validate one request's tensors; ``encode`` tokenises a prompt, ``encode_words`` a stop/bad word.

    A text prompt over ``inline_prompt_bytes`` (None: no limit) is not tokenised here: the request
    comes back with ``tokenize_later`` set and empty ``prompt_ids``."""
    get = tensors.get
    if _given(tensors, "stop") and _flag("stop", get("stop")):
        return StopRequest()
    if _given(tensors, "stats") and _flag("stats", get("stats")):
        return StatsRequest()
    _neutral_inputs(tensors)
    vals = {name: _number(name, get(name), kind, lo, hi)
            for name, (kind, lo, hi) in SCALARS.items() if _given(tensors, name)}
    max_tokens = vals.pop("max_tokens", limits.default_max_tokens)
    if max_tokens > limits.max_tokens:
        raise ConfigError(f"max_tokens = {max_tokens}: must be 1..{limits.max_tokens} on this deployment")
    if "top_p" in vals and vals["top_p"] <= 0:
        raise ConfigError(f"top_p = {vals['top_p']}: must be in (0, 1] (1 = no nucleus filtering)")
    cap = _policy_cap(tensors, deployment_policy)
    if cap is not None:
        vals["num_draft_tokens"] = cap
    stream = _flag("stream", get("stream")) if _given(tensors, "stream") else False
    exclude = _flag("exclude_input_in_output", get("exclude_input_in_output")) \
        if _given(tensors, "exclude_input_in_output") else True
    perf = _flag("return_perf_metrics", get("return_perf_metrics")) if _given(tensors, "return_perf_metrics") else False
    ignore_eos = _flag("ignore_eos", get("ignore_eos")) if _given(tensors, "ignore_eos") else False
    prompt, prompt_text = _prompt(tensors, limits, encode, inline_prompt_bytes)
    stop, stop_texts = _words("stop_words", get("stop_words"), encode_words) if get("stop_words") is not None else ([], ())
    bad, bad_texts = _words("bad_words", get("bad_words"), encode_words) if get("bad_words") is not None else ([], ())
    params = SamplingParams(max_tokens=int(max_tokens), temperature=float(vals.get("temperature", 0.0)),
                            top_k=int(vals.get("top_k", 0)), top_p=float(vals.get("top_p", 1.0)),
                            random_seed=vals.get("random_seed"), stop_words=stop, bad_words=bad,
                            num_draft_tokens=vals.get("num_draft_tokens"), end_id=vals.get("end_id"),
                            ignore_eos=ignore_eos, stop_texts=tuple(stop_texts), bad_texts=tuple(bad_texts))
    return GenerateRequest(prompt or [], params, stream, stop_texts, bad_texts, include_input=not exclude and not stream,
                           prompt_text=prompt_text, perf_metrics=perf, tokenize_later=prompt is None)


_JSON_RANGES = {"INT32": (-(2**31), INT32_MAX), "UINT64": (0, UINT64_MAX)}


def _json_value(name: str, dtype: str, v: Any) -> None:
    """Check one JSON value against the input's Triton dtype (Triton's JSON layer truncates to int32)."""
    if dtype == "BYTES":
        if not isinstance(v, str):
            raise ConfigError(f"{name} = {json.dumps(v)[:40]}: must be a string")
    elif dtype == "BOOL":
        if not isinstance(v, bool):
            raise ConfigError(f"{name} = {json.dumps(v)[:40]}: must be true or false")
    elif dtype == "FP32":
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ConfigError(f"{name} = {json.dumps(v)[:40]}: must be a finite number")
    else:
        lo, hi = _JSON_RANGES[dtype]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{name} = {json.dumps(v)[:40]}: must be an integer")
        if not lo <= v <= hi:
            raise ConfigError(f"{name} = {v}: out of range {lo}..{hi}")


def check_generate_body(body: Any, *, stream_endpoint: bool) -> None:
    """Check a Triton ``generate`` / ``generate_stream`` JSON body for the llm model.

    Raises ``ConfigError`` naming the field for what Triton's JSON layer would answer with an unnamed
    500 (a string where a number goes), silently truncate (integers beyond int32) or ignore (a
    misspelt field); ``stream`` true on ``generate`` (one response only) is refused too."""
    if not isinstance(body, dict):
        raise ConfigError("the request body must be a JSON object of the llm model's inputs")
    for name, v in body.items():
        dtype = INPUTS.get(name)
        if dtype is None:
            check_parameters({name: v})
            continue
        if name in LIST_INPUTS and isinstance(v, list):
            if name == "input_ids" and not v:
                raise ConfigError("input_ids is empty: give at least one token id")
            for i, x in enumerate(v):
                _json_value(f"{name}[{i}]", dtype, x)
        else:
            _json_value(name, dtype, v)
    if body.get("stream") is True and not stream_endpoint:
        raise ConfigError("stream = true on generate: use generate_stream for streamed responses")
