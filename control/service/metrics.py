"""Prometheus metrics for one service instance, rendered from its state at scrape time.

A collector registered in a registry owned by the app (no process-global registry): acceptance per
drafter and position, the k distribution, the share of speculative steps, predicted vs measured step
time, the plan version, dropped and rejected telemetry, the cost model in force.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from control.service.state import ControlState


class StateCollector(Collector):
    def __init__(self, state: ControlState, subscribers: Callable[[], int]) -> None:
        self.state = state
        self.subscribers = subscribers

    def collect(self) -> Iterator[Metric]:
        yield from self._plan()
        yield from self._acceptance()
        yield from self._steps()
        yield from self._step_times()
        yield from self._telemetry()

    def _plan(self) -> Iterator[Metric]:
        """The plan in force and its publications."""
        s = self.state
        t = s.totals
        p = s.plan
        g = GaugeMetricFamily("specctl_plan_version", "Version of the plan the service publishes", labels=["instance"])
        g.add_metric([s.instance], p.version)
        yield g
        c = CounterMetricFamily("specctl_plan_publications", "Plans published, by what triggered them", labels=["trigger"])
        for trig, n in sorted(t.replans.items()):
            c.add_metric([trig], n)
        yield c
        yield GaugeMetricFamily("specctl_plan_max_k", "Largest draft length the plan allows", value=p.max_k)
        yield GaugeMetricFamily("specctl_plan_force_off", "1 when speculation is forced off", value=int(p.force_off))
        yield GaugeMetricFamily("specctl_plan_subscribers", "Open plan-stream subscriptions", value=self.subscribers())

    def _acceptance(self) -> Iterator[Metric]:
        """Acceptance: live estimates and cumulative counts per drafter and position."""
        s = self.state
        t = s.totals
        p = s.plan
        est = GaugeMetricFamily("specctl_acceptance_rate", "Estimated conditional acceptance per drafter and draft "
                                "position (position=all: pooled)", labels=["drafter", "position"])
        trials = CounterMetricFamily("specctl_draft_position_trials", "Draft positions evaluated by the target",
                                     labels=["drafter", "position"])
        acc = CounterMetricFamily("specctl_draft_position_accepted", "Draft positions accepted by the target",
                                  labels=["drafter", "position"])
        tokens = CounterMetricFamily("specctl_draft_tokens", "Draft tokens by drafter and fate",
                                     labels=["drafter", "kind"])
        for i, d in enumerate(s.acceptance.names):
            est.add_metric([d, "all"], s.acceptance.pooled(d))
            rates = s.acceptance.positions(d, max(p.max_k, 1))
            for j, r in enumerate(rates):
                est.add_metric([d, str(j + 1)], float(r))
            for j in range(t.pos_trials.shape[1]):
                if t.pos_trials[i, j]:
                    trials.add_metric([d, str(j + 1)], int(t.pos_trials[i, j]))
                    acc.add_metric([d, str(j + 1)], int(t.pos_accepted[i, j]))
            for kind, row in (("drafted", 0), ("verified", 1), ("accepted", 2)):
                tokens.add_metric([d, kind], int(t.tokens[row, i]))
        yield est
        yield trials
        yield acc
        yield tokens

    def _steps(self) -> Iterator[Metric]:
        """The k distribution and step counts."""
        t = self.state.totals
        cum, total_k = 0, 0
        buckets = []
        for k, n in enumerate(t.k_hist.tolist()):
            cum += n
            total_k += k * n
            buckets.append((str(float(k)), cum))
        buckets.append(("+Inf", cum))
        yield HistogramMetricFamily("specctl_draft_length", "Draft length k chosen per request and step",
                                    buckets=buckets, sum_value=total_k)

        yield CounterMetricFamily("specctl_steps", "Decode steps reported by agents", value=t.steps)
        yield CounterMetricFamily("specctl_speculative_steps", "Steps in which at least one request drafted",
                                  value=t.spec_steps)
        yield GaugeMetricFamily("specctl_speculative_step_share", "Share of steps that speculated (since start)",
                                value=t.spec_steps / t.steps if t.steps else 0.0)
        yield CounterMetricFamily("specctl_request_steps", "Request-steps (sum of batch sizes)", value=t.request_steps)
        yield CounterMetricFamily("specctl_finished_requests", "Requests finished", value=t.finished)

    def _step_times(self) -> Iterator[Metric]:
        """Step time: measured, the policies' predictions, and the service's cost model."""
        s = self.state
        t = s.totals
        p = s.plan
        yield CounterMetricFamily("specctl_step_time_measured_ms", "Sum of measured step times (ms)", value=t.measured_ms)
        ap = CounterMetricFamily("specctl_step_time_policy_ms", "Steps the policy predicted: predicted and measured "
                                 "time sums (ms)", labels=["kind"])
        ap.add_metric(["predicted"], t.agent_pred_ms)
        ap.add_metric(["measured"], t.agent_pred_measured_ms)
        yield ap
        yield CounterMetricFamily("specctl_step_time_policy_steps", "Steps with a policy prediction",
                                  value=t.agent_pred_steps)
        m = t.model
        mp = CounterMetricFamily("specctl_step_time_model_ms", "Sampled steps: the service cost model's prediction "
                                 "(before refitting on them) and the measured time (ms)", labels=["kind"])
        mp.add_metric(["predicted"], m.predicted_ms)
        mp.add_metric(["measured"], m.measured_ms)
        yield mp
        yield CounterMetricFamily("specctl_step_time_model_samples", "Sampled steps scored", value=m.count)
        yield GaugeMetricFamily("specctl_step_time_model_mape", "Mean absolute % error of the service cost model "
                                "on sampled steps", value=m.abs_pct / m.count if m.count else 0.0)
        last = s.history[-1] if s.history else None
        lg = GaugeMetricFamily("specctl_step_time_last_ms", "Latest telemetry window: mean measured step time and "
                               "the model's mean prediction (ms)", labels=["kind"])
        if last is not None:
            lg.add_metric(["measured"], last.measured_ms)
            lg.add_metric(["predicted"], last.predicted_ms)
        yield lg
        if last is not None:
            yield GaugeMetricFamily("specctl_batch_size_last", "Latest window: mean decode batch size", value=last.mean_batch)
            yield GaugeMetricFamily("specctl_draft_length_last", "Latest window: mean k per request", value=last.mean_k)

        coef = GaugeMetricFamily("specctl_cost_coefficient", "Cost model in force: T = a*N_ctx + b*N_batched + c + d*N_req (ms)",
                                 labels=["model", "coef"])
        for key, cc in p.profile.models.items():
            coef.add_metric([key, "a"], cc.a_ms_per_ctx_token)
            coef.add_metric([key, "b"], cc.b_ms_per_batched_token)
            coef.add_metric([key, "c"], cc.c_ms)
            coef.add_metric([key, "d"], cc.d_ms_per_request)
        yield coef

    def _telemetry(self) -> Iterator[Metric]:
        """Telemetry health."""
        s = self.state
        t = s.totals
        yield CounterMetricFamily("specctl_telemetry_windows", "Telemetry windows accepted", value=t.windows)
        rej = CounterMetricFamily("specctl_telemetry_rejected", "Telemetry posts rejected, by reason", labels=["reason"])
        for reason, n in sorted(t.rejected.items()):
            rej.add_metric([reason], n)
        yield rej
        dw, ds = s.dropped
        yield GaugeMetricFamily("specctl_telemetry_dropped_windows", "Windows the agents report having dropped "
                                "(queue full or service away), summed over agents", value=dw)
        yield GaugeMetricFamily("specctl_telemetry_dropped_steps", "Steps in the dropped windows", value=ds)
        yield GaugeMetricFamily("specctl_agents", "Agents that posted telemetry", value=len(s.sources))


def make_registry(state: ControlState, subscribers: Callable[[], int]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(state, subscribers))
    return reg
