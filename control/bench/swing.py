"""A time-varying trace: a workload replayed with its arrival rate swung between levels, segment by segment.

``swing_rate`` keeps the trace's requests, their order and lengths, and the shape of its arrivals
(each gap is the trace's own gap, rescaled), but sets the mean rate of each ``segment_s``-long span
of the new time axis to the next level in turn (e.g. below and above the rate where speculation
stops paying). ``segment_table`` reads a run per segment: the mean latency of the requests arriving
in each one, and which configuration was best there in hindsight. ``drifting_rates`` makes the
drafters' acceptance drift instead (or as well): each segment draws its requests' rates around its
own mean, as when the prompt mix changes over the day.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from control.bench.workloads import Workload
from control.errors import ConfigError
from control.executors.sim import SimResult
from control.goodput.acceptance import MAX_RATE


@dataclass(frozen=True)
class Swing:
    workload: Workload
    segment: np.ndarray  # (N,) index of the segment each request arrives in
    rates: tuple[float, ...]  # the rate of each level, req/s (segment i has level i % len(rates))
    segment_s: float

    @property
    def segments(self) -> int:
        return int(self.segment.max()) + 1

    def level(self, seg: int) -> float:
        return self.rates[seg % len(self.rates)]


def swing_rate(base: Workload, rates: list[float], segment_s: float, requests: int | None = None) -> Swing:
    """The first ``requests`` of ``base`` with segment i of the new time axis at rate ``rates[i % len]``."""
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise ConfigError(f"swing rates {rates!r}: give one or more finite rates > 0 req/s")
    if not (segment_s > 0 and math.isfinite(segment_s)):
        raise ConfigError(f"segment length {segment_s!r} s: must be a finite number > 0")
    w = base.head(requests) if requests else base
    if w.n < 2 or w.span_s <= 0:
        raise ConfigError(f"workload '{w.name}' needs at least two requests at distinct times to swing its rate")
    gaps = np.diff(w.arrival_s) * w.rate  # (N - 1,) gaps in units of the mean gap
    t = np.zeros(w.n)
    seg = np.zeros(w.n, dtype=np.int64)
    now = 0.0
    for i, g in enumerate(gaps):  # each gap at the rate of the segment it starts in
        now += g / rates[int(now // segment_s) % len(rates)]
        t[i + 1] = now
        seg[i + 1] = int(now // segment_s)
    out = replace(w, arrival_s=t, notes={**w.notes, "swing_rates_req_s": list(rates), "segment_s": segment_s})
    return Swing(out, seg, tuple(float(r) for r in rates), float(segment_s))


def segment_latency(res: SimResult, swing: Swing) -> np.ndarray:
    """(segments,) mean latency of the requests arriving in each segment (NaN where none arrive)."""
    lat = res.finish_s - res.arrival_s  # (N,)
    total = np.bincount(swing.segment, weights=lat, minlength=swing.segments)
    count = np.bincount(swing.segment, minlength=swing.segments)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def segment_table(runs: dict[str, SimResult], swing: Swing, policy: str, static: list[str],
                  acceptance: list[float] | None = None) -> list[dict]:
    """Per segment: its rate, mean acceptance (``acceptance[i % len]`` when the drafters' acceptance
    drifts, else None), requests, ``policy``'s mean latency, the best of ``static`` in hindsight there
    and the ratio; then the whole trace, where the best static is the best over the trace."""
    per = {p: segment_latency(r, swing) for p, r in runs.items()}
    count = np.bincount(swing.segment, minlength=swing.segments)
    rows = []
    for s in range(swing.segments):
        if not count[s]:
            continue
        best = min(static, key=lambda p: per[p][s])
        acc = None if not acceptance else float(acceptance[s % len(acceptance)])
        rows.append({"segment": s, "rate_req_s": swing.level(s), "acceptance": acc, "requests": int(count[s]),
                     "policy": float(per[policy][s]),
                     "best_static": best, "best_static_s": float(per[best][s]),
                     "ratio": float(per[policy][s] / per[best][s])})
    whole = {p: float(np.mean(r.finish_s - r.arrival_s)) for p, r in runs.items()}
    best = min(static, key=whole.get)
    # switching to each segment's best static in hindsight, as if segments did not interact: what a
    # controller that only picks among the static configurations could reach
    switching = sum(r["requests"] * r["best_static_s"] for r in rows) / max(int(count.sum()), 1)
    rows.append({"segment": "all", "rate_req_s": float(swing.workload.rate), "acceptance": None,
                 "requests": int(swing.workload.n),
                 "policy": whole[policy], "best_static": best, "best_static_s": whole[best],
                 "ratio": whole[policy] / whole[best], "switching_s": switching,
                 "switching_ratio": switching / whole[best]})
    return rows


def drifting_rates(base_rates: np.ndarray, swing: Swing, means: list[float], concentration: float,
                   seed: int = 0) -> np.ndarray:
    """(N, m) per-request acceptance rates whose mean follows ``means`` segment by segment (segment i:
    ``means[i % len]``) for every drafter; each request keeps its quantile in the Beta of its segment."""
    from scipy.stats import beta as beta_dist

    if not means or any(not 0.0 < x < 1.0 for x in means):
        raise ConfigError(f"acceptance means {means!r}: give one or more rates in (0, 1)")
    if not (concentration > 0 and math.isfinite(concentration)):
        raise ConfigError(f"concentration {concentration!r}: must be a finite number > 0")
    u = np.random.default_rng([seed, 41]).uniform(size=swing.workload.n)  # (N,) request difficulty
    mean = np.asarray(means, dtype=np.float64)[swing.segment % len(means)]  # (N,)
    r = beta_dist.ppf(u, mean * concentration, (1.0 - mean) * concentration)  # (N,)
    out = np.array(base_rates, dtype=np.float64, copy=True)
    out[:, :] = np.clip(r, 0.0, MAX_RATE)[:, None]
    return out
