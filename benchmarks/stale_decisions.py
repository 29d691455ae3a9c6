"""What one-step-stale decisions cost in goodput: ``adaptive`` deciding fresh vs one step stale, on the simulator.

    python benchmarks/stale_decisions.py [--profile P] [--workload sharegpt] [--loads 0.1,...,1.1]
        [--requests 400] [--seeds 2] [--compare stale|held] [--json OUT]

An engine that prepares step t+1 while step t runs on the GPU (TensorRT-LLM's overlap scheduler)
decides from outcomes up to step t-1 (``control.policy.stale.OneStepStale``). Both variants replay
the same arrivals, prompts and acceptance draws (same seed) at each load, a fraction of the
no-speculation capacity. Reported per load: goodput (tokens per second of busy time) and mean
latency of each, and stale / fresh, with the mean over seeds. The bar: goodput within 1% of fresh.

``--compare held``: adaptive as built, which decides fully every few steps and looks its decisions
up between (``control/policy/adaptive/held.py``), against adaptive deciding fully every step
(``refresh_every=1``) as "fresh".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from control.bench.simrun import SimSetup, make_policy, measure_capacity, result_row, workload_at  # noqa: E402
from control.bench.workloads import load_workload  # noqa: E402
from control.executors.sim import AcceptanceProcess, SimEngine  # noqa: E402
from control.policy.adaptive import AdaptivePolicy  # noqa: E402
from control.policy.base import PolicyContext  # noqa: E402
from control.policy.stale import OneStepStale  # noqa: E402
from control.profile import load_profile  # noqa: E402

DEFAULT_PROFILE = ROOT / "profiles" / "h100" / "llama-3.1-8b+llama-3.2-1b.yaml"
LOADS = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1"


def run(setup: SimSetup, load: float, capacity: float, requests: int, seed: int, stale: bool,
        every_step: bool = False) -> dict:
    """One simulator run of adaptive (as ``simrun.run_policy`` builds it), optionally one step stale,
    or (``every_step``) deciding fully every step."""
    w = workload_at(setup, load * capacity, requests, seed)
    rr = setup.rates(w, seed)
    proc = AcceptanceProcess(rr.rates, rr.decay, rr.informativeness, setup.max_k, seed)
    engine = SimEngine(setup.profile.step_cost(setup.drafters), tuple(setup.drafters), w.arrival_s, w.prompt_tokens,
                       w.output_tokens, proc, setup.config(seed),
                       category=w.category if w.categories else None,
                       mape={"target": setup.profile.models["target"].mape})
    if every_step:
        policy = AdaptivePolicy(PolicyContext.from_plan(setup.plan()), seed=seed, refresh_every=1)
    else:
        policy = make_policy("adaptive", setup.plan(), engine, seed)
    if stale:
        policy = OneStepStale(policy)
    res = engine.run(policy)
    res.policy = "adaptive+stale" if stale else "adaptive-every-step" if every_step else "adaptive"
    return result_row(setup, res, load, seed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    ap.add_argument("--workload", default="sharegpt")
    ap.add_argument("--loads", default=LOADS)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--compare", choices=("stale", "held"), default="stale",
                    help="stale: one step stale vs fresh; held: held decisions (as built) vs a full decision every step")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not Path(args.profile).is_file():
        print(f"stale_decisions: profile '{args.profile}' not found; pass --profile (specctl.profile/v1)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    setup = SimSetup(load_profile(args.profile), load_workload(args.workload, requests=args.requests))
    capacity = measure_capacity(setup, requests=args.requests)
    rows = []
    for load in (float(x) for x in args.loads.split(",")):
        for seed in range(args.seeds):
            held = args.compare == "held"
            fresh = run(setup, load, capacity, args.requests, seed, stale=False, every_step=held)
            stale = run(setup, load, capacity, args.requests, seed, stale=not held)
            rows.append({"load": load, "seed": seed, "fresh": fresh, "stale": stale,
                         "goodput_ratio": stale["goodput_tok_s"] / fresh["goodput_tok_s"],
                         "latency_ratio": stale["mean_latency_s"] / fresh["mean_latency_s"]})
    print(f"profile {args.profile.split('/')[-1]}, workload {args.workload}, {args.requests} requests, "
          f"{args.seeds} seed(s), capacity {capacity:.2f} req/s ({time.perf_counter() - t0:.0f} s)")
    if args.compare == "held":
        print("fresh: a full decision every step; stale: adaptive as built (held decisions between refreshes)")
    print(f"{'load':>5s} {'fresh tok/s':>12s} {'stale tok/s':>12s} {'goodput s/f':>12s} {'latency s/f':>12s}")
    for load in sorted({r["load"] for r in rows}):
        rs = [r for r in rows if r["load"] == load]
        print(f"{load:5.2f} {np.mean([r['fresh']['goodput_tok_s'] for r in rs]):12.1f} "
              f"{np.mean([r['stale']['goodput_tok_s'] for r in rs]):12.1f} "
              f"{np.mean([r['goodput_ratio'] for r in rs]):12.4f} {np.mean([r['latency_ratio'] for r in rs]):12.4f}")
    worst = min(r["goodput_ratio"] for r in rows)
    print(f"worst single-run goodput ratio {worst:.4f}; bar (within 1% of fresh): "
          f"{'met' if min(np.mean([r['goodput_ratio'] for r in rows if r['load'] == ld]) for ld in {r['load'] for r in rows}) >= 0.99 else 'missed'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"capacity_req_s": capacity, "rows": rows}, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
