"""What each TensorRT-LLM path really verifies per request (``control.goodput.granularity``), read
against TensorRT-LLM's source:

- ``tensorrt`` backend, our BLS (draft_target, ngram): per request. Every request goes to the target
  engine on its own with exactly its ``draft_input_ids`` and ``request_output_len`` = k + 1
  (``tensors.verify_request``), as the stock BLS's ``_spec_generate`` sends one request's
  ``num_draft_tokens``.
- ``tensorrt`` backend, EAGLE-1 engines: the engine drafts and verifies its own tree; k is not ours
  to choose (per batch, the engine's).
- ``pytorch`` backend with the drafter hook (``control: drafter-hook``, n-gram): padded to the
  static max K on every step. ``py_executor.py`` calls ``drafter.pad_draft_tokens_for_cuda_graph``
  right after ``prepare_draft_tokens``, which pads every generation request's ``py_draft_tokens``
  to ``_static_max_total_draft_tokens``; the hook keeps ``max_concurrency`` None, so
  ``should_use_spec_decode`` never switches speculation off and a k = 0 draft is padded too.
- ``pytorch`` backend, two-model draft_target / ngram under ``draft_len_schedule``: the drafter drafts
  the schedule's k for the batch size, and the same padding restores every draft to the static
  max; the schedule's k = 0 turns speculation off for the iteration (``use_spec_decode`` False),
  so an off step verifies one token per request.
- ``pytorch`` backend, one-model EAGLE3 and MTP: ``runtime_draft_len`` for the whole batch (per batch).

Checked against source only (the stored TensorRT-LLM copies); none of this has run on a GPU here.
"""

from __future__ import annotations

from control.errors import ConfigError
from control.goodput.granularity import PER_BATCH, PER_REQUEST, VerifyGranularity, padded

# The BLS orchestrator's and the drafter hook's declarations (see the module docstring).
BLS_GRANULARITY = PER_REQUEST


def hook_granularity(max_k: int) -> VerifyGranularity:
    """The user-provided drafter hook: padded to its static max K on every iteration."""
    return padded(max_k, always=True)


def deployment_granularity(backend: str, method: str, control: str | None, max_k: int) -> tuple[VerifyGranularity, str]:
    """(granularity, the path's name) for a ``specctl build`` deployment (its ``specctl.yaml``)."""
    if backend == "tensorrt":
        if method in ("draft_target", "ngram"):
            return BLS_GRANULARITY, "specctl_bls over TensorRT engines (per-request num_draft_tokens)"
        if method == "eagle":
            return PER_BATCH, "EAGLE-1 engine (the engine drafts and verifies its tree)"
    elif backend == "pytorch":
        if control == "drafter-hook":
            return hook_granularity(max_k), "LLM API with the user-provided drafter hook"
        if method in ("draft_target", "ngram"):
            return padded(max_k), "LLM API two-model drafter with draft_len_schedule"
        if method in ("eagle3", "mtp"):
            return PER_BATCH, f"LLM API one-model {method} (runtime_draft_len per iteration)"
    raise ConfigError(f"no TensorRT-LLM path for backend {backend!r} with method {method!r}; "
                      "backends: pytorch (draft_target, eagle3, ngram, mtp), tensorrt (draft_target, ngram, eagle)")
