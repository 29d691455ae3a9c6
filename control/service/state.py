"""The control-plane service's state: the current plan and everything it is compiled from.

State = the profile (refit online from telemetry step samples, ``CostRefit``), the acceptance
estimates per drafter and position (``AcceptanceTracker``), the operator's overrides, and the plan
compiled from them. The plan is recompiled:

- at once on every override (a new version even if nothing else changed: the operator asked);
- on a periodic check (``maybe_replan``) when the plan would change materially, at most once per
  ``min_replan_s``. Material means any of: a drafter's pooled acceptance moved by more than
  ``acceptance_threshold``; the default drafter's per-position acceptance moved by more than twice
  that at a well-observed position; following the old k table would lose more than
  ``goodput_threshold`` of the goodput the new table gets, in the region of batch sizes, contexts
  and acceptance the agents reported in the last minute (or would break the SLO there); the
  predicted step time at the observed mix drifted by more than ``cost_threshold``; or the gate's
  batch threshold moved by more than ``GATE_SHIFT`` (10%).

Every publication bumps the version and notifies the listeners (the plan stream). The state is
plain Python driven by the app's event loop; it has no locks and no I/O except the optional state
file, which keeps the overrides and the version counter across restarts.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from control.agent.wire import K_BUCKETS, TelemetryBatch
from control.errors import ConfigError, describe_validation_error
from control.goodput.acceptance import chain_expected
from control.goodput.optimizer import Constraints
from control.goodput.stepcost import uniform_step_ms
from control.plan import SLO, AcceptanceState, Plan, compile_plan, typical_ctx
from control.policyspec import DEFAULT_MAX_K, MAX_K_LIMIT, check_policy_bounds
from control.profile import Profile
from control.service.estimates import AcceptanceTracker, CostRefit, ModelError
from control.service.overrides import Overrides

STATE_SCHEMA = "specctl.service-state/v1"
MIX_WINDOW_S = 60.0
MAX_SOURCES = 4096
GATE_SHIFT = 0.10  # a relative move of the gate's off threshold that is material


@dataclass(slots=True)
class ServiceConfig:
    """How the service compiles plans and when it recompiles them (see the module docstring)."""

    policy: str = "adaptive"
    max_k: int = DEFAULT_MAX_K
    max_batch: int | None = None  # the deployment's largest batch (None: the profile's limits.max_batch)
    slo: SLO = field(default_factory=SLO)
    drafters: list[str] | None = None
    default_drafter: str | None = None
    keepalive_s: float = 5.0
    replan_interval_s: float = 1.0
    min_replan_s: float = 2.0
    acceptance_threshold: float = 0.03
    goodput_threshold: float = 0.02
    cost_threshold: float = 0.10
    min_trials: int = 200
    acceptance_halflife_s: float = 60.0
    refit_window: int = 2048
    max_body_bytes: int = 1 << 20
    history: int = 900
    state_path: Path | None = None


@dataclass(slots=True)
class HistoryPoint:
    """One telemetry window as the dashboard plots it."""

    t: float
    source: str
    plan_version: int
    steps: int
    mean_batch: float
    max_batch: int
    mean_ctx: float
    mean_k: float
    spec_share: float
    acceptance: float  # accepted / evaluated draft positions over all drafters (NaN: none drafted)
    measured_ms: float  # mean step time
    predicted_ms: float  # the service model's mean prediction for the sampled steps (NaN: none)
    request_steps: int = 0
    trials: int = 0  # evaluated draft positions
    replica: str = ""


class Totals:
    """Cumulative counts since the service started (Prometheus counters are read from here)."""

    def __init__(self, drafters: tuple[str, ...]) -> None:
        m = len(drafters)
        self.windows = 0
        self.steps = 0
        self.spec_steps = 0
        self.request_steps = 0
        self.finished = 0
        self.k_hist = np.zeros(K_BUCKETS, dtype=np.int64)
        self.pos_trials = np.zeros((m, MAX_K_LIMIT), dtype=np.int64)
        self.pos_accepted = np.zeros((m, MAX_K_LIMIT), dtype=np.int64)
        self.tokens = np.zeros((3, m), dtype=np.int64)  # drafted, verified, accepted
        self.measured_ms = 0.0
        self.agent_pred_steps = 0
        self.agent_pred_ms = 0.0
        self.agent_pred_measured_ms = 0.0
        self.model = ModelError()
        self.rejected: dict[str, int] = {}
        self.replans: dict[str, int] = {}


class ControlState:
    def __init__(self, profile: Profile, config: ServiceConfig | None = None, *, instance: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config or ServiceConfig()
        self.base_profile = profile
        self.instance = instance or secrets.token_hex(4)
        self.clock = clock
        self.acceptance = AcceptanceTracker(profile, halflife_s=self.config.acceptance_halflife_s)
        self.refit = CostRefit(profile, window=self.config.refit_window)
        self.history: deque[HistoryPoint] = deque(maxlen=self.config.history)
        self.totals = Totals(tuple(profile.drafter_names))
        # (replica, source) -> (dropped windows, dropped steps, last seen): model instances of different
        # replicas share a source name ("triton-llm_0_0"), so an agent is named by both
        self.sources: dict[tuple[str, str], tuple[int, int, float]] = {}
        self.listeners: list[Callable[[Plan], None]] = []
        # Whether a replica still reports (the fleet's replica table decides); a stale one's windows
        # are left out of the batch and context mix the plan is checked against.
        self.is_fresh: Callable[[str], bool] = lambda replica: True
        self.overrides = Overrides()
        version = 1
        saved = self._load_state()
        if saved is not None:
            version, self.overrides = saved
        self.overrides.check_profile(profile)
        if self.overrides.policy is not None:
            max_k = self.overrides.max_k if self.overrides.max_k is not None else self.config.max_k
            try:
                check_policy_bounds(self.overrides.policy, max_k=max_k, max_batch=self.max_batch,
                                    where="saved override policy")
            except ConfigError as e:
                raise ConfigError(f"state file '{self.config.state_path}': {e}; fix the override there or move "
                                  "the file away") from None
        self.published_at = 0.0
        self.plan: Plan = self._compile(self.overrides, version, "service start")
        self._publish(self.plan, "start")

    # -- plans -------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self.plan.version

    @property
    def plan_id(self) -> str:
        return f"{self.instance}:{self.plan.version}"

    def _acceptance_state(self, max_k: int) -> AcceptanceState:
        rate, pos = {}, {}
        K = max(max_k, 1)
        for d in self.acceptance.names:
            if self.acceptance.live_trials(d) <= 0:
                continue  # no data: the plan falls back to the profile's prior
            rate[d] = round(self.acceptance.pooled(d), 4)
            pos[d] = [round(float(x), 4) for x in self.acceptance.positions(d, K)]
        return AcceptanceState(rate=rate, per_position=pos)

    def _compile(self, ov: Overrides, version: int, reason: str) -> Plan:
        c = self.config
        slo = SLO(tpot_ms=ov.slo_tpot_ms, quantile=ov.slo_quantile) if ov.slo_tpot_ms is not None else c.slo
        drafters = ov.drafters or c.drafters
        active = drafters or self.base_profile.drafter_names
        default = ov.default_drafter or (c.default_drafter if c.default_drafter in active else None)
        max_k = ov.max_k if ov.max_k is not None else c.max_k
        try:
            return compile_plan(self.refit.profile(), version=version, policy=ov.policy or c.policy, max_k=max_k,
                                acceptance=self._acceptance_state(max_k), slo=slo, drafters=drafters,
                                default_drafter=default, force_off=bool(ov.force_off), reason=reason)
        except ValidationError as e:
            raise ConfigError(describe_validation_error("plan", e)) from None

    def _publish(self, plan: Plan, trigger: str) -> None:
        self.plan = plan
        self.published_at = self.clock()
        self.totals.replans[trigger] = self.totals.replans.get(trigger, 0) + 1
        self._save_state()
        for cb in list(self.listeners):
            cb(plan)

    @property
    def max_batch(self) -> int:
        """The deployment's largest batch: configured, else the profile's limit."""
        return self.config.max_batch or self.base_profile.limits.max_batch

    def check_overrides(self, ov: Overrides) -> Plan:
        """The plan ``ov`` compiles to, once it is known that an agent can run it; ConfigError otherwise.

        Checks the drafters against the profile, the policy against the deployment's K and max batch,
        and builds the plan's policy as an agent would, so nothing is published that agents refuse.
        """
        from control.policy.registry import build_policy

        ov.check_profile(self.base_profile)
        max_k = ov.max_k if ov.max_k is not None else self.config.max_k
        if ov.policy is not None:
            check_policy_bounds(ov.policy, max_k=max_k, max_batch=self.max_batch, where="override policy")
        plan = self._compile(ov, self.plan.version + 1, f"override: {ov.describe()}")
        try:
            build_policy(plan.policy, plan)
        except ConfigError as e:
            raise ConfigError(f"override {ov.describe()}: the plan's policy cannot be built: {e}") from None
        return plan

    def set_overrides(self, ov: Overrides) -> Plan:
        """Apply an operator's overrides: validate all of it, then recompile and publish a new version.

        A refused override changes nothing (no version, no state file write).
        """
        plan = self.check_overrides(ov)
        self.overrides = ov
        self._publish(plan, "override")
        return plan

    def maybe_replan(self, now: float | None = None) -> Plan | None:
        """Recompile from the refit profile and current acceptance; publish if the change is material."""
        now = self.clock() if now is None else now
        if now - self.published_at < self.config.min_replan_s:
            return None
        self.refit.refit()
        cand = self._compile(self.overrides, self.plan.version + 1, "")
        trigger, why = self.material(self.plan, cand, now)
        if trigger is None:
            return None
        cand.reason = f"refit: {why}"
        self._publish(cand, trigger)
        return cand

    # -- materiality ---------------------------------------------------------------------------------
    def recent_mix(self, now: float) -> tuple[int, float, float, float] | None:
        """(max batch, min mean ctx, max mean ctx, mean batch) reported in the last minute, or None."""
        fresh: dict[str, bool] = {}
        pts = [p for p in self.history if now - p.t <= MIX_WINDOW_S and p.steps > 0
               and fresh.setdefault(p.replica, self.is_fresh(p.replica))]
        if not pts:
            return None
        w = np.array([p.steps for p in pts], dtype=np.float64)
        mean_batch = float(np.average([p.mean_batch for p in pts], weights=w))
        return (max(p.max_batch for p in pts), min(p.mean_ctx for p in pts), max(p.mean_ctx for p in pts), mean_batch)

    def material(self, cur: Plan, cand: Plan, now: float) -> tuple[str | None, str]:
        """(trigger, explanation) when ``cand`` differs materially from ``cur``; (None, '') otherwise."""
        c = self.config
        for d in cand.drafters:
            a0, a1 = cur.prior_rate(d), cand.prior_rate(d)
            if abs(a1 - a0) > c.acceptance_threshold:
                return "acceptance", f"acceptance of {d} {a0:.3f} -> {a1:.3f}"
        d = cand.default_drafter
        p0, p1 = cur.acceptance.per_position.get(d), cand.acceptance.per_position.get(d)
        if p0 and p1:
            trials = self.acceptance.position_trials(d)
            n = min(len(p0), len(p1))
            diff = np.abs(np.asarray(p1[:n]) - np.asarray(p0[:n]))
            diff[trials[:n] < c.min_trials] = 0.0
            j = int(np.argmax(diff)) if n else 0
            if n and diff[j] > 2 * c.acceptance_threshold:
                return "acceptance", f"acceptance of {d} at position {j + 1} {p0[j]:.3f} -> {p1[j]:.3f}"
        mix = self.recent_mix(now)
        loss = self._table_loss(cur, cand, mix)
        if loss is not None and loss[0] > c.goodput_threshold:
            return "table", loss[1]
        drift = self._cost_drift(cur, cand, mix)
        if drift[0] > c.cost_threshold:
            return "cost", drift[1]
        b0, b1 = cur.gate.b_off, cand.gate.b_off
        if (b0 is None) != (b1 is None) or (b0 is not None and abs(b1 - b0) > GATE_SHIFT * b0):
            return "gate", f"gate threshold {b0 or 'never'} -> {b1 or 'never'}"
        return None, ""

    def _region(self, plan: Plan, mix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t = plan.table
        nb, nc, na = len(t.batch), len(t.ctx), len(t.acceptance)
        if mix is None:
            return np.arange(nb), np.arange(nc), np.arange(na)
        max_batch, lo_ctx, hi_ctx, _ = mix
        bi = min(int(np.searchsorted(t.batch, max(max_batch, 1), side="left")), nb - 1)
        c0 = min(int(np.searchsorted(t.ctx, max(lo_ctx, 1), side="left")), nc - 1)
        c1 = min(int(np.searchsorted(t.ctx, max(hi_ctx, 1), side="left")), nc - 1)
        ai = int(np.clip(np.searchsorted(t.acceptance, plan.prior_rate(), side="right") - 1, 0, na - 1))
        return np.arange(bi + 1), np.arange(c0, c1 + 1), np.arange(max(ai - 1, 0), min(ai + 2, na))

    def _table_loss(self, cur: Plan, cand: Plan, mix) -> tuple[float, str] | None:
        """Worst relative goodput loss, under the candidate's model, of following the current table."""
        t0, t1 = cur.table, cand.table
        if (t0.batch, t0.ctx, t0.acceptance, t0.drafter) != (t1.batch, t1.ctx, t1.acceptance, t1.drafter):
            return 1.0, "k table layout or drafter changed"
        bi, ci, ai = self._region(cand, mix)
        k0 = np.asarray(t0.k)[np.ix_(bi, ci, ai)].astype(np.float64)
        k1 = np.asarray(t1.k)[np.ix_(bi, ci, ai)].astype(np.float64)
        if np.array_equal(k0, k1):
            return 0.0, ""
        cost = cand.profile.step_cost([cand.default_drafter])
        B = np.asarray(t1.batch, dtype=np.float64)[bi][:, None, None]
        S = np.asarray(t1.ctx, dtype=np.float64)[ci][None, :, None]
        A = np.asarray(t1.acceptance, dtype=np.float64)[ai][None, None, :]
        t_old = uniform_step_ms(cost, B, S, k0)
        g_old = B * chain_expected(A, k0) / t_old
        g_new = B * chain_expected(A, k1) / uniform_step_ms(cost, B, S, k1)
        loss = 1.0 - g_old / np.maximum(g_new, 1e-12)
        if cand.slo.tpot_ms is not None:
            margin = Constraints(slo_tpot_ms=cand.slo.tpot_ms, slo_quantile=cand.slo.quantile).slo_margin_ms(cost.step_std_ms())
            loss = np.where((k0 > 0) & (t_old + margin > cand.slo.tpot_ms) & (k0 != k1), 1.0, loss)
        w = np.unravel_index(int(np.argmax(loss)), loss.shape)
        b, s, a = int(B[w[0], 0, 0]), int(S[0, w[1], 0]), float(A[0, 0, w[2]])
        return float(loss[w]), (f"k table at batch {b}, ctx {s}, acceptance {a:.2f}: k {int(k0[w])} -> {int(k1[w])} "
                                f"(the old k loses {loss[w] * 100:.1f}% goodput)")

    def _cost_drift(self, cur: Plan, cand: Plan, mix) -> tuple[float, str]:
        batch = max(mix[3], 1.0) if mix else 1.0
        ctx = max((mix[1] + mix[2]) / 2.0, 1.0) if mix else float(typical_ctx(cand.profile))
        c0 = cur.profile.step_cost([cur.default_drafter])
        c1 = cand.profile.step_cost([cand.default_drafter])
        k = np.array([0.0, float(max(cand.lookup_k(int(round(batch)), int(ctx)), 1))])
        t0 = uniform_step_ms(c0, batch, ctx, k)
        t1 = uniform_step_ms(c1, batch, ctx, k)
        rel = np.abs(t1 - t0) / np.maximum(t0, 1e-9)
        i = int(np.argmax(rel))
        return float(rel[i]), (f"predicted step time at batch {batch:.0f} x ctx {ctx:.0f} (k={int(k[i])}) "
                               f"{t0[i]:.3f} -> {t1[i]:.3f} ms")

    # -- telemetry -------------------------------------------------------------------------------------
    def ingest(self, batch: TelemetryBatch, now: float | None = None) -> None:
        """Fold one telemetry window into the estimates and counters (ConfigError for unknown drafters)."""
        now = self.clock() if now is None else now
        for d in batch.drafters:
            if d.name not in self.acceptance.index:
                p = self.base_profile
                raise ConfigError(f"telemetry from '{batch.source}': drafter '{d.name}' is not in profile "
                                  f"{p.sku}/{p.pair}; it has: {', '.join(p.drafter_names)}")
        self.acceptance.add(batch, now)
        err = self.refit.add(batch)
        t = self.totals
        t.windows += 1
        t.steps += batch.steps
        t.spec_steps += batch.spec_steps
        t.request_steps += batch.request_steps
        t.finished += batch.finished
        t.k_hist[: len(batch.k_hist)] += np.asarray(batch.k_hist, dtype=np.int64)
        trials = accepted = 0
        for d in batch.drafters:
            i = self.acceptance.index[d.name]
            n = len(d.position_trials)
            t.pos_trials[i, :n] += d.position_trials
            t.pos_accepted[i, :n] += d.position_accepted
            t.tokens[:, i] += (d.drafted, d.verified, d.accepted)
            trials += sum(d.position_trials)
            accepted += sum(d.position_accepted)
        t.measured_ms += batch.measured_ms_sum
        t.agent_pred_steps += batch.predicted_steps
        t.agent_pred_ms += batch.predicted_ms_sum
        t.agent_pred_measured_ms += batch.predicted_measured_ms_sum
        m = t.model
        m.count += err.count
        m.predicted_ms += err.predicted_ms
        m.measured_ms += err.measured_ms
        m.abs_pct += err.abs_pct
        self.sources[(batch.replica_id, batch.source)] = (batch.dropped_windows, batch.dropped_steps, now)
        if len(self.sources) > MAX_SOURCES:
            oldest = min(self.sources, key=lambda s: self.sources[s][2])
            del self.sources[oldest]
        self.history.append(HistoryPoint(
            t=now, source=batch.source, plan_version=batch.plan_version, steps=batch.steps,
            mean_batch=batch.mean_batch, max_batch=batch.max_batch, mean_ctx=batch.mean_ctx, mean_k=batch.mean_k,
            spec_share=batch.spec_steps / batch.steps if batch.steps else 0.0,
            acceptance=accepted / trials if trials else math.nan,
            measured_ms=batch.measured_ms_sum / batch.steps if batch.steps else math.nan,
            predicted_ms=err.predicted_ms / err.count if err.count else math.nan,
            request_steps=batch.request_steps, trials=trials, replica=batch.replica_id,
        ))

    def reject(self, reason: str) -> None:
        self.totals.rejected[reason] = self.totals.rejected.get(reason, 0) + 1

    @property
    def dropped(self) -> tuple[int, int]:
        """Telemetry windows and steps the agents report having dropped (latest count per agent, summed)."""
        w = sum(v[0] for v in self.sources.values())
        s = sum(v[1] for v in self.sources.values())
        return w, s

    # -- persistence -----------------------------------------------------------------------------------
    def _load_state(self) -> tuple[int, Overrides] | None:
        path = self.config.state_path
        if path is None or not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"state file '{path}' is unreadable ({e}); move it away to start fresh") from None
        if not isinstance(doc, dict) or doc.get("schema") != STATE_SCHEMA:
            raise ConfigError(f"state file '{path}': schema = {doc.get('schema') if isinstance(doc, dict) else None!r}; "
                              f"this version reads {STATE_SCHEMA}")
        try:
            ov = Overrides.model_validate(doc.get("overrides") or {})
            version = int(doc.get("version", 0)) + 1
        except (ValidationError, TypeError, ValueError) as e:
            raise ConfigError(describe_validation_error(f"state file '{path}'", e)) from None
        return max(version, 1), ov

    def _save_state(self) -> None:
        path = self.config.state_path
        if path is None:
            return
        doc = {"schema": STATE_SCHEMA, "version": self.plan.version, "instance": self.instance,
               "overrides": self.overrides.model_dump(exclude_none=True)}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)

    # -- views -----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        p = self.plan
        t = self.totals
        dw, ds = self.dropped
        return {
            "instance": self.instance, "plan_id": self.plan_id, "plan_version": p.version, "reason": p.reason,
            "policy": p.policy, "max_k": p.max_k, "force_off": p.force_off, "drafters": p.drafters,
            "default_drafter": p.default_drafter, "slo": p.slo.model_dump(exclude_none=True),
            "overrides": self.overrides.model_dump(exclude_none=True),
            "acceptance": {d: {"pooled": round(self.acceptance.pooled(d), 4),
                               "trials": round(self.acceptance.live_trials(d), 1)} for d in self.acceptance.names},
            "cost_model": {k: v.model_dump() for k, v in p.profile.models.items()},
            "refit_samples": {k: self.refit.samples_in(k) for k in self.refit.windows},
            "telemetry": {"windows": t.windows, "steps": t.steps, "speculative_steps": t.spec_steps,
                          "rejected": dict(t.rejected), "agents": len(self.sources), "dropped_windows": dw,
                          "dropped_steps": ds},
            "replans": dict(t.replans),
        }
