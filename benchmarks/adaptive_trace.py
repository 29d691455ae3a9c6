"""Trace the adaptive policy on the reference executor: what it predicted vs what the step cost.

For one batch size it runs the same stdlib prompts as ``reference_speed.py`` under a policy and
prints, per step: the decode batch, the draft lengths and drafters chosen, the policy's predicted
step time and tokens (``Decision.predicted_step_ms`` / ``predicted_tokens``) next to the measured
step time and the tokens the step generated, whether the bandit was exploring and the gate on,
and the policy's pooled acceptance estimate per drafter. The summary gives the mean relative error
of the step-time and token predictions: where adaptive loses to the best fixed k, this shows
whether the cost model, the acceptance estimate or the drafter exploration is to blame.

    python benchmarks/adaptive_trace.py --engine-dir engines/cpu [--batch 1] [--policy adaptive]
        [--steps 40] [--max-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.reference_speed import stdlib_prompts  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--policy", default="adaptive", help="policy spec (default adaptive)")
    ap.add_argument("--max-k", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40, help="steps to print (all are summarised)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    from control.executors.base import SamplingParams
    from control.executors.reference.calibrate import find_profile, quick_profile
    from control.executors.reference.engine import EngineConfig, ReferenceEngine
    from control.executors.reference.loader import load_engine_dir
    from control.plan import compile_plan
    from control.policy import build_policy

    torch.set_num_threads(args.threads)
    loaded = load_engine_dir(args.engine_dir)
    profile = find_profile(loaded) or quick_profile(loaded)
    drafter = next(n for n, m in loaded.drafters.items() if hasattr(m, "config"))
    active = [n for n in loaded.drafters if n in profile.drafter_names]
    policy = build_policy(args.policy, compile_plan(profile, policy=args.policy, max_k=args.max_k, drafters=active,
                                                    default_drafter=drafter))
    prompts = stdlib_prompts(loaded, args.batch, args.prompt_len)
    cfg = EngineConfig(max_batch=args.batch, max_k=args.max_k, default_drafter=drafter,
                       max_len=args.prompt_len + args.max_tokens + 1)
    eng = ReferenceEngine(loaded.target, loaded.drafters, policy, cfg)
    names = list(loaded.drafters)
    decisions = []
    orig = policy.decide

    def decide(view):  # record what the policy predicted; the decision itself is untouched
        d = orig(view)
        decisions.append(d)
        return d

    policy.decide = decide
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    for p in prompts:
        eng.add_request(p, params)
    rows = []
    t0 = time.perf_counter()
    while eng.has_work():
        before = len(decisions)
        outs = eng.step()
        st = eng.last_stats
        if len(decisions) == before or st.decode_batch == 0:
            continue
        d = decisions[-1]
        bandit = getattr(policy, "bandit", None)
        gate = getattr(policy, "gate", None)
        rows.append({
            "step": st.step, "n": st.decode_batch, "k": list(st.k),
            "drafters": sorted({names[int(x)] for x, kk in zip(d.drafter, st.k, strict=True) if kk > 0}),
            "pred_ms": d.predicted_step_ms, "pred_tokens": d.predicted_tokens,
            "ms": st.total_ms, "draft_ms": st.draft_ms, "verify_ms": st.verify_ms, "policy_ms": st.policy_ms,
            "tokens": sum(len(o.new_token_ids) for o in outs), "accepted": st.accepted, "verified": st.verified,
            "exploring": None if bandit is None else bool(bandit.exploring),
            "gate": None if gate is None else bool(gate.on),
            "rates": {n: round(float(policy.pos[i].mean_rate), 3) for i, n in enumerate(policy.ctx.drafters)}
            if hasattr(policy, "pos") else {},
        })
    wall = time.perf_counter() - t0
    print(f"{args.policy} at batch {args.batch}: {sum(r['tokens'] for r in rows) / wall:.1f} tok/s, {len(rows)} steps")
    print(f"{'step':>4} {'n':>3} {'k':>12} {'drafters':>24} {'pred ms':>8} {'ms':>7} {'draft':>6} {'verify':>7} "
          f"{'pred tok':>8} {'tok':>4} {'expl':>5} rates")
    for r in rows[: args.steps]:
        ks = ",".join(map(str, r["k"][:4])) + ("..." if len(r["k"]) > 4 else "")
        pm = f"{r['pred_ms']:.1f}" if r["pred_ms"] is not None else "-"
        pt = f"{r['pred_tokens']:.2f}" if r["pred_tokens"] is not None else "-"
        print(f"{r['step']:>4} {r['n']:>3} {ks:>12} {','.join(r['drafters']):>24} {pm:>8} {r['ms']:7.1f} "
              f"{r['draft_ms']:6.1f} {r['verify_ms']:7.1f} {pt:>8} {r['tokens']:>4} {str(r['exploring']):>5} {r['rates']}")
    pred = [r for r in rows if r["pred_ms"] is not None and r["n"] == args.batch]
    if pred:
        e_ms = np.array([r["pred_ms"] / r["ms"] - 1 for r in pred])
        e_tok = np.array([r["pred_tokens"] / max(r["tokens"], 1) - 1 for r in pred])
        print(f"predicted/measured - 1 over {len(pred)} full-batch steps: step ms median {np.median(e_ms):+.1%} "
              f"(mean {e_ms.mean():+.1%}), tokens median {np.median(e_tok):+.1%} (mean {e_tok.mean():+.1%})")
    print(f"mean k {np.mean([np.mean(r['k']) for r in rows]):.2f}, policy share "
          f"{sum(r['policy_ms'] for r in rows) / sum(r['ms'] for r in rows):.2%}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if hasattr(policy, "_calibration"):
        cal = np.round(policy._calibration(), 3).tolist()
        print("confidence calibration (observed / predicted survival) per drafter:",
              dict(zip(policy.ctx.drafters, cal, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
