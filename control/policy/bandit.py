"""Drafter selection per request as a bandit (SPIN, Algorithms 1-2).

Epoch e = 1, 2, ...: an exploration stage of ``alpha`` slots in chunks of ``beta`` slots, where each
request gets a random drafter for a whole chunk (subject to each drafter's capacity B_j), then an
exploitation stage of 2^e slots (capped) with the max-weight assignment of requests to drafters:
each drafter j is replicated B_j times and ``scipy.optimize.linear_sum_assignment`` matches requests
to replicas on estimated goodput minus ``switch_cost_weight`` x the cost of switching a request's
drafter (the KV it must recompute on the new drafter).

A "slot" is one engine step the assignment is in force, whether or not the owner consults the bandit
at that step: an owner that holds its decisions between refreshes calls ``advance`` with the steps
the last assignment was held beyond its own, so stages and chunks last as many steps as when
consulted every step, and a chunk or stage whose boundary fell between two consultations ends at
the next one. Requests come and go: state is kept per executor slot and reset when
a new request takes it; a request with no estimate for a drafter uses that drafter's pooled mean.

Exploration draws drafters uniformly (SPIN) unless the owner sets ``explore_p``: then each draw
follows those probabilities, and a request whose drafter's probability has fallen to ``keep_p`` or
below is re-drawn at once instead of at the chunk's end. The adaptive policy sets them to each drafter's
posterior probability of being the best (Thompson sampling on acceptance through the cost model),
so a drafter that the profile and the outcomes so far make clearly worse is not tried for whole
chunks of steps: SPIN assumes no prior, and uniform exploration of a dominated drafter costs more
than it can teach (docs/decisions.md, 2026-11-22). Requests the owner flags in ``assign`` (``sync_rows``) draw
with ``sync_p`` instead: the adaptive policy's requests in sync with its favourite (or migration
target) draft model, whose move there costs no catch-up that the others' does. It also sets ``prior_slots``: a request's own
mean reward on a drafter, from a few noisy steps, is shrunk to the drafter's pooled mean, so the
matching does not keep on a worse drafter the requests whose first rewards there were luckiest.
While exploiting, the owner may instead name one drafter for the whole batch (``assign``'s ``whole``):
the adaptive policy does unless drafters have capacities (``control/policy/adaptive/drafters.py``).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

I64 = np.int64


class DrafterBandit:
    def __init__(self, n_drafters: int, capacities=None, explore_slots: int = 32, chunk_slots: int = 8,
                 switch_cost_weight: float = 1.0, max_exploit_slots: int = 4096, seed: int = 0) -> None:
        if n_drafters < 1:
            raise ValueError("DrafterBandit needs at least one drafter")
        if chunk_slots < 1 or explore_slots < chunk_slots:
            raise ValueError(f"need 1 <= chunk_slots ({chunk_slots}) <= explore_slots ({explore_slots})")
        self.m = n_drafters
        self.cap = None if capacities is None else np.asarray(capacities, dtype=I64)
        self.alpha = explore_slots
        self.beta = chunk_slots
        self.lam = switch_cost_weight
        self.max_exploit = max_exploit_slots
        self.rng = np.random.default_rng(seed)
        self.epoch = 1
        self.exploring = True
        self.t_stage = 0  # steps of the current stage gone by
        self._stage_no = 0  # stages begun so far (with ``t_stage``: where the clock is)
        self._last_chunk: tuple[int, int] | None = None  # (stage, chunk) of the last assignment
        size = 64
        self.g_sum = np.zeros((size, n_drafters))
        self.g_cnt = np.zeros((size, n_drafters))
        self.assigned = np.full(size, -1, dtype=I64)
        self.pool_sum = np.zeros(n_drafters)
        self.pool_cnt = np.zeros(n_drafters)
        self.switches = 0
        self._allowed: np.ndarray | None = None  # drafters the executor runs now (None: all)
        self._allowed_src: np.ndarray | None = None  # the caller's array that ``_allowed`` came from
        self._allowed_mask: np.ndarray | None = None
        self.explore_p: np.ndarray | None = None  # exploration draw probabilities (None: uniform)
        self.sync_p: np.ndarray | None = None  # the flagged requests' draw probabilities (None: explore_p)
        self.keep_p = 0.0  # mid-chunk, a request whose drafter's explore_p <= keep_p is re-drawn
        self.prior_slots = 0.0  # pseudo-rewards of the pooled mean in a request's estimate (``estimates``)

    # -- state -----------------------------------------------------------------------------------
    def _ensure(self, max_slot: int) -> None:
        if max_slot < self.assigned.size:
            return
        size = max(max_slot + 1, 2 * self.assigned.size)
        for name in ("g_sum", "g_cnt"):
            arr = getattr(self, name)
            grown = np.zeros((size, self.m))
            grown[: arr.shape[0]] = arr
            setattr(self, name, grown)
        a = np.full(size, -1, dtype=I64)
        a[: self.assigned.size] = self.assigned
        self.assigned = a

    def reset(self, slots: np.ndarray) -> None:
        self._ensure(int(slots.max()))
        self.g_sum[slots] = 0.0
        self.g_cnt[slots] = 0.0
        self.assigned[slots] = -1

    def hold(self, slots: np.ndarray, drafter: int) -> None:
        """New requests in ``slots`` that the owner put on ``drafter`` without asking (between two
        consultations): mid-stage they keep it, as if ``assign`` had put them there."""
        self.assigned[slots] = drafter

    def estimates(self, slots: np.ndarray) -> np.ndarray:
        """Estimated goodput per (request, drafter): the request's mean reward there, shrunk to the
        drafter's pooled mean by ``prior_slots`` pseudo-rewards (0: SPIN's plain mean); the pooled
        mean where a request has none."""
        pooled = np.where(self.pool_cnt > 0, self.pool_sum / np.maximum(self.pool_cnt, 1), 0.0)
        cnt = self.g_cnt[slots]
        if self.prior_slots > 0:
            return (self.g_sum[slots] + self.prior_slots * pooled[None, :]) / (cnt + self.prior_slots)
        return np.where(cnt > 0, self.g_sum[slots] / np.maximum(cnt, 1), pooled[None, :])

    def best_new(self) -> int:
        """The drafter a request without estimates gets mid-exploitation (the best pooled mean)."""
        pooled = np.where(self.pool_cnt > 0, self.pool_sum / np.maximum(self.pool_cnt, 1), 0.0)
        return int(self._best_allowed(pooled[None, :])[0])

    # -- assignment ------------------------------------------------------------------------------
    def _best_allowed(self, w: np.ndarray) -> np.ndarray:
        """Per row, the drafter with the highest weight among those the executor runs."""
        if self._allowed is not None:
            w = np.where(self._allowed[None, :], w, -np.inf)
        return np.argmax(w, axis=1)

    def _capacity(self, n: int) -> np.ndarray:
        cap = np.full(self.m, n, dtype=I64) if self.cap is None else np.minimum(self.cap, n)
        return cap if self._allowed is None else np.where(self._allowed, cap, 0)

    def _chunk(self) -> tuple[int, int]:
        """(stage, chunk) the clock is in; an exploitation stage is one chunk."""
        return self._stage_no, (self.t_stage // self.beta if self.exploring else 0)

    def boundary_next(self) -> bool:
        """Whether the next ``assign`` begins a chunk or stage (draws at random, or matches)."""
        return self._chunk() != self._last_chunk

    def draws_next(self) -> bool:
        """Whether the next ``assign`` starts an exploration chunk (draws drafters at random)."""
        return self.exploring and self.boundary_next()

    def matches_next(self) -> bool:
        """Whether the next ``assign`` starts an exploitation stage (the max-weight matching)."""
        return not self.exploring and self.boundary_next()

    def advance(self, steps: int) -> None:
        """Move the clock ``steps`` steps on: the steps the last assignment stayed in force beyond
        the one ``assign`` counted (an owner holding its decisions between consultations)."""
        steps = int(steps)
        while steps > 0:
            step = min(steps, self._stage_len() - self.t_stage)
            self.t_stage += step
            steps -= step
            if self.t_stage >= self._stage_len():
                self._next_stage()

    def _next_stage(self) -> None:
        self.t_stage = 0
        self._stage_no += 1
        if self.exploring:
            self.exploring = False
        else:
            self.exploring = True
            self.epoch += 1

    def _random(self, n: int, rows: np.ndarray | None = None) -> np.ndarray:
        """(n,) drafters drawn for n requests, those flagged in ``rows`` (n,) bool with ``sync_p``."""
        cap = self._capacity(n)
        if rows is None or self.sync_p is None or not rows.any():
            choice = self._draw(n, self.explore_p)
        else:
            choice = np.empty(n, dtype=I64)
            choice[~rows] = self._draw(n - int(rows.sum()), self.explore_p)
            choice[rows] = self._draw(int(rows.sum()), self.sync_p)
        # Respect capacity: move the overflow of a full drafter to drafters with room.
        for j in range(self.m):
            idx = np.flatnonzero(choice == j)
            if idx.size > cap[j]:
                over = self.rng.permutation(idx)[cap[j]:]
                room = cap - np.bincount(choice, minlength=self.m)
                for i in over:
                    free = np.flatnonzero(room > 0)
                    if free.size == 0:
                        break
                    new = int(self.rng.choice(free))
                    room[new] -= 1
                    room[j] += 1
                    choice[i] = new
        return choice

    def _draw(self, n: int, probs: np.ndarray | None) -> np.ndarray:
        """(n,) drafters drawn with ``probs`` (m,) among those allowed (None: uniformly)."""
        p = None
        if probs is not None:
            p = np.where(self._allowed, probs, 0.0) if self._allowed is not None else probs
            p = p / p.sum() if p.sum() > 0 else None
        if p is not None:
            return self.rng.choice(self.m, size=n, p=p).astype(I64)
        if self._allowed is None:
            return self.rng.integers(0, self.m, size=n)
        return self.rng.choice(np.flatnonzero(self._allowed), size=n).astype(I64)

    def _matching(self, slots: np.ndarray, switch_cost: np.ndarray | None) -> np.ndarray:
        n = slots.size
        w = self.estimates(slots)
        if switch_cost is not None and self.lam > 0:
            cur = self.assigned[slots]
            differs = (np.arange(self.m)[None, :] != cur[:, None]) & (cur[:, None] >= 0)
            w = w - self.lam * switch_cost * differs
        cap = self._capacity(n)
        cols = np.repeat(np.arange(self.m), cap)
        if cols.size < n:  # not enough capacity for everyone: extra requests use the best drafter anyway
            return self._best_allowed(w)
        rows, col_idx = linear_sum_assignment(w[:, cols], maximize=True)
        out = np.empty(n, dtype=I64)
        out[rows] = cols[col_idx]
        return out

    def _stage_len(self) -> int:
        return self.alpha if self.exploring else min(2**self.epoch, self.max_exploit)

    def assign(self, slots: np.ndarray, switch_cost: np.ndarray | None = None,
               allowed: np.ndarray | None = None, whole: int | np.ndarray = -1,
               sync_rows: np.ndarray | None = None) -> np.ndarray:
        """Drafter per request from this step on (the clock counts it; ``advance`` counts the steps it
        stays in force beyond it). ``switch_cost``: (n, m) cost of moving to each;
        ``allowed``: (m,) bool, the drafters the executor runs now (default: all); ``whole`` >= 0:
        while exploiting, every request on that drafter instead of the matching (the owner's choice
        for the batch; an (n,) array: each request's); ``sync_rows``: (n,) bool, the requests that
        draw with ``sync_p`` while exploring."""
        slots = np.asarray(slots, dtype=I64)
        if slots.size == 0:
            return np.zeros(0, dtype=I64)
        self._ensure(int(slots.max()))
        self._allowed = self._allowed_of(allowed)
        if self.m == 1:
            self.assigned[slots] = 0
            return np.zeros(slots.size, dtype=I64)
        boundary = self.boundary_next()
        self._last_chunk = self._chunk()
        cur = self.assigned[slots]
        if not self.exploring and (isinstance(whole, np.ndarray) or whole >= 0):  # the owner's drafter, one for all or each its own
            new = cur if (cur == whole).all() else np.broadcast_to(whole, cur.shape).astype(I64)
        elif boundary:
            new = self._random(slots.size, sync_rows) if self.exploring else self._matching(slots, switch_cost)
        else:
            new = self._keep(slots, cur, sync_rows)
        if new is not cur:  # (mid-stage, everyone kept: no switches, nothing to write back)
            self.switches += int(((cur >= 0) & (cur != new)).sum())
            self.assigned[slots] = new
        self.advance(1)
        return new

    def _allowed_of(self, allowed: np.ndarray | None) -> np.ndarray | None:
        """``allowed`` as the bool mask ``assign`` keeps (None: every drafter), the last one reused
        while the caller passes the same array."""
        if allowed is None:
            return None
        if allowed is not self._allowed_src:
            self._allowed_src = allowed
            self._allowed_mask = None if allowed.all() or not allowed.any() else np.asarray(allowed, dtype=bool)
        return self._allowed_mask

    def _keep(self, slots: np.ndarray, cur: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Mid-stage: each request keeps its drafter, except one that arrived since the stage began,
        whose drafter the executor no longer runs, or (exploring) whose drafter's chance has fallen
        to ``keep_p`` or below (the flagged ``rows``' ``sync_p``), dropped at once rather than at the
        chunk's end. Returns ``cur`` itself when everyone keeps theirs."""
        missing = cur < 0
        if self._allowed is not None:
            missing |= ~self._allowed[np.maximum(cur, 0)]
        if self.exploring and self.explore_p is not None:
            at = np.maximum(cur, 0)
            p_cur = self.explore_p[at] if rows is None or self.sync_p is None else np.where(rows, self.sync_p[at], self.explore_p[at])
            missing |= p_cur <= self.keep_p
        if not missing.any():
            return cur
        new = cur.copy()
        if self.exploring:
            new[missing] = self._random(int(missing.sum()), None if rows is None else rows[missing])
        else:
            new[missing] = self._best_allowed(self.estimates(slots[missing]))
        return new

    def update(self, slots: np.ndarray, drafter: np.ndarray, reward: np.ndarray) -> None:
        """Record per-request goodput ``reward`` observed on ``drafter`` this slot (distinct slots)."""
        slots = np.asarray(slots, dtype=I64)
        if slots.size == 0:
            return
        self._ensure(int(slots.max()))
        # slots are distinct within a step (one outcome per request): plain fancy-index adds suffice
        self.g_sum[slots, drafter] += reward
        self.g_cnt[slots, drafter] += 1.0
        self.pool_sum += np.bincount(drafter, weights=reward, minlength=self.m)
        self.pool_cnt += np.bincount(drafter, minlength=self.m)
