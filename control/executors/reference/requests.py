"""A request inside the reference engine, a finished one as ``generate`` returns it, and the
prompt check ``add_request`` applies."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from control.errors import ConfigError
from control.executors.base import FinishReason, RequestOutput, SamplingParams
from control.executors.reference.sampling import PositionNoise

I64 = np.int64
UNSEEDED = 0x5EED  # third part of an unseeded request's noise key, so it never equals a seeded one's


@dataclass(slots=True, eq=False)
class Request:
    rid: int
    prompt: np.ndarray  # (P,) int64 prompt token ids
    params: SamplingParams
    category: int
    noise: PositionNoise | None  # None: greedy
    slot: int = -1
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0


@dataclass
class GenerationResult:
    """A finished request, as ``ReferenceEngine.generate`` returns it."""

    request_id: int
    token_ids: list[int]
    finish_reason: FinishReason | None
    drafted: int = 0
    accepted: int = 0
    outputs: list[RequestOutput] = field(default_factory=list, repr=False)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def check_prompt(prompt_ids, params: SamplingParams, vocab: int, max_len: int) -> np.ndarray:
    """The prompt as (P,) int64, or ConfigError saying what is wrong with it."""
    try:
        prompt = np.asarray(list(prompt_ids))
    except TypeError:
        raise ConfigError(f"prompt must be a sequence of token ids, got {type(prompt_ids).__name__}") from None
    if prompt.size == 0:
        raise ConfigError("prompt is empty; give at least one token id")
    if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
        raise ConfigError(f"prompt must be a flat sequence of integer token ids (got dtype {prompt.dtype}, shape {prompt.shape})")
    bad = prompt[(prompt < 0) | (prompt >= vocab)]
    if bad.size:
        raise ConfigError(f"prompt token id {int(bad[0])} is outside the vocabulary [0, {vocab})")
    P = int(prompt.size)
    if P + params.max_tokens > max_len:
        raise ConfigError(
            f"prompt of {P} tokens + max_tokens {params.max_tokens} exceeds the engine's max sequence length "
            f"{max_len}; shorten the prompt or lower max_tokens (at most {max(max_len - P, 0)} here)"
        )
    return prompt.astype(I64)
