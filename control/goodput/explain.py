"""The goodput curve over k for one uniform batch, the winning k, and why (``specctl explain`` and
the service's ``/v1/explain``)."""

from __future__ import annotations

import numpy as np

from control.goodput.acceptance import chain_survival
from control.goodput.optimizer import Constraints, uniform_curve


def explain(profile, batch: int, ctx: int, acc: float, drafter: str | None, max_k: int,
            slo_ms: float | None, slo_q: float | None) -> dict:
    name = drafter or profile.drafter_names[0]
    cost = profile.step_cost([name])
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
        "curve": [
            {"k": int(k), "expected_tokens": round(float(t), 4), "step_ms": round(float(s), 4),
             "goodput_tok_s": round(float(gg), 2), "feasible": bool(f)}
            for k, t, s, gg, f in zip(curve.k, curve.tokens, curve.step_ms, g, curve.feasible, strict=True)
        ],
        "why": _why(curve, best, slo_ms),
    }


def _why(curve, best: int, slo_ms: float | None) -> str:
    g = curve.goodput_tok_s
    base = g[0]
    parts = []
    if best == 0:
        parts.append("no draft length beats plain decoding")
        if len(g) > 1:
            parts.append(f"(k=1 would give {g[1] / base:.2f}x the goodput: {curve.tokens[1] / curve.tokens[0]:.2f}x "
                         f"tokens per step for {curve.step_ms[1] / curve.step_ms[0]:.2f}x step time)")
    else:
        parts.append(f"k={best} gives {g[best] / base:.2f}x the goodput of plain decoding: "
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
