"""The short-context switch-off baseline: speculation off above a batch size, set the usual way.

What users deploy today is a fixed draft length switched off above a batch size: TensorRT-LLM's
``max_concurrency`` (speculate at ``max_draft_len`` up to N requests, off above) and vLLM's
``disable_by_batch_size``. N is found from a short-context benchmark (ShareGPT-like chat): the
largest batch at which speculating at that draft length still beats not speculating. This module
computes that N from a profile's cost model at a given (short) context, and the quantities needed to
tell whether a long-context workload ever reaches it (its decode context and KV-bounded batch).

The baseline is expressed with an existing policy: ``static-schedule:N=K`` (TensorRT-LLM's
``draft_len_schedule`` {N: K}: k = K up to batch N, no speculation above).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from control.bench.workloads import Workload
from control.errors import ConfigError
from control.goodput.acceptance import chain_expected
from control.goodput.stepcost import StepCostModel, uniform_step_ms
from control.plan import k_by_batch, threshold_batch
from control.profile import Profile


def decode_ctx(workload: Workload) -> float:
    """Mean context length over a workload's decode request-steps: a request of prompt P and output O
    decodes O steps at contexts P .. P + O - 1 (weighted by steps, as a batch sees them)."""
    p = workload.prompt_tokens.astype(np.float64)
    o = workload.output_tokens.astype(np.float64)
    return float(((p + (o - 1.0) / 2.0) * o).sum() / o.sum())


def residence_need(workload: Workload) -> float:
    """Mean KV reservation (prompt + output) of the requests in flight, each weighted by its decode
    steps: a request holds its reservation for about as long as it decodes."""
    need = (workload.prompt_tokens + workload.output_tokens).astype(np.float64)
    o = workload.output_tokens.astype(np.float64)
    return float((need * o).sum() / o.sum())


def kv_batch_reach(profile: Profile, workload: Workload) -> float:
    """The largest decode batch the KV cache admits for this workload when it is saturated (KV
    tokens / the in-flight mean reservation), capped at the profile's max_batch."""
    kv = profile.limits.kv_tokens
    if not kv:
        return float(profile.limits.max_batch)
    return min(kv / residence_need(workload), float(profile.limits.max_batch))


def breakeven_batch(cost: StepCostModel, ctx: float, acc: float, k: int, max_batch: int, drafter: int = 0) -> int | None:
    """The largest batch (1..max_batch) at which drafting ``k`` tokens per request beats not drafting,
    for a batch of identical requests of context ``ctx`` and per-token acceptance ``acc``: 0 if it
    never pays, None if it pays at every batch up to max_batch."""
    if k < 1:
        raise ConfigError(f"draft length k = {k!r}: the switch-off point needs k >= 1")
    if max_batch < 1:
        raise ConfigError(f"max_batch = {max_batch!r}: must be >= 1")
    b = np.arange(1, max_batch + 1, dtype=np.float64)
    gain = chain_expected(acc, float(k)) / uniform_step_ms(cost, b, ctx, float(k), drafter) \
        - 1.0 / uniform_step_ms(cost, b, ctx, 0.0, drafter)
    loses = np.flatnonzero(gain <= 0.0)
    if loses.size == 0:
        return None
    return int(loses[0])  # batches 1..loses[0] pay (index i is batch i + 1)


@dataclass(frozen=True, slots=True)
class SwitchOff:
    """A short-context switch-off setting and how it was derived."""

    ctx: float  # the short context it was computed at
    acc: float  # acceptance prior used
    k: int  # max_draft_len: the best k at batch 1 at that context
    max_concurrency: int | None  # speculate up to this batch (None: never off up to max_batch; 0: never on)
    threshold: int | None  # control.plan.threshold_batch at the same context (best k reaches 0), for reference

    @property
    def spec(self) -> str:
        """The policy spec that runs it."""
        if self.k == 0 or self.max_concurrency == 0:
            return "none"
        if self.max_concurrency is None:
            return f"fixed:{self.k}"
        return f"static-schedule:{self.max_concurrency}={self.k}"


def short_context_switch_off(profile: Profile, ctx: float, acc: float, max_k: int = 8,
                             drafter: str | None = None) -> SwitchOff:
    """max_concurrency / disable_by_batch_size the usual way: at the short context ``ctx``, the draft
    length is the cost model's best k at batch 1 and speculation is switched off above the largest
    batch at which that k still beats no speculation."""
    name = drafter or profile.drafter_names[0]
    cost = profile.step_cost([name])
    mb = profile.limits.max_batch
    k = int(k_by_batch(cost, int(round(ctx)), acc, max_k, 1)[0])
    n = breakeven_batch(cost, ctx, acc, k, mb) if k > 0 else 0
    return SwitchOff(ctx=float(ctx), acc=float(acc), k=k, max_concurrency=n,
                     threshold=threshold_batch(cost, int(round(ctx)), acc, max_k, mb))
