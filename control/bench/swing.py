"""A time-varying trace: a workload replayed with its arrival rate swung between levels, segment by segment.

``swing_rate`` keeps the trace's requests, their order and lengths, and the shape of its arrivals
(each gap is the trace's own gap, rescaled), but sets the mean rate of each ``segment_s``-long span
of the new time axis to the next level in turn (e.g. below and above the rate where speculation
stops paying). ``segment_table`` reads a run per segment: the mean latency of the requests arriving
in each one, and which configuration was best there in hindsight. ``drifting_rates`` makes the
drafters' acceptance drift instead (or as well): each segment draws its requests' rates around its
own mean, as when the prompt mix changes over the day. ``alternate_phases`` swings what arrives:
segment i draws its requests, in order, from workload ``i % P`` (e.g. short conversations, then
long-context sessions), each at its own rate.
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


MAX_EMPTY_SEGMENTS = 1000  # consecutive segments without an arrival: the rates are too low for the segments


def alternate_phases(phases: list[Workload], rates: list[float], segment_s: float, requests: int) -> Swing:
    """``requests`` arrivals whose segment i comes from ``phases[i % P]`` at ``rates[i % P]`` req/s.

    Each phase's requests are taken in their order, with its own gaps (in units of its mean gap)
    rescaled to its rate, so each keeps its lengths and burstiness; a gap that would cross into the
    next segment is not taken, and the next segment starts its phase's clock at the boundary."""
    if len(phases) < 2:
        raise ConfigError(f"{len(phases)} phase(s): alternating phases needs at least two workloads")
    if len(rates) != len(phases) or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise ConfigError(f"phase rates {rates!r}: give one finite rate > 0 req/s per phase ({len(phases)})")
    if not (segment_s > 0 and math.isfinite(segment_s)):
        raise ConfigError(f"segment length {segment_s!r} s: must be a finite number > 0")
    if requests < 1:
        raise ConfigError(f"requests = {requests}: must be >= 1")
    families = {w.family for w in phases}
    if len(families) > 1 or any(w.categories for w in phases):
        raise ConfigError("alternating phases need workloads of one acceptance family and without categories "
                          f"(got {', '.join(f'{w.name}: {w.family}' for w in phases)})")
    for w in phases:
        if w.n < 2 or w.span_s <= 0:
            raise ConfigError(f"workload '{w.name}' needs at least two requests at distinct times to be a phase")
    gaps = [np.diff(w.arrival_s) * w.rate for w in phases]  # per phase (n - 1,) gaps in mean gaps
    cursor = [0] * len(phases)
    picked: list[tuple[float, int, int, int]] = []  # (arrival, phase, request index, segment)
    now, seg, empty = 0.0, 0, 0
    while len(picked) < requests:
        p = seg % len(phases)
        end = (seg + 1) * segment_s
        before = len(picked)
        while len(picked) < requests:
            j = cursor[p]
            if j >= gaps[p].size:
                raise ConfigError(f"phase '{phases[p].name}' ran out of requests after {j + 1}; "
                                  "ask for fewer requests or shorter segments")
            t = now + gaps[p][j] / rates[p]
            if t >= end:
                break
            now = t
            cursor[p] = j + 1
            picked.append((t, p, j + 1, seg))
        empty = 0 if len(picked) > before else empty + 1
        if empty >= MAX_EMPTY_SEGMENTS:
            raise ConfigError(f"no arrival in {MAX_EMPTY_SEGMENTS} segments of {segment_s:g} s at rates {rates!r}; "
                              "raise the rates or the segment length")
        now, seg = end, seg + 1
    t = np.array([x[0] for x in picked])
    which = np.array([x[1] for x in picked], dtype=np.int64)
    idx = np.array([x[2] for x in picked], dtype=np.int64)
    segment = np.array([x[3] for x in picked], dtype=np.int64)
    prompt, output = np.empty(requests, dtype=np.int64), np.empty(requests, dtype=np.int64)
    for p, w in enumerate(phases):
        sel = which == p
        prompt[sel], output[sel] = w.prompt_tokens[idx[sel]], w.output_tokens[idx[sel]]
    name = "+".join(w.name for w in phases)
    out = Workload(name, t, prompt, output, np.full(requests, -1, dtype=np.int64), family=phases[0].family,
                   notes={"source": f"alternating phases of {', '.join(w.name for w in phases)}",
                          "phase_rates_req_s": [float(r) for r in rates], "segment_s": segment_s,
                          "phases": [{"name": w.name, **w.notes} for w in phases]})
    return Swing(out, segment, tuple(float(r) for r in rates), float(segment_s))


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
