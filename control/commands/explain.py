"""``specctl explain``: the goodput curve over k for one batch, the winning k, and why."""

from __future__ import annotations

import argparse
import json

from control.commands import args as A
from control.goodput.explain import explain


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
