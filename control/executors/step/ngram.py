"""Prompt lookup (n-gram drafting): the one proposer every data plane drafts n-grams with.

The longest suffix of the context (n = ``max_n`` down to ``min_n`` tokens) that occurred earlier in
the context proposes the tokens that followed its latest earlier occurrence.
"""

from __future__ import annotations

import numpy as np

DEFAULT_MAX_N = 3  # the longest suffix tried (prompt-lookup decoding's default)


def ngram_propose(context: np.ndarray, k: int, max_n: int = DEFAULT_MAX_N, min_n: int = 1) -> np.ndarray:
    """Up to ``k`` draft tokens (a new array) for ``context`` (L,) int; empty when nothing matches."""
    L = context.shape[0]
    if k <= 0:
        return context[:0].copy()
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        tail = context[L - n:]
        win = np.lib.stride_tricks.sliding_window_view(context[: L - 1], n)  # (L - n, n): windows before the tail's end
        hits = np.flatnonzero((win == tail).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return context[start: start + k].copy()
    return context[:0].copy()
