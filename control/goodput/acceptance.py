"""Accepted-length models: how many tokens a request generates in one speculative step.

All functions are vectorised. The common currency is the survival probability p[r, j]: the chance
that request r's draft token j (1-based) and every token before it are accepted. Expected generated
tokens for a draft length k = 1 (the bonus token) + sum_{j<=k} p[r, j].
"""

from __future__ import annotations

import numpy as np

# Per-token acceptance assumed for a drafter nobody has measured (no profile figure, no telemetry yet).
DEFAULT_ACCEPTANCE = 0.6
# Ceiling on every acceptance-rate estimate: at 1 a chain's expected length has no bound and the
# optimiser would draft without limit on a lucky streak.
MAX_RATE = 0.999


def chain_expected(alpha, k):
    """E[generated] for a chain of k drafts with one acceptance rate: (1 - a^(k+1)) / (1 - a).

    Leviathan et al.; SmartSpec eq. 8. Includes the bonus token; equals k + 1 at a = 1.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    one = np.isclose(alpha, 1.0)
    safe = np.where(one, 0.5, alpha)
    val = (1.0 - safe ** (k + 1.0)) / (1.0 - safe)
    return np.where(one, k + 1.0, val)


def survival_from_rates(rates) -> np.ndarray:
    """Survival p_j = prod_{i<=j} a_i from conditional per-position rates (last axis = position)."""
    return np.cumprod(np.asarray(rates, dtype=np.float64), axis=-1)


def chain_survival(alpha, max_k: int) -> np.ndarray:
    """Survival p_j = a^j for j = 1..max_k; alpha of shape (n,) gives (n, max_k)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    j = np.arange(1, max_k + 1, dtype=np.float64)
    return alpha[..., None] ** j


def expected_from_survival(surv: np.ndarray, k) -> np.ndarray:
    """E[generated] = 1 + sum_{j<=k_r} p[r, j] for each row r of ``surv`` (shape (n, K))."""
    surv = np.asarray(surv, dtype=np.float64)
    k = np.asarray(k, dtype=np.int64)
    csum = np.concatenate([np.zeros(surv.shape[:-1] + (1,)), np.cumsum(surv, axis=-1)], axis=-1)
    return 1.0 + np.take_along_axis(csum, k[..., None], axis=-1)[..., 0]


def positional_expected(rates, k) -> np.ndarray:
    """Per-position rates a_1..a_K (shape (K,) or (n, K)): E[gen] = 1 + sum_{j<=k} prod_{i<=j} a_i."""
    surv = survival_from_rates(rates)
    if surv.ndim == 1:
        surv = np.broadcast_to(surv, np.shape(k) + surv.shape)
    return expected_from_survival(surv, k)


def confidence_survival(confidence: np.ndarray) -> np.ndarray:
    """SpecServe eq. 8: survival of draft token j = prod_{i<=j} c_i, c = the drafter's confidence.

    NaN confidences (positions not drafted) become 0 survival.
    """
    c = np.nan_to_num(np.asarray(confidence, dtype=np.float64), nan=0.0)
    return np.cumprod(np.clip(c, 0.0, 1.0), axis=-1)


def tree_expected(alphas, ks) -> float:
    """Top-k tree per head (SmartSpec eq. 10): expected generated tokens incl. the bonus token.

    Head h proposes ks[h] candidates, each accepted with probability alphas[h] independently.
    l = sum_{i=0..h} (i + 1) * (1 - q_{i+1}) * prod_{j<=i} q_j, q_j = 1 - (1 - a_j)^{k_j}, q_{h+1} = 0.
    (The i = 0 term is the bonus-only outcome, which eq. 10 leaves implicit.)
    """
    alphas = np.asarray(alphas, dtype=np.float64)
    ks = np.asarray(ks, dtype=np.float64)
    if alphas.shape != ks.shape:
        raise ValueError(f"tree_expected: {alphas.size} head rates but {ks.size} head widths")
    q = 1.0 - (1.0 - alphas) ** ks  # P(at least one candidate at head j accepted)
    reach = np.concatenate([[1.0], np.cumprod(q)])  # P(heads 1..i all hit), i = 0..h
    stop = np.concatenate([1.0 - q, [1.0]])  # P(head i+1 misses); beyond the last head always stops
    i = np.arange(q.size + 1, dtype=np.float64)
    return float(np.sum((i + 1.0) * stop * reach))


def tree_batched_tokens(ks) -> int:
    """Tokens a top-k tree adds to the verify pass per request: sum_h prod_{i<=h} k_i."""
    ks = np.asarray(ks, dtype=np.int64)
    return int(np.cumprod(ks).sum()) if ks.size else 0
