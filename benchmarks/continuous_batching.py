"""Policies side by side on the reference executor under continuous batching (no server).

``reference_speed.py`` runs one batch of equal requests to completion; a server instead keeps its
batch full from a queue of requests of different lengths, which is where per-request draft lengths
and the drafter bandit matter. This queues ``--requests`` stdlib prompts with lognormal output
lengths (mean ``--max-tokens``) at ``--batch`` slots and reports, per policy, generated tokens per
second, acceptance, the mean k and the k histogram (request-steps). Policies are interleaved within
each repeat, and the median over repeats is reported with the spread, because single runs on a
shared machine vary by +-10-25%. ``adaptive-1d`` is adaptive restricted to the default drafter.

    python benchmarks/continuous_batching.py --engine-dir engines/cpu --batch 16 [--requests 64]
        [--policies fixed:2,fixed:3,adaptive,adaptive-1d] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.reference_speed import stdlib_prompts  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=float, default=40.0, help="mean of the lognormal output lengths")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--policies", default="fixed:2,fixed:3,adaptive,adaptive-1d")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--profile", help="profile for the plans (default: the stored one for this engine)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.batch < 1 or args.requests < 1 or args.repeats < 1 or args.max_tokens < 1:
        ap.error("--batch, --requests, --repeats and --max-tokens must be >= 1")

    import torch

    from control.executors.base import SamplingParams
    from control.executors.reference.calibrate import find_profile, quick_profile
    from control.executors.reference.engine import EngineConfig, ReferenceEngine
    from control.executors.reference.loader import load_engine_dir
    from control.plan import compile_plan
    from control.policy import build_policy
    from control.profile import load_profile

    torch.set_num_threads(args.threads)
    loaded = load_engine_dir(args.engine_dir)
    profile = load_profile(args.profile) if args.profile else (find_profile(loaded) or quick_profile(loaded))
    drafter = next(n for n, m in loaded.drafters.items() if hasattr(m, "config"))
    active = [n for n in loaded.drafters if n in profile.drafter_names]
    rng = np.random.default_rng(args.seed)
    prompts = stdlib_prompts(loaded, args.requests, args.prompt_len, seed=args.seed + 3)
    lengths = np.clip(rng.lognormal(np.log(args.max_tokens) - 0.18, 0.6, args.requests), 4, 4 * args.max_tokens).astype(int)

    def make(spec: str):
        name = spec.removesuffix("-1d")
        drafters = [drafter] if spec.endswith("-1d") else active
        return build_policy(name, compile_plan(profile, policy=name, max_k=args.max_k, drafters=drafters,
                                               default_drafter=drafter), seed=args.seed)

    specs = [s.strip() for s in args.policies.split(",") if s.strip()]
    tok_s: dict[str, list[float]] = {s: [] for s in specs}
    last: dict[str, dict] = {}
    for rep in range(args.repeats):
        for spec in specs:
            cfg = EngineConfig(max_batch=args.batch, max_k=args.max_k, default_drafter=drafter,
                               max_len=args.prompt_len + int(lengths.max()) + 1)
            eng = ReferenceEngine(loaded.target, loaded.drafters, make(spec), cfg)
            for p, n in zip(prompts, lengths, strict=True):
                eng.add_request(p, SamplingParams(max_tokens=int(n), ignore_eos=True))
            gen = verified = accepted = 0
            ks: list[int] = []
            t0 = time.perf_counter()
            while eng.has_work():
                gen += sum(len(o.new_token_ids) for o in eng.step())
                st = eng.last_stats
                verified += st.verified
                accepted += st.accepted
                ks += list(st.k)
            wall = time.perf_counter() - t0
            tok_s[spec].append(gen / wall)
            k = np.asarray(ks, dtype=np.int64)
            last[spec] = {"acceptance": accepted / verified if verified else 0.0, "mean_k": float(k.mean()) if k.size else 0.0,
                          "hist": np.bincount(k, minlength=args.max_k + 1).tolist()}
            print(f"repeat {rep + 1} {spec:>14s}: {gen / wall:7.1f} tok/s", flush=True)
    best_fixed = max((statistics.median(v) for s, v in tok_s.items() if s.startswith("fixed")), default=None)
    print(f"\nbatch {args.batch}, {args.requests} requests (mean {args.max_tokens:g} tokens), {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(f"{'policy':>14s} {'tok/s':>8s} {'min-max':>15s} {'/best fixed':>11s} {'accept':>7s} {'mean k':>7s}  k histogram")
    for spec in specs:
        v = tok_s[spec]
        med = statistics.median(v)
        ratio = f"{med / best_fixed:.3f}" if best_fixed else "-"
        s = last[spec]
        print(f"{spec:>14s} {med:8.1f} {min(v):7.1f}-{max(v):<7.1f} {ratio:>11s} {s['acceptance']:7.3f} "
              f"{s['mean_k']:7.2f}  {s['hist']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
