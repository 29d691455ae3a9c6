"""Acceptance estimators: cheap, vectorised, per deployment and per drafter.

"Acceptance rate" here is the per-token conditional acceptance probability alpha of the chain
model, estimated from chain outcomes by maximum likelihood: every evaluated draft position is a
Bernoulli trial; a request that drafted k and had m accepted evaluated min(m + 1, k) positions with m
successes (positions after the first rejection are never tried). accepted / drafted would be biased
low for long drafts.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from control.errors import ConfigError
from control.goodput.acceptance import DEFAULT_ACCEPTANCE, MAX_RATE

# Rates are clipped into [RATE_EPS, 1 - RATE_EPS] before their odds a / (1 - a) are taken.
RATE_EPS = 1e-6


def chain_trials(verified: np.ndarray, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(successes, trials) per request from chain outcomes."""
    verified = np.asarray(verified, dtype=np.int64)
    accepted = np.asarray(accepted, dtype=np.int64)
    return accepted, np.minimum(accepted + 1, verified)


def _check_rate(name: str, v: float) -> float:
    if not (0.0 <= v < 1.0):
        raise ConfigError(f"{name} = {v!r}: acceptance must be in [0, 1)")
    return float(v)


class MovingWindow:
    """Global rate over the last ``window`` steps (SmartSpec's moving average)."""

    def __init__(self, window: int = 64, prior: float = DEFAULT_ACCEPTANCE, prior_trials: float = 4.0) -> None:
        if window < 1:
            raise ConfigError(f"window = {window!r}: must be >= 1 step")
        self._succ = np.zeros(window)
        self._trials = np.zeros(window)
        self._i = 0
        self.prior = _check_rate("prior", prior)
        self.prior_trials = float(prior_trials)

    def update(self, successes: float, trials: float) -> None:
        if trials <= 0:
            return
        self._succ[self._i] = successes
        self._trials[self._i] = trials
        self._i = (self._i + 1) % self._succ.size

    @property
    def rate(self) -> float:
        s = self._succ.sum() + self.prior * self.prior_trials
        t = self._trials.sum() + self.prior_trials
        return float(min(s / t, MAX_RATE))

    @property
    def trials(self) -> float:
        return float(self._trials.sum())



class PositionRates:
    """Conditional acceptance per draft position j = 1..K (acceptance falls along the draft).

    Counts decay by ``decay`` per update so the estimate follows a changing workload; each position
    starts from its prior (a scalar or one rate per position) worth ``prior_trials`` trials.
    """

    def __init__(self, max_k: int, prior=DEFAULT_ACCEPTANCE, prior_trials: float = 4.0, decay: float = 0.999) -> None:
        if max_k < 1:
            raise ConfigError(f"max_k = {max_k!r}: must be >= 1")
        self.max_k = max_k
        self._cache = None
        self.set_prior(prior)
        self.prior_trials = prior_trials
        self.decay = decay
        # (2, K): trials and successes per position, decayed; ``trials`` and ``succ`` are its rows
        self._counts = np.zeros((2, max_k))
        self.trials = self._counts[0]
        self.succ = self._counts[1]
        self._pos = np.arange(max_k)

    def update(self, verified: np.ndarray, accepted: np.ndarray, tried: np.ndarray | None = None) -> None:
        """One step's chain outcomes; ``tried`` (optional): positions evaluated per request,
        min(accepted + 1, verified), if the caller has them (``chain_trials``' trials)."""
        accepted = np.asarray(accepted)
        if accepted.shape[0] == 1:  # one request: its trials and successes are prefixes of the positions
            acc = int(accepted[0])
            tried_one = min(acc + 1, int(np.asarray(verified)[0]))
            self._counts *= self.decay
            self.trials[:tried_one] += 1.0
            self.succ[:acc] += 1.0
            self._cache = None
            return
        if tried is None:
            tried = np.minimum(accepted + 1, np.asarray(verified))
        K = self.max_k
        # trials at position j = #requests that tried more than j positions: a reverse cumulative
        # histogram (no (n, K) comparison matrix on the per-step path); successes likewise, both
        # from one histogram over (tried, K + 1 + accepted)
        hist = np.bincount(np.concatenate((np.minimum(tried, K), np.minimum(accepted, K) + (K + 1))),
                           minlength=2 * (K + 1)).reshape(2, K + 1)
        self._counts *= self.decay
        self._counts += hist[:, :0:-1].cumsum(axis=1)[:, ::-1]  # columns j = 1..K: counts above j - 1
        self._cache = None

    def update_steps(self, accepted: np.ndarray, tried: np.ndarray, age: np.ndarray, steps: int) -> None:
        """Several steps' chain outcomes at once, as ``steps`` calls of ``update`` would leave the counts
        (to rounding): the counts decay once per step, so an outcome ``age[r]`` steps before the last
        enters with weight decay ** age[r]. ``accepted``, ``tried``, ``age``: (rows,) over all the steps."""
        K = self.max_k
        w = np.power(self.decay, age)  # (rows,)
        hist = np.bincount(np.concatenate((np.minimum(tried, K), np.minimum(accepted, K) + (K + 1))),
                           weights=np.concatenate((w, w)), minlength=2 * (K + 1)).reshape(2, K + 1)
        self._counts *= self.decay ** steps
        self._counts += hist[:, :0:-1].cumsum(axis=1)[:, ::-1]
        self._cache = None

    def age(self, steps: int) -> None:
        """``steps`` updates passed without outcomes of this estimator: its counts decay as if each had
        been an update with nothing to learn (the estimate drifts back to the prior)."""
        if steps > 0:
            self._counts *= self.decay ** steps
            self._cache = None

    def set_prior(self, prior) -> None:
        p = np.asarray(prior, dtype=np.float64).reshape(-1)
        if 1 < p.size < self.max_k:  # a plan with a smaller max_k: its last position's rate for the rest
            p = np.concatenate([p, np.full(self.max_k - p.size, p[-1])])
        p = np.broadcast_to(p if p.size > 1 else p.reshape(()), (self.max_k,)).copy()
        for v in p:
            _check_rate("prior", float(v))
        self.prior = p
        self._cache = None

    def _estimates(self) -> tuple[np.ndarray, float, np.ndarray, float, float, np.ndarray]:
        """(rates, mean_rate, odds of the clipped rates, total successes, total trials, ``prefix``),
        recomputed only after an update."""
        if self._cache is None:
            pt = self.prior_trials
            rates = np.minimum((self.succ + self.prior * pt) / (self.trials + pt), MAX_RATE)
            t_all, s_all = self._counts.sum(axis=1).tolist()
            mean = min((s_all + float(self.prior[0]) * pt) / (t_all + pt), MAX_RATE)
            c = np.maximum(rates, RATE_EPS)  # clipped to (0, 1): the upper bound is already MAX_RATE
            self._cache = (rates, mean, c / (1.0 - c), s_all, t_all, np.concatenate(([0.0], np.cumsum(rates))))
        return self._cache

    @property
    def prefix(self) -> np.ndarray:
        """(K+1,) the rates' sums over positions 0..c-1, c = 0..K: the chain successes they expect of a
        draft that tried c positions (what ``RequestBeta.reference`` compares a request with)."""
        return self._estimates()[5]

    @property
    def totals(self) -> tuple[float, float]:
        """(successes, trials) summed over positions (decayed counts, no prior)."""
        e = self._estimates()
        return e[3], e[4]

    @property
    def rates(self) -> np.ndarray:
        return self._estimates()[0]

    @property
    def mean_rate(self) -> float:
        """Pooled rate over all positions (trials-weighted; the first position's prior when empty)."""
        return self._estimates()[1]

    @property
    def odds(self) -> np.ndarray:
        """rates / (1 - rates), rates clipped to (0, 1): what ``request_position_survival`` multiplies."""
        return self._estimates()[2]


class RequestBeta:
    """Per-request Beta posterior on the acceptance rate, shrunk to a prior.

    Request r's posterior mean = (s_r + m * prior_r) / (t_r + m): a new request starts at the prior
    (global or its category's), an easy request earns a higher rate after a few steps. Beside its
    successes it keeps how many of its drafts tried each number of positions, h_r[c] (c = 0..K), so
    that it is compared with what the pooled position curve a[j] expects of the same trials
    (``reference``):

        ref_r = (sum_c h_r[c] A[c] + m * pooled) / (t_r + m),   A[c] = a[0] + ... + a[c-1],

    not with the pooled rate, which counts deep positions (0.93+ on the CPU pair) that a short draft
    never reaches. The curve is read as it is now, so evidence a request gave while the curve was
    still at its prior is judged by what the curve learned since.
    State lives in arrays indexed by executor slot; ``reset`` clears a slot when a new request takes it.
    """

    def __init__(self, strength: float = 8.0, capacity: int = 64, max_k: int = 8) -> None:
        if strength <= 0:
            raise ConfigError(f"prior strength = {strength!r}: must be > 0 pseudo-trials")
        self.m = float(strength)
        self.s = np.zeros(capacity)
        self.t = np.zeros(capacity)
        self.h = np.zeros((capacity, max_k + 1))  # (slots, K+1) drafts by the positions they tried
        self.K = max_k

    def ensure(self, max_slot: int) -> None:
        size = self.s.size
        if max_slot >= size:
            extra = max(max_slot + 1, 2 * size) - size  # new slots start empty
            self.s = np.concatenate([self.s, np.zeros(extra)])
            self.t = np.concatenate([self.t, np.zeros(extra)])
            self.h = np.concatenate([self.h, np.zeros((extra, self.K + 1))])

    def reset(self, slots: np.ndarray) -> None:
        self.s[slots] = 0.0
        self.t[slots] = 0.0
        self.h[slots] = 0.0

    def update(self, slots: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        """Slots are distinct within one step (one outcome per request); the arrays grow to the
        largest slot. ``trials`` (n,) int: each request's chain trials, positions 0..trials-1."""
        if slots.shape[0] == 1:  # one request: scalar adds instead of gathers and scatters
            j = int(slots[0])
            self.ensure(j)
            self.s[j] += successes[0]
            self.t[j] += trials[0]
            self.h[j, min(int(trials[0]), self.K)] += 1.0
            return
        try:
            self.s[slots] += successes
        except IndexError:  # a slot past the arrays (rare): grow them, no max() every step
            self.ensure(int(slots.max()))
            self.s[slots] += successes
        self.t[slots] += trials
        self.h[slots, np.minimum(trials, self.K)] += 1.0

    def mean(self, slots: np.ndarray, prior) -> np.ndarray:
        if slots.shape[0] == 1 and not isinstance(prior, np.ndarray):  # plain floats, same bits
            j = int(slots[0])
            return np.array([min((float(self.s[j]) + self.m * prior) / (float(self.t[j]) + self.m), MAX_RATE)])
        return np.minimum((self.s[slots] + self.m * prior) / (self.t[slots] + self.m), MAX_RATE)

    def reference(self, slots: np.ndarray, prefix: np.ndarray, pooled: float) -> np.ndarray | float:
        """What the position curve expects of each request's trials, shrunk to ``pooled`` as ``mean``
        shrinks its own rate (class doc): a request's shift is mean's log-odds minus this one's.
        ``prefix`` (K+1,): the curve's sums A[c] (``PositionRates.prefix``). (n,), or a float for one request."""
        # (no upper clip: a mean of rates that are at most MAX_RATE, with pooled, is at most MAX_RATE)
        if slots.shape[0] == 1:
            j = int(slots[0])
            return (float(self.h[j] @ prefix) + self.m * pooled) / (float(self.t[j]) + self.m)
        return (self.h[slots] @ prefix + self.m * pooled) / (self.t[slots] + self.m)


class CategoryRates:
    """Acceptance per request category (e.g. Spec-Bench's), falling back to a global rate."""

    def __init__(self, n_categories: int, prior_trials: float = 16.0) -> None:
        self.succ = np.zeros(max(n_categories, 1))
        self.trials = np.zeros(max(n_categories, 1))
        self.prior_trials = prior_trials

    def update(self, category: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        known = category >= 0
        if not known.any():
            return
        cat = category[known]
        if cat.max() >= self.succ.size:
            size = int(cat.max()) + 1
            self.succ = np.resize(self.succ, size)
            self.trials = np.resize(self.trials, size)
        # counts are whole numbers, so summing them per category first changes no bit
        size = self.succ.size
        self.succ += np.bincount(cat, weights=successes[known], minlength=size)
        self.trials += np.bincount(cat, weights=trials[known], minlength=size)

    def rates(self, category: np.ndarray, global_rate: float) -> np.ndarray:
        out = np.full(category.shape, global_rate, dtype=np.float64)
        known = (category >= 0) & (category < self.succ.size)
        c = category[known]
        out[known] = (self.succ[c] + global_rate * self.prior_trials) / (self.trials[c] + self.prior_trials)
        return np.minimum(out, MAX_RATE)


class ConfidenceMap:
    """Survival of a draft token as a function of the drafter's running confidence (the product of
    its token probabilities so far): binned on log10 of the product, made monotone, decayed.

    Small draft models are badly and non-linearly calibrated: on the CPU pair's held-out prompts a
    running product of 0.013 meant survival 0.39, 0.07 meant 0.62 and 0.45 or more meant about 1.
    One ratio of observed to predicted survival cannot map both ends, and a cut through it stopped
    drafts that would mostly have been accepted. Each bin starts at the identity (calibrated),
    worth ``prior_tokens`` drafted tokens.
    """

    def __init__(self, bins: int = 16, lo: float = -4.0, prior_tokens: float = 2.0, decay: float = 0.995) -> None:
        if bins < 2 or not lo < 0.0:
            raise ConfigError(f"bins = {bins!r}, lo = {lo!r}: need at least 2 bins over [lo, 0] with lo < 0")
        self.bins, self.lo, self.decay = bins, float(lo), float(decay)
        edges = np.linspace(lo, 0.0, bins + 1)
        self.log_centers = 0.5 * (edges[:-1] + edges[1:])
        self.hits = np.power(10.0, self.log_centers) * prior_tokens
        self.n = np.full(bins, float(prior_tokens))
        self._ramp = 1e-9 * np.arange(bins)  # makes the monotone curve strictly increasing for interp
        self._curve: np.ndarray | None = None
        self._ramped: np.ndarray | None = None
        self._lists: tuple[list, list] | None = None  # the ramped curve and bin centres as floats

    def _bin(self, prod: np.ndarray) -> np.ndarray:
        x = (np.log10(np.maximum(prod, 1e-300)) - self.lo) * (self.bins / -self.lo)
        return np.clip(x.astype(np.int64), 0, self.bins - 1)

    def update(self, prod: np.ndarray, hit: np.ndarray) -> None:
        """One step's drafted tokens: their running confidence and whether each survived."""
        self.hits *= self.decay
        self.n *= self.decay
        if prod.size:
            b = self._bin(np.asarray(prod, dtype=np.float64))
            self.hits += np.bincount(b, weights=np.asarray(hit, dtype=np.float64), minlength=self.bins)
            self.n += np.bincount(b, minlength=self.bins)
        self._curve = None

    def update_steps(self, prod: np.ndarray, hit: np.ndarray, age: np.ndarray, steps: int) -> None:
        """Several steps' drafted tokens at once, as ``steps`` calls of ``update`` would leave the bins
        (to rounding): a token ``age`` steps before the last enters with weight decay ** age."""
        f = self.decay ** steps
        self.hits *= f
        self.n *= f
        if prod.size:
            b = self._bin(np.asarray(prod, dtype=np.float64))
            w = np.power(self.decay, age)
            self.hits += np.bincount(b, weights=w * np.asarray(hit, dtype=np.float64), minlength=self.bins)
            self.n += np.bincount(b, weights=w, minlength=self.bins)
        self._curve = None

    def curve(self) -> np.ndarray:
        """Survival per bin (bins in increasing confidence), non-decreasing."""
        if self._curve is None:
            self._curve = np.maximum.accumulate(self.hits / self.n)
            self._ramped = self._curve + self._ramp
            self._lists = None
        return self._curve

    def survival(self, prod: np.ndarray) -> np.ndarray:
        return self.curve()[self._bin(np.asarray(prod, dtype=np.float64))]

    def raw_cut(self, cut: np.ndarray) -> np.ndarray:
        """The running confidence below which survival falls under ``cut`` (per request): 0 where
        even the least confident bin beats the cut (never stop), 1 where no bin reaches it."""
        self.curve()
        c = self._ramped  # the curve made strictly increasing, refreshed with the curve
        return np.power(10.0, np.interp(np.asarray(cut, dtype=np.float64), c, self.log_centers, left=-np.inf, right=0.0))

    def raw_cut_one(self, cut: float) -> float:
        """``raw_cut`` for one request: np.interp's arithmetic on plain floats (at batch 1 numpy's
        per-call cost is most of the work), then numpy's power (whose last bit can differ from
        Python's), so the same bits."""
        self.curve()
        if self._lists is None:
            self._lists = (self._ramped.tolist(), self.log_centers.tolist())
        xp, fp = self._lists
        if cut < xp[0]:
            return 0.0  # even the least confident bin beats the cut: never stop
        if cut >= xp[-1]:
            return 1.0 if cut > xp[-1] else float(np.power(10.0, fp[-1]))
        j = bisect_right(xp, cut) - 1  # xp[j] <= cut < xp[j + 1]
        slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
        return float(np.power(10.0, slope * (cut - xp[j]) + fp[j]))


def request_position_survival(request_rate: np.ndarray, position_rates: np.ndarray, reference: float | np.ndarray,
                              position_odds: np.ndarray | None = None) -> np.ndarray:
    """Survival p[r, j] combining a request's own rate with the global per-position shape.

    logit(a[r, j]) = logit(position_rate[j]) + logit(request_rate[r]) - logit(reference[r]): the
    request's rate against what the curve expects of it shifts the whole per-position curve, which
    keeps its decay along the draft (``reference``: a float, such as the pooled rate, or (n,) each
    request's, ``RequestBeta.reference``).
    Computed as a product of odds (no log/exp on the hot path); ``position_odds`` (the clipped
    position rates' odds, e.g. ``PositionRates.odds``) saves recomputing them. Shape (n, K).
    """
    if request_rate.shape[0] == 1:
        ref = float(reference[0]) if isinstance(reference, np.ndarray) else reference
        return _one_request_survival(float(request_rate[0]), position_rates, ref, position_odds)
    if position_odds is None:
        pos = np.clip(position_rates, RATE_EPS, 1 - RATE_EPS)
        position_odds = pos / (1.0 - pos)
    if isinstance(reference, np.ndarray):  # references are at most MAX_RATE < 1 - RATE_EPS
        ref = np.maximum(reference, RATE_EPS)
    else:
        ref = min(max(reference, RATE_EPS), 1 - RATE_EPS)
    r = np.minimum(np.maximum(request_rate, RATE_EPS), 1 - RATE_EPS)  # np.clip, without its dispatch cost
    odds = position_odds[None, :] * ((r / (1.0 - r)) * ((1.0 - ref) / ref))[:, None]
    return np.cumprod(odds / (1.0 + odds), axis=1)


def _one_request_survival(rate: float, position_rates: np.ndarray, reference: float,
                          position_odds: np.ndarray | None) -> np.ndarray:
    """``request_position_survival`` for one request on plain floats (the same operations in the same
    order, so the same bits; at batch 1 numpy's per-call cost is most of the work). Shape (1, K)."""
    if position_odds is None:
        pos = np.clip(position_rates, RATE_EPS, 1 - RATE_EPS)
        position_odds = pos / (1.0 - pos)
    ref = min(max(reference, RATE_EPS), 1 - RATE_EPS)
    r = min(max(rate, RATE_EPS), 1 - RATE_EPS)
    q = (r / (1.0 - r)) * ((1.0 - ref) / ref)
    out = []
    run = 1.0
    for o in position_odds.tolist():
        x = o * q
        a = x / (1.0 + x)
        run = a if not out else run * a
        out.append(run)
    return np.array([out])
