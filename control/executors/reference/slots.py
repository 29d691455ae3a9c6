"""The reference engine's slot table: per batch slot, the request it holds, its tokens so far and
its sampling parameters (S = max_batch slots, L = max_len positions per slot). The KV pool
(``kvpool.py``) holds the caches of the same slots."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from control.executors.reference.requests import Request

I64 = np.int64
NO_REQUEST = -1  # rid of a free slot
NO_DRAFTER = -1  # last_drafter of a request that has not drafted yet
NO_CATEGORY = -1


@dataclass(slots=True)
class ViewRows:
    """What a step's view reads of the engine's mutable state, gathered for n decoding slots (copies,
    so the engine may go on writing its arrays while another thread builds the view from these)."""

    slots: np.ndarray  # (n,) int64
    n_tok: np.ndarray  # (n,)
    k_cap: np.ndarray  # (n,)
    draft_len: np.ndarray  # (n, m) each drafter's cached tokens
    rid: np.ndarray  # (n,)
    remaining: np.ndarray  # (n,) max_tokens - generated
    drafter: np.ndarray  # (n,) last drafter
    category: np.ndarray | None  # (n,), None while no request carries one
    free_kv: int
    waiting: int
    now: float  # the engine's clock, seconds since start
    step: int
    ngram_avail: np.ndarray | None = None  # (n,) the n-gram lookup's proposal at max_k; None: no n-gram drafter


class SlotTable:
    def __init__(self, slots: int, max_len: int) -> None:
        S = slots
        self.tok = np.zeros((S, max_len), dtype=I64)  # (S, L) prompt + generated tokens
        self.n_tok = np.zeros(S, dtype=I64)  # (S,) tokens in ``tok``
        self.decoding = np.zeros(S, dtype=bool)  # (S,) past its prefill, not finished
        self.rid = np.full(S, NO_REQUEST, dtype=I64)  # (S,) request id
        self.k_cap = np.zeros(S, dtype=I64)  # (S,) the request's cap on k (num_draft_tokens, max_k)
        self.last_drafter = np.full(S, NO_DRAFTER, dtype=I64)  # (S,) drafter of the latest draft
        self.category = np.full(S, NO_CATEGORY, dtype=I64)  # (S,)
        self.max_new = np.zeros(S, dtype=I64)  # (S,) max_tokens
        self.generated = np.zeros(S, dtype=I64)  # (S,) output tokens so far
        self.sampled = np.zeros(S, dtype=bool)  # (S,) temperature > 0
        self.temperature = np.ones(S, dtype=np.float32)  # (S,) 1 for greedy requests
        self.top_k = np.zeros(S, dtype=I64)  # (S,) 0 = off
        self.top_p = np.ones(S, dtype=np.float32)  # (S,) 1 = off
        self.req: list[Request | None] = [None] * S  # (S,) the request in each slot

    def fill(self, s: int, req: Request, max_k: int) -> None:
        """Slot ``s`` now holds ``req`` with its prompt, caps and sampling parameters."""
        P = int(req.prompt.size)
        p = req.params
        req.slot = s
        self.req[s] = req
        self.tok[s, :P] = req.prompt
        self.n_tok[s] = P
        self.rid[s] = req.rid
        self.k_cap[s] = max_k if p.num_draft_tokens is None else min(p.num_draft_tokens, max_k)
        self.last_drafter[s] = NO_DRAFTER
        self.category[s] = req.category
        self.max_new[s] = p.max_tokens
        self.generated[s] = 0
        self.sampled[s] = not p.greedy
        self.temperature[s] = p.temperature if not p.greedy else 1.0
        self.top_k[s] = p.top_k
        self.top_p[s] = p.top_p

    def clear(self, s: int) -> None:
        """Slot ``s`` holds no request any more."""
        self.decoding[s] = False
        self.req[s] = None
        self.rid[s] = NO_REQUEST
