"""A control plane for several deployment groups: one ``ControlState`` (plans, estimates, overrides)
per group (``<sku>/<pair>``, one profile each) and one table of the replicas that report to them.

Plans are compiled per group from the group's own profile and telemetry: an H100 replica's step
times never refit an L4 group's cost model. A request that names no group goes to the first one,
so a single-group deployment (and an agent that predates groups) works as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from control.agent.wire import TelemetryBatch, group_name
from control.errors import ConfigError
from control.service.replicas import ReplicaTable
from control.service.state import ControlState


class UnknownGroup(ConfigError):
    """A request named a group this control plane does not serve."""


class Fleet:
    def __init__(self, states: list[ControlState], *, replicas: ReplicaTable | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not states:
            raise ConfigError("a control plane needs at least one profile (group)")
        self.groups: dict[str, ControlState] = {}
        for s in states:
            name = group_name(s.base_profile.sku, s.base_profile.pair)
            if name in self.groups:
                raise ConfigError(f"two profiles for group {name}: give one profile per SKU and pair")
            self.groups[name] = s
        self.default_group = next(iter(self.groups))
        self.replicas = replicas or ReplicaTable()
        self.clock = clock
        for name, s in self.groups.items():
            s.is_fresh = self._fresh_checker(name)

    def _fresh_checker(self, group: str) -> Callable[[str], bool]:
        def fresh(replica: str) -> bool:
            r = self.replicas.replicas.get(replica)
            return r is None or r.group != group or not self.replicas.is_stale(r, self.clock())

        return fresh

    @property
    def default(self) -> ControlState:
        return self.groups[self.default_group]

    def name_of(self, group: str | None) -> str:
        """The group ``group`` names (None: the default); UnknownGroup naming the groups served."""
        if group is None or group == "":
            return self.default_group
        if group not in self.groups:
            raise UnknownGroup(f"group {group[:200]!r} is not served here; groups: {', '.join(self.groups)} "
                               "(a group is '<sku>/<pair>' of a profile given to the control plane)")
        return group

    def state(self, group: str | None) -> ControlState:
        return self.groups[self.name_of(group)]

    def ingest(self, batch: TelemetryBatch) -> ControlState:
        """Fold a window into its group's state and its replica's row; the group's state."""
        name = self.name_of(batch.group)
        st = self.groups[name]
        now = self.clock()
        st.ingest(batch, now)
        self.replicas.observe(batch, name, now, st.plan.slo.tpot_ms)
        return st

    def forget_departed(self) -> None:
        self.replicas.forget(self.clock())
