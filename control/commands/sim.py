"""``specctl sim``: policies x loads x seeds on the event-clock simulator; JSON, Markdown and plots."""

from __future__ import annotations

import argparse
import math

from control.commands import args as A


def loads_list(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"load {part!r} is not a number; write e.g. 0.1,0.5,1.1") from None
        if not (math.isfinite(v) and 0 < v <= 10):
            raise argparse.ArgumentTypeError(f"load {part} must be in (0, 10] (a fraction of the no-speculation capacity)")
        out.append(v)
    return out


def qps_list(text: str) -> list[float]:
    """Absolute request rates (req/s), comma-separated."""
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"qps {part!r} is not a number; write e.g. 0.5,2,8 (requests per second)") from None
        if not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"qps {part} must be a finite number > 0 (requests per second)")
        out.append(v)
    return out


def qps_loads(qps: list[float], capacity: float, max_load: float) -> list[float]:
    """``--qps`` as fractions of the capacity, refused beyond ``max_load`` times it."""
    from control.errors import ConfigError

    for q in qps:
        if q / capacity > max_load:
            raise ConfigError(f"--qps {q:g}: {q / capacity:.3g}x the no-speculation capacity {capacity:.3g} req/s; "
                              f"at most {max_load:g}x")
    return [q / capacity for q in qps]


def policies_list(text: str) -> list[str]:
    from control.errors import ConfigError
    from control.policyspec import parse_policy_spec

    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            out.append(str(parse_policy_spec(part)))
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    if not out:
        raise argparse.ArgumentTypeError("no policies given; write e.g. none,fixed:3,adaptive")
    return out


def _acceptance_pair(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not DRAFTER=RATE (e.g. llama-160m=0.7)")
    return name.strip(), A.acceptance(value)


def register(sub) -> None:
    p = sub.add_parser("sim", help="simulate policies at GPU scale on a profile and workload",
                       description="Run policies x loads x seeds on the event-clock simulator. Loads are fractions "
                                   "of the no-speculation capacity, which the simulator measures and prints.")
    p.add_argument("--profile", required=True, help="profile YAML (measured or from `specctl roofline`)")
    p.add_argument("--workload", required=True,
                   help="poisson[:in=DIST,out=DIST], azure-conv, azure-code, mooncake, sharegpt, spec-bench, or a "
                        "FILE.jsonl / FILE.csv of requests (arrival_s optional, input_tokens or prompt, output_tokens)")
    p.add_argument("--loads", type=loads_list, default=loads_list("0.1,0.3,0.5,0.7,0.9,1.1"),
                   help="comma-separated fractions of capacity (default 0.1,0.3,0.5,0.7,0.9,1.1)")
    p.add_argument("--qps", type=qps_list, help="absolute request rates in req/s instead of --loads, e.g. 0.5,2,8")
    p.add_argument("--policies", type=policies_list,
                   default=policies_list("none,fixed:1,fixed:3,fixed:5,fixed:7,smartspec,turbospec,specserve,"
                                         "static-schedule,hf-heuristic,adaptive,oracle"),
                   help="comma-separated policies (default: all twelve)")
    p.add_argument("--seeds", type=A.positive_int, default=1, help="seeds per point (default 1)")
    p.add_argument("--requests", type=A.positive_int, default=2000,
                   help="requests per run (traces: the first N after time scaling; default 2000)")
    A.add_max_k(p)
    p.add_argument("--drafter", action="append", default=[], help="restrict to these profile drafters (repeatable)")
    p.add_argument("--chunked-prefill", action="store_true", help="mix prompt chunks into decode steps")
    p.add_argument("--noise", action="store_true", help="add the profile fit's error as step-time noise")
    p.add_argument("--acceptance", type=_acceptance_pair, action="append", default=[], metavar="DRAFTER=RATE",
                   help="override a drafter's mean acceptance (keeps the workload's spread and decay)")
    p.add_argument("--confidence-info", type=float, default=0.5,
                   help="informativeness of draft confidences in [0, 1] (default 0.5)")
    p.add_argument("--capacity", type=A.positive_float, help="no-speculation capacity in req/s (default: measure it)")
    p.add_argument("--slo-ttft-s", type=A.positive_float, default=2.0, help="TTFT target for SLO attainment (default 2 s)")
    p.add_argument("--slo-tpot-ms", type=A.positive_float, default=100.0, help="TPOT target (default 100 ms)")
    p.add_argument("--workers", type=A.positive_int, default=1, help="parallel processes (default 1)")
    p.add_argument("--json", dest="json_out", type=A.output_file, help="write results (schema specctl.bench/v1) here")
    p.add_argument("--report", type=A.output_file, help="write a Markdown report here (plots go next to it)")
    p.add_argument("--series-policy", default="adaptive", help="policy whose run is plotted over time (default adaptive)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from control.bench import report
    from control.bench.metrics import SLOTargets
    from control.bench.simrun import SimSetup, measure_capacity, sweep
    from control.bench.workloads import load_workload
    from control.errors import ConfigError
    from control.profile import load_profile

    if not 0.0 <= args.confidence_info <= 1.0:
        raise ConfigError(f"--confidence-info {args.confidence_info}: must be in [0, 1]")
    con = Console(stderr=True, width=120)
    profile = load_profile(args.profile)
    workload = load_workload(args.workload, requests=None if args.workload.split(":")[0] in
                             ("azure-conv", "azure-code", "mooncake") else args.requests)
    setup = SimSetup(profile, workload, drafters=args.drafter or None, max_k=args.max_k,
                     chunked_prefill=args.chunked_prefill, noise=args.noise, informativeness=args.confidence_info,
                     slo=SLOTargets(args.slo_ttft_s, args.slo_tpot_ms),
                     acceptance_overrides=dict(args.acceptance) or None)
    con.print(f"profile {profile.sku}/{profile.pair} ({profile.source}); {setup.workload.describe()}")
    capacity = args.capacity or measure_capacity(setup)
    how = "given" if args.capacity else "measured: the highest Poisson rate at which none keeps a bounded queue"
    con.print(f"no-speculation capacity: {capacity:.3f} req/s ({how})")
    if args.qps:
        args.loads = qps_loads(args.qps, capacity, max_load=10.0)
        con.print("loads from --qps: " + ", ".join(f"{q:g} req/s = {x:.3g}" for q, x in zip(args.qps, args.loads, strict=True)))
    seeds = list(range(args.seeds))
    total = len(args.loads) * len(seeds) * len(args.policies)
    res = _with_progress(con, total, lambda tick: sweep(
        setup, args.loads, args.policies, seeds, requests=args.requests, capacity=capacity,
        series_policy=args.series_policy, progress=tick, workers=args.workers))
    meta = {
        "command": "specctl sim",
        "profile": f"{profile.sku}/{profile.pair} ({profile.source})",
        "workload": setup.workload.name,
        "workload_family": setup.workload.family,
        "requests_per_run": args.requests,
        "capacity_req_s": round(capacity, 4),
        "loads": args.loads,
        "seeds": args.seeds,
        "max_k": args.max_k,
        "chunked_prefill": args.chunked_prefill,
        "noise": args.noise,
        "slo": f"TTFT <= {args.slo_ttft_s} s and TPOT <= {args.slo_tpot_ms} ms",
        "time_scaling": "traces: arrival times divided by (load x capacity) / native rate",
        "length_scale": setup.workload.notes.get("length_scale", 1.0),
        "clipped_to_max_ctx": setup.workload.notes.get("clipped_to_max_ctx", 0),
        "acceptance": {d: setup.rates(setup.workload.head(1), 0).sources[d] for d in setup.drafters},
        "wall_s": round(res.wall_s, 1),
    }
    if args.json_out:
        report.write_json(args.json_out, res.rows, meta)
        con.print(f"wrote {args.json_out}")
    if args.report:
        out = Path(args.report)
        stem = out.with_suffix("")
        plots = [("mean latency vs load", report.plot_latency_vs_load(
            res.rows, f"{stem}-latency.png", f"{profile.sku}/{profile.pair}, {setup.workload.name}").name)]
        if res.series:
            plots.append((f"k, batch size and acceptance over time: {res.series_label}",
                          report.plot_series(res.series, f"{stem}-series.png", res.series_label).name))
        report.write_markdown(out, res.rows, title=f"Simulation: {profile.sku}/{profile.pair} on {setup.workload.name}",
                              meta=meta, plots=plots)
        con.print(f"wrote {out} (+ {len(plots)} plot(s))")
    print(report.markdown_table(res.rows))
    if any(r["policy"] == "adaptive" for r in res.rows):
        print(report.bar_check(res.rows)[1])
    return 0


def _with_progress(con, total: int, simulate):
    """``simulate(tick)``'s result, its ``total`` runs shown on ``con``: a transient bar on a terminal,
    timed lines in a log or a pipe (rich would draw nothing until the end)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from control.buildsys.cpu.progress import reporter_for

    if con.is_terminal:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=con, transient=True) as prog:
            task = prog.add_task("simulating", total=total)
            return simulate(lambda msg: prog.update(task, advance=1, description=msg))
    lines = reporter_for(con)
    lines.phase("simulating", total)
    try:
        return simulate(lambda msg: lines.advance(1, last=msg.split(" ", 1)[1]))
    finally:
        lines.close()
