"""Composition of forward-pass costs into the cost of one speculative decode step.

T_step = T_draft + T_verify + overhead, where (DESIGN.md section 4):
- draft model / EAGLE-style head: sum over draft depths s = 1..max k_i of one draft pass over the
  requests still drafting: T_fwd_d(sum of their contexts + s - 1, their count);
- n-gram prompt lookup: a small constant, independent of k;
- sink+window self-speculation (MagicDec): the draft's context per request is min(ctx, sink + window);
- verify: T_fwd_target(sum ctx, sum (k_i + 1), n requests) where the executor verifies per request;
  where it pads or verifies per batch, the tokens its target really computes (``verify``,
  ``control.goodput.granularity``): n (K + 1) under padding to the static max K. A target that
  verifies by batch expansion (``LinearCost.expanded``) also reads request r's KV once per verified
  draft token j = 1..k_r (context ctx_r + j, at the re-read price a' = a x ``reread_share``) and pays
  its per-request term d for each: the verify slot j of a request costs b + d + a' (ctx + j) instead
  of b (``verify_slots``).
A request whose draft state lags the target by L tokens re-prefills them in its first draft pass
(catch-up), which adds L batched tokens to that pass at ``catch_up_ms`` each: the draft's per-token
cost without the per-sequence term a profile folds into it (``seq_ms``), which the request's sequence
pays once for the pass, not once per token it catches up.

Everything is vectorised over requests. ``slot_costs`` gives the marginal cost of each draft slot
(request r, position j) for the request-level optimiser.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from control.errors import ConfigError
from control.goodput.cost import LinearCost
from control.goodput.granularity import PER_REQUEST, VerifyGranularity


class DrafterKind(str, Enum):
    draft_model = "draft_model"
    ngram = "ngram"
    eagle = "eagle"
    self_spec = "self_spec"


@dataclass(frozen=True, slots=True)
class DrafterCost:
    """How much drafting costs for one drafter.

    ``model`` is the forward-pass cost of the draft model or EAGLE head (for ``self_spec``, the
    target's own cost with its KV capped at ``sink + window``); ``const_ms`` is a per-step cost
    (n-gram lookup, or a fixed launch overhead for the others). ``seq_ms``: the per-sequence term
    (host preparation per request per pass) folded into ``model.b`` (``LinearCost.per_token_draft``),
    which a caught-up token does not pay again.
    """

    name: str
    kind: DrafterKind
    model: LinearCost | None = None
    const_ms: float = 0.0
    sink: int = 0
    window: int = 0
    seq_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.kind in (DrafterKind.draft_model, DrafterKind.eagle, DrafterKind.self_spec) and self.model is None:
            raise ConfigError(f"drafter '{self.name}' of kind {self.kind.value} needs a cost model (model: ...)")
        if self.kind == DrafterKind.self_spec and self.sink + self.window <= 0:
            raise ConfigError(f"drafter '{self.name}' (self_spec) needs sink + window > 0 KV tokens")
        if not np.isfinite(self.const_ms) or self.const_ms < 0:
            raise ConfigError(f"drafter '{self.name}': cost_ms = {self.const_ms!r}: must be a finite number >= 0")

    @property
    def has_passes(self) -> bool:
        return self.kind != DrafterKind.ngram

    @property
    def catch_up_ms(self) -> float:
        """ms per context token a lagging draft catches up in its first pass (0: no model)."""
        return max(self.model.b - self.seq_ms, 0.0) if self.model is not None else 0.0

    @property
    def catch_up_share(self) -> float:
        """A caught-up token's cost as a share of a drafted token's (1 without a per-sequence term)."""
        b = self.model.b if self.model is not None else 0.0
        return self.catch_up_ms / b if b > 0 else 0.0

    def draft_ctx(self, ctx: np.ndarray) -> np.ndarray:
        if self.kind == DrafterKind.self_spec:
            return np.minimum(ctx, self.sink + self.window)
        return ctx

    def draft_ms(self, ctx: np.ndarray, k: np.ndarray, lag: np.ndarray | None = None) -> float:
        """Drafting cost in ms for requests with contexts ``ctx`` drafting ``k`` tokens each."""
        k = np.asarray(k, dtype=np.int64)
        if k.size == 0:
            return 0.0
        kmax = int(k.max())
        if kmax <= 0:
            return 0.0
        if not self.has_passes:
            return self.const_ms
        dctx = self.draft_ctx(np.asarray(ctx, dtype=np.float64))
        # count_s and ctx_s for depths s = 1..kmax via histograms of k, reverse-cumulated.
        cnt = np.bincount(k, minlength=kmax + 1)[::-1].cumsum()[::-1][1:]
        ctxsum = np.bincount(k, weights=dctx, minlength=kmax + 1)[::-1].cumsum()[::-1][1:]
        depth = np.arange(kmax, dtype=np.float64)  # s - 1
        m = self.model
        total_ctx = float(ctxsum.sum() + (depth * cnt).sum())
        total_tok = float(cnt.sum())
        if lag is not None:
            total_tok += self.catch_up_share * float(np.asarray(lag)[k > 0].sum())
        return m.a * total_ctx + m.b * total_tok + m.c * kmax + self.const_ms

    def slot_costs(self, ctx: np.ndarray, lag: np.ndarray, max_k: int) -> np.ndarray:
        """Marginal cost in ms of draft slot (r, j), j = 1..max_k, excluding the per-depth pass cost.

        The per-depth cost ``model.c`` is paid once per depth reached by any request; the
        optimiser adds it from the running maximum depth. Shape (n, max_k).
        """
        n = ctx.shape[0]
        if not self.has_passes:
            return np.zeros((n, max_k))
        m = self.model
        dctx = self.draft_ctx(ctx.astype(np.float64))
        j = np.arange(max_k, dtype=np.float64)
        cost = m.a * (dctx[:, None] + j[None, :]) + m.b
        cost[:, 0] += self.catch_up_ms * lag
        return cost

    @property
    def depth_ms(self) -> float:
        return self.model.c if self.has_passes else 0.0

    def features(self, ctx: np.ndarray, k: np.ndarray) -> tuple[float, float, int]:
        """(sum N_ctx, sum N_batched, passes) of the draft side, for an online refit."""
        k = np.asarray(k, dtype=np.int64)
        kmax = int(k.max()) if k.size else 0
        if kmax <= 0 or not self.has_passes:
            return 0.0, 0.0, 0
        dctx = self.draft_ctx(np.asarray(ctx, dtype=np.float64))
        cnt = np.bincount(k, minlength=kmax + 1)[::-1].cumsum()[::-1][1:]
        ctxsum = np.bincount(k, weights=dctx, minlength=kmax + 1)[::-1].cumsum()[::-1][1:]
        depth = np.arange(kmax, dtype=np.float64)
        return float(ctxsum.sum() + (depth * cnt).sum()), float(cnt.sum()), kmax


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Target cost, the drafters' costs and a per-step overhead: predicts a whole step's time."""

    target: LinearCost
    drafters: tuple[DrafterCost, ...]
    overhead_ms: float = 0.0
    verify: VerifyGranularity = PER_REQUEST  # what the executor's target verifies per request

    def verify_ms(self, ctx: np.ndarray, k: np.ndarray) -> float:
        n = k.shape[0]
        if not self.verify.per_request:
            tokens = float(self.verify.verified_tokens(k).sum())
            return float(self.target.predict(float(np.sum(ctx)), tokens, 1, n))
        t = float(self.target.predict(float(np.sum(ctx)), float(np.sum(k) + n), 1, n))
        if self.target.expanded:
            t += float(expansion_ms(self.target, np.asarray(ctx, dtype=np.float64), np.asarray(k, dtype=np.float64)).sum())
        return t

    def verify_slots(self, ctx: np.ndarray) -> tuple[np.ndarray, float]:
        """Marginal verify cost of each request's draft slot j = 0, 1, ...: base (n,) + slope * j ms.
        One token's b, plus under batch expansion that token's own sequence over ctx + j + 1 KV tokens."""
        t = self.target
        if not t.expanded:
            return np.full(ctx.shape[0], t.b), 0.0
        return t.b + t.d + t.a_reread * (np.asarray(ctx, dtype=np.float64) + 1.0), t.a_reread

    def catch_up_ms_per_token(self) -> np.ndarray:
        """(m,) each drafter's draft-model ms per context token caught up (0: no model)."""
        return np.array([d.catch_up_ms for d in self.drafters])

    def step_ms(self, ctx, k, drafter=None, lag=None) -> float:
        """Predicted step time in ms. ``drafter``: per-request drafter index (default all 0)."""
        ctx = np.asarray(ctx, dtype=np.float64)
        k = np.asarray(k, dtype=np.int64)
        t = self.verify_ms(ctx, k) + self.overhead_ms
        if not self.drafters or k.size == 0 or k.max() <= 0:
            return t
        if drafter is None or len(self.drafters) == 1:
            return t + self.drafters[0 if drafter is None else int(np.asarray(drafter).flat[0])].draft_ms(ctx, k, lag)
        drafter = np.asarray(drafter)
        for i, d in enumerate(self.drafters):
            sel = drafter == i
            if sel.any():
                t += d.draft_ms(ctx[sel], k[sel], None if lag is None else np.asarray(lag)[sel])
        return t

    def plain_ms(self, ctx) -> float:
        """Time of a non-speculative decode step (k = 0 for everyone)."""
        ctx = np.asarray(ctx, dtype=np.float64)
        n = ctx.shape[0]
        if not self.verify.per_request:  # a padded executor may verify K + 1 tokens even at k = 0
            return self.verify_ms(ctx, np.zeros(n, dtype=np.int64)) + self.overhead_ms
        return float(self.target.predict(float(ctx.sum()), float(n), 1, n)) + self.overhead_ms

    def step_std_ms(self) -> float:
        """Residual std of a step's predicted time, from the fits' residuals (for quantile SLOs)."""
        s = self.target.resid_std_ms**2
        for d in self.drafters:
            if d.model is not None:
                s += d.model.resid_std_ms**2
        return float(np.sqrt(s))


def expansion_ms(target: LinearCost, ctx, k):
    """What batch expansion adds, per request, to verifying ``k`` draft tokens at context ``ctx``:
    sum over j = 1..k of a' (ctx + j) + d, a' the re-read price (elementwise; broadcasts)."""
    return target.a_reread * (k * ctx + 0.5 * k * (k + 1.0)) + target.d * k


def uniform_step_ms(cost: StepCostModel, batch, ctx, k, drafter: int = 0):
    """Closed-form step time for ``batch`` identical requests of context ``ctx`` drafting ``k`` each.

    Broadcasts over numpy arrays of batch, ctx and k (used to tabulate plans over a grid).
    """
    B = np.asarray(batch, dtype=np.float64)
    S = np.asarray(ctx, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    per_req = k + 1.0 if cost.verify.per_request else cost.verify.uniform_tokens(k)
    t = cost.target.predict(B * S, B * per_req, 1, B) + cost.overhead_ms
    if cost.target.expanded and cost.verify.per_request:
        t = t + B * expansion_ms(cost.target, S, k)
    if not cost.drafters:
        return t
    return t + uniform_draft_ms(cost, B, S, k, drafter)


def uniform_draft_ms(cost: StepCostModel, batch, ctx, k, drafter: int = 0):
    """The drafting part of ``uniform_step_ms``: ``drafter``'s passes (or its constant) for ``batch``
    identical requests of context ``ctx`` drafting ``k`` each (0 without drafters)."""
    B = np.asarray(batch, dtype=np.float64)
    S = np.asarray(ctx, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if not cost.drafters:
        return np.zeros(k.shape)
    d = cost.drafters[drafter]
    on = k > 0
    if not d.has_passes:
        return np.where(on, d.const_ms, 0.0)
    dS = np.minimum(S, d.sink + d.window) if d.kind == DrafterKind.self_spec else S
    m = d.model
    return k * (m.a * B * dS + m.b * B + m.c) + m.a * B * k * (k - 1.0) / 2.0 + np.where(on, d.const_ms, 0.0)
