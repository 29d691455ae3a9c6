"""The simulator bar (issue 4): every policy on the bar's GPU/model pairs and workloads.

Pairs: H100 Llama-3.1-8B + Llama-3.2-1B and A100 Llama-2-7B + Llama-160M (roofline profiles in
``profiles/``); workloads: ShareGPT-like prompts and the Azure conversation trace at loads 0.1..1.1
of the no-speculation capacity, plus the Mooncake long-context trace. Writes one specctl.bench/v1
JSON per configuration, a Markdown report per configuration and a summary with the bar check.

    SPECCTL_WORKLOADS=... python benchmarks/sim_bar.py --out runs/sim-bar [--seeds 3] [--requests 4000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from control.bench import report  # noqa: E402
from control.bench.simrun import DEFAULT_POLICIES, SimSetup, measure_capacity, sweep  # noqa: E402
from control.bench.workloads import load_workload  # noqa: E402
from control.profile import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {
    "h100-8b": ROOT / "profiles/h100/llama-3.1-8b+llama-3.2-1b.yaml",
    "a100-7b": ROOT / "profiles/a100/llama-2-7b+llama-160m.yaml",
}
WORKLOADS = ("sharegpt", "azure-conv", "mooncake")
LOADS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/sim-bar")
    ap.add_argument("--pairs", default=",".join(PAIRS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--loads", default=",".join(str(x) for x in LOADS))
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4000,
                    help="requests per run (prompt sets; default 4000: the measured window excludes the first 20%% as ramp-up)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--length-scale", type=float, default=1.0,
                    help="multiply prompt and output lengths (recorded in the report; e.g. 0.25 for Mooncake)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loads = [float(x) for x in args.loads.split(",")]
    policies = args.policies.split(",")
    for pair in args.pairs.split(","):
        prof = load_profile(PAIRS[pair])
        for wl in args.workloads.split(","):
            tag = f"{pair}-{wl}" + (f"-x{args.length_scale:g}" if args.length_scale != 1.0 else "")
            base = load_workload(wl, requests=None if wl in ("azure-conv", "mooncake") else args.requests)
            if args.length_scale != 1.0:
                base = base.scale_lengths(args.length_scale)
            setup = SimSetup(prof, base)
            t0 = time.perf_counter()
            cap = measure_capacity(setup)
            print(f"{tag}: capacity {cap:.3f} req/s; {setup.workload.describe()}", flush=True)
            res = sweep(setup, loads, policies, list(range(args.seeds)), requests=args.requests, capacity=cap,
                        workers=args.workers, progress=None)
            meta = {"pair": pair, "profile": str(PAIRS[pair].relative_to(ROOT)), "workload": wl,
                    "capacity_req_s": cap, "requests_per_run": args.requests, "seeds": args.seeds,
                    "time_scaling": "traces: arrivals divided by (load x capacity) / native rate",
                    "length_scale": setup.workload.notes.get("length_scale", 1.0),
                    "clipped_to_max_ctx": setup.workload.notes.get("clipped_to_max_ctx", 0),
                    "wall_s": round(time.perf_counter() - t0, 1)}
            report.write_json(out / f"{tag}.json", res.rows, meta)
            plots = [("mean latency vs load", report.plot_latency_vs_load(res.rows, out / f"{tag}-latency.png", tag).name)]
            if res.series:
                plots.append((res.series_label, report.plot_series(res.series, out / f"{tag}-series.png", res.series_label).name))
            report.write_markdown(out / f"{tag}.md", res.rows, title=f"Simulation: {tag}", meta=meta, plots=plots)
            verdicts, table = report.bar_check(res.rows)
            (out / f"{tag}-bar.json").write_text(json.dumps(verdicts, indent=1))
            print(table, flush=True)


if __name__ == "__main__":
    main()
