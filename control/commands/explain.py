"""``specctl explain``: the goodput curve over k for one batch, the winning k, and why."""

from __future__ import annotations

import argparse
import json

from control.commands import args as A
from control.errors import ConfigError
from control.goodput.explain import explain
from control.policyspec import DEFAULT_MAX_K


def register(sub) -> None:
    p = sub.add_parser("explain", help="goodput over k for a batch; which k wins and why",
                       description="Show predicted goodput for k = 0..K for B requests of context S at acceptance A.")
    p.add_argument("--profile", help="profile YAML (specctl.profile/v1); default: the --deployment's plan profile")
    p.add_argument("--deployment", help="a `specctl build` output directory: its profile, max K and the verification "
                                        "granularity of its TensorRT-LLM path (e.g. padded to K under the drafter hook)")
    p.add_argument("--verify", help="verification granularity: per_request (default), per_batch, padded:K or "
                                    "padded:K:always (overrides the --deployment's)")
    p.add_argument("--batch", type=A.positive_int, required=True, help="requests in the batch (>= 1)")
    p.add_argument("--ctx", type=A.positive_int, required=True, help="context tokens per request (>= 1)")
    p.add_argument("--acceptance", type=A.acceptance, required=True, help="per-token acceptance rate in [0, 1)")
    p.add_argument("--drafter", help="drafter name from the profile (default: its first)")
    p.add_argument("--slo-tpot-ms", type=A.positive_float, help="TPOT SLO in ms: slower steps are infeasible")
    p.add_argument("--slo-quantile", type=A.quantile, help="meet the SLO at this quantile of step time (default: mean)")
    p.add_argument("--max-k", type=A.k_value, help="largest draft length considered (default: the padded K, the "
                                                   "deployment's max_k, else 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run)


def _setup(args: argparse.Namespace):
    """(profile, max_k, granularity, the path's name) from --profile / --deployment / --verify / --max-k."""
    from control.goodput.granularity import PER_REQUEST, VerifyKind, parse_granularity
    from control.profile import load_profile

    profile, max_k, verify, path = None, None, PER_REQUEST, None
    if args.deployment:
        profile, max_k, verify, path = _deployment(args.deployment)
    if args.profile:
        profile = load_profile(args.profile)
    if profile is None:
        raise ConfigError("specctl explain needs --profile FILE or --deployment DIR (a `specctl build` output)")
    if args.verify:
        verify, path = parse_granularity(args.verify), None
    if verify.kind == VerifyKind.padded:
        if args.max_k is not None and args.max_k > verify.pad_to:
            raise ConfigError(f"--max-k {args.max_k} is above the padded K = {verify.pad_to}: drafts never exceed it; "
                              f"use --max-k <= {verify.pad_to}")
        max_k = args.max_k if args.max_k is not None else verify.pad_to
    elif args.max_k is not None:
        max_k = args.max_k
    return profile, max_k if max_k is not None else DEFAULT_MAX_K, verify, path


def _deployment(directory: str):
    from pathlib import Path

    import yaml

    from control.executors.trtllm.granularity import deployment_granularity
    from control.plan import load_plan

    spec = Path(directory) / "specctl.yaml"
    if not spec.is_file():
        raise ConfigError(f"--deployment {directory}: no specctl.yaml there; give the --out directory of `specctl build`")
    doc = yaml.safe_load(spec.read_text()) or {}
    plan = load_plan(Path(directory) / str(doc.get("plan", "plan.yaml")))
    verify, path = deployment_granularity(str(doc.get("backend")), str(doc.get("method")), doc.get("control"),
                                          plan.max_k)
    return plan.profile, plan.max_k, verify, path


def run(args: argparse.Namespace) -> int:
    profile, max_k, verify, path = _setup(args)
    if args.drafter:
        profile.drafter(args.drafter)
    out = explain(profile, args.batch, args.ctx, args.acceptance, args.drafter, max_k, args.slo_tpot_ms,
                  args.slo_quantile, verify)
    if args.json:
        keys = ("best_k", "curve", "why", "drafter", "profile", "verify", "verify_note")
        print(json.dumps({**{k: out[k] for k in keys}, "path": path}))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{out['profile']}: batch {args.batch} x ctx {args.ctx}, acceptance {args.acceptance}, "
                    f"drafter {out['drafter']}")
    for col in ("k", "verified/req", "verify ms", "tokens/step", "step ms", "goodput tok/s", "vs k=0", "feasible"):
        t.add_column(col, justify="right")
    base = out["curve"][0]["goodput_tok_s"]
    for row in out["curve"]:
        style = "bold green" if row["k"] == out["best_k"] else None
        t.add_row(str(row["k"]), str(row["verified_tokens"]), f"{row['verify_ms']:.3f}", f"{row['expected_tokens']:.3f}",
                  f"{row['step_ms']:.3f}", f"{row['goodput_tok_s']:.1f}", f"{row['goodput_tok_s'] / base:.2f}x",
                  "yes" if row["feasible"] else "no (SLO)", style=style)
    console = Console(highlight=False)
    if path:
        console.print(f"path: {path}")
    console.print(f"verification: {out['verify_note']}")
    console.print(t)
    console.print(f"best k = {out['best_k']}: {out['why']}")
    return 0
