"""The event-clock simulator: the reference executor's semantics, step times from a profile,
acceptance from per-request latent processes. ``control.bench.simrun`` wires it to workloads,
plans and policies."""

from control.executors.sim.acceptance import AcceptanceProcess
from control.executors.sim.engine import SimConfig, SimEngine, SimResult

__all__ = ["AcceptanceProcess", "SimConfig", "SimEngine", "SimResult"]
