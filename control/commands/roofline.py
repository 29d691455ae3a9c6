"""``specctl roofline``: a profile for a GPU SKU and model pair from the roofline model (no GPU needed)."""

from __future__ import annotations

import argparse
import shlex
import sys

from control.commands import args as A


def _acceptance_pair(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=RATE (e.g. llama-3.2-1b=0.75)")
    return name.strip().lower(), A.acceptance(value)


def register(sub) -> None:
    p = sub.add_parser("roofline", help="predict a GPU SKU's cost model from the roofline and write a profile",
                       description="Predict forward-pass times of a target and its drafts on a GPU SKU from "
                                   "bandwidth and compute ceilings, fit T = a*N_ctx + b*N_batched + c, and write "
                                   "a profile (source: roofline).")
    p.add_argument("--sku", required=True, help="GPU SKU: h100, h200, b200, a100, l40s, l4")
    p.add_argument("--target", required=True, help="target model (e.g. llama-3.1-8b)")
    p.add_argument("--draft", action="append", default=[], metavar="MODEL",
                   help="draft model or EAGLE head (repeat for several drafters)")
    p.add_argument("--tp", type=A.positive_int, default=1, help="tensor parallelism of the target (default 1)")
    p.add_argument("--framework", default="trtllm", help="serving framework overheads: trtllm (default), vllm, vllm-0.5, vllm-0.6, vllm-mqa, gpt-fast")
    p.add_argument("--fp8", action="store_true", help="fp8 weights and KV (Ada, Hopper, Blackwell)")
    p.add_argument("--max-batch", type=A.positive_int, default=256, help="largest batch (default 256)")
    p.add_argument("--token-budget", type=A.positive_int, default=8192, help="max tokens per pass (default 8192)")
    p.add_argument("--ngram-ms", type=A.positive_float, help="also offer an n-gram drafter costing this many ms per step")
    p.add_argument("--acceptance", type=_acceptance_pair, action="append", default=[], metavar="NAME=RATE",
                   help="acceptance prior for a drafter, recorded in the profile")
    p.add_argument("--out", required=True, type=A.output_file, help="profile YAML to write (e.g. profiles/h100/llama-3.1-8b+llama-3.2-1b.yaml)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from control.buildsys.roofline import roofline_profile

    argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith(("specctl", "__main__.py")) else None
    command = "specctl " + shlex.join(argv) if argv else None
    prof = roofline_profile(args.sku, args.target, list(args.draft), args.tp, framework=args.framework,
                            fp8=args.fp8, max_batch=args.max_batch, token_budget=args.token_budget,
                            ngram_ms=args.ngram_ms, acceptance=dict(args.acceptance), command=command)
    prof.save(args.out)
    c = Console(stderr=True, width=160)
    c.print(f"wrote {args.out}: {prof.sku}/{prof.pair} (roofline, {prof.environment['ceilings']}, "
            f"framework {args.framework}, KV capacity {prof.limits.kv_tokens} tokens)")
    for name, m in prof.models.items():
        fit = prof.environment["fits"][name]
        c.print(f"  {name}: T = {m.a_ms_per_ctx_token:.3g}*N_ctx + {m.b_ms_per_batched_token:.3g}*N_batched + "
                f"{m.c_ms:.3g} ms  (R^2 {m.r2:.3f}, mean |err| {m.mape:.1f}%, max {fit['max_abs_pct']:.1f}% over "
                f"{fit['points']} grid points)")
    return 0
