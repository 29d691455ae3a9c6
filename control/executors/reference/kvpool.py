"""KV caches of the target and of every draft model, allocated per request by slot.

A request holds one slot from admission until it finishes or is cancelled; its KV rows live at that
slot index in every cache. The pool records how many positions of each cache are valid per slot:
truncating (rolling back rejected draft tokens) is lowering that number, so a rollback never
copies. ``free_tokens`` is the target cache's unused capacity in token positions.

Invariants the engine keeps (checked by ``check``): a running request with ``t`` tokens (prompt +
generated) has ``t - 1`` valid target positions (the last token is fed in the next step), and each
draft model's valid length is at most ``t - 1`` and covers exactly a prefix of those tokens.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from control.errors import SpecctlError
from control.executors.reference.model import KVCache, LlamaConfig

I64 = np.int64


class KVPool:
    def __init__(self, target_cfg: LlamaConfig, draft_cfgs: dict[int, LlamaConfig], n_drafters: int, slots: int,
                 max_len: int, device="cpu", dtype=torch.float32) -> None:
        self.slots = slots
        self.max_len = max_len
        self.target = KVCache(target_cfg, slots, max_len, device, dtype)
        self.drafts = {j: KVCache(cfg, slots, max_len, device, dtype) for j, cfg in draft_cfgs.items()}
        self.target_len = np.zeros(slots, dtype=I64)
        self.draft_len = np.zeros((slots, max(n_drafters, 1)), dtype=I64)
        self.in_use = np.zeros(slots, dtype=bool)
        self._free = list(range(slots))
        heapq.heapify(self._free)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """The lowest free slot (so the active slots stay compact)."""
        if not self._free:
            raise SpecctlError(f"no free KV slot (all {self.slots} in use); the scheduler admits only when one is free")
        s = heapq.heappop(self._free)
        self.in_use[s] = True
        self.target_len[s] = 0
        self.draft_len[s] = 0
        return s

    def release(self, slot: int) -> None:
        if not self.in_use[slot]:
            return
        self.in_use[slot] = False
        self.target_len[slot] = 0
        self.draft_len[slot] = 0
        heapq.heappush(self._free, slot)

    def free_tokens(self) -> int:
        """Unused target KV positions over all slots."""
        return int(self.slots * self.max_len - self.target_len[self.in_use].sum())

    def nbytes(self) -> int:
        return self.target.nbytes() + sum(c.nbytes() for c in self.drafts.values())

    def check(self, slots: np.ndarray, n_tok: np.ndarray) -> None:
        """Assert the invariants above for running requests in ``slots`` (used by tests)."""
        t = n_tok[slots]
        assert np.all(self.in_use[slots]), "a running request's slot is not marked in use"
        assert np.all(self.target_len[slots] == t - 1), (self.target_len[slots], t - 1)
        for j in self.drafts:
            assert np.all(self.draft_len[slots, j] <= t - 1), (j, self.draft_len[slots, j], t - 1)
