"""Stage: held decisions. The fast path between full decisions: per step, look up; every N steps, optimise.

A full decision (every stage of ``policy.py``) runs on a refresh step: the first step, every N steps
after it, when the batch size has doubled or halved since the last one, when
the executor's drafters or the gate's state changed (with several drafters, every step while the
queued outcomes would still move the estimates, ``MOVE_FRACTION``; the bandit's clock counts the held
steps, ``bandit.py``).
N spends at most ``DECISION_SHARE`` of the step time on full decisions (``refresh_interval``):

    N = clip(ceil(full_us(n) / (DECISION_SHARE * step_us)), 1, REFRESH_EVERY)

with step_us the mean time of the steps since the last refresh (their outcomes' ``total_ms``, or
draft + verify time where the engine has no total; the full decision's prediction before any) and
full_us(n) what a full decision over n requests costs (``FULL_DECISION_US``, measured by
``benchmarks/decision_cost.py``): on an H100's 6-17 ms steps that is the 6-8 steps between
refreshes, on the CPU pair's 25-90 ms steps every 1-3 steps, where a decision held over 8 steps cost
1-2% of the replay's tokens per second (docs/controller-cost.md).
An owner that passes ``refresh_every`` fixes N; while the owner decides on the engine's loop (the
drafter bandit's first epochs, ``AdaptivePolicy.wants_fresh``, which an overlapping engine does not
move to its worker) N is the longest, REFRESH_EVERY.
It leaves, per slot, the request's draft length, drafter and confidence cut, and per drafter d a
table of draft lengths over the acceptance rate:

    tau_d = (upper) median over requests r on d of  g * next_cost_r / w_r   (the optimiser's marginal
            condition: one more token of survival p pays iff w_r * p >= g * next_cost_r)
    table[d, b] = #{j < K : S_d(rate_b)[j] >= tau_d},   rate_b = (b + 1/2) / RATE_BUCKETS,

with S_d the drafter's survival curve at that rate (``AcceptanceModel.survival_of``'s formula).
Between refreshes a step only looks up: k = min(held k of the slot, cap); a request that arrived
since the last refresh takes the drafter most requests drafted with (with the bandit, the one it
would give a request without estimates, ``DrafterChoice.newcomer``) and table[d, bucket(d's pooled
rate)], its prior's draft length, at most the refresh's deepest draft (the table prices tokens,
not the draft passes a deeper draft adds to everyone's step). The outcomes of those steps are
queued in order and learned at the next refresh (``AdaptivePolicy.flush``), so the estimators end
each refresh as if they had learned every step; only the decisions in between are up to N - 1
steps stale.
"""

from __future__ import annotations

import math

import numpy as np

from control.goodput.estimators import request_position_survival
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.survival import AcceptanceModel
from control.policy.base import I64

REFRESH_EVERY = 8  # steps between full decisions (the optimiser, the bandit, the cuts): docs/controller-cost.md,
# section 3, sixth round
MOVE_FRACTION = 0.05  # with several drafters, a full decision as well while the queued outcomes hold more
# draft trials than this share of those learned (early in a run, when one step's outcomes still decide
# which drafter the bandit explores for a whole stage)
# a full decision's cost in us for one request and for several (the batched path; flat in n up to 256
# within the timer's spread): benchmarks/decision_cost.py on the H100 profile, docs/controller-cost.md
FULL_DECISION_US = (230.0, 420.0)
DECISION_SHARE = 0.005  # share of the step time full decisions may take (the look-ups between: < 0.25%)
RATE_BUCKETS = 32  # acceptance-rate buckets of the draft-length table
NO_CUT = 0.0  # a raw confidence cut that never stops a draft (running confidences are > 0)


def refresh_interval(n: int, step_ms: float, most: int = REFRESH_EVERY) -> int:
    """Steps between full decisions over ``n`` requests whose step takes ``step_ms`` (module doc)."""
    if not step_ms > 0.0:  # nothing predicted (no admissible draft): the longest hold
        return most
    full_us = FULL_DECISION_US[0] if n <= 1 else FULL_DECISION_US[1]
    return int(min(max(math.ceil(full_us / (DECISION_SHARE * step_ms * 1000.0)), 1), most))


class HeldDecisions:
    def __init__(self, slots: int, m: int, K: int, every: int | None = None) -> None:
        """``every``: steps between full decisions (None: from the step time, ``refresh_interval``)."""
        self.auto = every is None
        self.every = REFRESH_EVERY if every is None else int(every)  # the interval now
        self.k = np.zeros(slots, dtype=I64)  # (slots,) draft length of the last full decision
        self.drafter = np.zeros(slots, dtype=I64)  # (slots,) its executor drafter
        self.cut = np.full(slots, NO_CUT)  # (slots,) its raw confidence cut
        self.table = np.zeros((m, RATE_BUCKETS), dtype=I64)  # (m, RATE_BUCKETS) k per drafter and rate
        self._rates = (np.arange(RATE_BUCKETS) + 0.5) / RATE_BUCKETS  # (RATE_BUCKETS,) bucket centres
        self.new_k = 0  # draft length of a request that arrived since the refresh
        self.new_drafter = 0  # its executor drafter
        self._table_for: tuple | None = None  # (plan, acceptance, favourite) the table waits to be built from
        self.has_cut = False  # the last full decision had confidence cuts
        self.depth = 0  # the last full decision's deepest draft
        self.valid = False  # a full decision to hold exists
        self._step = -1  # step of the last full decision
        self._batch = 0  # batch size of the last full decision
        self._map = None  # the executor drafter map the held indices refer to
        self.K = K

    def grow(self, size: int) -> None:
        if size > self.k.size:
            extra = size - self.k.size
            self.k = np.concatenate([self.k, np.zeros(extra, dtype=I64)])
            self.drafter = np.concatenate([self.drafter, np.zeros(extra, dtype=I64)])
            self.cut = np.concatenate([self.cut, np.full(extra, NO_CUT)])

    def due(self, n: int, step: int, to_exec: np.ndarray) -> bool:
        """Whether this step needs a full decision."""
        return (self.every == 1 or not self.valid or step - self._step >= self.every or step < self._step
                or n > 2 * self._batch or 2 * n < self._batch or to_exec is not self._map)

    def admit(self, slots: np.ndarray) -> None:
        """Requests that took ``slots`` since the refresh: the prior's draft length on the favourite."""
        if self._table_for is not None:  # the first arrival since the refresh builds the table
            self._rebuild(*self._table_for)
            self._table_for = None
        self.k[slots] = self.new_k
        self.drafter[slots] = self.new_drafter
        self.cut[slots] = NO_CUT

    def lookup(self, slots: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(k, executor drafter, raw cut or None), each (n,), of the requests in ``slots``."""
        k = np.minimum(self.k[slots], cap)
        return k, self.drafter[slots], (self.cut[slots] if self.has_cut else None)

    def hold(self, sp: StepPlan, acceptance: AcceptanceModel, to_exec: np.ndarray, default: int,
             newcomer: int = -1, step_ms: float = math.nan, on_loop: bool = False) -> None:
        """Keep a full decision (``sp``) per slot and rebuild the table for new requests (``newcomer``:
        the plan drafter for them, -1: the one most requests drafted with; ``step_ms``: the steps'
        mean time since the last refresh, NaN: none measured; ``on_loop``: the next decisions run on
        the engine's loop even where it overlaps them with its steps, so hold the longest)."""
        slots, choice = sp.view.slots, sp.choice
        self.k[slots] = choice.k
        self.drafter[slots] = sp.d_exec
        self.has_cut = sp.conf_cut is not None
        if self.has_cut:
            self.cut[slots] = sp.conf_cut
        self.valid, self._step, self._batch, self._map = True, sp.view.step, sp.n, to_exec
        if self.auto:
            self.every = REFRESH_EVERY if on_loop else refresh_interval(
                sp.n, step_ms if step_ms > 0.0 else float(choice.step_ms))
        # the refresh's deepest draft among requests not held back by a cap of their own, below max_k
        # (at batch 1 near the end of a request its k is capped by the tokens left: then no limit)
        free = choice.k[(choice.k < sp.cap) | (sp.cap >= self.K)]
        self.depth = int(free.max()) if free.size else self.K
        ran = sp.d_ctx[(choice.k > 0) & (sp.d_ctx >= 0)]  # plan drafters that drafted
        fav = newcomer if newcomer >= 0 else int(np.argmax(np.bincount(ran))) if ran.size else default
        self.new_drafter = max(int(to_exec[fav]), 0) if to_exec.size else 0
        self._table_for = (sp, acceptance, fav)  # built when a request arrives before the next refresh

    def _rebuild(self, sp: StepPlan, acceptance: AcceptanceModel, fav: int) -> None:
        """table[d] for the drafters in the step and the favourite (the others keep theirs) from the
        marginal condition (the favourite, if no request drafted with it, at every request's), and the
        favourite's draft length at its pooled rate (``new_k``)."""
        nxt = sp.choice.next_cost
        if nxt is not None:  # None: nothing admissible (every cap 0), nothing to learn about thresholds
            tau = sp.g_value * nxt if sp.weights is None else sp.g_value * nxt / sp.weights  # (n,) in survival
            in_step = sp.d_ctx[:1] if sp.uniform else np.unique(sp.d_ctx)
            for d in in_step if fav in in_step else np.append(in_step, fav):
                if d < 0:
                    continue
                mine = np.sort(tau if sp.uniform or d not in in_step else tau[sp.d_ctx == d])
                pos = acceptance.pos[int(d)]
                surv = request_position_survival(self._rates, pos.rates, pos.mean_rate, pos.odds)  # (RATE_BUCKETS, K)
                self.table[int(d)] = np.cumprod(surv >= float(mine[mine.size // 2]), axis=1).sum(axis=1)
        bucket = min(int(acceptance.pooled_rate(fav) * RATE_BUCKETS), RATE_BUCKETS - 1)
        self.new_k = min(int(self.table[fav, bucket]), self.depth)

    def invalidate(self) -> None:
        self.valid = False
        self._table_for = None
