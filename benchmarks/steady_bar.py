"""The steady-state bar (issue 21): adaptive against the best fixed k and against no speculation.

For each pair and workload: measure the no-speculation capacity (the highest Poisson rate whose queue
stays bounded), run ``none``, fixed k = 1..K and ``adaptive`` (plus any ``--extra`` policies) on the
same arrivals at each load, and print one table row per load: the best fixed k, adaptive over it, and
adaptive over ``none``. A load is past the crossover when no fixed k >= 1 beats ``none`` there. The
bar: adaptive <= 1.02x the best fixed k at every load, and <= 1.02x ``none`` past the crossover.
Latencies cover the requests arriving after the ramp-up (the first 20%), see ``control.bench.simrun``.

``--framework trtllm`` uses the committed profiles (TensorRT-LLM-like; speculation pays at every load
they reach); ``vllm`` / ``vllm-mqa`` build the same pair's roofline profile with that framework's
terms, where speculation stops paying under load. Needs the shared workloads (``SPECCTL_WORKLOADS``).

    python benchmarks/steady_bar.py --framework vllm --pairs a100-7b --workloads sharegpt --loads 0.5,0.9,1.1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from control.bench.simrun import SimSetup, measure_capacity, sweep  # noqa: E402
from control.bench.workloads import load_workload  # noqa: E402
from control.buildsys.roofline import roofline_profile  # noqa: E402
from control.errors import ConfigError  # noqa: E402
from control.profile import Profile, load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {  # name: (committed profile, (sku, target, drafts) for a roofline of another framework)
    "h100-8b": (ROOT / "profiles/h100/llama-3.1-8b+llama-3.2-1b.yaml", ("h100", "llama-3.1-8b", ["llama-3.2-1b"])),
    "a100-7b": (ROOT / "profiles/a100/llama-2-7b+llama-160m.yaml", ("a100", "llama-2-7b", ["llama-160m"])),
}
TRACES = ("azure-conv",)  # replayed from their start; --whole: the whole trace (the hour: 19,366 requests)
LOADS = (0.3, 0.5, 0.7, 0.9, 1.0, 1.1)
TOLERANCE = 1.02


def pair_profile(pair: str, framework: str) -> Profile:
    path, (sku, target, drafts) = PAIRS[pair]
    if framework == "trtllm":
        return load_profile(path)
    return roofline_profile(sku, target, drafts, framework=framework)


def mean_latency(rows: list[dict], policy: str, load: float) -> float:
    vals = [r["mean_latency_s"] for r in rows if r["policy"] == policy and abs(r["load"] - load) < 1e-9]
    return float(np.mean(vals))


def bar_rows(rows: list[dict], loads: list[float], ks: list[int], extra: list[str]) -> list[dict]:
    """Per load: none, the best fixed k >= 0, adaptive and the ratios the bar reads."""
    out = []
    for load in loads:
        fixed = {k: mean_latency(rows, "none" if k == 0 else f"fixed:{k}", load) for k in [0, *ks]}
        best_k = min(fixed, key=fixed.get)
        ad = mean_latency(rows, "adaptive", load)
        past = best_k == 0
        row = {"load": load, "none_s": fixed[0], "best_k": best_k, "best_s": fixed[best_k], "adaptive_s": ad,
               "vs_best": ad / fixed[best_k], "vs_none": ad / fixed[0], "past_crossover": past}
        row["ok"] = row["vs_best"] <= TOLERANCE and (not past or row["vs_none"] <= TOLERANCE)
        for p in extra:
            row[p] = mean_latency(rows, p, load) / fixed[best_k]
        out.append(row)
    return out


def markdown(tag: str, cap: float, table: list[dict], extra: list[str]) -> str:
    head = "| load | none s | best fixed k | its s | adaptive s | adaptive / best fixed | adaptive / none |"
    head += "".join(f" {p} / best fixed |" for p in extra) + " bar |"
    lines = [f"{tag} (capacity {cap:.2f} req/s)", "", head, "|" + "---|" * (8 + len(extra))]
    for r in table:
        mark = "*" if r["past_crossover"] else ""
        cells = [f"{r['load']:g}{mark}", f"{r['none_s']:.3f}", f"k={r['best_k']}", f"{r['best_s']:.3f}",
                 f"{r['adaptive_s']:.3f}", f"{r['vs_best']:.3f}", f"{r['vs_none']:.3f}",
                 *(f"{r[p]:.3f}" for p in extra), "ok" if r["ok"] else "**miss**"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n(* past the crossover: no fixed k >= 1 beats none)\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--framework", default="trtllm", help="trtllm (committed profiles), vllm or vllm-mqa")
    ap.add_argument("--pairs", default=",".join(PAIRS))
    ap.add_argument("--workloads", default="sharegpt,azure-conv")
    ap.add_argument("--loads", default=",".join(str(x) for x in LOADS))
    ap.add_argument("--ks", default="1,2,3,4,5", help="fixed k to compare with (k = 0 is policy none)")
    ap.add_argument("--extra", default="", help="more policies to run and report against the best fixed k")
    ap.add_argument("--requests", type=int, default=4000, help="requests per run (traces: the first ones)")
    ap.add_argument("--whole", action="store_true", help="replay traces whole instead of their first --requests")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="", help="write the rows and tables here")
    args = ap.parse_args()
    try:
        loads = [float(x) for x in args.loads.split(",")]
        ks = [int(x) for x in args.ks.split(",") if x]
    except ValueError:
        ap.error(f"--loads {args.loads!r} / --ks {args.ks!r}: give comma-separated numbers, e.g. --loads 0.5,0.9 --ks 1,2,3")
    if not loads or min(loads) <= 0 or min(ks, default=1) < 1:
        ap.error("loads must be > 0 and each k >= 1 (k = 0 is policy none, always run)")
    unknown = [p for p in args.pairs.split(",") if p not in PAIRS]
    if unknown:
        ap.error(f"--pairs: unknown {', '.join(unknown)}; known: {', '.join(PAIRS)}")
    try:
        run(args, loads, ks)
    except ConfigError as e:
        raise SystemExit(f"steady_bar.py: {e}") from None


def run(args, loads: list[float], ks: list[int]) -> None:
    extra = [p for p in args.extra.split(",") if p]
    policies = ["none", *(f"fixed:{k}" for k in ks), "adaptive", *extra]
    dump = {}
    for pair in args.pairs.split(","):
        prof = pair_profile(pair, args.framework)
        for wl in args.workloads.split(","):
            tag = f"{pair}-{wl}-{args.framework}"
            t0 = time.perf_counter()
            n = None if args.whole and wl in TRACES else args.requests
            setup = SimSetup(prof, load_workload(wl, requests=n))
            cap = measure_capacity(setup)
            res = sweep(setup, loads, policies, list(range(args.seeds)), requests=n, capacity=cap, workers=args.workers)
            table = bar_rows(res.rows, loads, ks, extra)
            print(markdown(tag, cap, table, extra), f"({setup.workload.describe()}; {time.perf_counter() - t0:.0f} s)",
                  flush=True)
            dump[tag] = {"capacity_req_s": cap, "table": table, "rows": res.rows}
            if args.json:  # after each configuration: a long run stopped early keeps what it has
                Path(args.json).write_text(json.dumps(dump, indent=1, default=float))


if __name__ == "__main__":
    main()
