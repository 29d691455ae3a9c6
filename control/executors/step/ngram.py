"""Prompt lookup (n-gram drafting): the one proposer every data plane drafts n-grams with.

The longest suffix of the context (n = ``max_n`` down to ``min_n`` tokens) that occurred earlier in
the context proposes the tokens that followed its latest earlier occurrence. ``ngram_available``
counts those tokens without copying them: what the step view reports (``StepView.ngram_avail``), so
the policy knows, before it decides, how many tokens a lookup asked for k would propose.
``lookup_match`` scores, after a step, the lookup each request's context proposed at its start
against the tokens the step committed (``StepOutcome.ngram_match``), whatever the request drafted with.
"""

from __future__ import annotations

import numpy as np

DEFAULT_MAX_N = 3  # the longest suffix tried (prompt-lookup decoding's default)
NO_MATCH = -1  # ``match_start`` of a context whose suffixes occur nowhere earlier
I64 = np.int64


def match_start(context: np.ndarray, max_n: int = DEFAULT_MAX_N, min_n: int = 1) -> int:
    """Index in ``context`` (L,) of the first token after the latest earlier occurrence of its
    longest matching suffix (``NO_MATCH`` when none matches).

    One pass over the context finds where its last token occurred before; each longer suffix only
    narrows those places (an occurrence of the n-token suffix ends where the (n-1)-token one does)."""
    L = context.shape[0]
    top = min(max_n, L - 1)
    if top < max(min_n, 1):
        return NO_MATCH
    ends = np.flatnonzero(context[: L - 1] == context[L - 1])  # (hits,) where an occurrence of the last token ends
    best_n, best_end = 0, -1
    for n in range(1, top + 1):
        if n > 1:
            ends = ends[ends >= n - 1]
            ends = ends[context[ends - (n - 1)] == context[L - n]]
        if not ends.size:
            break
        best_n, best_end = n, int(ends[-1])
    return best_end + 1 if best_n >= max(min_n, 1) else NO_MATCH


def ngram_propose(context: np.ndarray, k: int, max_n: int = DEFAULT_MAX_N, min_n: int = 1) -> np.ndarray:
    """Up to ``k`` draft tokens (a new array) for ``context`` (L,) int; empty when nothing matches."""
    if k <= 0:
        return context[:0].copy()
    start = match_start(context, max_n, min_n)
    if start == NO_MATCH:
        return context[:0].copy()
    return context[start: start + k].copy()


def ngram_available(context: np.ndarray, k: int, max_n: int = DEFAULT_MAX_N, min_n: int = 1) -> int:
    """How many tokens ``ngram_propose(context, k, max_n, min_n)`` returns (0: no match)."""
    if k <= 0:
        return 0
    start = match_start(context, max_n, min_n)
    return 0 if start == NO_MATCH else min(k, context.shape[0] - start)


def lookup_avail(tokens: np.ndarray, n_tok: np.ndarray, slots: np.ndarray, k: int, max_n: int = DEFAULT_MAX_N,
                 min_n: int = 1) -> np.ndarray:
    """(n,) int64 ``ngram_available`` of each slot's context: ``tokens`` (S, L) token buffer,
    ``n_tok`` (S,) tokens in each row, ``slots`` (n,) the rows asked about."""
    out = np.zeros(slots.shape[0], dtype=I64)  # (n,)
    for i, s in enumerate(slots.tolist()):
        out[i] = ngram_available(tokens[s, : n_tok[s]], k, max_n, min_n)
    return out


def lookup_match(tokens: np.ndarray, n_tok: np.ndarray, slots: np.ndarray, committed: np.ndarray, avail: np.ndarray,
                 max_n: int = DEFAULT_MAX_N, min_n: int = 1) -> np.ndarray:
    """(n,) int64 ``StepOutcome.ngram_match``: for each slot whose step committed ``committed`` (n,)
    tokens (the last ones of its ``n_tok`` (S,) in ``tokens`` (S, L)), how many leading tokens of the
    lookup its context proposed before them, cut at ``avail`` (n,), those tokens repeat; -1 where
    nothing was committed or proposed (a request that stopped in the step: its caller passes 0)."""
    out = np.full(slots.shape[0], -1, dtype=I64)  # (n,)
    for i in np.flatnonzero((committed > 0) & (avail > 0)).tolist():
        s = int(slots[i])
        end = int(n_tok[s])
        out[i] = lookup_score(tokens[s, :end], end - int(committed[i]), int(avail[i]), max_n, min_n)
    return out


def lookup_score(seq: np.ndarray, cut: int, avail: int, max_n: int = DEFAULT_MAX_N, min_n: int = 1) -> int:
    """How many leading tokens of the lookup ``seq[:cut]`` proposed, cut at ``avail``, the tokens
    after it in ``seq`` (L,) repeat (0 where it proposed nothing)."""
    start = match_start(seq[:cut], max_n, min_n)
    if start == NO_MATCH:
        return 0
    w = min(avail, cut - start, seq.shape[0] - cut)
    same = seq[start: start + w] == seq[cut: cut + w]  # (w,) bool
    return w if same.all() else int(np.argmin(same))
