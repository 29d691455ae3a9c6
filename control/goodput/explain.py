"""The goodput curve over k for one uniform batch, the winning k, and why (``specctl explain`` and
the service's ``/v1/explain``).

``verify`` is the executor's verification granularity: where the target pads every draft to a
static max K, each row's verify cost is that of K + 1 tokens per request, whatever its k.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from control.goodput.acceptance import chain_survival
from control.goodput.granularity import PER_REQUEST, VerifyGranularity
from control.goodput.optimizer import Constraints, uniform_curve


def explain(profile, batch: int, ctx: int, acc: float, drafter: str | None, max_k: int,
            slo_ms: float | None, slo_q: float | None, verify: VerifyGranularity = PER_REQUEST) -> dict:
    name = drafter or profile.drafter_names[0]
    cost = replace(profile.step_cost([name]), verify=verify)
    ctx_arr = np.full(batch, ctx, dtype=np.float64)
    surv = chain_survival(np.full(batch, acc), max(max_k, 1))[:, :max_k] if max_k else np.zeros((batch, 0))
    cons = Constraints(slo_tpot_ms=slo_ms, slo_quantile=slo_q)
    curve = uniform_curve(cost, ctx_arr, surv, np.full(batch, max_k), cons)
    g = curve.goodput_tok_s
    best = curve.best
    return {
        "profile": f"{profile.sku}/{profile.pair}",
        "drafter": name,
        "batch": batch,
        "ctx": ctx,
        "acceptance": acc,
        "best_k": best,
        "verify": str(verify),
        "verify_note": verify.describe(),
        "curve": [
            {"k": int(k), "expected_tokens": round(float(t), 4), "verified_tokens": int(v),
             "verify_ms": round(float(cost.verify_ms(ctx_arr, np.full(batch, k))), 4),
             "step_ms": round(float(s), 4), "goodput_tok_s": round(float(gg), 2), "feasible": bool(f)}
            for k, t, s, gg, f, v in zip(curve.k, curve.tokens, curve.step_ms, g, curve.feasible,
                                         verify.uniform_tokens(curve.k), strict=True)
        ],
        "why": _why(curve, best, slo_ms, "k = 0 (padded all the same)" if verify.always else "plain decoding")
               + _why_granularity(verify, best),
    }


def _why_granularity(verify: VerifyGranularity, best: int) -> str:
    if verify.per_request:
        return ""
    if verify.kind.value == "per_batch":
        return "; the target verifies per batch, so this k is the step's one k for every request"
    when = ("at every k, 0 included (nothing switches the padding off)" if verify.always
            else "at every k >= 1 (only k = 0, off, verifies 1)")
    off = " Off wins here." if best == 0 and not verify.always else ""
    return (f"; drafts are padded to the static max K = {verify.pad_to}, so the target verifies {verify.pad_to + 1} "
            f"tokens per request {when}: a smaller k saves drafting only.{off}")


def _why(curve, best: int, slo_ms: float | None, base_name: str = "plain decoding") -> str:
    g = curve.goodput_tok_s
    base = g[0]
    parts = []
    if best == 0:
        parts.append(f"no draft length beats {base_name}")
        if len(g) > 1:
            parts.append(f"(k=1 would give {g[1] / base:.2f}x the goodput: {curve.tokens[1] / curve.tokens[0]:.2f}x "
                         f"tokens per step for {curve.step_ms[1] / curve.step_ms[0]:.2f}x step time)")
    else:
        parts.append(f"k={best} gives {g[best] / base:.2f}x the goodput of {base_name}: "
                     f"{curve.tokens[best] / curve.tokens[0]:.2f}x tokens per step for "
                     f"{curve.step_ms[best] / curve.step_ms[0]:.2f}x step time")
        if best + 1 < len(g):
            nxt = best + 1
            if not curve.feasible[nxt]:
                parts.append(f"; k={nxt} would break the {slo_ms} ms TPOT SLO")
            else:
                parts.append(f"; k={nxt} adds {curve.tokens[nxt] - curve.tokens[best]:.3f} tokens for "
                             f"+{curve.step_ms[nxt] - curve.step_ms[best]:.3f} ms, which lowers goodput")
    return "".join(parts)
