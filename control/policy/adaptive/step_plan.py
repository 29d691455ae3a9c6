"""The typed plan of one ``adaptive`` step, filled in stage by stage.

``AdaptivePolicy._decide`` runs the stages in order; each reads what the stages before it wrote and
adds its own fields (n = the step's decode requests, K = the policy's maximum draft length):

    gate -> drafter choice -> survival -> optimiser -> probes -> gate evidence -> cuts -> pace

Every array is over the step's requests in the view's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from control.goodput.optimizer import Choice, Constraints
from control.policy.types import StepView


@dataclass(slots=True)
class StepPlan:
    view: StepView
    cap: np.ndarray  # (n,) int64: most draft tokens each request may get (caps, catch-up limit)
    # drafter choice
    d_ctx: np.ndarray | None = None  # (n,) int64: each request's drafter, plan index
    d_exec: np.ndarray | None = None  # (n,) int64: the same drafter, executor index
    lag: np.ndarray | None = None  # (n,) int64: tokens the chosen drafter's state is behind the target
    uniform: bool = True  # one drafter serves the whole batch
    lookup_ctx: int = -1  # the n-gram drafter whose lookup the view reports (plan index; -1: none)
    lookup_exec: int = -1  # the same drafter, executor index
    lookup_curves: np.ndarray | None = None  # (K+1, K): its survival by proposal length a = 0..K
    lagged: bool = False  # some request must catch up before drafting
    sunk: np.ndarray | None = None  # (n,) bool: new requests priced in sync with their draft model, whose
    # catch-up there stands for a prefill (``DrafterChoice._choice_lag``; None: none)
    # survival
    surv: np.ndarray | None = None  # (n, K): P(draft position j of request r is accepted)
    csum: np.ndarray | None = None  # (n, K+1): expected accepted draft tokens at k = 0..K (None at n = 1)
    # optimiser
    cons: Constraints | None = None  # the step's KV, token-budget and SLO limits
    pace: np.ndarray | None = None  # (n,) float: smoothed tokens per step so far (NaN: not decided on yet)
    known: np.ndarray | bool = True  # (n,) bool where ``pace`` is finite, or True: all of it
    weights: np.ndarray | None = None  # (n,) float: residence value of a token, batch mean 1 (None: equal)
    choice: Choice | None = None  # per-request k, predicted tokens and step time
    g_value: float = 0.0  # the optimiser's goodput, residence-weighted tokens per ms (the cuts' scale)
    accepted: np.ndarray | None = None  # (n,) float: expected accepted draft tokens at ``choice.k``
    # cuts
    conf_cut: np.ndarray | None = None  # (n,) float: running raw confidence below which drafting stops

    @property
    def n(self) -> int:
        return self.view.n
