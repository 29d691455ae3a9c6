"""Issue 21 item 6: a time-varying trace on which the best static configuration changes over time.

The Azure conversation hour (its requests, lengths and burstiness) with its arrival rate swung
between levels below and above the rate where speculation stops paying, one level per segment
(``control/bench/swing.py``), on a profile whose speculation does stop paying under load (the A100
LLaMA-7B + LLaMA-160M roofline with vLLM's framework terms, the SmartSpec Fig. 1 pair of
``docs/validation.md``). Every static configuration runs on the same arrivals: no speculation,
fixed k, the ``draft_len_schedule`` the plan compiles once, and max_concurrency switch-offs (k up to
N requests, off above: ``static-schedule:N=K``); then the adaptive policies. Printed: mean latency
per segment and over the whole trace, the best static configuration in hindsight for each, and
adaptive's ratio to it.

``--pair h100-8b`` swings the H100 LLaMA-3.1-8B + LLaMA-3.2-1B roofline with vLLM's terms instead
(speculation gains more there at low load). ``--acceptance-levels`` drifts the drafters' mean
acceptance one level per segment in turn; with as many levels as rate levels (or a multiple), rate
and prompt mix swing together, as they do over a real day. ``--phase azure-conv --phase mooncake`` swings what
arrives instead: segment i replays the next requests of the i-th workload in turn (short conversations,
then long-context sessions), each at its level of its own no-speculation capacity.

    SPECCTL_WORKLOADS=... python benchmarks/adaptive_swing.py [--pair a100-7b|h100-8b] [--levels 0.35,0.95]
        [--acceptance-levels 0.35,0.9] [--phase W1 --phase W2] [--segment-s 300] [--requests 3000] [--capacity C[,C2]]
        [--seeds 3] [--workers 2]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

STATIC = ("none", "fixed:1", "fixed:2", "fixed:3", "static-schedule", "static-schedule:4=2", "static-schedule:8=1",
          "static-schedule:8=2", "static-schedule:16=1", "static-schedule:32=1")
POLICIES = ("adaptive", "smartspec")
BAR = 0.90
PAIRS = {  # --pair: (sku, target, drafts) of a roofline profile with vLLM's framework terms
    "a100-7b": ("a100", "llama-2-7b", ["llama-160m"]),  # the SmartSpec Fig. 1 pair
    "h100-8b": ("h100", "llama-3.1-8b", ["llama-3.2-1b"]),
}


def _run(args):
    setup, workload, spec, rates, seed = args
    from control.bench.simrun import run_policy

    t = time.perf_counter()
    return spec, seed, run_policy(setup, workload, spec, seed, rates=rates), time.perf_counter() - t


def run_all(jobs: list, workers: int) -> dict[int, dict]:
    """Every configuration on the same arrivals (in ``workers`` processes), by seed then configuration;
    progress on stderr."""
    runs: dict[int, dict] = {}
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as ex:
            done = list(ex.map(_run, jobs))
    else:
        done = map(_run, jobs)
    for spec, seed, res, wall in done:
        runs.setdefault(seed, {})[spec] = res
        print(f"  {spec} (seed {seed}): mean latency {np.mean(res.finish_s - res.arrival_s):.2f} s ({wall:.0f} s)",
              file=sys.stderr, flush=True)
    return runs


def build_profile(profile_path: str | None, pair: str = "a100-7b"):
    from control.buildsys.roofline import roofline_profile, scaled_framework
    from control.profile import load_profile

    if profile_path:
        return load_profile(profile_path)
    sku, target, drafts = PAIRS[pair]
    return roofline_profile(sku, target, drafts, framework=scaled_framework("vllm", 1.0, None))


def build_setup(profile_path: str | None, workload, max_k: int, pair: str = "a100-7b", profile=None):
    """The simulation setup of ``workload`` (a name, or a ``Workload``) on the profile."""
    from control.bench.simrun import SimSetup
    from control.bench.workloads import load_workload

    prof = profile or build_profile(profile_path, pair)
    return SimSetup(prof, load_workload(workload) if isinstance(workload, str) else workload, max_k=max_k,
                    max_batch=256)


def build_swing(args, levels: list[float]):
    """(setup of the swung trace, the swing, capacity per phase): the rate swing of one workload, or
    with ``--phase`` the workloads alternating, each at its level of its own capacity."""
    from control.bench.simrun import measure_capacity
    from control.bench.swing import alternate_phases, swing_rate
    from control.errors import ConfigError

    try:
        caps = [float(x) for x in args.capacity.split(",")] if args.capacity else []
    except ValueError:
        raise ConfigError(f"--capacity {args.capacity}: give req/s as numbers, one per --phase, comma-separated") from None
    if not args.phase:
        setup = build_setup(args.profile, args.workload, args.max_k, args.pair)
        capacity = caps[0] if caps else measure_capacity(setup)
        return setup, swing_rate(setup.workload, [x * capacity for x in levels], args.segment_s, args.requests), [capacity]
    prof = build_profile(args.profile, args.pair)
    names = args.phase
    if len(names) < 2:
        raise ConfigError(f"--phase {names[0]}: give --phase at least twice (the workloads that alternate)")
    if len(levels) == 1:
        levels = levels * len(names)
    if len(levels) != len(names) or (caps and len(caps) != len(names)):
        raise ConfigError(f"--phase {' --phase '.join(names)}: give one --levels value per phase (or one for all) and, if any, "
                          f"one --capacity per phase; got levels {levels} and capacities {caps or 'none'}")
    setups = [build_setup(None, name, args.max_k, profile=prof) for name in names]
    caps = caps or [measure_capacity(s) for s in setups]
    swing = alternate_phases([s.workload for s in setups], [x * c for x, c in zip(levels, caps, strict=True)],
                             args.segment_s, args.requests)
    return build_setup(None, swing.workload, args.max_k, profile=prof), swing, caps


def markdown(rows: list[dict], policy: str) -> str:
    lines = [f"| segment | rate req/s | acceptance | requests | {policy} s | best static | best static s | "
             f"{policy} / best static |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = "" if r.get("acceptance") is None else f"{r['acceptance']:g}"
        lines.append(f"| {r['segment']} | {r['rate_req_s']:.2f} | {acc} | {r['requests']} | {r['policy']:.2f} | "
                     f"{r['best_static']} | {r['best_static_s']:.2f} | {r['ratio']:.3f} |")
    return "\n".join(lines)


def bar_line(policy: str, whole: list[dict]) -> str:
    """The bar's verdict on the whole-trace rows ``whole`` (one per seed): the mean ratio, and the
    spread where there are several seeds."""
    ratios = np.array([r["ratio"] for r in whole])  # (seeds,)
    mean = float(ratios.mean())
    spread = "" if ratios.size == 1 else (f" over {ratios.size} seeds, per seed {' / '.join(f'{x:.3f}' for x in ratios)}, "
                                          f"worst {ratios.max():.3f}")
    switching = np.mean([r["switching_ratio"] for r in whole])
    return (f"bar ({policy} / best single static over the whole trace <= {BAR:.2f}): "
            f"{'met' if mean <= BAR else 'not met'} ({mean:.3f}{spread}); each segment's best "
            f"static in hindsight, switched per segment: {switching:.3f} of the best single one")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="profile YAML (default: the --pair roofline with vLLM's framework terms)")
    ap.add_argument("--pair", default="a100-7b", choices=sorted(PAIRS),
                    help="roofline pair when no --profile is given (default a100-7b: A100 LLaMA-7B + LLaMA-160M)")
    ap.add_argument("--workload", default="azure-conv", help="trace to swing (default azure-conv)")
    ap.add_argument("--levels", default="0.35,0.95", help="rate levels as fractions of the no-speculation capacity, "
                                                          "one per segment in turn (default 0.35,0.95)")
    ap.add_argument("--segment-s", type=float, default=300.0, help="segment length in seconds (default 300)")
    ap.add_argument("--requests", type=int, default=3000, help="the trace's first N requests (default 3000)")
    ap.add_argument("--capacity", help="no-speculation capacity in req/s, one per --phase, comma-separated "
                                       "(default: measure it)")
    ap.add_argument("--phase", action="append", help="a workload that arrives in every other segment (give two or "
                                                     "more, e.g. --phase azure-conv --phase mooncake; --levels then "
                                                     "gives each its fraction of its own capacity)")
    ap.add_argument("--acceptance-levels", help="drafters' mean acceptance per segment in turn, e.g. 0.9,0.4 "
                                                "(default: the workload's acceptance table, constant)")
    ap.add_argument("--concentration", type=float, default=8.0,
                    help="Beta concentration of per-request rates around a segment's mean (default 8)")
    ap.add_argument("--static", default=",".join(STATIC), help="static configurations (comma-separated)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="adaptive policies (comma-separated)")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=1,
                    help="seeds 0..N-1 of acceptance outcomes, per-request rates and policy draws, each on the same "
                         "arrivals; the bar reads the mean ratio (default 1)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", help="also write the tables here")
    args = ap.parse_args(argv)

    from control.bench.swing import drifting_rates, segment_table
    from control.errors import SpecctlError

    try:
        if args.seeds < 1:
            raise ValueError(f"--seeds {args.seeds}: give a whole number >= 1")
        levels = [float(x) for x in args.levels.split(",")]
        setup, swing, caps = build_swing(args, levels)
        seeds = range(args.seeds)
        rates, acc = dict.fromkeys(seeds), None
        if args.acceptance_levels:
            acc = [float(x) for x in args.acceptance_levels.split(",")]
            rates = {seed: drifting_rates(setup.rates(swing.workload, seed).rates, swing, acc, args.concentration, seed)
                     for seed in seeds}
    except (SpecctlError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    static = [s for s in args.static.split(",") if s]
    policies = [p for p in args.policies.split(",") if p]
    print(f"profile {setup.profile.sku}/{setup.profile.pair}; {swing.workload.describe()}; capacity "
          f"{', '.join(f'{c:.3f}' for c in caps)} req/s; levels {', '.join(f'{r:.2f} req/s' for r in swing.rates)}, "
          f"{args.segment_s:g} s segments, {swing.segments} segments; acceptance "
          f"{args.acceptance_levels or 'from the table'}", flush=True)
    runs = run_all([(setup, swing.workload, s, rates[seed], seed) for seed in seeds for s in static + policies],
                   args.workers)
    print("| configuration | mean latency s |\n|---|---|")
    for spec in static + policies:
        print(f"| {spec} | {np.mean([np.mean(runs[seed][spec].finish_s - runs[seed][spec].arrival_s) for seed in seeds]):.3f} |")
    out = {"capacity_req_s": caps if args.phase else caps[0], "levels": levels, "phases": args.phase, "segment_s": args.segment_s, "requests": swing.workload.n,
           "acceptance_levels": args.acceptance_levels, "seeds": args.seeds}
    for p in policies:
        tables = [segment_table(runs[seed], swing, p, static, acceptance=acc) for seed in seeds]
        out[p], out[f"{p}_by_seed"] = tables[0], [t[-1] for t in tables]
        print()
        print(markdown(tables[0], p) + ("\n(seed 0)" if args.seeds > 1 else ""))
        print(bar_line(p, [t[-1] for t in tables]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
