"""Timing a draft model's passes the way the engine drafts with it.

A bare forward leaves out what the engine does around every draft pass
(``drafters.DraftModelDrafter.propose``): the softmax over the vocabulary, the token choice and
its copy to the host, the rows still drafting and the next pass's segments. On the full CPU pair
that host work costs about as much as draft-tiny's forward itself, so a profile fitted on bare
forwards prices draft-tiny's passes at half what the engine pays (docs/decisions.md, 2026-11-28).

``DraftStepTimer`` times whole draft steps through ``propose`` on greedy rows whose draft cache is in
sync with the context (its first pass reads only the last token, as in a step after a rejection), or
a given number of tokens behind it (the first pass catches them up), and reports each step's features
as the engine reports them to the cost refit: context tokens, batched tokens and passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from control.executors.reference.drafters import DraftModelDrafter, DraftRows
from control.executors.reference.model import KVCache, LlamaForCausalLM

I64 = np.int64


@dataclass(frozen=True, slots=True)
class DraftStep:
    """What one timed draft step did, in the cost refit's features."""

    ms: float
    ctx_tokens: int
    batched_tokens: int
    passes: int


class DraftStepTimer:
    """Draft steps of ``batch`` requests through the engine's own drafting code, on one KV cache of
    ``max_len`` positions per request (a context ``ctx`` drafting ``k`` tokens needs ctx + k of them)."""

    def __init__(self, name: str, model: LlamaForCausalLM, batch: int, max_len: int, seed: int = 0) -> None:
        w = model.lm_head.weight
        self.device = w.device
        self.batch, self.max_len = batch, max_len
        cache = KVCache(model.config, slots=batch, max_len=max_len, device=self.device, dtype=w.dtype)
        self.lengths = np.zeros(batch, dtype=I64)  # (batch,) the draft cache's valid tokens per slot
        self.drafter = DraftModelDrafter(name, model, cache, self.lengths)
        rng = np.random.default_rng(seed)
        self.tokens = rng.integers(0, model.config.vocab_size, size=(batch, max_len), dtype=I64)  # (batch, max_len)
        self._slots = np.arange(batch, dtype=I64)  # (batch,)
        self._greedy = np.zeros(batch, dtype=bool)  # (batch,)

    def rows(self, ctx: int, k: int) -> DraftRows:
        """Every slot at context ``ctx`` (its last token at position ctx) drafting ``k`` tokens, greedily."""
        if ctx < 1 or k < 1 or ctx + k > self.max_len:
            raise ValueError(f"draft step at context {ctx} with k = {k}: needs ctx >= 1, k >= 1 and ctx + k <= "
                             f"{self.max_len} (the timer's cache length)")
        b = self.batch
        return DraftRows(self._slots, np.full(b, k, dtype=I64), None, self.tokens, np.full(b, ctx + 1, dtype=I64),
                         self._greedy, np.ones(b), np.zeros(b, dtype=I64), np.ones(b), [None] * b)

    @torch.inference_mode()
    def run(self, rows: DraftRows, lag: int = 0) -> DraftStep:
        """Time one draft step of ``rows`` (from ``rows``), its cache first set ``lag`` tokens behind the
        context (0: in sync; more: the first pass catches them up, as for a request whose draft missed
        its prompt or plain steps)."""
        ctx = int(rows.n_tok.min()) - 1
        if not 0 <= lag < ctx:
            raise ValueError(f"catch-up of {lag} tokens at context {ctx}: needs 0 <= lag < ctx")
        self.lengths[:] = rows.n_tok - 1 - lag
        self._sync()
        t0 = time.perf_counter()
        res = self.drafter.propose(rows, self.device)
        self._sync()
        return DraftStep((time.perf_counter() - t0) * 1e3, res.ctx_tokens, res.batched_tokens, res.passes)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
