"""A request inside the reference engine, a finished one as ``generate`` returns it, and the
prompt check ``add_request`` applies."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
