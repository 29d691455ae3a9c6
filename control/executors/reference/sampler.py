"""The engine's sampler: logits of its requests turned into tokens, with their parameters.

``Sampler`` reads the engine's slot table (``slots.py``; S = max_batch slots, L = max_len positions)
in place: the token buffer, the sampling parameters and each slot's request (its noise, bad words).
"""

from __future__ import annotations

import numpy as np
import torch

from control.executors.reference.sampling import banned_tokens, filtered_probs
from control.executors.reference.slots import SlotTable

I64 = np.int64


class Sampler:
    def __init__(self, device, slots: SlotTable) -> None:
        self.device = device
        self.tok = slots.tok  # (S, L) int64 prompt + generated tokens per slot
        self.n_tok = slots.n_tok  # (S,) int64 tokens in the buffer
        self.sampled = slots.sampled  # (S,) bool temperature > 0
        self.temperature = slots.temperature  # (S,) float32
        self.top_k = slots.top_k  # (S,) int64, 0 = off
        self.top_p = slots.top_p  # (S,) float32, 1 = off
        self.slot_req = slots.req  # (S,) the request in each slot, or None

    def pick(self, logits: torch.Tensor, slots: np.ndarray) -> np.ndarray:
        """(R,) one token per row of ``logits`` (R, V): greedy, or sampled with the row's request's
        parameters and noise at its next position; ``slots`` (R,)."""
        out = logits.argmax(dim=-1).cpu().numpy().astype(I64)
        samp = np.flatnonzero(self.sampled[slots])
        if samp.size:
            s = slots[samp]
            p = self.probs(logits[torch.from_numpy(samp).to(self.device)], s)
            for j, row in enumerate(samp):
                out[row] = self.slot_req[int(s[j])].noise.sample(p[j], int(self.n_tok[s[j]]))
        return out

    def probs(self, logits: torch.Tensor, slots: np.ndarray) -> np.ndarray:
        """(R, V) float64 filtered probabilities of ``logits`` (R, V) with each slot's parameters."""
        p = filtered_probs(logits.float().cpu(), torch.from_numpy(self.temperature[slots]),
                           torch.from_numpy(self.top_k[slots]), torch.from_numpy(self.top_p[slots]))
        return p.double().numpy()

    def mask_bad_words(self, logits: torch.Tensor, rows: list[tuple[object, int]], drafts: np.ndarray | None = None,
                       first_row: np.ndarray | None = None, rows_per: np.ndarray | None = None) -> None:
        """Set -inf on tokens that would complete a bad word. ``rows``: (request, index in batch);
        with ``drafts`` (n, K), request i's rows are first_row[i] .. + rows_per[i] (its drafts in turn)."""
        for r, i in rows:
            words = r.params.bad_words
            if not words:
                continue
            s, nt = r.slot, int(self.n_tok[r.slot])
            if drafts is None:
                ban = banned_tokens(self.tok[s, :nt], words)
                if ban:
                    logits[i, ban] = float("-inf")
                continue
            base = int(first_row[i])
            n_rows = int(rows_per[i])
            ctx = np.concatenate([self.tok[s, :nt], drafts[i, : n_rows - 1]])  # (nt + n_rows - 1,)
            for j in range(n_rows):
                ban = banned_tokens(ctx[: nt + j], words)
                if ban:
                    logits[base + j, ban] = float("-inf")
