"""Run policies on the simulator: plan, acceptance processes, capacity, load sweeps.

``SimSetup`` names what is fixed across a sweep (profile, workload, drafters, K, options);
``run_policy`` simulates one policy at one arrival rate and seed; ``measure_capacity`` finds the
no-speculation capacity (requests per second the engine completes when it never idles), and
``sweep`` runs every policy x load x seed with loads as fractions of that capacity.
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
                         chunked_prefill=self.chunked_prefill, noise=self.noise, seed=seed)


def make_policy(spec: str, plan: Plan, engine: SimEngine, seed: int):
    from control.policy import build_policy
    from control.policy.base import PolicyContext
    from control.policy.oracle import OraclePolicy

    if spec == RATE_ORACLE:  # diagnostic, not a user-facing policy name
        from control.policy.oracle import RateOraclePolicy

        return RateOraclePolicy(PolicyContext.from_plan(plan), engine.peek_survival)
    if parse_policy_spec(spec).name == "oracle":
        return OraclePolicy(PolicyContext.from_plan(plan), engine.peek)
    return build_policy(spec, plan, seed=seed)


def run_policy(setup: SimSetup, workload: Workload, spec: str, seed: int) -> SimResult:
    """Simulate ``workload`` (already at its arrival rate) under policy ``spec``."""
    plan = setup.plan()
    rr = setup.rates(workload, seed)
    proc = AcceptanceProcess(rr.rates, rr.decay, rr.informativeness, setup.max_k, seed)
    cost = setup.profile.step_cost(setup.drafters)
    mape = {"target": setup.profile.models["target"].mape}
    engine = SimEngine(cost, tuple(setup.drafters), workload.arrival_s, workload.prompt_tokens,
                       workload.output_tokens, proc, setup.config(seed),
                       category=workload.category if workload.categories else None, mape=mape)
    policy = make_policy(spec, plan, engine, seed)
    res = engine.run(policy)
    res.policy = spec
    return res


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
    return run_row(res.policy, load, seed, res.arrival_s, res.first_token_s, res.finish_s, res.output_tokens,
                   busy_s=res.busy_s, verified=res.verified, accepted=res.accepted, decode_steps=res.decode_steps,
                   spec_steps=res.spec_steps, slo=setup.slo, k_hist=res.k_hist[: setup.max_k + 1],
                   extra={"steps": res.steps, "mean_batch": round(res.request_steps / max(res.decode_steps, 1), 3),
                          "k_by_batch": k_by_batch(res),
                          **(extra or {})})


def measure_capacity(setup: SimSetup, requests: int = 1000, seed: int = 0) -> float:
    """No-speculation capacity in req/s: everyone arrives at t = 0 and the engine never idles; the
    completion rate between the 10th and 90th percentile of completions (ramp-up and drain excluded)."""
    w = setup.workload.head(min(requests, setup.workload.n)).at_time_zero()
    res = run_policy(setup, w, "none", seed)
    fin = np.sort(res.finish_s)
    lo, hi = int(0.1 * fin.size), int(0.9 * fin.size) - 1
    if hi <= lo or fin[hi] <= fin[lo]:
        return fin.size / max(fin[-1], 1e-9)
    return (hi - lo) / (fin[hi] - fin[lo])


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
