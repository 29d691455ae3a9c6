"""The ``llm`` model's request contract: tensor names, parsing and validation, without Triton.

Names follow tensorrtllm_backend's ensemble and BLS models so clients written for a stock
TensorRT-LLM deployment work unchanged: ``text_input`` (or ``input_ids``), ``max_tokens``, ``stream``,
``temperature``, ``top_k``, ``top_p``, ``random_seed``, ``stop_words``, ``bad_words``, ``end_id``,
``num_draft_tokens`` (a per-request cap on the draft length) -> ``text_output``, ``output_ids`` and the
per-request speculation metrics. Two additions: ``policy`` (``none`` turns speculation off for the
request; the deployment's policy is switched through the control plane) and ``stats`` (a request
whose ``stats`` is true gets the instance's counters as JSON in ``text_output`` instead of text).

``parse_request`` takes the request's tensors as a name -> numpy array mapping and raises
``ConfigError`` with one line naming the value and what is accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from control.errors import ConfigError
from control.executors.base import MAX_SEED, SamplingParams
from control.policyspec import parse_policy_spec

# Output names: ours first, then the names `specctl build` renders for the TensorRT-LLM llm config.
DRAFTED_OUTPUTS = ("drafted_tokens", "total_draft_tokens")
ACCEPTED_OUTPUTS = ("accepted_tokens", "total_accepted_draft_tokens")

SCALARS = {  # name -> (kind, lo, hi)
    "max_tokens": ("int", 1, None),
    "temperature": ("float", 0.0, None),
    "top_k": ("int", 0, None),
    "top_p": ("float", 0.0, 1.0),
    "random_seed": ("int", 0, MAX_SEED),
    "num_draft_tokens": ("int", 0, None),
    "end_id": ("int", 0, None),
}


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens: int = 1024  # the most tokens one request may ask for
    default_max_tokens: int = 64  # when the request gives none


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


@dataclass(frozen=True, slots=True)
class StatsRequest:
    pass


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
            raise ConfigError(f"{name} = {v!r}: must be an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))
    elif not (ok_int or isinstance(v, float)) or not np.isfinite(v):
        raise ConfigError(f"{name} = {v!r}: must be a finite number >= {lo}")
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
    """(token ids per word, the words themselves); empty words and words without tokens are dropped."""
    out, texts = [], []
    for w in np.asarray(arr, dtype=object).reshape(-1):
        s = w.decode("utf-8", "replace") if isinstance(w, bytes) else str(w)
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
    raise ConfigError(f"{name} = {v!r}: must be true or false")


def parse_request(tensors: Mapping[str, np.ndarray | None], *, limits: Limits, encode: Callable[[str], list[int]],
                  encode_words: Callable[[str], list[int]], deployment_policy: str) -> GenerateRequest | StatsRequest:
    """Validate one request's tensors; ``encode`` tokenises a prompt, ``encode_words`` a stop/bad word."""
    get = tensors.get
    if get("stats") is not None and _flag("stats", get("stats")):
        return StatsRequest()
    ids = get("input_ids")
    if ids is not None and np.asarray(ids).size:
        a = np.asarray(ids)
        if not np.issubdtype(a.dtype, np.integer):
            raise ConfigError(f"input_ids must be integer token ids (got {a.dtype})")
        prompt = [int(x) for x in a.reshape(-1)]
    else:
        if get("text_input") is None:
            raise ConfigError("text_input is missing: give the prompt text (a string) or input_ids (token ids)")
        text = _text("text_input", get("text_input"))
        if not text.strip():
            raise ConfigError("text_input is empty: give the prompt text to continue")
        prompt = encode(text)
    vals = {}
    for name, (kind, lo, hi) in SCALARS.items():
        arr = get(name)
        if arr is not None and np.asarray(arr).size:
            vals[name] = _number(name, arr, kind, lo, hi)
    max_tokens = vals.pop("max_tokens", limits.default_max_tokens)
    if max_tokens > limits.max_tokens:
        raise ConfigError(f"max_tokens = {max_tokens}: must be 1..{limits.max_tokens} on this deployment")
    if "top_p" in vals and vals["top_p"] <= 0:
        raise ConfigError(f"top_p = {vals['top_p']}: must be in (0, 1] (1 = no nucleus filtering)")
    if get("policy") is not None and np.asarray(get("policy")).size:
        name = _text("policy", get("policy")).strip()
        if name:
            spec = str(parse_policy_spec(name))  # unknown names: ConfigError listing the accepted ones
            if spec == "none":
                vals["num_draft_tokens"] = 0
            elif spec != deployment_policy:
                raise ConfigError(f"policy = {name!r}: a request may ask for 'none' or the deployment's policy "
                                  f"'{deployment_policy}'; switch the deployment's policy with PUT /v1/overrides")
    stream = _flag("stream", get("stream")) if get("stream") is not None and np.asarray(get("stream")).size else False
    stop, stop_texts = _words("stop_words", get("stop_words"), encode_words) if get("stop_words") is not None else ([], ())
    bad, bad_texts = _words("bad_words", get("bad_words"), encode_words) if get("bad_words") is not None else ([], ())
    params = SamplingParams(max_tokens=int(max_tokens), temperature=float(vals.get("temperature", 0.0)),
                            top_k=int(vals.get("top_k", 0)), top_p=float(vals.get("top_p", 1.0)),
                            random_seed=vals.get("random_seed"), stop_words=stop, bad_words=bad,
                            num_draft_tokens=vals.get("num_draft_tokens"), end_id=vals.get("end_id"))
    return GenerateRequest(prompt, params, stream, stop_texts, bad_texts)
