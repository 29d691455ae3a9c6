"""SmartSpec Fig. 1 on the simulator: A100, LLaMA-7B + LLaMA-160M, acceptance 0.7, in = out = 128.

SmartSpec reports that fixed k = 5 stops paying at about 12 req/s and k = 3 starts to hurt at
about 16 req/s (speedup = mean latency without speculation / with). This script sweeps the request
rate on a roofline profile of that pair (framework ``vllm-0.5``: the vLLM SmartSpec ran on, June 2024,
which prepared every draft pass on the host) and prints where each k's speedup crosses 1.

    python benchmarks/validate_smartspec_fig1.py [--framework vllm-0.5|vllm|vllm-mqa] [--host-scale 1] [--requests 1000]
        [--seeds 2] [--rates 4,8,12,16,20,24,28,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from control.bench.acceptance import AcceptanceTable  # noqa: E402
from control.bench.simrun import SimSetup, crossover_rate, run_policy, workload_at  # noqa: E402
from control.bench.workloads import poisson  # noqa: E402
from control.buildsys.roofline import roofline_profile, scaled_framework  # noqa: E402
from control.errors import ConfigError  # noqa: E402

DRAFT_HOST_PREP = {"framework": None, "on": True, "off": False}
TABLE = AcceptanceTable({
    "schema": "specctl.acceptance/v1",
    "families": {"chat": {"drafters": {"draft_model": {
        "mean": 0.7, "concentration": 1e6, "decay": 1.0,
        "source": "SmartSpec Fig. 1: the token acceptance rate is fixed at 0.7"}}}},
})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--framework", default="vllm-0.5", help="roofline framework (control/buildsys/roofline.py FRAMEWORKS)")
    ap.add_argument("--host-scale", type=float, default=1.0,
                    help="multiply the framework's host time per sequence and per token (sensitivity)")
    ap.add_argument("--draft-host-prep", choices=("framework", "on", "off"), default="framework",
                    help="host input preparation (per sequence) on every draft pass: as the framework has it, "
                         "or forced (sensitivity)")
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--rates", default="2,4,6,8,10,12,14,16,18,20,22,24,26,28")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        rates = [float(x) for x in args.rates.split(",")]
    except ValueError:
        raise SystemExit(f"--rates {args.rates!r}: expected comma-separated request rates (req/s), e.g. 4,8,12") from None
    if min(rates) <= 0 or args.requests < 1 or args.seeds < 1:
        raise SystemExit("--rates must be > 0, --requests and --seeds >= 1")
    try:
        fw = scaled_framework(args.framework, args.host_scale, DRAFT_HOST_PREP[args.draft_host_prep])
    except ConfigError as e:
        raise SystemExit(f"--framework/--host-scale: {e}") from None
    prof = roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework=fw)
    base = poisson(args.requests, 1.0, "128", "128", seed=0)
    setup = SimSetup(prof, base, max_k=8, table=TABLE, max_batch=256)
    lat = {p: [] for p in ("none", "fixed:1", "fixed:3", "fixed:5")}
    for r in rates:
        for p in lat:
            vals = []
            for seed in range(args.seeds):
                w = workload_at(setup, r, args.requests, seed)
                res = run_policy(setup, w, p, seed)
                vals.append(float(np.mean(res.finish_s - res.arrival_s)))
            lat[p].append(float(np.mean(vals)))
        print(f"rate {r:5.1f}: " + "  ".join(f"{p} {lat['none'][-1] / lat[p][-1]:.3f}" for p in lat if p != "none"),
              flush=True)
    out = {"rates": rates, "latency_s": lat,
           "crossover_req_s": {p: crossover_rate(rates, [a / b for a, b in zip(lat["none"], lat[p], strict=True)])
                               for p in lat if p != "none"}}
    print(json.dumps(out["crossover_req_s"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
