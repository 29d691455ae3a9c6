"""The replicas a control plane steers: who reports, on which plan, with what acceptance and step times.

A replica is one Triton server (``replica`` in telemetry and on the plan stream; an agent that names
none is its own replica); it belongs to one group (``<sku>/<pair>``) and runs one agent per model
instance. The table keeps, per replica: when it joined and was last heard from (a telemetry window or
an open plan stream), the last plan version pushed down its plan stream, the plan each of its agents
reports running (an idle agent reports nothing, so this one can lag behind), and its own acceptance, step time, batch and
k, decayed with a half-life so they follow the replica's current load.

A replica with no open plan stream that has not been heard from for ``stale_after_s`` is stale:
it is listed as such and left out of the group's aggregates (``aggregate``); after ``forget_after_s``
without a word it has left and is dropped from the table. Its windows already folded into the
group's acceptance and cost refit decay away there like any other data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from control.agent.wire import TelemetryBatch

STALE_AFTER_S = 5.0  # five missed one-second windows
FORGET_AFTER_S = 600.0
HALFLIFE_S = 30.0
MAX_REPLICAS = 4096


@dataclass(slots=True)
class Decayed:
    """Sums that halve every ``HALFLIFE_S`` seconds: recent windows weigh most."""

    trials: float = 0.0
    accepted: float = 0.0
    steps: float = 0.0
    measured_ms: float = 0.0
    request_steps: float = 0.0
    k_sum: float = 0.0
    slo_met: float = 0.0
    slo_scored: float = 0.0
    t: float | None = None

    def decay_to(self, now: float, halflife_s: float) -> None:
        if self.t is not None and now > self.t:
            f = 0.5 ** ((now - self.t) / halflife_s)
            for name in ("trials", "accepted", "steps", "measured_ms", "request_steps", "k_sum", "slo_met", "slo_scored"):
                setattr(self, name, getattr(self, name) * f)
        self.t = now if self.t is None else max(self.t, now)

    def add(self, other: Decayed) -> None:
        for name in ("trials", "accepted", "steps", "measured_ms", "request_steps", "k_sum", "slo_met", "slo_scored"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def view(self) -> dict[str, float]:
        nan = math.nan
        return {
            "acceptance": self.accepted / self.trials if self.trials else nan,
            "step_ms": self.measured_ms / self.steps if self.steps else nan,
            "mean_batch": self.request_steps / self.steps if self.steps else nan,
            "mean_k": self.k_sum / self.request_steps if self.request_steps else nan,
            "slo_attainment": self.slo_met / self.slo_scored if self.slo_scored else nan,
        }


@dataclass(slots=True)
class Replica:
    replica: str
    group: str
    joined: float
    last_seen: float
    last_window: float | None = None
    streams: int = 0  # open plan-stream subscriptions
    plan_delivered: int = 0  # the last plan version written to its plan stream
    windows: int = 0
    steps: int = 0
    finished: int = 0
    agents: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # source -> (plan version, plan id)
    recent: Decayed = field(default_factory=Decayed)

    @property
    def plan_version(self) -> int:
        """The oldest plan any of the replica's agents runs (0: an agent's default plan)."""
        return min((v for v, _ in self.agents.values()), default=0)


def window_stats(batch: TelemetryBatch, slo_ms: float | None) -> Decayed:
    """One window's contribution to a replica's recent sums; SLO: sampled steps within ``slo_ms``."""
    trials = sum(sum(d.position_trials) for d in batch.drafters)
    accepted = sum(sum(d.position_accepted) for d in batch.drafters)
    k_sum = sum(i * c for i, c in enumerate(batch.k_hist))
    met = scored = 0
    if slo_ms is not None and batch.samples is not None and batch.samples.n:
        times = batch.samples.total_ms
        scored = len(times)
        met = sum(1 for t in times if t <= slo_ms)
    return Decayed(trials=trials, accepted=accepted, steps=batch.steps, measured_ms=batch.measured_ms_sum,
                   request_steps=batch.request_steps, k_sum=k_sum, slo_met=met, slo_scored=scored)


class ReplicaTable:
    """Every replica heard from, across groups (see the module docstring)."""

    def __init__(self, *, stale_after_s: float = STALE_AFTER_S, forget_after_s: float = FORGET_AFTER_S,
                 halflife_s: float = HALFLIFE_S) -> None:
        self.stale_after_s = stale_after_s
        self.forget_after_s = forget_after_s
        self.halflife_s = halflife_s
        self.replicas: dict[str, Replica] = {}
        self.joined = 0
        self.left = 0

    def _get(self, replica: str, group: str, now: float) -> Replica:
        r = self.replicas.get(replica)
        if r is None or r.group != group:
            if r is not None:
                self.left += 1  # the same name now serves another group: a new replica
            r = Replica(replica=replica, group=group, joined=now, last_seen=now)
            self.replicas[replica] = r
            self.joined += 1
            if len(self.replicas) > MAX_REPLICAS:
                self.forget(now, force_oldest=True)
        return r

    def observe(self, batch: TelemetryBatch, group: str, now: float, slo_ms: float | None) -> Replica:
        r = self._get(batch.replica_id, group, now)
        r.last_seen = r.last_window = now
        r.windows += 1
        r.steps += batch.steps
        r.finished += batch.finished
        r.agents[batch.source] = (batch.plan_version, batch.plan_id)
        r.recent.decay_to(now, self.halflife_s)
        r.recent.add(window_stats(batch, slo_ms))
        return r

    def stream_opened(self, replica: str, group: str, now: float) -> None:
        r = self._get(replica, group, now)
        r.streams += 1
        r.last_seen = now

    def delivered(self, replica: str, version: int) -> None:
        r = self.replicas.get(replica)
        if r is not None:
            r.plan_delivered = max(r.plan_delivered, version)

    def stream_closed(self, replica: str, now: float) -> None:
        r = self.replicas.get(replica)
        if r is not None:
            r.streams = max(r.streams - 1, 0)
            r.last_seen = now

    def is_stale(self, r: Replica, now: float) -> bool:
        """Stale: no plan stream open and nothing heard for ``stale_after_s``. An idle replica posts no
        windows but keeps its stream open, so it stays fresh; a dead one's stream closes with its
        connection (or at the next keepalive the service cannot deliver)."""
        return r.streams == 0 and now - r.last_seen > self.stale_after_s

    def forget(self, now: float, *, force_oldest: bool = False) -> None:
        """Drop replicas silent for ``forget_after_s`` (they left); ``force_oldest``: also the longest silent."""
        gone = [k for k, r in self.replicas.items() if r.streams == 0 and now - r.last_seen > self.forget_after_s]
        if force_oldest and not gone and self.replicas:
            gone = [min(self.replicas, key=lambda k: self.replicas[k].last_seen)]
        for k in gone:
            del self.replicas[k]
            self.left += 1

    def in_group(self, group: str) -> list[Replica]:
        return sorted((r for r in self.replicas.values() if r.group == group), key=lambda r: r.replica)

    def aggregate(self, group: str, now: float) -> dict[str, Any]:
        """The group's fresh replicas pooled (stale ones left out), with their counts."""
        pooled = Decayed()
        fresh = stale = 0
        for r in self.in_group(group):
            if self.is_stale(r, now):
                stale += 1
                continue
            fresh += 1
            r.recent.decay_to(now, self.halflife_s)
            pooled.add(r.recent)
        return {"fresh": fresh, "stale": stale, **pooled.view()}

    def describe(self, r: Replica, now: float) -> dict[str, Any]:
        r.recent.decay_to(now, self.halflife_s)
        return {"replica": r.replica, "group": r.group, "stale": self.is_stale(r, now),
                "plan_version": r.plan_version, "plan_delivered": r.plan_delivered, "agents": {s: v for s, (v, _) in sorted(r.agents.items())},
                "joined_s_ago": round(now - r.joined, 3), "last_seen_s_ago": round(now - r.last_seen, 3),
                "streams": r.streams, "windows": r.windows, "steps": r.steps, "finished": r.finished,
                **r.recent.view()}
