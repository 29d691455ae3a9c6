"""Step 1, the view: what the policy sees of a decode step, built the same way by every data plane.

Each plane reads the per-request arrays from its own state (slot table, request objects, the
TensorRT-LLM executor's requests) and hands them here; arrays go into the ``StepView`` as they are
(int64, length n), so the simulator's hot loop pays no copies.
"""

from __future__ import annotations

import numpy as np

from control.goodput.granularity import PER_REQUEST, VerifyGranularity
from control.policy.types import StepView

I64 = np.int64

# ``free_kv_slots`` of a plane that cannot see the target's KV cache: the TensorRT-LLM paths, where
# TensorRT-LLM's own scheduler reserves each request's KV (draft tokens included) before the step and
# the controller sees no free-block count. "No limit" there, as ``goodput.optimizer.Constraints``
# defaults, leaves the token budget as the binding limit on sum k.
UNSEEN_KV = 1 << 62
NO_DRAFTER = -1  # StepView.drafter of a request that has not drafted yet


def build_view(*, slots: np.ndarray, request_ids: np.ndarray, ctx_lens: np.ndarray, remaining: np.ndarray,
               drafters: tuple[str, ...], max_k: int, token_budget: int, free_kv_slots: int = UNSEEN_KV,
               k_cap: np.ndarray | None = None, drafter: np.ndarray | None = None,
               draft_lag: np.ndarray | None = None, category: np.ndarray | None = None, now: float = 0.0,
               step: int = 0, prefill_tokens: int = 0, waiting: int = 0,
               verify: VerifyGranularity = PER_REQUEST, ngram_avail: np.ndarray | None = None) -> StepView:
    """The step's view. Arrays (n,) int64 unless noted; defaults: k_cap ``max_k`` for everyone,
    drafter ``NO_DRAFTER``, draft_lag (n, max(m, 1)) zeros (every drafter in sync), ngram_avail None
    (no n-gram drafter, or its lookup unseen; ``ngram.lookup_avail`` builds it from a token buffer)."""
    n = int(slots.shape[0])
    return StepView(
        slots=slots, request_ids=request_ids, ctx_lens=ctx_lens, remaining=remaining,
        k_cap=np.full(n, max_k, dtype=I64) if k_cap is None else k_cap,
        drafter=np.full(n, NO_DRAFTER, dtype=I64) if drafter is None else drafter,
        draft_lag=np.zeros((n, max(len(drafters), 1)), dtype=I64) if draft_lag is None else draft_lag,
        free_kv_slots=int(free_kv_slots), token_budget=int(token_budget), max_k=int(max_k), drafters=drafters,
        now=now, step=step, category=category, prefill_tokens=prefill_tokens, waiting=waiting, verify=verify,
        ngram_avail=ngram_avail,
    )
