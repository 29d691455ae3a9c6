"""What the drafter choice believes about each drafter's chain rate, compared at like places in a request.

Drafters are measured on different evidence: the one explored first drafts the opening of a request
(its hardest positions: on the CPU pair's record the chain rate by output position is 0.80 in positions
0-7 and 0.92 past 32 for draft-tiny, 0.31 and 0.77 for n-gram), the next one the rest of it, each on a
few requests whose own rates spread widely (docs/decisions.md, 2026-11-29). The posterior separates
the three, in log-odds:

    logit r[d, b] = alpha_d + beta_b        (d: drafter, b: bin of the request's output position)
    alpha ~ Normal(logit prior, lam lam^T + diag(eps^2)),  lam_d = sqrt(tau_d^2 - eps_d^2)
    tau_d^2 = 1 / ((PRIOR_TRIALS + 1) prior_d (1 - prior_d))   (the Beta prior's width in log-odds)
    beta_b ~ Normal(0, POSITION_SD^2)
    logit(s[d, b] / t[d, b]) ~ Normal(alpha_d + beta_b, 1 / (n p (1 - p)) + REQUEST_SD^2 / q)

with s, t the chain successes and trials in cell (d, b), n its drafting request-steps (not the positions
tried: one draft's positions are one chain, and neighbouring tokens are accepted together), q its requests
and p its rate (clipped to [RATE_CLIP, 1 - RATE_CLIP]); counts decay by ``POSITION_DECAY`` per
learned step. One workload factor lam moves every drafter's rate together: closely for the draft
models (``MODEL_SD`` gives about the 0.82-0.89 correlation of their per-request rates on the CPU pair's
record), loosely for n-gram (``NGRAM_SD``). A drafter's rate for the choice is at the workload's
position mix w (the share of request-steps per bin):

    v_d = alpha_d + w . beta     (Gaussian: the posterior's mean and covariance, mapped)
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from control.policy.adaptive.survival import POSITION_DECAY

PRIOR_TRIALS = 8.0  # request-steps the profile's acceptance is worth: its Beta has a std of 0.14-0.17 at
# rates 0.6-0.8, about the spread of acceptance across held-out prompts
POSITION_EDGES = np.array([8.0, 16.0, 32.0, 64.0])  # output tokens where a request's position bins start
POSITION_SD = 0.7  # prior sd of a bin's log-odds effect: the CPU pair's models span 1.1 from 0-7 to 32+
REQUEST_SD = 0.9  # sd of a request's own log-odds shift: one request's steps are one piece of evidence
MODEL_SD = 0.3  # a draft model's own log-odds part, beside the workload factor
NGRAM_SD = 0.6  # n-gram's own part: larger than the record's per-request correlations give (0.45), since a workload
# without repeats fails the lookups and not the models; coupled as tightly, it condemned the models untried
RATE_CLIP = 0.03  # a cell's rate is read in [RATE_CLIP, 1 - RATE_CLIP] before its log-odds
_COUNTS = 4  # successes, trials, request-steps, requests


def logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1.0 - p))


def sigmoid(v: np.ndarray) -> np.ndarray:
    """The rate of log-odds ``v`` (``logit``'s inverse)."""
    return 1.0 / (1.0 + np.exp(-v))


class DrafterEvidence:
    """Chain trials per (drafter, output-position bin), decayed, and each slot's request position."""

    def __init__(self, drafters: int, slots: int = 64) -> None:
        self.m, self.B = drafters, POSITION_EDGES.size + 1
        self.counts = np.zeros((_COUNTS, drafters, self.B))  # (4, m, B): s, t, n, q
        self.out = np.zeros(slots)  # (slots,) tokens each slot's request has generated since it arrived
        self.seen = np.zeros((slots, drafters * self.B), dtype=bool)  # (slots, m * B) cells the request fed
        self.version = 0  # counts' updates so far (a posterior read from them is good until it moves)
        self._edges = POSITION_EDGES.tolist()  # for one request's bin without an array call

    def reset(self, slots: np.ndarray) -> None:
        """New requests in ``slots``: their positions start at 0 and they have fed no cell."""
        if slots.size:
            self._grow(int(slots.max()))
            self.out[slots] = 0.0
            self.seen[slots] = False

    def learn(self, slots: np.ndarray, d_ctx: np.ndarray, s: np.ndarray, t: np.ndarray, spec: np.ndarray | None,
              accepted: np.ndarray) -> None:
        """One step's outcome: requests ``slots`` (n,) on plan drafters ``d_ctx`` (n,) (-1: unknown), their
        chain successes ``s`` and trials ``t`` (n,), ``spec`` (n,) bool: those that drafted (None: none),
        ``accepted`` (n,): the tokens each got beyond the one every step gives."""
        self.version += 1
        self.counts *= POSITION_DECAY
        if slots.shape[0] == 1:  # one request (batch 1): scalar work, no gathers
            self._learn_one(int(slots[0]), int(d_ctx[0]), spec is not None and bool(spec[0]), float(s[0]),
                            float(t[0]), float(accepted[0]))
            return
        self._grow(int(slots.max()))
        if spec is not None:
            sel = spec & (d_ctx >= 0)  # (n,) bool
            if sel.any():
                sl = slots[sel]
                cell = d_ctx[sel] * self.B + np.searchsorted(POSITION_EDGES, self.out[sl], side="right")  # (r,)
                flat = self.counts.reshape(_COUNTS, -1)  # (4, m * B) view
                size = flat.shape[1]
                flat[0] += np.bincount(cell, weights=s[sel], minlength=size)
                flat[1] += np.bincount(cell, weights=t[sel], minlength=size)
                flat[2] += np.bincount(cell, minlength=size)
                new = ~self.seen[sl, cell]  # (r,) bool: the request's first step in its cell
                flat[3] += np.bincount(cell[new], minlength=size)
                self.seen[sl, cell] = True
        self.out[slots] += accepted + 1

    def _learn_one(self, j: int, d: int, drafted: bool, s: float, t: float, accepted: float) -> None:
        self._grow(j)
        if drafted and d >= 0:
            b = bisect_right(self._edges, float(self.out[j]))
            c = self.counts[:, d, b]  # (4,) view
            c[0] += s
            c[1] += t
            c[2] += 1.0
            cell = d * self.B + b
            if not self.seen[j, cell]:
                c[3] += 1.0
                self.seen[j, cell] = True
        self.out[j] += accepted + 1.0

    def mix(self) -> np.ndarray:
        """(B,) the share of drafting request-steps per position bin (uniform before any)."""
        n = self.counts[2].sum(axis=0)  # (B,)
        total = n.sum()
        return n / total if total > 0.0 else np.full(self.B, 1.0 / self.B)

    def _grow(self, slot: int) -> None:
        if slot >= self.out.size:
            extra = max(slot + 1, 2 * self.out.size) - self.out.size
            self.out = np.concatenate([self.out, np.zeros(extra)])
            self.seen = np.concatenate([self.seen, np.zeros((extra, self.seen.shape[1]), dtype=bool)])


def prior_cov(prior: np.ndarray, is_ngram: np.ndarray) -> np.ndarray:
    """(m, m) the drafters' log-odds prior covariance: one workload factor plus each one's own part."""
    tau2 = 1.0 / ((PRIOR_TRIALS + 1.0) * prior * (1.0 - prior))  # (m,)
    own = np.minimum(np.where(is_ngram, NGRAM_SD, MODEL_SD) ** 2, tau2)  # (m,)
    lam = np.sqrt(tau2 - own)  # (m,)
    return np.outer(lam, lam) + np.diag(own)


class RatePosterior:
    """Each drafter's log-odds chain rate at the workload's position mix, from ``DrafterEvidence``
    (module doc), recomputed only when the evidence or the prior moved."""

    def __init__(self, is_ngram: np.ndarray) -> None:
        self.is_ngram = np.asarray(is_ngram, dtype=bool)  # (m,)
        self._prior: np.ndarray | None = None
        self._key = (-1, None)  # (evidence version, prior) of the cached result
        self._out: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, prior: np.ndarray, ev: DrafterEvidence) -> tuple[np.ndarray, np.ndarray]:
        """(m,) mean and (m, m) covariance; ``prior`` (m,): the profile's rates."""
        if self._out is not None and self._key[0] == ev.version and self._key[1] is prior:
            return self._out
        if self._prior is None or not np.array_equal(self._prior, prior):
            self._prior = np.array(prior, dtype=np.float64)
            self._prec0 = spd_inverse(prior_cov(self._prior, self.is_ngram))  # (m, m)
            self._prec0_mu = self._prec0 @ logit(self._prior)  # (m,)
        self._key, self._out = (ev.version, prior), self._fit(ev)
        return self._out

    def _fit(self, ev: DrafterEvidence) -> tuple[np.ndarray, np.ndarray]:
        """The Gaussian posterior of (alpha, beta) with beta integrated out first: its precision block is
        diagonal, so only an m x m matrix is inverted (no LAPACK call on the decision path: a threaded
        one took 1.7 ms on an 8 x 8 matrix beside a busy core)."""
        s, t, n, q = ev.counts  # (m, B) each
        p = np.clip(s / np.where(t > 0.0, t, 1.0), RATE_CLIP, 1.0 - RATE_CLIP)  # (m, B)
        h = np.where(n > 0.0, 1.0 / (1.0 / np.maximum(n * p * (1.0 - p), 1e-12) + REQUEST_SD ** 2 / np.maximum(q, 1e-12)),
                     0.0)  # (m, B) each cell's precision
        hz = h * logit(p)  # (m, B)
        d = 1.0 / POSITION_SD ** 2 + h.sum(axis=0)  # (B,) beta's precision (diagonal)
        hd = h / d  # (m, B)
        # alpha's precision with beta integrated out (Schur complement), and its inverse
        cov_a = spd_inverse(self._prec0 + np.diag(h.sum(axis=1)) - hd @ h.T)  # (m, m)
        rb = hz.sum(axis=0)  # (B,)
        mean_a = cov_a @ (self._prec0_mu + hz.sum(axis=1) - hd @ rb)  # (m,)
        # beta | alpha ~ Normal((rb - h^T alpha) / d, diag(1 / d)), so v = alpha + w . beta
        # = (I - 1 g^T) alpha + w . rb / d + w . e with g = hd w
        w = ev.mix()  # (B,)
        g = hd @ w  # (m,)
        M = np.eye(ev.m) - g[None, :]  # (m, m)
        mean = mean_a - float(g @ mean_a) + float(w @ (rb / d))
        return mean, M @ cov_a @ M.T + float(w @ (w / d))


def spd_inverse(a: np.ndarray) -> np.ndarray:
    """(m, m) the inverse of a small symmetric positive definite matrix ``a`` (m, m), by Gauss-Jordan
    elimination without pivoting (safe for such a matrix)."""
    m = a.shape[0]
    aug = np.concatenate([a, np.eye(m)], axis=1)  # (m, 2m)
    for i in range(m):
        aug[i] /= aug[i, i]
        col = aug[:, i].copy()  # (m,)
        col[i] = 0.0
        aug -= np.outer(col, aug[i])
    return aug[:, m:]


def rate_posterior(prior: np.ndarray, is_ngram: np.ndarray, ev: DrafterEvidence) -> tuple[np.ndarray, np.ndarray]:
    """(m,) mean and (m, m) covariance of each drafter's log-odds chain rate at the workload's position
    mix (module doc), without a cache; ``prior`` (m,): the profile's rates."""
    return RatePosterior(is_ngram)(prior, ev)
