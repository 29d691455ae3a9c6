"""Build a policy from its name and a plan."""

from __future__ import annotations

from control.errors import ConfigError
from control.plan import Plan
from control.policy.adaptive import AdaptivePolicy
from control.policy.base import PolicyContext
from control.policy.simple import FixedPolicy, HFHeuristicPolicy, NonePolicy, StaticSchedulePolicy
from control.policy.smartspec import SmartSpecPolicy, TurboSpecPolicy
from control.policy.specserve import SpecServePolicy
from control.policy.types import Policy
from control.policyspec import parse_policy_spec, parse_schedule_arg


def build_policy(spec: str, plan: Plan, *, seed: int = 0) -> Policy:
    """A fresh policy instance for ``spec`` (e.g. ``fixed:3``, ``adaptive``) under ``plan``.

    ``oracle`` needs the simulator's knowledge of each step's outcome; the simulator builds it.
    """
    ps = parse_policy_spec(spec)
    ctx = PolicyContext.from_plan(plan)
    if ps.name == "none":
        return NonePolicy(ctx)
    if ps.name == "fixed":
        return FixedPolicy(ctx, ps.fixed_k)
    if ps.name == "smartspec":
        return SmartSpecPolicy(ctx)
    if ps.name == "turbospec":
        return TurboSpecPolicy(ctx)
    if ps.name == "specserve":
        return SpecServePolicy(ctx)
    if ps.name == "hf-heuristic":
        return HFHeuristicPolicy(ctx)
    if ps.name == "static-schedule":
        if ps.arg:
            sched, maxconc = parse_schedule_arg(ps.arg)
            return StaticSchedulePolicy(ctx, sched, maxconc)
        return StaticSchedulePolicy(ctx)
    if ps.name == "adaptive":
        return AdaptivePolicy(ctx, seed=seed)
    raise ConfigError(f"policy '{spec}' runs only inside the simulator (it needs each step's outcome in advance)")
