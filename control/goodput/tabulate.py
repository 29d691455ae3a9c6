"""Best uniform k over grids of homogeneous batches: the goodput maths behind a plan's k table,
its gate threshold and TensorRT-LLM's draft_len_schedule.

A homogeneous batch is B requests of one context S at one acceptance rate A, all drafting k tokens;
its goodput is B * E[generated](A, k) / step_ms(B, S, k). Everything here is vectorised over the grid.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from control.goodput.acceptance import chain_expected
from control.goodput.optimizer import Constraints
from control.goodput.stepcost import StepCostModel, uniform_step_ms


class SloTarget(Protocol):
    """A TPOT target: ``tpot_ms`` None means no SLO; ``quantile`` None means the mean form."""

    tpot_ms: float | None
    quantile: float | None


def tabulate_k(cost: StepCostModel, batch, ctx, acc, max_k: int, slo: SloTarget | None = None,
               kv_tokens: int | None = None, token_budget: int | None = None,
               drafter: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Best uniform k and confidence cut over a grid of homogeneous batches, fully vectorised.

    Returns arrays of shape (len(batch), len(ctx), len(acc)).
    """
    B = np.asarray(batch, dtype=np.float64)[:, None, None, None]  # (nb, 1, 1, 1)
    S = np.asarray(ctx, dtype=np.float64)[None, :, None, None]  # (1, ns, 1, 1)
    A = np.asarray(acc, dtype=np.float64)[None, None, :, None]  # (1, 1, na, 1)
    k = np.arange(max_k + 1, dtype=np.float64)[None, None, None, :]  # (1, 1, 1, K+1)
    t = np.broadcast_to(uniform_step_ms(cost, B, S, k, drafter), np.broadcast_shapes(B.shape, S.shape, A.shape, k.shape))
    tokens = B * chain_expected(A, k)
    g = tokens / t  # (nb, ns, na, K+1)
    feasible = np.ones(g.shape, dtype=bool)
    if slo is not None and slo.tpot_ms is not None:
        margin = Constraints(slo_tpot_ms=slo.tpot_ms, slo_quantile=slo.quantile).slo_margin_ms(cost.step_std_ms())
        feasible &= t + margin <= slo.tpot_ms
    if kv_tokens is not None:
        feasible &= B * k <= kv_tokens
    if token_budget is not None:
        feasible &= B * (k + 1) <= token_budget
    feasible[..., 0] = True
    g = np.where(feasible, g, -np.inf)
    best = np.argmax(g, axis=-1)  # (nb, ns, na)
    # Marginal-cost confidence cut at the chosen k: one more token of survival p pays iff p > G * dT.
    g_best = np.take_along_axis(g, best[..., None], axis=-1)[..., 0]
    t_best = np.take_along_axis(t, best[..., None], axis=-1)[..., 0]
    t_next = uniform_step_ms(cost, B[..., 0], S[..., 0], best + 1.0, drafter)
    dT = (t_next - t_best) / B[..., 0]
    cut = np.clip(g_best * dT, 0.0, 1.0)
    return best.astype(np.int64), cut


def k_by_batch(cost: StepCostModel, ctx: int, acc: float, max_k: int, max_batch: int, slo: SloTarget | None = None,
               kv_tokens: int | None = None, token_budget: int | None = None, drafter: int = 0) -> np.ndarray:
    """Best uniform k for every batch size 1..max_batch at one context and acceptance (index 0 = batch 1)."""
    k, _ = tabulate_k(cost, np.arange(1, max_batch + 1), [ctx], [acc], max_k, slo, kv_tokens, token_budget, drafter)
    return k[:, 0, 0]  # (max_batch,)


def threshold_batch(cost: StepCostModel, ctx: int, acc: float, max_k: int, max_batch: int,
                    slo: SloTarget | None = None, drafter: int = 0) -> int | None:
    """The smallest batch size at which speculation stops paying (None if it pays up to max_batch)."""
    if max_k <= 0:
        return 1
    k = k_by_batch(cost, ctx, acc, max_k, max_batch, slo, drafter=drafter)
    zero = np.flatnonzero(k == 0)
    return int(zero[0]) + 1 if zero.size else None


def per_request_goodput_sum(cost: StepCostModel, ctx: int, acc: float, k_per_batch: np.ndarray) -> float:
    """Sum over batch sizes 1..len(k_per_batch) of one request's predicted goodput (tokens per ms)
    when batch size b drafts k_per_batch[b - 1] tokens: how schedules of k over batch size compare."""
    batches = np.arange(1, len(k_per_batch) + 1, dtype=np.float64)  # (max_batch,)
    return float(np.sum(chain_expected(acc, k_per_batch) / uniform_step_ms(cost, batches, ctx, k_per_batch)))
