"""``specctl record-acceptance``: record a real model pair's exact greedy acceptance for replay."""

from __future__ import annotations

import argparse

from control.commands import args as A


def register(sub) -> None:
    p = sub.add_parser(
        "record-acceptance", help="record a model pair's exact acceptance per prompt, position and drafter (npz)",
        description="Run the target's greedy decoding over a prompt set; at every output position run each drafter "
                    "for --max-k tokens and count how many match the target's continuation, with the draft "
                    "model's confidence per token. The record replays exactly in the simulator "
                    "(benchmarks/replay_bar.py, control/bench/replay.py).")
    p.add_argument("--engine-dir", required=True, help="engine directory (e.g. engines/cpu from `specctl build --sku cpu`)")
    p.add_argument("--out", required=True, type=A.output_file, help="record to write (.npz)")
    p.add_argument("--prompts", type=A.positive_int, default=128, help="prompts drawn from the stdlib (default 128)")
    p.add_argument("--prompt-len", type=A.positive_int, default=64, help="prompt tokens (default 64)")
    p.add_argument("--max-tokens", type=A.positive_int, default=128, help="generated tokens per prompt (default 128)")
    p.add_argument("--max-k", type=A.k_value, default=8, help="draft length recorded at each position (default 8)")
    p.add_argument("--seed", type=A.nonnegative_int, default=0, help="prompt draw seed (default 0)")
    p.add_argument("--drafter", action="append", default=[], help="record only these drafters (repeatable)")
    p.add_argument("--threads", type=A.positive_int, default=1, help="torch threads (default 1)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console

    from control.bench.replay import prompt_set_name, record_acceptance, stdlib_prompts
    from control.errors import ConfigError
    from control.executors.reference.loader import load_engine_dir
    from control.profiler.models import resolve_device

    if args.max_k < 1:
        raise ConfigError(f"--max-k {args.max_k}: must be >= 1 to record drafts")
    con = Console(stderr=True)
    torch.set_num_threads(args.threads)
    loaded = load_engine_dir(args.engine_dir, device=str(resolve_device(args.device)))
    prompts = stdlib_prompts(loaded.encode, args.prompts, args.prompt_len, args.seed)
    name = prompt_set_name(args.prompts, args.prompt_len, args.seed)
    con.print(f"{loaded.name}: {args.prompts} prompts ({name}), {args.max_tokens} tokens each, max_k {args.max_k}")
    rec = record_acceptance(loaded, prompts, args.max_tokens, args.max_k, name, drafters=args.drafter or None,
                            progress=lambda m: con.print(m))
    path = rec.save(args.out)
    means = ", ".join(f"{d} {rec.lead[:, 1:, i].mean():.2f}" for i, d in enumerate(rec.drafters))
    print(f"wrote {path}: {rec.n} requests x {args.max_tokens} positions x {len(rec.drafters)} drafters; "
          f"mean accepted run at k = {args.max_k}: {means}")
    return 0
