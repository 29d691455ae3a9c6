"""1 / step time of a uniform draft length, per drafter, for the batch's size and mean context.

    inv[i, k] = 1 / T(n, S, k, drafter i),   k = 0..K,   S = 16 * (mean ctx // 16) + 8,

cached per 16-token context bucket, batch size and cost model. The gate's pooled-rate check and the
bandit's Thompson draws both price uniform k with it: tokens of a chain of rate r at k,
(1 - r^(k+1)) / (1 - r), times ``inv`` is its goodput.
"""

from __future__ import annotations

import numpy as np

from control.goodput.stepcost import StepCostModel, uniform_draft_ms, uniform_step_ms

CTX_BUCKET_SHIFT = 4  # contexts bucketed by 16 tokens


class UniformSteps:
    def __init__(self, m: int, K: int) -> None:
        self.m = m
        self.kk = np.arange(K + 1, dtype=np.float64)  # (K+1,) uniform draft lengths 0..K
        self._key: tuple | None = None
        self._inv = np.zeros((m, K + 1))  # (m, K+1)
        self._draft_key: tuple | None = None
        self._draft = np.zeros((m, K + 1))  # (m, K+1) the drafting part of each step's ms

    def inv(self, cost: StepCostModel, ctx_lens: np.ndarray) -> np.ndarray:
        """(m, K+1): 1 / step ms of a uniform k = 0..K for each drafter, batch of ``ctx_lens`` (n,)."""
        key, ctx = _bucket(cost, ctx_lens)
        if self._key != key:
            self._inv = 1.0 / np.stack([uniform_step_ms(cost, ctx_lens.shape[0], ctx, self.kk, drafter=i)
                                        for i in range(self.m)])
            self._key = key
        return self._inv

    def draft_ms(self, cost: StepCostModel, ctx_lens: np.ndarray) -> np.ndarray:
        """(m, K+1): the drafting part of ``1 / inv`` (each drafter's passes, or its constant)."""
        key, ctx = _bucket(cost, ctx_lens)
        if self._draft_key != key:
            self._draft = np.stack([uniform_draft_ms(cost, ctx_lens.shape[0], ctx, self.kk, drafter=i)
                                    for i in range(self.m)])
            self._draft_key = key
        return self._draft


def _bucket(cost: StepCostModel, ctx_lens: np.ndarray) -> tuple[tuple, float]:
    """The cache key (batch size, 16-token context bucket, cost model) and the bucket's middle context."""
    bucket = int(ctx_lens.mean()) >> CTX_BUCKET_SHIFT
    return (ctx_lens.shape[0], bucket, id(cost)), float(bucket << CTX_BUCKET_SHIFT) + float(1 << (CTX_BUCKET_SHIFT - 1))
