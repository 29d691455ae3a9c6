"""Step 5, acceptance: which drafts the target keeps, and the token it adds after them.

- ``accepted_run``: the leading run of accepted positions; every rule below ends in it.
- ``accept_greedy``: exact match against the target's greedy tokens, a whole batch at once.
- ``accept_coupled``: a sampled request against the target's own draws with the request's
  per-position noise (the reference executor's sampled path: seeded output is reproducible).
- ``accept_rejection``: speculative sampling (Leviathan et al., Chen et al.): accept draft token d
  with probability min(1, p(d) / q(d)); on the first rejection sample from norm(max(0, p - q)); after
  every draft is accepted sample the bonus token from p. A deterministic proposal (n-gram lookup) is
  the point mass q = onehot(d).

Shapes: n requests, K draft positions, V vocabulary, v drafts of one request.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

I64 = np.int64


class Noise(Protocol):
    """A sampled request's randomness: the token it draws at ``position`` from ``p`` (V,)."""

    def sample(self, p: np.ndarray, position: int) -> int: ...


def accepted_run(accept: np.ndarray) -> np.ndarray:
    """(n,) int64 length of each row's leading run of accepted positions; ``accept``: (n, K) bool."""
    return np.cumprod(accept, axis=1).sum(axis=1).astype(I64)


def accept_greedy(drafts: np.ndarray, verified: np.ndarray, target_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy exact-match acceptance for a batch.

    drafts: (n, K) draft tokens; verified: (n,) how many of each row went to the target;
    target_tokens: (n, K + 1) the target's greedy token after the prefix and after each draft token.
    Returns (accepted (n,), bonus (n,)): the longest prefix of verified drafts equal to the target's
    tokens, and the target's token right after it.
    """
    n, K = drafts.shape
    pos = np.arange(K)[None, :]  # (1, K)
    match = (drafts == target_tokens[:, :K]) & (pos < verified[:, None])  # (n, K)
    accepted = accepted_run(match)
    bonus = target_tokens[np.arange(n), accepted]  # (n,)
    return accepted, bonus


def accept_coupled(p: np.ndarray, drafts: np.ndarray, noise: Noise, position: int) -> tuple[int, int]:
    """One sampled request against the target's own draws.

    p: (v + 1, V) target probabilities after the prefix and after each of the v drafts; drafts: (v,);
    ``position``: the index of the first new token. Returns (accepted, next token): the drafts equal
    to the target's draw at their position, and the target's draw after them.
    """
    v = drafts.shape[0]
    for j in range(v + 1):
        t = noise.sample(p[j], position + j)
        if j == v or t != int(drafts[j]):
            return j, t
    raise AssertionError("unreachable: the loop returns at j == v")


def sample_index(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from the (unnormalised, non-negative) distribution ``p`` (V,) by inverse CDF."""
    c = np.cumsum(p, dtype=np.float64)  # (V,)
    total = c[-1]
    if not total > 0:
        return int(np.argmax(p))
    i = int(np.searchsorted(c, rng.random() * total, side="right"))
    return min(i, p.shape[0] - 1)


def accept_rejection(p: np.ndarray, drafts: np.ndarray, q: np.ndarray | None,
                     rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling for one request.

    p: (v + 1, V) target probabilities after the prefix and after each of the v drafts; drafts: (v,);
    q: (v, V) the distributions the drafts were sampled from, or None for a deterministic proposal.
    Returns (accepted, next token).
    """
    v = drafts.shape[0]
    for j in range(v):
        d = int(drafts[j])
        pj = float(p[j, d])
        qj = 1.0 if q is None else float(q[j, d])
        if rng.random() * qj < pj:  # accept with probability min(1, p/q)
            continue
        if q is None:
            resid = p[j].astype(np.float64, copy=True)  # (V,)
            resid[d] = 0.0
        else:
            resid = np.maximum(p[j].astype(np.float64) - q[j], 0.0)  # (V,)
        if not resid.sum() > 0:  # p <= q everywhere only when p == q, where rejection has probability 0
            resid = p[j]
        return j, sample_index(resid, rng)
    return v, sample_index(p[v], rng)
