"""Prompt lookup (n-gram) drafting for the CPU pair: the executors' one proposer
(``control.executors.step.ngram``) and how often it would have been right."""

from __future__ import annotations

import numpy as np

from control.executors.step.ngram import ngram_propose

__all__ = ["ngram_match_rate", "ngram_propose"]


def ngram_match_rate(seq: np.ndarray, start: int, max_n: int = 3) -> float:
    """Share of positions t >= ``start`` where the one-token proposal from seq[:t] equals seq[t]
    (a position without any match counts as a miss)."""
    hits = 0
    for t in range(start, seq.shape[0]):
        prop = ngram_propose(seq[:t], 1, max_n=max_n)
        hits += int(prop.size > 0 and prop[0] == seq[t])
    return hits / max(seq.shape[0] - start, 1)
