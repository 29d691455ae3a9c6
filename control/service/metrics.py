"""Prometheus metrics for one service instance, rendered from its state at scrape time.

A collector registered in a registry owned by the app (no process-global registry). Per group
(label ``group``, ``<sku>/<pair>``): acceptance per drafter and position, the k distribution, the
share of speculative steps, predicted vs measured step time, the plan version, dropped and rejected
telemetry, the cost model in force. Per replica (labels ``group``, ``replica``): the plan version
its agents run, its own acceptance, step time, batch, k and SLO attainment (decayed, the last half
minute weighing most), seconds since it was last heard from, and whether it is stale.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from control.service.fleet import Fleet
from control.service.state import ControlState


class Subscribers(Protocol):
    @property
    def subscribers(self) -> int: ...


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["group", *(labels or [])])


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=["group", *(labels or [])])


class FleetCollector(Collector):
    def __init__(self, fleet: Fleet, hubs: Subscribers) -> None:
        self.fleet = fleet
        self.hubs = hubs

    def collect(self) -> Iterator[Metric]:
        groups = list(self.fleet.groups.items())
        yield from self._plan(groups)
        yield from self._acceptance(groups)
        yield from self._steps(groups)
        yield from self._step_times(groups)
        yield from self._telemetry(groups)
        yield from self._replicas()

    def _plan(self, groups: list[tuple[str, ControlState]]) -> Iterator[Metric]:
        """The plan in force per group and its publications."""
        v = _gauge("specctl_plan_version", "Version of the plan the service publishes", ["instance"])
        pubs = _counter("specctl_plan_publications", "Plans published, by what triggered them", ["trigger"])
        mk = _gauge("specctl_plan_max_k", "Largest draft length the plan allows")
        off = _gauge("specctl_plan_force_off", "1 when speculation is forced off")
        slo = _gauge("specctl_plan_slo_tpot_ms", "TPOT SLO of the plan (ms; absent: none)")
        for g, s in groups:
            p = s.plan
            v.add_metric([g, s.instance], p.version)
            for trig, n in sorted(s.totals.replans.items()):
                pubs.add_metric([g, trig], n)
            mk.add_metric([g], p.max_k)
            off.add_metric([g], int(p.force_off))
            if p.slo.tpot_ms is not None:
                slo.add_metric([g], p.slo.tpot_ms)
        yield from (v, pubs, mk, off, slo)
        yield GaugeMetricFamily("specctl_plan_subscribers", "Open plan-stream subscriptions", value=self.hubs.subscribers)

    def _acceptance(self, groups: list[tuple[str, ControlState]]) -> Iterator[Metric]:
        """Acceptance: live estimates and cumulative counts per drafter and position."""
        est = _gauge("specctl_acceptance_rate", "Estimated conditional acceptance per drafter and draft "
                     "position (position=all: pooled)", ["drafter", "position"])
        trials = _counter("specctl_draft_position_trials", "Draft positions evaluated by the target", ["drafter", "position"])
        acc = _counter("specctl_draft_position_accepted", "Draft positions accepted by the target", ["drafter", "position"])
        tokens = _counter("specctl_draft_tokens", "Draft tokens by drafter and fate", ["drafter", "kind"])
        for g, s in groups:
            t, p = s.totals, s.plan
            for i, d in enumerate(s.acceptance.names):
                est.add_metric([g, d, "all"], s.acceptance.pooled(d))
                for j, r in enumerate(s.acceptance.positions(d, max(p.max_k, 1))):
                    est.add_metric([g, d, str(j + 1)], float(r))
                for j in range(t.pos_trials.shape[1]):
                    if t.pos_trials[i, j]:
                        trials.add_metric([g, d, str(j + 1)], int(t.pos_trials[i, j]))
                        acc.add_metric([g, d, str(j + 1)], int(t.pos_accepted[i, j]))
                for kind, row in (("drafted", 0), ("verified", 1), ("accepted", 2)):
                    tokens.add_metric([g, d, kind], int(t.tokens[row, i]))
        yield from (est, trials, acc, tokens)

    def _steps(self, groups: list[tuple[str, ControlState]]) -> Iterator[Metric]:
        """The k distribution and step counts."""
        hist = HistogramMetricFamily("specctl_draft_length", "Draft length k chosen per request and step", labels=["group"])
        steps = _counter("specctl_steps", "Decode steps reported by agents")
        spec = _counter("specctl_speculative_steps", "Steps in which at least one request drafted")
        share = _gauge("specctl_speculative_step_share", "Share of steps that speculated (since start)")
        rsteps = _counter("specctl_request_steps", "Request-steps (sum of batch sizes)")
        fin = _counter("specctl_finished_requests", "Requests finished")
        for g, s in groups:
            t = s.totals
            cum, total_k, buckets = 0, 0, []
            for k, n in enumerate(t.k_hist.tolist()):
                cum += n
                total_k += k * n
                buckets.append((str(float(k)), cum))
            buckets.append(("+Inf", cum))
            hist.add_metric([g], buckets, total_k)
            steps.add_metric([g], t.steps)
            spec.add_metric([g], t.spec_steps)
            share.add_metric([g], t.spec_steps / t.steps if t.steps else 0.0)
            rsteps.add_metric([g], t.request_steps)
            fin.add_metric([g], t.finished)
        yield from (hist, steps, spec, share, rsteps, fin)

    def _step_times(self, groups: list[tuple[str, ControlState]]) -> Iterator[Metric]:
        """Step time: measured, the policies' predictions, and the service's cost model."""
        meas = _counter("specctl_step_time_measured_ms", "Sum of measured step times (ms)")
        ap = _counter("specctl_step_time_policy_ms", "Steps the policy predicted: predicted and measured time sums (ms)",
                      ["kind"])
        aps = _counter("specctl_step_time_policy_steps", "Steps with a policy prediction")
        mp = _counter("specctl_step_time_model_ms", "Sampled steps: the service cost model's prediction (before "
                      "refitting on them) and the measured time (ms)", ["kind"])
        mps = _counter("specctl_step_time_model_samples", "Sampled steps scored")
        mape = _gauge("specctl_step_time_model_mape", "Mean absolute % error of the service cost model on sampled steps")
        lg = _gauge("specctl_step_time_last_ms", "Latest telemetry window: mean measured step time and the model's "
                    "mean prediction (ms)", ["kind"])
        lb = _gauge("specctl_batch_size_last", "Latest window: mean decode batch size")
        lk = _gauge("specctl_draft_length_last", "Latest window: mean k per request")
        coef = _gauge("specctl_cost_coefficient", "Cost model in force: T = a*N_ctx + b*N_batched + c + d*N_req (ms)",
                      ["model", "coef"])
        for g, s in groups:
            t, m = s.totals, s.totals.model
            meas.add_metric([g], t.measured_ms)
            ap.add_metric([g, "predicted"], t.agent_pred_ms)
            ap.add_metric([g, "measured"], t.agent_pred_measured_ms)
            aps.add_metric([g], t.agent_pred_steps)
            mp.add_metric([g, "predicted"], m.predicted_ms)
            mp.add_metric([g, "measured"], m.measured_ms)
            mps.add_metric([g], m.count)
            mape.add_metric([g], m.abs_pct / m.count if m.count else 0.0)
            last = s.history[-1] if s.history else None
            if last is not None:
                lg.add_metric([g, "measured"], last.measured_ms)
                lg.add_metric([g, "predicted"], last.predicted_ms)
                lb.add_metric([g], last.mean_batch)
                lk.add_metric([g], last.mean_k)
            for key, cc in s.plan.profile.models.items():
                for name, val in (("a", cc.a_ms_per_ctx_token), ("b", cc.b_ms_per_batched_token), ("c", cc.c_ms),
                                  ("d", cc.d_ms_per_request)):
                    coef.add_metric([g, key, name], val)
        yield from (meas, ap, aps, mp, mps, mape, lg, lb, lk, coef)

    def _telemetry(self, groups: list[tuple[str, ControlState]]) -> Iterator[Metric]:
        """Telemetry health."""
        win = _counter("specctl_telemetry_windows", "Telemetry windows accepted")
        dw = _gauge("specctl_telemetry_dropped_windows", "Windows the agents report having dropped (queue full or "
                    "service away), summed over agents")
        dsteps = _gauge("specctl_telemetry_dropped_steps", "Steps in the dropped windows")
        agents = _gauge("specctl_agents", "Agents that posted telemetry")
        rejected: dict[str, int] = {}
        for g, s in groups:
            win.add_metric([g], s.totals.windows)
            w, st = s.dropped
            dw.add_metric([g], w)
            dsteps.add_metric([g], st)
            agents.add_metric([g], len(s.sources))
            for reason, n in s.totals.rejected.items():
                rejected[reason] = rejected.get(reason, 0) + n
        rej = CounterMetricFamily("specctl_telemetry_rejected", "Telemetry posts rejected, by reason", labels=["reason"])
        for reason, n in sorted(rejected.items()):
            rej.add_metric([reason], n)
        yield from (win, rej, dw, dsteps, agents)

    def _replicas(self) -> Iterator[Metric]:
        """Per replica: plan version, own acceptance and step times, freshness."""
        table, now = self.fleet.replicas, self.fleet.clock()
        labels = ["replica"]
        fams = {
            "plan_version": _gauge("specctl_replica_plan_version", "Oldest plan version the replica's agents run", labels),
            "acceptance": _gauge("specctl_replica_acceptance", "Replica's accepted / evaluated draft positions (recent)", labels),
            "step_ms": _gauge("specctl_replica_step_time_ms", "Replica's mean measured step time (recent, ms)", labels),
            "mean_batch": _gauge("specctl_replica_batch_size", "Replica's mean decode batch size (recent)", labels),
            "mean_k": _gauge("specctl_replica_draft_length", "Replica's mean k per request (recent)", labels),
            "slo_attainment": _gauge("specctl_replica_slo_attainment", "Replica's share of sampled steps within the "
                                     "plan's TPOT SLO (recent; absent without an SLO)", labels),
        }
        delivered = _gauge("specctl_replica_plan_delivered", "Last plan version pushed down the replica's plan stream",
                           labels)
        stale = _gauge("specctl_replica_stale", "1 when the replica stopped reporting (left out of aggregates)", labels)
        seen = _gauge("specctl_replica_last_seen_seconds", "Seconds since the replica was last heard from", labels)
        count = _gauge("specctl_replicas", "Replicas per group and freshness", ["state"])
        steps = _counter("specctl_replica_steps", "Decode steps the replica reported", labels)
        for g in self.fleet.groups:
            agg = table.aggregate(g, now)
            count.add_metric([g, "fresh"], agg["fresh"])
            count.add_metric([g, "stale"], agg["stale"])
            for r in table.in_group(g):
                d = table.describe(r, now)
                for key, fam in fams.items():
                    v = d[key]
                    if not (isinstance(v, float) and math.isnan(v)):
                        fam.add_metric([g, r.replica], v)
                stale.add_metric([g, r.replica], int(d["stale"]))
                delivered.add_metric([g, r.replica], r.plan_delivered)
                seen.add_metric([g, r.replica], now - r.last_seen)
                steps.add_metric([g, r.replica], r.steps)
        yield from (*fams.values(), delivered, stale, seen, count, steps)


def make_registry(fleet: Fleet, hubs: Subscribers) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FleetCollector(fleet, hubs))
    return reg
