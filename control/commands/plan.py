"""``specctl plan``: compile a plan from a profile; print it, or TensorRT-LLM's draft_len_schedule."""

from __future__ import annotations

import argparse
import json

from control.commands import args as A
from control.goodput.acceptance import DEFAULT_ACCEPTANCE


def register(sub) -> None:
    p = sub.add_parser("plan", help="compile a plan (or a TensorRT-LLM draft_len_schedule) from a profile",
                       description="Compile the controller's plan from a profile and constraints.")
    p.add_argument("--profile", required=True, help="profile YAML (specctl.profile/v1)")
    p.add_argument("--acceptance", type=A.acceptance, help=f"acceptance prior for the default drafter (default: the profile's, else {DEFAULT_ACCEPTANCE})")
    A.add_max_k(p)
    p.add_argument("--slo-tpot-ms", type=A.positive_float, help="TPOT SLO in ms")
    p.add_argument("--slo-quantile", type=A.quantile, help="meet the SLO at this quantile of step time")
    p.add_argument("--policy", default="adaptive", help="policy the plan names (default adaptive)")
    p.add_argument("--drafter", help="default drafter (default: the profile's first)")
    p.add_argument("--ctx", type=A.positive_int, help="context length for --trtllm-schedule (default: the profile's typical)")
    p.add_argument("--one-model", action="store_true",
                   help="schedule for a one-model drafter (EAGLE3/MTP): never k=0 (TensorRT-LLM PR #16888)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the plan as JSON")
    out.add_argument("--trtllm-schedule", action="store_true", help="print TensorRT-LLM's draft_len_schedule as JSON")
    p.add_argument("--out", type=A.output_file, help="also write the plan (YAML) to this file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from control.plan import SLO, AcceptanceState, compile_plan, trtllm_schedule, typical_ctx
    from control.policyspec import parse_policy_spec
    from control.profile import load_profile

    profile = load_profile(args.profile)
    parse_policy_spec(args.policy)
    drafter = args.drafter or profile.drafter_names[0]
    profile.drafter(drafter)
    acc = AcceptanceState(rate={drafter: args.acceptance}) if args.acceptance is not None else None
    slo = SLO(tpot_ms=args.slo_tpot_ms, quantile=args.slo_quantile)
    plan = compile_plan(profile, policy=args.policy, max_k=args.max_k, acceptance=acc, slo=slo,
                        default_drafter=drafter, reason="specctl plan")
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(plan.to_yaml())
    if args.trtllm_schedule:
        ctx = args.ctx or typical_ctx(profile)
        sched = trtllm_schedule(plan, ctx=ctx, acc=plan.prior_rate(), one_model=args.one_model)
        print(json.dumps({"max_draft_len": max(sched.values()) if sched else 0,
                          "draft_len_schedule": {str(k): v for k, v in sched.items()}}))
        return 0
    if args.json:
        print(plan.to_json())
        return 0
    _summary(plan, args)
    return 0


def _summary(plan, args) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    p = plan.profile
    c.print(f"plan v{plan.version} for {p.sku}/{p.pair} ({p.source}), policy {plan.policy}, K={plan.max_k}, "
            f"drafter {plan.default_drafter} (acceptance prior {plan.prior_rate():.2f})")
    if plan.slo.tpot_ms:
        c.print(f"TPOT SLO {plan.slo.tpot_ms} ms" + (f" at p{plan.slo.quantile * 100:g}" if plan.slo.quantile else " (mean)"))
    g = plan.gate
    c.print(f"gate: off above batch {g.b_off if g.b_off else 'never'}, back on below {g.b_on if g.b_on else '-'}")
    c.print(f"TensorRT-LLM draft_len_schedule: {plan.static_schedule or '{} (speculation never pays)'}")
    t = Table(title="best k by batch size (rows) and context (columns) at the prior acceptance")
    t.add_column("batch", justify="right")
    ctxs = plan.table.ctx
    for s in ctxs:
        t.add_column(f"{s}", justify="right")
    for b in plan.table.batch:
        t.add_row(str(b), *[str(plan.table.lookup(b, s, plan.prior_rate())) for s in ctxs])
    c.print(t)
