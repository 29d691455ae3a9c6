"""Stage: survival. What ``adaptive`` believes about each request's acceptance, and how it learns.

Per drafter i: pooled per-position rates ``pos[i]`` (conditional a[j] = P(position j accepted |
j-1 accepted)), each request's own Beta-posterior rate ``req[i]`` shrunk to its category's rate
(``cat``) or the drafter's pooled rate, and a calibration ``conf[i]`` from the drafter's running
confidence to survival.

Survival of request r's draft position j (``request_position_survival``):

    logit(a[r, j]) = logit(pos_rate[j]) + logit(rate_r) - logit(ref_r)
    surv[r, j] = prod_{j' <= j} a[r, j']

with ref_r what the curve expects of the positions r tried (``RequestBeta.reference``), shrunk to
the pooled rate alike: a request is shifted by how it did against the curve where it drafted. Against
the pooled rate, which counts the deep positions only long drafts reach (0.93+ on the CPU pair, 0.83
at the first), every request that drafts short read as a poor one: on the full pair's replay at batch
4 the requests' shifts averaged -0.26 in log-odds, and adaptive expected the first draft position
to pass 0.77 of the times it passed 0.83 (docs/decisions.md, stop 62).

An n-gram lookup's acceptance depends on what it proposes: on the CPU pair's record a lookup that
proposes 2-5 tokens (a recent repeat) has its first token accepted 94-100% of the time, one that
proposes max_k (an old match) 25%. So for the drafters marked ``lookup`` (n-gram) whose request's
view carries the lookup's proposal a_r (``StepView.ngram_avail``), survival comes from per-position
rates pooled over the steps whose lookup proposed the same a (``LookupRates``), and is 0 past a_r:

    surv[r, j] = prod_{j' <= j} lookup_rate[a_r, j']   (j < a_r),   0   (j >= a_r).

Those rates learn from the requests that drafted on the lookup and, where the executor scores every
lookup (``StepOutcome.ngram_match``), from every other request too (``lookup_evidence``): its lookup
saw min(a_r, accepted_r + 1) committed tokens and matched the first ``ngram_match`` of them, a chain
with a miss where the match stopped short of what it saw and none where it did not.
"""

from __future__ import annotations

import numpy as np

from control.goodput.acceptance import MAX_RATE
from control.goodput.estimators import (
    CategoryRates,
    ConfidenceMap,
    PositionRates,
    RequestBeta,
    request_position_survival,
)
from control.goodput.stepcost import DrafterKind
from control.policy.types import StepOutcome, StepView

CATEGORIES = 8  # category slots of the pooled per-category rates
# per-step decay of every drafter's pooled per-position counts, drafted with or not (each step that
# learned anything, and each step the gate kept off): a memory of ~200 steps, so a prompt mix whose
# acceptance moved is learned within a few gate probe windows (0.999 kept ~1,000 steps' counts and let
# the gate reopen only minutes into a high-acceptance phase; docs/validation.md), and a drafter the
# bandit stopped drawing after an unlucky start drifts back to its prior and is drawn again
# (docs/validation.md, "The full pair's replay")
POSITION_DECAY = 0.995
# per-step decay of every lookup proposal length's counts, drafted on or not (half-life 32 steps): an
# n-gram lookup's acceptance moves with the request's output (the full CPU pair's 8-token lookups: 16%
# in the first 8 positions, 80% past 64), and a proposal length the held table stopped drafting never
# gets a trial that would show it; its stale evidence fades to the prior, which drafts it again
LOOKUP_CLOCK_DECAY = 0.5 ** (1.0 / 32.0)


class AcceptanceModel:
    """Per drafter: position rates, per-request posteriors, confidence calibration; plus categories."""

    def __init__(self, prior_positions: np.ndarray, strength: float, slots: int, confidences: np.ndarray,
                 lookup: np.ndarray | None = None) -> None:
        m, K = prior_positions.shape  # (m, K)
        self.K = K
        self.confidences = confidences  # (m,) bool: drafter reports confidences
        self.lookup = np.zeros(m, dtype=bool) if lookup is None else np.asarray(lookup, dtype=bool)  # (m,) n-gram
        self.pos = [(LookupPositions if self.lookup[i] else PositionRates)(K, prior=prior_positions[i], decay=POSITION_DECAY)
                    for i in range(m)]
        self.by_avail = {int(i): self.pos[i].by_avail for i in np.flatnonzero(self.lookup)}
        self.req = [RequestBeta(strength, capacity=slots, max_k=K) for _ in range(m)]
        self.cat = CategoryRates(CATEGORIES)
        self.conf = [ConfidenceMap() for _ in range(m)]
        self._pos_idx = np.arange(K)[None, :]  # (1, K) draft positions, for masks over (n, K) arrays

    def set_priors(self, prior_positions: np.ndarray) -> None:
        for i, pr in enumerate(self.pos):
            pr.set_prior(prior_positions[i])

    def pooled_rate(self, i: int) -> float:
        return self.pos[i].mean_rate

    def reset(self, slots: np.ndarray) -> None:
        """Forget the requests that held ``slots`` (new requests take them)."""
        for r in self.req:
            r.ensure(int(slots.max()))
            r.reset(slots)

    def survival(self, view: StepView, d_ctx: np.ndarray, uniform: bool) -> np.ndarray:
        """(n, K) survival of each request's draft positions on its drafter ``d_ctx`` (n,) (``uniform``:
        one drafter serves the whole batch)."""
        if uniform:  # always so at batch 1: no masks
            i = int(d_ctx[0])
            if view.ngram_avail is not None and i in self.by_avail:  # every row from its lookup's curve
                return self.by_avail[i].curves()[np.minimum(view.ngram_avail, self.K)]
            surv = self.survival_of(i, view.slots, view.category)
        else:
            surv = self._mixed_survival(view, d_ctx)
        if view.ngram_avail is not None and self.by_avail:
            self._lookup_survival(surv, view.ngram_avail, d_ctx)
        return surv

    def _lookup_survival(self, surv: np.ndarray, avail: np.ndarray, d_ctx: np.ndarray) -> None:
        """Rows of ``surv`` (n, K) on a lookup drafter replaced in place by their lookup's curve (module doc)."""
        for i, lr in self.by_avail.items():
            on = d_ctx == i  # (n,) bool
            if on.all():
                surv[:] = lr.curves()[np.minimum(avail, self.K)]
            elif on.any():
                surv[on] = lr.curves()[np.minimum(avail[on], self.K)]

    def _mixed_survival(self, view: StepView, d_ctx: np.ndarray) -> np.ndarray:
        surv = np.empty((view.n, self.K))  # (n, K)
        for i in range(len(self.pos)):
            sel = d_ctx == i  # (n,) bool
            if not sel.any():
                continue
            surv[sel] = self.survival_of(i, view.slots[sel], None if view.category is None else view.category[sel])
        return surv

    def survival_of(self, i: int, slots: np.ndarray, category: np.ndarray | None) -> np.ndarray:
        """(len(slots), K) survival on drafter ``i`` of the requests in ``slots``."""
        pos = self.pos[i]
        pooled = pos.mean_rate
        prior = pooled if category is None else self.cat.rates(category, pooled)  # float or (n,)
        rate = self.req[i].mean(slots, prior)  # (n,)
        return request_position_survival(rate, pos.rates, self.req[i].reference(slots, pos.prefix, pooled), pos.odds)

    def learn(self, outcome: StepOutcome, d_ctx: np.ndarray, tried: np.ndarray, spec: np.ndarray, s: np.ndarray,
              t: np.ndarray, uniform: bool) -> None:
        """Update the estimators with the requests that drafted (``spec``, (n,) bool); ``tried`` (n,):
        draft tokens counted as trials; ``s``, ``t`` (n,): their chain successes and trials."""
        if uniform and d_ctx[0] >= 0 and (outcome.n == 1 or spec.all()):  # one known drafter, everyone drafted
            # (at batch 1 the caller saw that it drafted): no masks
            i = int(d_ctx[0])
            self.pos[i].update(tried, outcome.accepted, t)
            self.req[i].update(outcome.slots, s, t)
            self._age_idle(1, i)
        else:
            for i in range(len(self.pos)):
                sel = spec & (d_ctx == i)  # (n,) bool
                if not sel.any():
                    self.pos[i].age(1)
                    continue
                self.pos[i].update(tried[sel], outcome.accepted[sel], t[sel])
                self.req[i].update(outcome.slots[sel], s[sel], t[sel])
        if outcome.category is not None:
            self.cat.update(outcome.category[spec], s[spec], t[spec])
        if outcome.confidence is not None and self.confidences.any():
            self.calibrate(outcome, d_ctx, spec)
        if outcome.ngram_avail is not None and self.by_avail:
            avail = outcome.ngram_avail
            for i, lr in self.by_avail.items():
                lr.age(1)
                sel, acc, tr = lookup_evidence(spec & (d_ctx == i), outcome.accepted, t, avail, outcome.ngram_match)
                if sel.any():
                    lr.update(avail[sel], acc[sel], tr[sel])

    def learn_request(self, slots: np.ndarray, d_ctx: np.ndarray, s: np.ndarray, t: np.ndarray, spec: np.ndarray,
                      uniform: bool) -> None:
        """The per-request posteriors alone (``learn``'s first part, for ``learn_pooled``'s caller):
        slot state, so learned in the order of the steps, between the slot resets."""
        if uniform and d_ctx[0] >= 0 and (slots.shape[0] == 1 or spec.all()):
            self.req[int(d_ctx[0])].update(slots, s, t)
            return
        for i in range(len(self.req)):
            sel = spec & (d_ctx == i)  # (n,) bool
            if sel.any():
                self.req[i].update(slots[sel], s[sel], t[sel])

    def learn_pooled(self, rows: PooledRows) -> None:
        """The pooled estimators (per position, per category, confidence calibration) from several
        steps' rows at once, as learning them step by step would leave them (to rounding): an
        estimator that decays per update weighs a row by decay ** (its updates after the row's step)."""
        if not rows.steps:
            return
        acc, t, step = rows.col("accepted"), rows.col("t"), rows.col("step")
        age = (rows.steps - 1) - step  # (rows,) learning steps after each row's
        if rows.one >= 0:  # one drafter learned from every row: each step is one of its updates
            self.pos[rows.one].update_steps(acc, t, age, rows.steps)
            self._age_idle(rows.steps, rows.one)
        else:
            spec, d = rows.col("spec"), rows.col("d")
            for i in range(len(self.pos)):
                sel = spec & (d == i)  # (rows,) bool
                if sel.any():
                    self.pos[i].update_steps(acc[sel], t[sel], age[sel], rows.steps)
                else:
                    self.pos[i].age(rows.steps)
        category = rows.col("category")
        if category is not None:
            spec = rows.col("spec")
            self.cat.update(category[spec], rows.col("s")[spec], t[spec])
        if self.confidences.any() and rows.col("conf") is not None:
            self._calibrate_rows(rows)
        if self.by_avail and rows.col("avail") is not None:
            self._lookup_rows(rows)

    def age_pooled(self, steps: int) -> None:
        """``steps`` steps passed in which nothing drafted (the gate off): every drafter's pooled
        per-position evidence decays as if it had been a learning step."""
        for pr in self.pos:
            pr.age(steps)

    def _age_idle(self, steps: int, active: int) -> None:
        """Every drafter but ``active`` learned nothing for ``steps`` learning steps: its evidence decays."""
        for i, pr in enumerate(self.pos):
            if i != active:
                pr.age(steps)

    def _lookup_rows(self, rows: PooledRows) -> None:
        avail, spec, d, step = rows.col("avail"), rows.col("spec"), rows.col("d"), rows.col("step")
        for i, lr in self.by_avail.items():
            lr.age(rows.steps)
            on = spec & (d == i) & (avail > 0)  # (rows,) bool: drafted on this lookup, its proposal known
            sel, acc, tr = lookup_evidence(on, rows.col("accepted"), rows.col("t"), avail, rows.col("match"))
            if sel.any():
                lr.update_steps(avail[sel], acc[sel], tr[sel], step[sel], clock=rows.steps)

    def _calibrate_rows(self, rows: PooledRows) -> None:
        conf = rows.col("conf")  # (rows, K), NaN where nothing was drafted
        step, spec, d, steps = rows.col("step"), rows.col("spec"), rows.col("d"), rows.steps
        pos = self._pos_idx[:, : conf.shape[1]]  # (1, K)
        drafted = (pos < rows.col("drafted")[:, None]) & np.isfinite(conf)  # (rows, K) bool
        prod = np.cumprod(np.where(drafted, conf, 1.0), axis=1)  # (rows, K) running confidence
        hit = (pos < rows.col("accepted")[:, None]) & drafted  # (rows, K) bool: observed survival
        any_drafted = np.bincount(step, weights=drafted.any(axis=1), minlength=steps) > 0  # (steps,)
        for i in np.flatnonzero(self.confidences):
            mine = spec & (d == i)  # (rows,) bool
            updated = np.zeros(steps, dtype=bool)  # (steps,) steps whose update reached this map
            updated[step[mine]] = True
            updated &= any_drafted
            if not updated.any():
                continue
            ages_by_step = np.cumsum(updated[::-1])[::-1] - updated  # (steps,) updates after each step
            sel = mine & updated[step]  # (rows,) bool
            age = np.repeat(ages_by_step[step[sel]], drafted[sel].sum(axis=1))  # (tokens,)
            self.conf[i].update_steps(prod[sel][drafted[sel]], hit[sel][drafted[sel]], age, int(updated.sum()))

    def calibrate(self, outcome: StepOutcome, d_ctx: np.ndarray, spec: np.ndarray) -> None:
        """Feed each confidence-reporting drafter's map the (running confidence, survived) pairs of
        the tokens it drafted this step."""
        conf = outcome.confidence  # (n, >= w)
        w = min(conf.shape[1], self.K)
        pos = self._pos_idx[:, :w]  # (1, w)
        drafted = (pos < outcome.drafted[:, None]) & np.isfinite(conf[:, :w])  # (n, w) bool
        if not drafted.any():
            return
        prod = np.cumprod(np.where(drafted, conf[:, :w], 1.0), axis=1)  # (n, w) running confidence per drafted token
        hit = (pos < outcome.accepted[:, None]) & drafted  # (n, w) bool: observed survival
        for i in drafters_in(d_ctx[spec]):
            if i < 0 or not self.confidences[i]:
                continue
            rows = spec & (d_ctx == i)  # (n,) bool
            self.conf[i].update(prod[rows][drafted[rows]], hit[rows][drafted[rows]])


class PooledRows:
    """Several steps' outcomes, row by row, for ``AcceptanceModel.learn_pooled``."""

    NAMES = ("d", "tried", "accepted", "s", "t", "spec", "drafted", "category", "conf", "avail", "match")

    def __init__(self, K: int) -> None:
        self.K = K
        self.steps = 0
        self._parts: list[tuple] = []
        self._cols: dict[str, np.ndarray | None] = {}
        self.one = -2  # the drafter of every row when each step had one drafter and every row drafted
        # (-2: no step yet, -1: not so)

    def add(self, d_ctx, tried, accepted, s, t, spec, drafted, category, confidence, uniform: bool,
            avail: np.ndarray | None = None, match: np.ndarray | None = None) -> None:
        """One step's (n,) arrays (``confidence`` (n, >= 1) or None; ``avail``, ``match``: the step's
        ``ngram_avail`` and ``ngram_match`` or None) that learned anything."""
        self._parts.append((d_ctx, tried, accepted, s, t, spec, drafted, category, confidence, avail, match))
        self.steps += 1
        i = int(d_ctx[0]) if uniform and d_ctx[0] >= 0 and (spec.shape[0] == 1 or spec.all()) else -1
        self.one = i if self.one in (-2, i) else -1

    def col(self, name: str) -> np.ndarray | None:
        """Column ``name`` over every step's rows (``step``: each row's step index; steps without a
        category: -1, unknown; without confidences: NaN; None where no step has them)."""
        if name not in self._cols:
            self._cols[name] = self._concat(name)
        return self._cols[name]

    def _concat(self, name: str) -> np.ndarray | None:
        parts = self._parts
        if name == "step":
            return np.repeat(np.arange(len(parts)), [p[0].shape[0] for p in parts])
        j = self.NAMES.index(name)
        if name in ("category", "conf", "avail", "match"):
            if all(p[j] is None for p in parts):
                return None
            if name != "conf":  # unknown: -1 (an unknown proposal or match teaches the lookup rates nothing)
                return np.concatenate([np.full(p[0].shape[0], -1) if p[j] is None else p[j] for p in parts])
            return np.concatenate([np.full((p[0].shape[0], self.K), np.nan) if p[j] is None else _width(p[j], self.K)
                                   for p in parts])  # (rows, K)
        return np.concatenate([p[j] for p in parts])


class LookupRates:
    """Per-position conditional acceptance of an n-gram lookup, one ``PositionRates`` per proposal
    length a = 1..K (row 0 of ``curves``: a lookup that proposes nothing, survival 0).

    The K estimators' counts live in one (K, 2, K) array (each ``PositionRates`` holds a view of its
    row), so one step's or several steps' outcomes update every proposal length in one pass."""

    def __init__(self, K: int, prior: np.ndarray) -> None:
        self.K = K
        self.rates = [PositionRates(K, prior=prior) for _ in range(K)]  # [a - 1]
        self._counts = np.zeros((K, 2, K))  # (a - 1, trials | successes, position), decayed
        for a, r in enumerate(self.rates):
            r._counts = self._counts[a]
            r.trials, r.succ = r._counts[0], r._counts[1]
        self.decay = self.rates[0].decay
        self._curves: np.ndarray | None = None
        self._mask = np.arange(K)[None, :] < np.arange(K + 1)[:, None]  # (K+1, K): position j < a

    def set_prior(self, prior: np.ndarray) -> None:
        for r in self.rates:
            r.set_prior(prior)
        self._curves = None

    def age(self, steps: int) -> None:
        """``steps`` steps passed: every proposal length's evidence decays (``LOOKUP_CLOCK_DECAY``)."""
        if steps > 0 and self._counts.any():
            self._counts *= LOOKUP_CLOCK_DECAY ** steps
            for r in self.rates:
                r._cache = None
            self._curves = None

    def curves(self) -> np.ndarray:
        """(K+1, K): survival of draft position j for a lookup proposing a tokens (0 past a)."""
        if self._curves is None:  # every length's ``PositionRates.rates`` at once (one prior for all)
            first = self.rates[0]
            pt, c = first.prior_trials, self._counts  # c: (K, 2, K)
            rates = np.minimum((c[:, 1] + first.prior * pt) / (c[:, 0] + pt), MAX_RATE)  # (K a - 1, K position)
            curves = np.zeros((self.K + 1, self.K))  # (K+1, K)
            curves[1:] = np.cumprod(rates, axis=1) * self._mask[1:]
            self._curves = curves
        return self._curves

    def update(self, avail: np.ndarray, accepted: np.ndarray, tried: np.ndarray) -> None:
        """One step's outcomes of requests whose lookups proposed ``avail`` (rows,) tokens (none: no row)."""
        on = avail > 0  # (rows,) bool
        if not on.any():
            return
        a = np.minimum(avail[on], self.K) - 1  # (rows,) estimator row, 0..K-1
        once = np.minimum(np.bincount(a, minlength=self.K), 1)  # (K,) each length with a row decays once
        self._add(a, accepted[on], tried[on], None, once)

    def update_steps(self, avail: np.ndarray, accepted: np.ndarray, tried: np.ndarray, step: np.ndarray,
                     clock: int = 0) -> None:
        """Several steps' outcomes (rows,) at once, ``avail`` > 0, ``step``: each row's step (>= 0). As
        ``PositionRates.update_steps`` of each proposal length would leave them: the estimator of
        proposal length a decays once per step with a row of its own, so a row enters with weight
        decay ** (such steps after its own); with ``clock`` (the steps covered, already passed to
        ``age``) also LOOKUP_CLOCK_DECAY ** (steps after its own), as ``age(1)`` before each step would."""
        K = self.K
        a = np.minimum(avail, K) - 1  # (rows,) estimator row, 0..K-1
        span = int(step.max()) + 1 if step.shape[0] else 1
        uk = np.unique(a * span + step)  # (updates,) distinct (a, step), sorted by a, then step
        per_a = np.bincount(uk // span, minlength=K)  # (K,) updates per proposal length
        age = np.cumsum(per_a)[a] - 1 - np.searchsorted(uk, a * span + step)  # (rows,)
        w = np.power(self.decay, age)  # (rows,)
        if clock:
            w = w * np.power(LOOKUP_CLOCK_DECAY, (clock - 1) - step)
        self._add(a, accepted, tried, w, per_a)

    def _add(self, a: np.ndarray, accepted: np.ndarray, tried: np.ndarray, w: np.ndarray | None,
             decays: np.ndarray) -> None:
        """Rows (estimator row ``a``, weight ``w``; None: 1) added after each proposal length's counts
        decayed ``decays`` (K,) times, in one histogram over (length, trials | successes, position)."""
        K = self.K
        width = 2 * (K + 1)
        idx = np.concatenate((a * width + np.minimum(tried, K), a * width + (K + 1) + np.minimum(accepted, K)))
        hist = np.bincount(idx, weights=None if w is None else np.concatenate((w, w)),
                           minlength=K * width).reshape(K, 2, K + 1)  # (a - 1, trials | successes, 0..K)
        self._counts *= np.power(self.decay, decays)[:, None, None]
        self._counts += hist[:, :, :0:-1].cumsum(axis=2)[:, :, ::-1]  # columns j = 1..K: counts above j - 1
        for v in np.flatnonzero(decays).tolist():
            self.rates[v]._cache = None
        self._curves = None


class LookupPositions(PositionRates):
    """An n-gram drafter's position rates, with the same rates split by what its lookup proposed
    (``by_avail``, learned and read by ``AcceptanceModel``; the drafter stage reads its curves)."""

    def __init__(self, max_k: int, prior, decay: float) -> None:
        super().__init__(max_k, prior=prior, decay=decay)
        self.by_avail = LookupRates(max_k, self.prior)

    def set_prior(self, prior) -> None:
        super().set_prior(prior)
        if hasattr(self, "by_avail"):
            self.by_avail.set_prior(self.prior)


def lookup_evidence(on: np.ndarray, accepted: np.ndarray, t: np.ndarray, avail: np.ndarray,
                    match: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows (n,) bool that teach a lookup drafter's rates, with their accepted runs and trials
    (n,): those that drafted on it (``on``: ``accepted``, ``t``), and those whose lookup proposed
    something it did not draft, scored against the tokens the step committed (``match`` >= 0: the
    executor's ``StepOutcome.ngram_match``). Such a row saw min(avail, accepted + 1) of the lookup's
    tokens, so its trials stop there: a lookup matching every committed token has no failure yet."""
    if match is None:
        return on, accepted, t
    scored = (match >= 0) & (avail > 0) & ~on  # (n,) bool
    if not scored.any():
        return on, accepted, t
    seen = np.minimum(avail, accepted + 1)  # (n,) lookup tokens the committed ones cover
    return on | scored, np.where(on, accepted, match), np.where(on, t, np.minimum(match + 1, seen))


def _width(conf: np.ndarray, K: int) -> np.ndarray:
    """(n, K): ``conf``'s first K columns, NaN-padded to K."""
    if conf.shape[1] >= K:
        return conf[:, :K]
    return np.concatenate([conf, np.full((conf.shape[0], K - conf.shape[1]), np.nan)], axis=1)


def lookup_drafters(ctx) -> np.ndarray:
    """(m,) bool: the context's drafters that are n-gram lookups (``AcceptanceModel``'s ``lookup``)."""
    return np.array([d.kind == DrafterKind.ngram for d in ctx.cost.drafters], dtype=bool)


def is_uniform(d: np.ndarray) -> bool:
    """Whether one drafter index fills ``d`` (n,)."""
    return d.size == 1 or bool((d == d[0]).all())


def drafters_in(d: np.ndarray) -> np.ndarray:
    """The distinct drafter indices in ``d`` (n,) (np.unique's sort, skipped for the usual one drafter)."""
    if d.size == 0 or is_uniform(d):
        return d[:1]
    return np.unique(d)
