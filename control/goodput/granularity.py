"""Verification granularity: how many tokens the target really verifies per request for the k chosen.

An executor states it; the step cost model (``StepCostModel.verify``) and the policies follow it.

- ``per_request``: request r's verify pass computes k_r + 1 tokens. The reference and simulated
  engines, and the ``tensorrt`` backend's BLS, which sends each request to the target engine with
  exactly its own ``draft_input_ids`` and ``request_output_len`` = k_r + 1.
- ``per_batch``: every request of the step verifies max_r k_r + 1 tokens (one draft length per
  iteration: TensorRT-LLM's one-model drafters run ``runtime_draft_len`` for the whole batch).
- ``padded``: every request verifies ``pad_to`` + 1 tokens whenever the step speculates, whatever
  its k. TensorRT-LLM's PyTorch executor calls ``Drafter.pad_draft_tokens_for_cuda_graph`` right
  after ``prepare_draft_tokens`` (``_torch/pyexecutor/py_executor.py``), which extends every
  generation request's ``py_draft_tokens`` with zeros up to the drafter's static maximum
  (``_static_max_total_draft_tokens``, ``_torch/speculative/drafter.py``); two-model drafters under
  ``draft_len_schedule`` draft the schedule's k but are padded back to that maximum too
  (``_torch/speculative/model_drafter.py``). ``always``: the step is padded even when no request
  drafts: the user-provided drafter hook runs with ``max_concurrency`` None, so
  ``should_use_spec_decode`` never turns speculation off and an empty draft is padded like any
  other. Without ``always`` a step where every k is 0 verifies one token per request (the schedule's
  k = 0 switches speculation off for the iteration).

Under ``padded`` a per-request k only changes what is drafted, never what is verified: the step's
decision is on or off, and each request's k then trades its drafting cost alone against its
accepted tokens (``control.goodput.granular``; with n-gram lookup, whose cost does not grow with k,
every request drafts its cap). Under ``per_batch`` the step's largest k sets everyone's verify cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

import numpy as np

from control.errors import ConfigError


class VerifyKind(str, Enum):
    per_request = "per_request"
    per_batch = "per_batch"
    padded = "padded"


@dataclass(frozen=True, slots=True)
class VerifyGranularity:
    """What the target verifies per request (see the module docstring)."""

    kind: VerifyKind = VerifyKind.per_request
    pad_to: int = 0  # padded: the static maximum K every draft is padded to
    always: bool = False  # padded: also when no request drafts (no engine-level off switch)

    def __post_init__(self) -> None:
        if self.kind == VerifyKind.padded and self.pad_to < 1:
            raise ConfigError(f"padded verification needs the static max draft length (pad_to >= 1), got {self.pad_to}")
        if self.kind != VerifyKind.padded and (self.pad_to or self.always):
            raise ConfigError(f"{self.kind.value} verification takes no pad_to/always; use padded:K")

    @property
    def per_request(self) -> bool:
        return self.kind == VerifyKind.per_request

    def verified_tokens(self, k: np.ndarray) -> np.ndarray:
        """Tokens the target computes per request for draft lengths ``k``. Shape (n,) -> (n,)."""
        k = np.asarray(k, dtype=np.int64)
        if self.kind == VerifyKind.per_request:
            return k + 1
        on = bool(k.size) and int(k.max()) > 0
        if self.kind == VerifyKind.per_batch:
            return np.full(k.shape, int(k.max()) + 1 if on else 1, dtype=np.int64)
        return np.full(k.shape, self.pad_to + 1 if (on or self.always) else 1, dtype=np.int64)

    def uniform_tokens(self, k):
        """Tokens per request for a uniform k over a batch (broadcasts over arrays of k)."""
        k = np.asarray(k, dtype=np.float64)
        if self.kind != VerifyKind.padded:
            return k + 1.0
        return np.where((k > 0) | self.always, float(self.pad_to + 1), 1.0)

    def __str__(self) -> str:
        if self.kind != VerifyKind.padded:
            return self.kind.value
        return f"padded:{self.pad_to}" + (":always" if self.always else "")

    def describe(self) -> str:
        """One line for ``specctl explain`` and logs."""
        if self.kind == VerifyKind.per_request:
            return "per request: the target verifies each request's own k + 1 tokens"
        if self.kind == VerifyKind.per_batch:
            return "per batch: every request verifies the step's largest k + 1 tokens"
        if self.always:
            return (f"padded to the static max K = {self.pad_to}: every request verifies {self.pad_to + 1} tokens at "
                    f"every step whatever its k, k = 0 included; a request's k changes only its drafting")
        return (f"padded to the static max K = {self.pad_to}: every request verifies {self.pad_to + 1} tokens "
                f"whenever the step drafts, whatever its k; the step is on or off, a request's k changes only its "
                f"drafting")


PER_REQUEST = VerifyGranularity()
PER_BATCH = VerifyGranularity(VerifyKind.per_batch)


def padded(pad_to: int, always: bool = False) -> VerifyGranularity:
    return VerifyGranularity(VerifyKind.padded, int(pad_to), bool(always))


ACCEPTED = "per_request, per_batch, padded:K or padded:K:always (K = the static max draft length, >= 1)"


def parse_granularity(text: str) -> VerifyGranularity:
    """``per_request`` | ``per_batch`` | ``padded:K`` | ``padded:K:always``; ConfigError names the value."""
    t = str(text).strip().lower().replace("-", "_")
    if t in (VerifyKind.per_request.value, VerifyKind.per_batch.value):
        return VerifyGranularity(VerifyKind(t))
    m = re.fullmatch(r"padded:([0-9]{1,2})(:always)?", t)
    if not m or int(m.group(1)) < 1:
        raise ConfigError(f"verify granularity {text!r} is not one of: {ACCEPTED}")
    return padded(int(m.group(1)), bool(m.group(2)))
