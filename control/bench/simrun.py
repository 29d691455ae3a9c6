"""Run policies on the simulator: plan, acceptance processes, capacity, load sweeps.

``SimSetup`` names what is fixed across a sweep (profile, workload, drafters, K, options);
``run_policy`` simulates one policy at one arrival rate and seed; ``measure_capacity`` finds the
no-speculation capacity (the highest Poisson rate at which policy ``none`` keeps a bounded queue),
and ``sweep`` runs every policy x load x seed with loads as fractions of that capacity; its rows
measure past the ramp-up (``result_row``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from control.bench.acceptance import AcceptanceTable, RequestRates, request_rates
from control.bench.metrics import SLOTargets, run_row
from control.bench.workloads import Workload
from control.errors import ConfigError
from control.executors.sim import AcceptanceProcess, SimConfig, SimEngine, SimResult
from control.plan import AcceptanceState, Plan, compile_plan
from control.policyspec import parse_policy_spec
from control.profile import Profile

RATE_ORACLE = "rate-oracle"  # diagnostic: true per-request acceptance, no foresight of outcomes
DEFAULT_POLICIES = ("none", "fixed:1", "fixed:3", "fixed:5", "fixed:7", "smartspec", "turbospec", "specserve",
                    "static-schedule", "hf-heuristic", "adaptive", "oracle")
CAPACITY_REQUESTS = 4000  # Poisson requests per probe of the capacity search
CAPACITY_REL_TOL = 0.02  # the search stops when the bracket is this narrow (relative)
CAPACITY_HALVINGS = 20  # at most this many halvings below the saturated throughput
WARMUP_SHARE = 0.2  # the first 20% of arrivals are ramp-up: outside the measured window
BACKLOG_SHARE = 0.03  # a probe's queue is bounded if it grew by at most 3% of its window's arrivals
SERIES_WINDOWS = 12  # per-window series of a run: this many equal spans of arrival time
ORACLE_PRICE_ROUNDS = 3  # Dinkelbach rounds of the oracle's run-level price after its step-greedy run


@dataclass
class SimSetup:
    profile: Profile
    workload: Workload
    drafters: list[str] | None = None  # default: all of the profile's drafters
    max_k: int = 8
    chunked_prefill: bool = False
    noise: bool = False
    informativeness: float = 0.5
    slo: SLOTargets = field(default_factory=SLOTargets)
    acceptance_overrides: dict[str, float] | None = None
    max_batch: int | None = None
    table: AcceptanceTable | None = None  # default: control/bench/data/acceptance.yaml
    verify_expansion: bool | None = None  # default: what the profile's framework records (roofline profiles)

    def __post_init__(self) -> None:
        names = self.drafters or self.profile.drafter_names
        for d in names:
            self.profile.drafter(d)
        self.drafters = list(names)
        unknown = sorted(set(self.acceptance_overrides or {}) - set(self.drafters))
        if unknown:
            raise ConfigError(f"acceptance override for {', '.join(repr(d) for d in unknown)}: not a drafter of this run; "
                              f"drafters: {', '.join(self.drafters)}")
        lim = self.profile.limits
        if lim.max_ctx:
            too_long = int(((self.workload.prompt_tokens + self.workload.output_tokens) > lim.max_ctx).sum())
            if too_long:
                self.workload = self.workload.scale_lengths(1.0, lim.max_ctx)
        self._plan: Plan | None = None

    @property
    def entries(self):
        return [self.profile.drafter(d) for d in self.drafters]

    def rates(self, workload: Workload, seed: int) -> RequestRates:
        return request_rates(workload, [(e.name, e.kind.value, e.confidences) for e in self.entries], seed,
                             self.informativeness, table=self.table, overrides=self.acceptance_overrides)

    def plan(self) -> Plan:
        """One plan for every policy (the policy name does not change what the plan holds); acceptance
        priors are the workload's configured mean per drafter, as a profiling run would measure them."""
        if self._plan is None:
            means = self.rates(self.workload.head(1), 0).means
            self._plan = compile_plan(self.profile, policy="adaptive", max_k=self.max_k, drafters=self.drafters,
                                      acceptance=AcceptanceState(rate={k: min(v, 0.99) for k, v in means.items()}),
                                      reason="specctl sim")
        return self._plan

    def config(self, seed: int) -> SimConfig:
        lim = self.profile.limits
        return SimConfig(max_batch=self.max_batch or lim.max_batch, kv_tokens=lim.kv_tokens or (1 << 40),
                         token_budget=lim.token_budget or 8192, max_k=self.max_k,
                         chunked_prefill=self.chunked_prefill, noise=self.noise, seed=seed,
                         verify_expansion=self.expands_verify, reread_share=self.profile.expansion_reread_share,
                         host_token_ms=self.host_token_ms,
                         output_async=bool(self._framework.get("async_output", False)),
                         draft_step_prep_ms=self.draft_step_prep_ms, plain_chunk_budget=self.profile.plain_chunk_budget)

    @property
    def _framework(self) -> dict:
        fw = self.profile.environment.get("framework")
        return fw if isinstance(fw, dict) else {}

    @property
    def draft_step_prep_ms(self) -> float:
        """Host time per drafting request per step of a framework that prepares each step's first draft
        pass on the host (roofline profiles; 0 otherwise)."""
        fw = self._framework
        return float(fw.get("host_seq_us", 0.0)) / 1000.0 if fw.get("draft_step_host_prep") else 0.0

    @property
    def host_token_ms(self) -> float:
        """Host time per generated token of the framework a roofline profile was built for (0 otherwise)."""
        fw = self.profile.environment.get("framework")
        return float(fw.get("host_token_us", 0.0)) / 1000.0 if isinstance(fw, dict) else 0.0

    @property
    def expands_verify(self) -> bool:
        """Whether the simulated engine verifies by batch expansion: set explicitly, or as the framework
        a roofline profile was built for records it."""
        if self.verify_expansion is not None:
            return self.verify_expansion
        return self.profile.verifies_by_expansion


def make_policy(spec: str, plan: Plan, engine: SimEngine, seed: int, price: float | None = None):
    from control.policy import build_policy
    from control.policy.base import PolicyContext
    from control.policy.oracle import OraclePolicy

    if spec == RATE_ORACLE:  # diagnostic, not a user-facing policy name
        from control.policy.oracle import RateOraclePolicy

        return RateOraclePolicy(PolicyContext.from_plan(plan), engine.peek_survival)
    if parse_policy_spec(spec).name == "oracle":
        return OraclePolicy(PolicyContext.from_plan(plan), engine.peek, price)
    return build_policy(spec, plan, seed=seed)


def _simulate(setup: SimSetup, workload: Workload, spec: str, seed: int, price: float | None = None,
              rates: np.ndarray | None = None) -> SimResult:
    plan = setup.plan()
    rr = setup.rates(workload, seed)
    proc = AcceptanceProcess(rr.rates if rates is None else rates, rr.decay, rr.informativeness, setup.max_k, seed)
    cost = setup.profile.step_cost(setup.drafters)
    mape = {"target": setup.profile.models["target"].mape}
    prefill = tuple(setup.profile.models[e.model].to_cost() if e.model else None for e in setup.entries)
    engine = SimEngine(cost, tuple(setup.drafters), workload.arrival_s, workload.prompt_tokens,
                       workload.output_tokens, proc, setup.config(seed),
                       category=workload.category if workload.categories else None, mape=mape,
                       prefill_costs=prefill)
    policy = make_policy(spec, plan, engine, seed, price)
    res = engine.run(policy)
    res.policy = spec
    return res


def run_policy(setup: SimSetup, workload: Workload, spec: str, seed: int, rates: np.ndarray | None = None) -> SimResult:
    """Simulate ``workload`` (already at its arrival rate) under policy ``spec`` (``rates``: (n, m)
    per-request acceptance rates instead of the setup's draw, e.g. a drift over time).

    ``oracle`` runs several times on the same arrivals and outcomes: first maximising each step's
    goodput, then maximising tokens - price * step time with the price set to the goodput (tokens
    per busy ms) of its previous run (Dinkelbach on the run's goodput), until the price repeats.
    Per-step choices cannot see that finishing a request early changes later batches (at light load
    a plain token later costs less than the run's average), so every fixed k is run too: the run
    with the least busy time, hence the highest goodput, in hindsight is its result."""
    if spec == RATE_ORACLE or parse_policy_spec(spec).name != "oracle":
        return _simulate(setup, workload, spec, seed, rates=rates)
    best = res = _simulate(setup, workload, spec, seed, rates=rates)
    price = None
    for _ in range(ORACLE_PRICE_ROUNDS):
        last, price = price, float(res.output_tokens.sum()) / (res.busy_s * 1000.0)
        if price == last:
            break  # a run is a function of its price: the next round would repeat the last
        res = _simulate(setup, workload, spec, seed, price, rates=rates)
        if res.busy_s < best.busy_s:
            best = res
    for k in range(setup.max_k + 1):
        res = _simulate(setup, workload, f"fixed:{k}", seed, rates=rates)
        if res.busy_s < best.busy_s:
            best = res
    best.policy = spec
    return best


def k_by_batch(res: SimResult) -> dict[str, float]:
    """Mean k per request-step in each batch-size bucket ("<=B": mean k), buckets with steps only."""
    from control.executors.sim.engine import BATCH_BUCKETS

    out = {}
    for i, edge in enumerate(BATCH_BUCKETS):
        if res.batch_requests[i]:
            lo = BATCH_BUCKETS[i - 1] + 1 if i else 1
            out[f"{lo}-{edge}" if edge < (1 << 30) else f">{BATCH_BUCKETS[i - 1]}"] = round(
                float(res.batch_k[i] / res.batch_requests[i]), 3)
    return out


def result_row(setup: SimSetup, res: SimResult, load: float, seed: int, extra: dict | None = None) -> dict:
    """One bench row. Latency, TTFT, TPOT and SLO figures cover the measured window (requests
    arriving after the ramp-up, ``steady_window``); goodput and throughput the whole run (busy time
    is not attributable per request). ``extra.windows`` is the per-window series over arrival time."""
    t0, t1 = steady_window(res.arrival_s)
    m = res.arrival_s >= t0  # (N,) requests in the measured window
    whole = run_row(res.policy, load, seed, res.arrival_s, res.first_token_s, res.finish_s, res.output_tokens,
                    busy_s=res.busy_s)
    row = run_row(res.policy, load, seed, res.arrival_s[m], res.first_token_s[m], res.finish_s[m],
                  res.output_tokens[m], busy_s=res.busy_s, verified=res.verified, accepted=res.accepted,
                  decode_steps=res.decode_steps, spec_steps=res.spec_steps, slo=setup.slo,
                  k_hist=res.k_hist[: setup.max_k + 1],
                  extra={"steps": res.steps, "mean_batch": round(res.request_steps / max(res.decode_steps, 1), 3),
                         "k_by_batch": k_by_batch(res), "measured_window_s": [round(t0, 3), round(t1, 3)],
                         "windows": arrival_windows(res), **(extra or {})})
    row["goodput_tok_s"] = whole["goodput_tok_s"]
    row["extra"]["throughput_tok_s"] = whole["extra"]["throughput_tok_s"]
    row["extra"]["requests"] = int(res.arrival_s.size)
    return row


def arrival_windows(res: SimResult, windows: int = SERIES_WINDOWS) -> list[dict]:
    """Mean latency and TTFT of the requests arriving in each of ``windows`` equal spans of arrival
    time (the series a time-varying trace is read by)."""
    edges = np.linspace(float(res.arrival_s.min()), float(res.arrival_s.max()), windows + 1)
    which = np.clip(np.searchsorted(edges, res.arrival_s, side="right") - 1, 0, windows - 1)  # (N,)
    lat = res.finish_s - res.arrival_s
    ttft = res.first_token_s - res.arrival_s
    out = []
    for i in range(windows):
        sel = which == i
        n = int(sel.sum())
        out.append({"t_s": round(float(edges[i]), 3), "requests": n,
                    "mean_latency_s": round(float(lat[sel].mean()), 4) if n else None,
                    "ttft_s": round(float(ttft[sel].mean()), 4) if n else None})
    return out


def saturated_throughput(setup: SimSetup, requests: int = 1000, seed: int = 0) -> float:
    """No-speculation completion rate in req/s when everyone arrives at t = 0 and the engine never
    idles, between the 10th and 90th percentile of completions (ramp-up and drain excluded). With
    every prompt prefilled in full batches up front this is an upper bound on what Poisson arrivals
    sustain, not the capacity (``measure_capacity``)."""
    w = setup.workload.head(min(requests, setup.workload.n)).at_time_zero()
    res = run_policy(setup, w, "none", seed)
    fin = np.sort(res.finish_s)
    lo, hi = int(0.1 * fin.size), int(0.9 * fin.size) - 1
    if hi <= lo or fin[hi] <= fin[lo]:
        return fin.size / max(fin[-1], 1e-9)
    return (hi - lo) / (fin[hi] - fin[lo])


def steady_window(arrival_s: np.ndarray) -> tuple[float, float]:
    """The measured window of a run: from the arrival of the first request past the ramp-up
    (``WARMUP_SHARE`` of arrivals) to the last arrival."""
    arr = np.sort(np.asarray(arrival_s, dtype=np.float64))
    return float(arr[int(WARMUP_SHARE * (arr.size - 1))]), float(arr[-1])


def queue_bounded(res: SimResult) -> bool:
    """Whether a run's queue stayed bounded over its measured window: the requests in the system
    (arrived, not finished) grew by at most ``BACKLOG_SHARE`` of the window's arrivals."""
    t0, t1 = steady_window(res.arrival_s)
    arrived = int((res.arrival_s <= t1).sum()) - int((res.arrival_s <= t0).sum())
    in_sys0 = int(((res.arrival_s <= t0) & (res.finish_s > t0)).sum())
    in_sys1 = int(((res.arrival_s <= t1) & (res.finish_s > t1)).sum())
    return in_sys1 - in_sys0 <= BACKLOG_SHARE * max(arrived, 1)


def poisson_probe(base: Workload, rate: float, requests: int, seed: int) -> Workload:
    """``requests`` Poisson arrivals at ``rate`` carrying the workload's lengths in order (cycled)."""
    from dataclasses import replace

    from control.bench.workloads import poisson_arrivals

    rng = np.random.default_rng([seed, 31])
    idx = np.arange(requests) % base.n
    return replace(base, arrival_s=poisson_arrivals(rng, requests, rate), prompt_tokens=base.prompt_tokens[idx],
                   output_tokens=base.output_tokens[idx], category=base.category[idx],
                   notes={**base.notes, "rate_req_s": rate, "arrival_seed": seed, "probe": "poisson"})


def measure_capacity(setup: SimSetup, requests: int = CAPACITY_REQUESTS, seed: int = 0) -> float:
    """No-speculation capacity in req/s: the highest Poisson arrival rate at which policy ``none``
    keeps its queue bounded over ``requests`` arrivals with the workload's lengths
    (``queue_bounded``), found by bisection below the saturated throughput. A trace replayed at
    this mean rate keeps its own burstiness on top."""
    def bounded(rate: float) -> bool:
        return queue_bounded(run_policy(setup, poisson_probe(setup.workload, rate, requests, seed), "none", seed))

    hi = saturated_throughput(setup, min(requests, 1000), seed) * 1.05
    lo = hi * 0.5
    for _ in range(CAPACITY_HALVINGS):  # capacity is usually 0.8-0.9x the saturated throughput
        if bounded(lo):
            break
        hi, lo = lo, lo * 0.5
    else:
        raise ConfigError(f"no Poisson rate down to {lo:.3g} req/s keeps the queue of policy none bounded; "
                          "check the profile and workload")
    while hi - lo > CAPACITY_REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if bounded(mid) else (lo, mid)
    return lo


def workload_at(setup: SimSetup, rate: float, requests: int | None, seed: int) -> Workload:
    """The setup's workload at ``rate`` req/s: traces are time-scaled; prompt sets and Poisson runs
    are redrawn per seed at that rate."""
    base = setup.workload
    w = base
    if "rate_req_s" in base.notes and base.notes.get("source", "").startswith(("synthetic", "prompt set")):
        from control.bench.workloads import poisson_arrivals

        rng = np.random.default_rng([seed, 29])
        n = requests or base.n
        idx = np.arange(n) % base.n
        from dataclasses import replace

        w = replace(base, arrival_s=poisson_arrivals(rng, n, rate), prompt_tokens=base.prompt_tokens[idx],
                    output_tokens=base.output_tokens[idx], category=base.category[idx],
                    notes={**base.notes, "rate_req_s": rate, "arrival_seed": seed})
        return w
    w = base.with_rate(rate)
    return w.head(requests) if requests else w


@dataclass
class SweepResult:
    rows: list[dict]
    capacity_req_s: float
    series: dict | None
    series_label: str
    notes: dict
    wall_s: float


def sweep(setup: SimSetup, loads: list[float], policies: list[str], seeds: list[int], *, requests: int | None = None,
          capacity: float | None = None, series_policy: str = "adaptive", series_load: float | None = None,
          progress: Callable[[str], None] | None = None, workers: int = 1) -> SweepResult:
    """Every policy x load x seed. ``capacity`` (req/s) is measured when not given."""
    for p in policies:
        if p != RATE_ORACLE:
            parse_policy_spec(p)
    t0 = time.perf_counter()
    if capacity is None:
        capacity = measure_capacity(setup)
    if not (capacity > 0 and math.isfinite(capacity)):
        raise ConfigError(f"measured capacity {capacity!r} req/s is not positive; check the profile and workload")
    series_load = series_load if series_load is not None else loads[len(loads) // 2]
    jobs = [(load, seed, pol) for load in loads for seed in seeds for pol in policies]
    rows: list[dict] = []
    series = None
    label = ""
    results = _run_jobs(setup, jobs, capacity, requests, workers, progress)
    for (load, seed, pol), (row, ser) in zip(jobs, results, strict=True):
        rows.append(row)
        if ser is not None and pol == series_policy and abs(load - series_load) < 1e-9 and seed == seeds[0]:
            series, label = ser, f"{pol} at load {load:g} (seed {seed})"
    notes = {"capacity_req_s": capacity, "workload": setup.workload.name, **setup.workload.notes}
    return SweepResult(rows, capacity, series, label, notes, time.perf_counter() - t0)


def _one(setup: SimSetup, load: float, seed: int, pol: str, capacity: float, requests: int | None):
    w = workload_at(setup, load * capacity, requests, seed)
    t = time.perf_counter()
    res = run_policy(setup, w, pol, seed)
    row = result_row(setup, res, load, seed, {"sim_wall_s": round(time.perf_counter() - t, 3),
                                             "rate_req_s": round(load * capacity, 5),
                                             "time_scale": w.notes.get("time_scale")})
    return row, res.series or None


def _run_jobs(setup, jobs, capacity, requests, workers, progress):
    if workers <= 1:
        out = []
        for i, (load, seed, pol) in enumerate(jobs):
            out.append(_one(setup, load, seed, pol, capacity, requests))
            if progress:
                progress(f"{i + 1}/{len(jobs)} {pol} load {load:g} seed {seed}")
        return out
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as ex:
        futs = [ex.submit(_one, setup, load, seed, pol, capacity, requests) for load, seed, pol in jobs]
        out = []
        for i, f in enumerate(futs):
            out.append(f.result())
            if progress:
                load, seed, pol = jobs[i]
                progress(f"{i + 1}/{len(jobs)} {pol} load {load:g} seed {seed}")
        return out


def crossover_rate(rates: list[float], speedup: list[float]) -> float | None:
    """The first rate at which ``speedup`` (no-speculation latency / speculative latency) falls to 1
    or below, interpolated linearly between neighbouring rates; None if it stays above 1."""
    if len(rates) != len(speedup):
        raise ConfigError(f"{len(rates)} rates for {len(speedup)} speedups")
    if speedup and speedup[0] <= 1.0:
        return float(rates[0])
    for i in range(1, len(rates)):
        s0, s1 = speedup[i - 1], speedup[i]
        if s0 > 1.0 >= s1:
            r0, r1 = rates[i - 1], rates[i]
            return float(r0 + (s0 - 1.0) * (r1 - r0) / (s0 - s1))
    return None
