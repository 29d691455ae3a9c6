"""``specctl explain``: the goodput curve over k for one batch, the winning k, and why."""

from __future__ import annotations

import argparse
import json

import numpy as np

from control.commands import args as A


def register(sub) -> None:
    p = sub.add_parser("explain", help="goodput over k for a batch; which k wins and why",
                       description="Show predicted goodput for k = 0..K for B requests of context S at acceptance A.")
    p.add_argument("--profile", required=True, help="profile YAML (specctl.profile/v1)")
    p.add_argument("--batch", type=A.positive_int, required=True, help="requests in the batch (>= 1)")
    p.add_argument("--ctx", type=A.positive_int, required=True, help="context tokens per request (>= 1)")
    p.add_argument("--acceptance", type=A.acceptance, required=True, help="per-token acceptance rate in [0, 1)")
    p.add_argument("--drafter", help="drafter name from the profile (default: its first)")
    p.add_argument("--slo-tpot-ms", type=A.positive_float, help="TPOT SLO in ms: slower steps are infeasible")
    p.add_argument("--slo-quantile", type=A.quantile, help="meet the SLO at this quantile of step time (default: mean)")
    p.add_argument("--max-k", type=A.k_value, default=8, help="largest draft length considered (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run)


def explain(profile, batch: int, ctx: int, acc: float, drafter: str | None, max_k: int,
            slo_ms: float | None, slo_q: float | None) -> dict:
    from control.goodput.acceptance import chain_survival
    from control.goodput.optimizer import Constraints, uniform_curve

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


def run(args: argparse.Namespace) -> int:
    from control.profile import load_profile

    profile = load_profile(args.profile)
    if args.drafter:
        profile.drafter(args.drafter)
    out = explain(profile, args.batch, args.ctx, args.acceptance, args.drafter, args.max_k, args.slo_tpot_ms,
                  args.slo_quantile)
    if args.json:
        print(json.dumps({k: out[k] for k in ("best_k", "curve", "why", "drafter", "profile")}))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{out['profile']}: batch {args.batch} x ctx {args.ctx}, acceptance {args.acceptance}, "
                    f"drafter {out['drafter']}")
    for col in ("k", "tokens/step", "step ms", "goodput tok/s", "vs k=0", "feasible"):
        t.add_column(col, justify="right")
    base = out["curve"][0]["goodput_tok_s"]
    for row in out["curve"]:
        style = "bold green" if row["k"] == out["best_k"] else None
        t.add_row(str(row["k"]), f"{row['expected_tokens']:.3f}", f"{row['step_ms']:.3f}", f"{row['goodput_tok_s']:.1f}",
                  f"{row['goodput_tok_s'] / base:.2f}x", "yes" if row["feasible"] else "no (SLO)", style=style)
    console = Console()
    console.print(t)
    console.print(f"best k = {out['best_k']}: {out['why']}")
    return 0
