"""``EngineConfig``: the limits of one reference engine instance."""

from __future__ import annotations

from dataclasses import dataclass

from control.errors import ConfigError
from control.policyspec import DEFAULT_MAX_K, MAX_K_LIMIT


@dataclass(frozen=True)
class EngineConfig:
    """Limits of one engine instance.

    max_batch: KV slots = the most requests decoding at once. max_len: positions per request
    (prompt + generated; default: the target's max_position_embeddings). max_k: the longest draft.
    token_budget: tokens one iteration may compute (prompts admitted + verified tokens). default
    drafter: the one whose cache is prefilled with the prompt (default: the first draft model).
    batch_invariant: False trades the bitwise lossless guarantee for speed at tiny batches (model.py).
    overlap_policy: decide step t+1 on a worker thread while step t's passes run, from estimates one
    step stale (``overlap.py``); the step loop then pays only the hand-over. Greedy output is the same.
    """

    max_batch: int = 32
    max_len: int | None = None
    max_k: int = DEFAULT_MAX_K
    token_budget: int | None = None
    default_drafter: str | None = None
    eos_token_id: int | None = None
    seed: int = 0
    batch_invariant: bool | None = None  # set the target's batch invariance (None: leave the model's setting)
    overlap_policy: bool = False

    def validate(self) -> EngineConfig:
        if not (isinstance(self.max_batch, int) and self.max_batch >= 1):
            raise ConfigError(f"max_batch = {self.max_batch!r}: must be an integer >= 1")
        if self.max_len is not None and not (isinstance(self.max_len, int) and self.max_len >= 2):
            raise ConfigError(f"max_len = {self.max_len!r}: must be an integer >= 2")
        if not (isinstance(self.max_k, int) and 0 <= self.max_k <= MAX_K_LIMIT):
            raise ConfigError(f"max_k = {self.max_k!r}: must be an integer in 0..{MAX_K_LIMIT}")
        if self.token_budget is not None and not (isinstance(self.token_budget, int) and self.token_budget >= 1):
            raise ConfigError(f"token_budget = {self.token_budget!r}: must be an integer >= 1")
        if not isinstance(self.overlap_policy, bool):
            raise ConfigError(f"overlap_policy = {self.overlap_policy!r}: must be True or False")
        return self
