"""Stage: cost refit. The live step-cost model, refitted online from the steps' measured times.

Each model's step time is fitted by recursive least squares with forgetting (``RecursiveCost``):
the target's verify pass on (context tokens, verified tokens, 1, n), each draft model's passes on
(context tokens, batched tokens, passes). Every ``REFIT_EVERY`` steps the cost model is rebuilt
from the fits that predict better than the profile, plus the loop's own time outside the passes
(``LoopOverhead``): per step into the overhead, per request-step into the target's d. A step's draft
time goes to the one draft model that ran passes in it (n-gram lookups beside it charged at their
profiled time), to its fit and to its price posterior (``draft_prices.py``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from control.goodput.cost import RecursiveCost
from control.goodput.granularity import VerifyGranularity
from control.goodput.overhead import LoopOverhead
from control.goodput.stepcost import DrafterCost, StepCostModel
from control.policy.adaptive.draft_prices import DraftPrices
from control.policy.adaptive.survival import drafters_in
from control.policy.types import StepOutcome

REFIT_EVERY = 32  # steps between rebuilding the cost model from the online fit


class CostRefit:
    def __init__(self, cost: StepCostModel) -> None:
        self.rls_target = RecursiveCost(cost.target)
        self.expanded = cost.target.expanded  # verification by batch expansion (fit its extra sequences)
        self.reread_share = cost.target.reread_share  # those sequences' KV reads, as a share of a's price
        self.rls_draft = [RecursiveCost(d.model) if d.model is not None else None for d in cost.drafters]
        self.prices = DraftPrices(np.array([d.model is not None for d in cost.drafters], dtype=bool))
        self.loop = LoopOverhead()
        self._since = 0

    def update(self, outcome: StepOutcome, d_ctx: np.ndarray, spec: np.ndarray, uniform: bool,
               verify: VerifyGranularity, base: StepCostModel) -> StepCostModel | None:
        """Feed one step's times; every ``REFIT_EVERY`` steps return the rebuilt cost model (else None).
        ``spec`` (n,) bool: requests that drafted; ``base``: the plan's cost model (the prior)."""
        self.loop.update(outcome.prev_loop_ms, outcome.prev_loop_requests)
        one = outcome.n == 1  # (plain ints instead of reductions: the same sums)
        if outcome.verify_ms > 0:
            # the pass also computed any prompt chunks mixed into it (chunked prefill)
            ctx_sum = int(outcome.ctx_lens[0]) if one else outcome.ctx_lens.sum()
            if verify.per_request:
                verified = float((int(outcome.verified[0]) if one else outcome.verified.sum()) + outcome.n)
            else:
                verified = float(verify.verified_tokens(outcome.verified).sum())  # padding included
            ctx_feature, seqs = float(ctx_sum), float(outcome.n)
            if self.expanded and verify.per_request:
                ctx_feature, seqs = _expanded_features(outcome, ctx_feature, seqs, self.reread_share)
            self.rls_target.update(ctx_feature + outcome.prefill_ctx_tokens,
                                   verified + outcome.prefill_tokens, outcome.verify_ms, 1.0, seqs)
        used = d_ctx[:1] if uniform and (spec[0] if one else spec.any()) else drafters_in(d_ctx[spec])
        if outcome.draft_ms > 0 and outcome.draft_passes > 0:
            self._update_draft(outcome, used, base)
        self._since += 1
        if self._since < REFIT_EVERY:
            return None
        self._since = 0
        return self.rebuild(base, verify)

    def _update_draft(self, outcome: StepOutcome, used: np.ndarray, base: StepCostModel) -> None:
        """Feed the step's draft time to its draft model's fit when one model ran its passes; the
        drafters without passes beside it (n-gram lookups) are charged their profiled time. With two
        models in a step their shares of the time are unknown, and neither fit learns from it."""
        ms = outcome.draft_ms
        if used.size == 1:  # the usual step: one drafter
            i = int(used[0])
        else:
            models = [int(j) for j in used if self.rls_draft[int(j)] is not None]
            if len(models) != 1:
                return
            i = models[0]
            ms -= sum(base.drafters[int(j)].const_ms for j in used if self.rls_draft[int(j)] is None)
        rls = self.rls_draft[i]
        if rls is None or ms <= 0.0:
            return
        ctx, batched, passes = outcome.draft_ctx_tokens, outcome.draft_batched_tokens, outcome.draft_passes
        d = base.drafters[i]
        if d.seq_ms and used.size == 1:
            # tokens beyond one per request per pass were caught up, without the per-sequence term
            # folded into b (DrafterCost.catch_up_ms): adding it back fits the drafted-token price
            ms += d.seq_ms * max(batched - int(outcome.drafted.sum()), 0)
        rls.update(ctx, batched, ms, passes)
        self.prices.observe(i, ms, float(d.model.predict(ctx, batched, passes)) + d.const_ms)

    def rebuild(self, base: StepCostModel, verify: VerifyGranularity) -> StepCostModel:
        """The cost model from each fit that improves on the profile's (``base``), plus the loop's time."""
        rd = self.rls_draft
        fitted = self.prices.fitted
        fitted[:] = [r is not None and r.improves_on_prior() for r in rd]
        drafters = tuple(
            DrafterCost(d.name, d.kind, rd[i].cost if fitted[i] else d.model, d.const_ms, d.sink, d.window, d.seq_ms)
            for i, d in enumerate(base.drafters)
        )
        target = self.rls_target.cost if self.rls_target.improves_on_prior() else base.target
        per_step, per_request = self.loop.fit()
        if per_request > 0.0:
            target = replace(target, d=target.d + per_request)
        return StepCostModel(target, drafters, base.overhead_ms + per_step, verify)


def _expanded_features(outcome: StepOutcome, ctx_sum: float, n: float, share: float) -> tuple[float, float]:
    """Under batch expansion each verified draft token j = 1..v of a request is a sequence of its own
    over ctx + j KV tokens read at ``share`` of a's price (``stepcost.expansion_ms``): the pass's
    context feature gains share * sum(v * ctx + v (v + 1) / 2) and its sequence count sum(v), so the fit
    learns the same a and d the cost model charges instead of folding the expansion into b and
    charging it twice."""
    v = outcome.verified.astype(np.float64)  # (n,) draft tokens verified per request
    ctx = outcome.ctx_lens.astype(np.float64)  # (n,)
    return ctx_sum + share * float((v * ctx).sum() + 0.5 * (v * (v + 1.0)).sum()), n + float(v.sum())
