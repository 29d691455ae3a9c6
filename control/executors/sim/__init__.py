"""The event-clock simulator: the reference executor's semantics, step times from a profile,
acceptance from per-request latent processes or, exactly, from a real pair's recorded greedy
acceptance (``ReplayAcceptance``). ``control.bench.simrun`` and ``control.bench.replay`` wire it to
workloads, plans and policies."""

from control.executors.sim.acceptance import AcceptanceProcess, ReplayAcceptance
from control.executors.sim.engine import SimConfig, SimEngine, SimResult

__all__ = ["AcceptanceProcess", "ReplayAcceptance", "SimConfig", "SimEngine", "SimResult"]
