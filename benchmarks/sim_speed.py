"""Simulator speed: one hour of the Azure conversation trace (19,366 requests, native timing) per
policy on the H100 Llama-3.1-8B + Llama-3.2-1B roofline profile. Prints wall time, engine steps
and microseconds per step, so the policy's own decide cost can be told apart from the engine's.

    SPECCTL_WORKLOADS=... python benchmarks/sim_speed.py [--policies none,fixed:3,adaptive]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from control.bench.simrun import SimSetup, run_policy
from control.bench.workloads import load_workload
from control.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(ROOT / "profiles/h100/llama-3.1-8b+llama-3.2-1b.yaml"))
    ap.add_argument("--policies", default="none,fixed:3,hf-heuristic,adaptive")
    args = ap.parse_args()
    w = load_workload("azure-conv")
    setup = SimSetup(load_profile(args.profile), w)
    print(f"{w.describe()}; trace span {w.span_s / 60:.1f} min")
    for pol in args.policies.split(","):
        t = time.perf_counter()
        res = run_policy(setup, setup.workload, pol, 0)
        dt = time.perf_counter() - t
        print(f"{pol:14s} wall {dt:7.1f} s  steps {res.steps:8d} (decode {res.decode_steps:8d})  "
              f"{dt / max(res.steps, 1) * 1e6:6.0f} us/step  simulated {res.finish_s.max() / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
