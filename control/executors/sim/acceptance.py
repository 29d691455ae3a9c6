"""Per-request latent acceptance processes for the simulator.

Request r has, for each drafter d, a per-token rate alpha[r, d] (drawn once from a Beta fitted per
workload or category; see ``control.bench.acceptance``). Draft position j (1-based) is accepted with
conditional probability a[r, d, j] = alpha[r, d] * decay[d]^(j - 1).

Every random number is a counter-based hash of (seed, request, output position, draft position,
drafter, stream), not a draw from a stateful generator. So the luck of request r at its p-th output
token is the same under every policy (common random numbers: policies are compared on the same
draws), the outcome of any draft length can be known before the step (what the oracle uses), and a
run depends only on its seed.

Draft confidences (SpecServe): where a drafter reports them, token j's confidence is
c = a + h * (2v - 1) with v uniform and h = informativeness * min(a, 1 - a), and the token is
accepted iff u < c. So E[c] = a (the configured rate is reproduced exactly), P(accept | c) = c (the
confidence is calibrated), and ``informativeness`` in [0, 1] sets how much it tells about this
particular token (0: nothing beyond the rate).
"""

from __future__ import annotations

import numpy as np

from control.executors.step.accept import accepted_run
from control.goodput.acceptance import MAX_RATE

U64 = np.uint64
_M1 = U64(0xBF58476D1CE4E5B9)
_M2 = U64(0x94D049BB133111EB)
_GOLD = U64(0x9E3779B97F4A7C15)
_S30, _S27, _S31, _S11 = U64(30), U64(27), U64(31), U64(11)
_INV53 = 1.0 / float(1 << 53)

# Key layout (bits): request id 24 | output position 22 | draft position 5 | drafter 4 | stream 2.
POS_BITS, J_BITS, D_BITS, S_BITS = 22, 5, 4, 2
MAX_REQUESTS = 1 << 24
MAX_POSITION = 1 << POS_BITS


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (vectorised, wrapping uint64 arithmetic)."""
    x = x + _GOLD
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def seed_key(seed: int) -> np.uint64:
    return _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=U64))[0]


def uniform_from_keys(keys: np.ndarray, seed: np.uint64) -> np.ndarray:
    """Uniforms in [0, 1) from uint64 keys; distinct keys give independent-looking values.

    (Array arithmetic on uint64 wraps silently, which is what the hash wants.)"""
    return (_mix(keys ^ seed) >> _S11).astype(np.float64) * _INV53


class AcceptanceProcess:
    """Realised acceptance for every (request, output position, draft position, drafter).

    Args:
        rates: (n_requests, m) per-token rate of each request under each drafter.
        decay: (m,) per-position decay.
        informativeness: (m,) confidence informativeness, NaN where the drafter has no confidences.
        max_k: the longest draft.
        seed: the run's seed.
    """

    def __init__(self, rates: np.ndarray, decay: np.ndarray, informativeness: np.ndarray, max_k: int,
                 seed: int = 0) -> None:
        rates = np.asarray(rates, dtype=np.float64)
        if rates.ndim != 2:
            raise ValueError(f"rates must be (requests, drafters), got shape {rates.shape}")
        if rates.shape[0] > MAX_REQUESTS:
            raise ValueError(f"at most {MAX_REQUESTS} requests per run")
        self.rates = np.clip(rates, 0.0, MAX_RATE)
        self.m = rates.shape[1]
        self.K = max(int(max_k), 1)
        decay = np.asarray(decay, dtype=np.float64).reshape(self.m)
        j = np.arange(self.K, dtype=np.float64)
        self.pos_factor = decay[:, None] ** j[None, :]  # (m, K)
        self.info = np.asarray(informativeness, dtype=np.float64).reshape(self.m)
        self.has_conf = ~np.isnan(self.info)
        self.seed = seed_key(seed)
        jj = np.arange(1, self.K + 1, dtype=U64)
        self._jkey = jj << U64(D_BITS + S_BITS)  # (K,)

    def conditional(self, rid: np.ndarray, d: int, k: int | None = None) -> np.ndarray:
        """(n, k) conditional acceptance probabilities a[r, d, j] for j = 1..k (default K)."""
        k = self.K if k is None else k
        return self.rates[rid, d][:, None] * self.pos_factor[d, :k][None, :]

    def _keys(self, rid: np.ndarray, pos: np.ndarray, d: int, k: int) -> np.ndarray:
        base = ((rid.astype(U64) << U64(POS_BITS)) | (pos.astype(U64) & U64(MAX_POSITION - 1))) << U64(
            J_BITS + D_BITS + S_BITS)
        tail = self._jkey[:k] | U64(d << S_BITS)
        return base[:, None] | tail[None, :]

    def draw(self, rid: np.ndarray, pos: np.ndarray, d: int, k: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Accept flags (n, k) for draft positions 1..k (default K) starting at output position
        ``pos`` (tokens generated so far), and the drafter's confidences (n, k) or None. Position j's
        outcome does not depend on k."""
        k = self.K if k is None else min(int(k), self.K)
        a = self.conditional(rid, d, k)
        keys = self._keys(rid, pos, d, k)
        u = uniform_from_keys(keys, self.seed)
        if not self.has_conf[d]:
            return u < a, None
        v = uniform_from_keys(keys | U64(1), self.seed)
        h = self.info[d] * np.minimum(a, 1.0 - a)
        c = a + h * (2.0 * v - 1.0)
        return u < c, c

    @staticmethod
    def leading(accept: np.ndarray) -> np.ndarray:
        """(n,) length of the leading run of accepted positions per row of ``accept`` (n, k)."""
        return accepted_run(accept)

    def leading_all(self, rid: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """(n, m) leading accepted run under each drafter (what a step would accept at k = K)."""
        out = np.empty((rid.shape[0], self.m), dtype=np.int64)
        for d in range(self.m):
            acc, _ = self.draw(rid, pos, d)
            out[:, d] = self.leading(acc)
        return out


class ReplayAcceptance:
    """Acceptance recorded from a real model pair under greedy decoding, replayed exactly.

    Under greedy decoding a request's continuation and each drafter's proposal at an output position
    depend on the context alone, so what a draft of any length k would get accepted is known once the
    drafter's longest proposal at that position is compared with the target's continuation:
    ``lead[r, p, d]`` tokens match. A step drafting k tokens there accepts min(lead, k).

    Args:
        lead: (n_requests, positions, m) matching prefix of drafter d's ``max_k``-token proposal at
            output position p (tokens generated so far) against the target's greedy continuation.
        avail: (n_requests, positions, m) tokens the drafter proposes there (n-gram lookup may find
            fewer than ``max_k``, or none; a draft model always proposes ``max_k``).
        conf: (n_requests, positions, m, max_k) the draft model's probability of each proposed token
            (its top probability); NaN for drafters without confidences and past ``avail``.
        has_conf: (m,) whether drafter d reports confidences.
    """

    def __init__(self, lead: np.ndarray, avail: np.ndarray, conf: np.ndarray, has_conf: np.ndarray) -> None:
        lead = np.asarray(lead)
        if lead.ndim != 3:
            raise ValueError(f"lead must be (requests, positions, drafters), got shape {lead.shape}")
        if np.asarray(avail).shape != lead.shape or np.asarray(conf).shape[:3] != lead.shape:
            raise ValueError(f"avail {np.shape(avail)} and conf {np.shape(conf)} must match lead {lead.shape} "
                             "(conf with one more axis: the draft position)")
        self.lead = lead.astype(np.int16)  # (N, P, m)
        self.avail = np.asarray(avail).astype(np.int16)  # (N, P, m)
        self.conf = np.asarray(conf, dtype=np.float32)  # (N, P, m, K)
        self.n, self.positions, self.m = lead.shape
        self.K = int(self.conf.shape[3])
        self.has_conf = np.asarray(has_conf, dtype=bool).reshape(self.m)
        if (self.lead > self.avail).any():
            raise ValueError("lead exceeds avail somewhere: a drafter cannot match more tokens than it proposed")
        self._j = np.arange(self.K)

    def _check(self, rid: np.ndarray, pos: np.ndarray) -> None:
        if rid.size and (int(rid.max()) >= self.n or int(pos.max()) >= self.positions or int(pos.min()) < 0):
            raise ValueError(f"replay holds {self.n} requests x {self.positions} output positions; asked for request "
                             f"{int(rid.max())}, position {int(pos.min())}..{int(pos.max())} (record more tokens or "
                             "run fewer requests)")

    def limit(self, rid: np.ndarray, pos: np.ndarray, d: int) -> np.ndarray:
        """(n,) tokens drafter d can propose for each request at its output position."""
        rid, pos = np.asarray(rid), np.asarray(pos)
        self._check(rid, pos)
        return self.avail[rid, pos, d].astype(np.int64)

    def draw(self, rid: np.ndarray, pos: np.ndarray, d: int, k: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Accept flags (n, k): the first lead[r, pos, d] positions accepted; confidences (n, k) or None."""
        k = self.K if k is None else min(int(k), self.K)
        rid, pos = np.asarray(rid), np.asarray(pos)
        self._check(rid, pos)
        acc = self._j[None, :k] < self.lead[rid, pos, d][:, None]
        if not self.has_conf[d]:
            return acc, None
        return acc, self.conf[rid, pos, d, :k].astype(np.float64)

    def conditional(self, rid: np.ndarray, d: int, k: int | None = None) -> np.ndarray:
        """(n, k) each request's empirical conditional acceptance at draft positions 1..k over its
        recorded positions (what a rate oracle may know; no single outcome)."""
        k = self.K if k is None else k
        lead = self.lead[np.asarray(rid), :, d].astype(np.int64)  # (n, P)
        reach = (lead[:, :, None] >= self._j[None, None, :k]).sum(axis=1)  # (n, k): positions reaching j
        ok = (lead[:, :, None] > self._j[None, None, :k]).sum(axis=1)  # (n, k): ... and accepting j + 1
        return np.where(reach > 0, ok / np.maximum(reach, 1), 0.0)

    @staticmethod
    def leading(accept: np.ndarray) -> np.ndarray:
        return AcceptanceProcess.leading(accept)

    def leading_all(self, rid: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """(n, m) accepted run under each drafter at k = max_k."""
        rid, pos = np.asarray(rid), np.asarray(pos)
        self._check(rid, pos)
        return self.lead[rid, pos, :].astype(np.int64)

    def subset(self, rows: np.ndarray) -> ReplayAcceptance:
        """The replay of requests ``rows`` only, renumbered 0..len(rows) - 1."""
        rows = np.asarray(rows)
        return ReplayAcceptance(self.lead[rows], self.avail[rows], self.conf[rows], self.has_conf)
