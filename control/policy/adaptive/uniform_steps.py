"""1 / step time of a uniform draft length, per drafter, for the batch's size and mean context.

    inv[i, k] = 1 / T(n, S, k, drafter i),   k = 0..K,   S = 16 * (mean ctx // 16) + 8,

cached per 16-token context bucket, batch size and cost model. The gate's pooled-rate check and the
bandit's Thompson draws both price uniform k with it: tokens of a chain of rate r at k,
(1 - r^(k+1)) / (1 - r), times ``inv`` is its goodput.
"""

from __future__ import annotations

import numpy as np

from control.goodput.stepcost import StepCostModel, uniform_step_ms

CTX_BUCKET_SHIFT = 4  # contexts bucketed by 16 tokens


class UniformSteps:
    def __init__(self, m: int, K: int) -> None:
        self.m = m
        self.kk = np.arange(K + 1, dtype=np.float64)  # (K+1,) uniform draft lengths 0..K
        self._key: tuple | None = None
        self._inv = np.zeros((m, K + 1))  # (m, K+1)

    def inv(self, cost: StepCostModel, ctx_lens: np.ndarray) -> np.ndarray:
        """(m, K+1): 1 / step ms of a uniform k = 0..K for each drafter, batch of ``ctx_lens`` (n,)."""
        bucket = int(ctx_lens.mean()) >> CTX_BUCKET_SHIFT
        key = (ctx_lens.shape[0], bucket, id(cost))
        if self._key != key:
            ctx = float(bucket << CTX_BUCKET_SHIFT) + float(1 << (CTX_BUCKET_SHIFT - 1))
            self._inv = 1.0 / np.stack([uniform_step_ms(cost, ctx_lens.shape[0], ctx, self.kk, drafter=i)
                                        for i in range(self.m)])
            self._key = key
        return self._inv
