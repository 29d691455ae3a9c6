"""The tensorrtllm backend's request/response tensors, as the Triton ``tensorrt_llm`` model declares
them (``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``) and the stock
BLS uses them (``tensorrt_llm_bls/1/lib/triton_decoder.py``):

- draft step: ``input_ids`` = the whole sequence so far, ``request_output_len`` = k; the response's
  ``output_ids`` hold the draft tokens (``exclude_input_in_output``: true in our configs).
- verify step: ``input_ids`` = the same sequence, ``draft_input_ids`` = the k draft tokens,
  ``request_output_len`` = k + 1; the response holds the target's own tokens: the accepted draft
  prefix, its next token and, from an engine that goes on decoding to ``request_output_len`` (the
  stock BLS's ``_spec_generate`` appends all target ``output_ids``), plain decoding after that, up
  to k + 1 tokens in all. ``verified_tokens`` reads either shape.
- shapes carry a leading batch dimension of 1; ``output_ids`` is [1, beam, T], ``sequence_length``
  [1, beam].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from control.errors import SpecctlError
from control.executors.step.accept import accepted_run


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str  # Triton data type
    dims: str
    optional: bool = True
    scalar: bool = False  # dims [ 1 ] reshaped to [ ] by the backend
    ragged: bool = False


TRTLLM_INPUTS = (
    TensorSpec("input_ids", "TYPE_INT32", "[ -1 ]", optional=False, ragged=True),
    TensorSpec("input_lengths", "TYPE_INT32", "[ 1 ]", optional=False, scalar=True),
    TensorSpec("request_output_len", "TYPE_INT32", "[ 1 ]", optional=False, scalar=True),
    TensorSpec("draft_input_ids", "TYPE_INT32", "[ -1 ]", ragged=True),
    TensorSpec("draft_logits", "TYPE_FP32", "[ -1, -1 ]", ragged=True),
    TensorSpec("end_id", "TYPE_INT32", "[ 1 ]", scalar=True),
    TensorSpec("pad_id", "TYPE_INT32", "[ 1 ]", scalar=True),
    TensorSpec("temperature", "TYPE_FP32", "[ 1 ]", scalar=True),
    TensorSpec("runtime_top_k", "TYPE_INT32", "[ 1 ]", scalar=True),
    TensorSpec("runtime_top_p", "TYPE_FP32", "[ 1 ]", scalar=True),
    TensorSpec("seed", "TYPE_UINT64", "[ 1 ]", scalar=True),
    TensorSpec("return_generation_logits", "TYPE_BOOL", "[ 1 ]", scalar=True),
    TensorSpec("return_perf_metrics", "TYPE_BOOL", "[ 1 ]", scalar=True),
    TensorSpec("exclude_input_in_output", "TYPE_BOOL", "[ 1 ]", scalar=True),
    TensorSpec("streaming", "TYPE_BOOL", "[ 1 ]", scalar=True),
    TensorSpec("stop", "TYPE_BOOL", "[ 1 ]", scalar=True),
)

TRTLLM_OUTPUTS = (
    TensorSpec("output_ids", "TYPE_INT32", "[ -1, -1 ]"),
    TensorSpec("sequence_length", "TYPE_INT32", "[ -1 ]"),
    TensorSpec("generation_logits", "TYPE_FP32", "[ -1, -1, -1 ]"),
    TensorSpec("acceptance_rate", "TYPE_FP32", "[ 1 ]"),
    TensorSpec("total_accepted_draft_tokens", "TYPE_INT32", "[ 1 ]"),
    TensorSpec("total_draft_tokens", "TYPE_INT32", "[ 1 ]"),
)

INPUT_NAMES = frozenset(t.name for t in TRTLLM_INPUTS)
OUTPUT_NAMES = ("output_ids", "sequence_length")


def _i32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int32)


def generate_request(seq: np.ndarray, n: int, end_id: int | None = None) -> dict[str, np.ndarray]:
    """``n`` tokens after ``seq`` (a draft step, or plain decoding)."""
    seq = _i32(seq).reshape(-1)
    req = {"input_ids": seq[None, :], "input_lengths": _i32([[seq.size]]), "request_output_len": _i32([[n]]),
           "exclude_input_in_output": np.array([[True]]), "streaming": np.array([[False]])}
    if end_id is not None:
        req["end_id"] = _i32([[end_id]])
        req["pad_id"] = _i32([[end_id]])
    return req


def verify_request(seq: np.ndarray, draft: np.ndarray, end_id: int | None = None) -> dict[str, np.ndarray]:
    """Verify ``draft`` after ``seq``: the target returns the accepted prefix plus one token of its own."""
    draft = _i32(draft).reshape(-1)
    req = generate_request(seq, draft.size + 1, end_id)
    if draft.size:
        req["draft_input_ids"] = draft[None, :]
    return req


def output_tokens(resp: dict[str, np.ndarray]) -> np.ndarray:
    """New tokens of a response (beam 0), ``sequence_length`` of them."""
    try:
        ids = np.asarray(resp["output_ids"])
        n = int(np.asarray(resp["sequence_length"]).reshape(-1)[0])
    except KeyError as e:
        raise SpecctlError(f"tensorrt_llm response lacks output '{e.args[0]}'; is the model a tensorrtllm model "
                           f"with exclude_input_in_output: true?") from None
    ids = ids.reshape(-1) if ids.ndim <= 1 else ids.reshape(ids.shape[0], -1, ids.shape[-1])[0, 0]
    return ids[:n].astype(np.int64)


def verified_tokens(resp: dict[str, np.ndarray], draft: np.ndarray) -> tuple[np.ndarray, int]:
    """The target's new tokens from a verify response, and how many of ``draft`` it accepted.

    Every returned token is the target's own (the accepted prefix equals the drafts it matched), so
    all of them are output, whether the engine answered accepted + 1 tokens or the full k + 1.
    """
    new = output_tokens(resp)  # [n], 1 <= n <= k + 1
    k = int(np.asarray(draft).size)
    if new.size == 0:
        raise SpecctlError("the target returned no token for a verify request")
    if new.size > k + 1:
        raise SpecctlError(f"the target returned {new.size} tokens for {k} draft tokens (request_output_len {k + 1}); "
                           f"set exclude_input_in_output to true in the tensorrt_llm model's config")
    m = min(k, new.size - 1)
    match = new[None, :m] == np.asarray(draft)[None, :m]  # (1, m): the target's token equals the draft's
    accepted = int(accepted_run(match)[0])
    return new, accepted


def check_request(req: dict[str, np.ndarray]) -> tuple[np.ndarray, int, np.ndarray, int | None]:
    """Validate a request as the backend would; returns (input ids, output len, draft ids, end id)."""
    unknown = set(req) - INPUT_NAMES
    if unknown:
        raise SpecctlError(f"unknown input tensor(s) {sorted(unknown)}; the tensorrt_llm model accepts "
                           f"{', '.join(sorted(INPUT_NAMES))}")
    for name in ("input_ids", "input_lengths", "request_output_len"):
        if name not in req:
            raise SpecctlError(f"input tensor '{name}' is required")
    ids = np.asarray(req["input_ids"]).reshape(-1).astype(np.int64)
    n_in = int(np.asarray(req["input_lengths"]).reshape(-1)[0])
    if n_in != ids.size or n_in < 1:
        raise SpecctlError(f"input_lengths {n_in} does not match input_ids of {ids.size} tokens")
    out_len = int(np.asarray(req["request_output_len"]).reshape(-1)[0])
    if out_len < 1:
        raise SpecctlError(f"request_output_len {out_len} must be >= 1")
    draft = np.asarray(req.get("draft_input_ids", np.zeros((1, 0)))).reshape(-1).astype(np.int64)
    end = req.get("end_id")
    end_id = None if end is None else int(np.asarray(end).reshape(-1)[0])
    return ids, out_len, draft, end_id
