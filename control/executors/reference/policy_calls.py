"""The engine's calls into its policy: errors contained, and the overlap worker's hand-over.

A policy that raises must not take the requests down with it: ``call`` returns None, the step goes
on without speculation (or verifies every drafted token, or misses one outcome), and the error is
logged and kept in the step's stats. With ``EngineConfig.overlap_policy`` the worker (``overlap.py``)
decides step t+1 during step t: ``prepared`` collects its decision, ``launch`` hands it the next job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from control.executors.base import IterationStats
from control.executors.reference.overlap import PolicyWorker
from control.policy.types import Decision, Policy, StepOutcome, StepView, wants_fresh

log = logging.getLogger("control.executors.reference.engine")
LOG_EVERY = 1000  # after the first failure, log one in this many
FALLBACK = {"decide": "this step without speculation", "prune": "verifying every drafted token",
            "observe": "the policy misses this step's outcome"}


class PolicyCalls:
    """Policy calls of one engine; ``policy_name`` names the engine's current policy in logs."""

    def __init__(self, overlap: bool, policy_name: Callable[[], str]) -> None:
        self.worker = PolicyWorker() if overlap else None
        self._held: tuple[Policy, StepOutcome] | None = None  # last outcome, with the policy it belongs to
        self.fresh = False  # overlap: this step's outcome is observed at once and the next decided on the loop
        self.fresh_steps = 0  # overlap: steps so handled because the policy wanted fresh decisions
        self._name = policy_name
        self.errors = 0
        self.last_error: str | None = None

    def call(self, stats: IterationStats, what: str, fn, *args):
        """``fn(*args)``, or None after recording the exception it raised."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - any policy bug; the engine keeps serving
            self.failed(stats, what, e)
            return None

    def failed(self, stats: IterationStats, what: str, e: Exception) -> None:
        stats.policy_error = self.last_error = f"{what}: {type(e).__name__}: {e}"
        self.errors += 1
        if self.errors == 1 or self.errors % LOG_EVERY == 0:
            log.error("policy '%s' failed in %s (%d failures so far); the engine keeps serving (%s)",
                      self._name(), what, self.errors, FALLBACK[what], exc_info=e)

    def hold(self, policy: Policy, outcome: StepOutcome) -> None:
        """overlap: keep ``outcome`` for the worker to observe during the next step, after it decides."""
        self._held = (policy, outcome)

    def prepared(self, view: StepView, policy: Policy, stats: IterationStats) -> Decision | None:
        """overlap: the decision the worker prepared for this step, cut to ``view``'s requests
        (None: none was prepared for this policy and these requests; the caller decides now)."""
        prep = self.worker.collect()
        if prep is None:
            return None
        for what, e in prep.errors:
            self.failed(stats, what, e)
        if prep.policy is not policy:  # set_policy since: the new policy decides afresh
            return None
        decision = prep.decision_for(view)
        self.worker.used += decision is not None
        return decision

    def drain(self) -> None:
        """overlap: observe the outcome still held for the worker (the engine's last step), here."""
        held, self._held = self._held, None
        if held is not None:
            self.call(IterationStats(step=-1), "observe", held[0].observe, held[1])

    def launch(self, policy: Policy, next_view: StepView | Callable[[], StepView], stats: IterationStats) -> None:
        """overlap: hand the worker the last outcome and the next step's predicted view; or, while the
        policy wants fresh decisions (``wants_fresh``), observe the outcome here and give the worker
        nothing, so this step's outcome is observed at once and the next step decides on the loop."""
        self.worker.collect()  # a job left from a step without decoding (its decision is stale)
        held, self._held = self._held, None
        outcome = held[1] if held is not None and held[0] is policy else None  # a replaced policy's: dropped
        self.fresh = wants_fresh(policy)
        if self.fresh:
            self.fresh_steps += 1
            if outcome is not None:
                self.call(stats, "observe", policy.observe, outcome)
            return
        self.worker.submit(policy, outcome, next_view)

