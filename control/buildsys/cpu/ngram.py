"""Prompt lookup (n-gram) drafting: propose the tokens that followed the latest earlier occurrence
of the context's last n tokens, trying n = max_n down to min_n (as in prompt-lookup decoding)."""

from __future__ import annotations

import numpy as np


def ngram_propose(context: np.ndarray, k: int, max_n: int = 3, min_n: int = 1) -> np.ndarray:
    """Up to ``k`` draft tokens for ``context`` (1-D int array); empty when nothing matches."""
    L = context.shape[0]
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        tail = context[L - n:]
        # windows ending before the tail's own start: positions i with context[i:i+n] == tail
        win = np.lib.stride_tricks.sliding_window_view(context[: L - 1], n)
        hits = np.flatnonzero((win == tail).all(axis=1))
        hits = hits[hits + n < L]
        if hits.size:
            start = int(hits[-1]) + n
            return context[start: start + k].copy()
    return context[:0].copy()


def ngram_match_rate(seq: np.ndarray, start: int, max_n: int = 3) -> float:
    """Share of positions t >= ``start`` where the one-token proposal from seq[:t] equals seq[t]
    (a position without any match counts as a miss)."""
    hits = 0
    for t in range(start, seq.shape[0]):
        prop = ngram_propose(seq[:t], 1, max_n=max_n)
        hits += int(prop.size > 0 and prop[0] == seq[t])
    return hits / max(seq.shape[0] - start, 1)
