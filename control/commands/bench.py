"""``specctl bench``: drive a running deployment (``specctl serve``) and report per policy and load."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from control.commands import args as A
from control.commands.sim import qps_list, qps_loads


def _fractions(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"loads {text!r}: give comma-separated fractions of capacity, e.g. 0.25,0.5,0.8,1.1") from None
    if not vals or any(not (0 < v <= 4) for v in vals):
        raise argparse.ArgumentTypeError(f"loads {text!r}: each must be in (0, 4] (fractions of the no-speculation capacity)")
    return vals


def _policies(text: str) -> list[str]:
    from control.errors import ConfigError
    from control.policyspec import parse_policy_spec

    out = []
    for p in (x.strip() for x in text.split(",")):
        if not p:
            continue
        if "@" in p:  # the replay tools' POLICY@DRAFTER: here the drafters are the run's, for every policy
            name, _, drafters = p.partition("@")
            raise argparse.ArgumentTypeError(f"policy '{p[:80]}': a policy names no drafter here; give '{name[:40]}' and "
                                             f"--drafters {drafters.replace('+', ',')[:80]} (the drafter set every "
                                             "policy of the run uses), in a run of its own for another set")
        try:
            spec = str(parse_policy_spec(p))
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if spec == "oracle":
            raise argparse.ArgumentTypeError("policy 'oracle' runs only inside the simulator (specctl sim)")
        out.append(spec)
    if not out:
        raise argparse.ArgumentTypeError(f"policies {text!r}: give comma-separated names, e.g. none,fixed:3,adaptive")
    return out


def add_load_args(p: argparse.ArgumentParser, *, requests: int, loads: str, warmup: int = 16) -> None:
    p.add_argument("--workload", default="corpus",
                   help="corpus (Poisson arrivals, held-out corpus prompts; default), or a trace/prompt set replayed "
                        "with rescaled times and lengths: azure-code, azure-conv, mooncake, sharegpt, spec-bench, poisson:..., "
                        "or a FILE.jsonl / FILE.csv of requests (arrival_s optional, input_tokens or prompt, output_tokens)")
    p.add_argument("--loads", type=_fractions, default=_fractions(loads),
                   help=f"load levels as fractions of the measured no-speculation capacity (default {loads})")
    p.add_argument("--qps", type=qps_list, help="absolute request rates in req/s instead of --loads, e.g. 0.5,1,2")
    p.add_argument("--policies", type=_policies, default=["none", "fixed:3", "adaptive"],
                   help="policies to compare, switched through the override API (default none,fixed:3,adaptive)")
    p.add_argument("--requests", type=A.positive_int, default=requests, help=f"requests per run (default {requests})")
    p.add_argument("--capacity", type=A.positive_float, help="no-speculation capacity in req/s (default: measure it)")
    p.add_argument("--capacity-requests", type=A.positive_int, help="requests in the capacity run (default: --requests)")
    p.add_argument("--prompt-chars", type=A.positive_float, default=300.0, help="mean prompt length in characters (default 300)")
    p.add_argument("--max-tokens", type=A.positive_float, default=48.0, help="mean max_tokens per request (default 48)")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="let a request end at the model's end token (default: each generates its max_tokens, "
                        "the workload's output length, as vLLM's --ignore-eos)")
    p.add_argument("--slo-ttft-s", type=A.positive_float, default=2.0, help="TTFT SLO in seconds (default 2)")
    p.add_argument("--slo-tpot-ms", type=A.positive_float, default=100.0, help="TPOT SLO in ms (default 100)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--drafters", type=lambda t: [x.strip() for x in t.split(",") if x.strip()],
                   help="drafter set every policy runs with, e.g. draft-small (default: the deployment's; the "
                        "control plane rejects names the profile does not have)")
    p.add_argument("--repeats", type=A.positive_int, default=1, help="runs per policy and load, interleaved, the policies' order rotating each repeat (default 1)")
    p.add_argument("--warmup-requests", type=A.nonnegative_int, default=warmup,
                   help="requests each policy serves, unmeasured, before the measured runs, at half the capacity: a "
                        f"learning policy starts from what a running deployment knows, not cold (default {warmup}; 0: none)")


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark a running deployment: policies x load levels over gRPC streaming",
                       description="Measure the no-speculation capacity, then for each load level and policy (switched "
                                   "through the control plane's override API) send the same requests with Poisson or "
                                   "trace-replay arrivals over gRPC streaming; report TTFT, TPOT, inter-token latency, "
                                   "latency, goodput, SLO attainment and acceptance (specctl.bench/v1 JSON, Markdown, plots).")
    p.add_argument("--url", required=True,
                   help="Triton gRPC endpoint: grpc://HOST:PORT or HOST:PORT; several replicas under one control "
                        "plane: a comma-separated list (requests are spread over them, retried on another if one dies)")
    p.add_argument("--http-url", help="Triton HTTP endpoint for the model's stats (default http://HOST:8000); "
                                      "with several --url, one per replica, comma-separated, in the same order")
    p.add_argument("--control-url", help="control-plane service (default http://HOST:8700)")
    p.add_argument("--token", help="control-plane token (default: SPECCTL_TOKEN)")
    add_load_args(p, requests=40, loads="0.25,0.5,0.8,1.1")
    p.add_argument("--json", type=A.output_file, help="write the specctl.bench/v1 document here")
    p.add_argument("--report", type=A.output_file, help="write a Markdown report here (plots next to it)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from urllib.parse import urlsplit

    from control.bench.live import Endpoints
    from control.clients.triton import grpc_addresses
    from control.errors import ConfigError

    urls = [u.strip() for u in args.url.split(",") if u.strip()]
    addrs = grpc_addresses(urls, "--url")
    hosts = [urlsplit("grpc://" + a).hostname for a in addrs]
    https = [h.strip().rstrip("/") for h in args.http_url.split(",")] if args.http_url else [f"http://{h}:8000" for h in hosts]
    if len(https) != len(addrs):
        raise ConfigError(f"--http-url lists {len(https)} endpoint(s) for {len(addrs)} --url replica(s); give one per "
                          "replica in the same order (or leave it out: http://HOST:8000 each)")
    ep = Endpoints(grpc=addrs[0], http=https[0], control=(args.control_url or f"http://{hosts[0]}:8700").rstrip("/"),
                   token=args.token or os.environ.get("SPECCTL_TOKEN"), replicas=tuple(zip(addrs[1:], https[1:], strict=True)))
    rows, meta = run_bench(ep, args)
    print(report(rows, meta, json_path=args.json, report_path=args.report))
    return 0


def run_bench(ep, args: argparse.Namespace, console=None) -> tuple[list[dict], dict]:
    """Capacity, then every load x policy (x repeats), interleaved (``run_order``); rows and meta."""
    import asyncio
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from control.bench.live import clear_overrides, make_requests, measure_capacity, run_once, switch_policy
    from control.bench.metrics import SLOTargets
    from control.clients.triton import RequestError, model_stats

    console = console or Console(stderr=True)
    try:
        model_stats(ep.http)  # fail fast, with the reason, if the server is not there
    except RequestError as e:
        if getattr(args, "http_url", None):
            raise
        raise RequestError(f"{e}; that is --url's host on port 8000 by default: pass --http-url where Triton's HTTP "
                           "port is (specctl serve's --http-port)") from None
    slo = SLOTargets(ttft_s=args.slo_ttft_s, tpot_ms=args.slo_tpot_ms)

    def requests(n: int, seed: int):
        return make_requests(args.workload, n, seed=seed, prompt_chars=args.prompt_chars, max_tokens=args.max_tokens,
                             ignore_eos=not args.stop_at_eos)

    reqs = requests(args.requests, args.seed)
    rows: list[dict] = []
    meta = {"harness": "specctl bench (live Triton, gRPC streaming)", "grpc": ep.grpc, "requests_per_run": reqs.n,
            "loads": ",".join(f"{x:g}" for x in args.loads), "policies": ",".join(args.policies),
            "slo_ttft_s": slo.ttft_s, "slo_tpot_ms": slo.tpot_ms, "repeats": args.repeats, **reqs.notes}
    if args.drafters:
        meta["drafters"] = ",".join(args.drafters)
    runs = len(args.loads) * len(args.policies) * args.repeats
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as prog:
        loop = asyncio.new_event_loop()  # one for every run (``run_once``)
        try:
            capacity = args.capacity
            if capacity is None:
                switch_policy(ep, "none")
                creqs = requests(args.capacity_requests, args.seed + 1) if args.capacity_requests else reqs
                task = prog.add_task("capacity (policy none, all at once)", total=creqs.n)
                capacity, _ = measure_capacity(ep, creqs, on_done=lambda d: prog.update(task, completed=d), loop=loop)
            meta["capacity_req_s"] = round(capacity, 4)
            if getattr(args, "qps", None):
                args.loads = qps_loads(args.qps, capacity, max_load=4.0)
                meta["qps"] = ",".join(f"{q:g}" for q in args.qps)
                meta["loads"] = ",".join(f"{x:.4g}" for x in args.loads)
                runs = len(args.loads) * len(args.policies) * args.repeats
            console.print(f"no-speculation capacity: {capacity:.3f} req/s")
            if args.warmup_requests:
                wreqs = requests(args.warmup_requests, args.seed + 2)
                meta["warmup"] = f"{wreqs.n} requests per policy at load 0.5, unmeasured, before the runs"
                for pol in args.policies:
                    switch_policy(ep, pol, drafters=args.drafters)
                    task = prog.add_task(f"warm-up {pol}", total=wreqs.n)
                    run_once(ep, wreqs, policy=pol, load=0.5, rate=0.5 * capacity, seed=args.seed + 1000, slo=slo,
                             on_done=lambda d, t=task: prog.update(t, completed=d), loop=loop)
                    prog.remove_task(task)
            overall = prog.add_task("runs", total=runs)
            for rep, load, pol in run_order(args.loads, args.policies, args.repeats):
                switch_policy(ep, pol, drafters=args.drafters)
                time.sleep(0.2)
                task = prog.add_task(f"load {load:g} {pol}", total=reqs.n)
                row = run_once(ep, reqs, policy=pol, load=load, rate=load * capacity, seed=args.seed + rep,
                               slo=slo, on_done=lambda d, t=task: prog.update(t, completed=d), loop=loop)
                prog.remove_task(task)
                prog.advance(overall)
                rows.append(row)
                lat = row["mean_latency_s"]
                console.print(f"load {load:g} {pol:>10s}: mean latency {lat if lat is None else round(lat, 3)} s, "
                              f"goodput {row['goodput_tok_s']} tok/s, failed {row['extra']['failed']}"
                              f"{_drafter_note(row['extra'])}{_policy_note(row['extra'])}")
        finally:
            clear_overrides(ep)
            loop.close()
    return rows, meta


def _drafter_note(extra: dict) -> str:
    """The run line's note on which drafters drafted (shares of the drafting request-steps)."""
    from control.bench.report import drafter_mix

    mix = drafter_mix(extra.get("drafter_steps"))
    return "" if mix == "-" else f", drafters {mix}%"


def _policy_note(extra: dict) -> str:
    """The run line's note on the policy's share of busy time (and its worker's), where the server reports it."""
    if "policy_share" not in extra:
        return ""
    worker = extra.get("policy_worker_share")
    return (f", policy {100 * extra['policy_share']:.2f}% of busy time"
            + ("" if worker is None else f" (off the critical path; worker {100 * worker:.2f}%)"))


def run_order(loads: list[float], policies: list[str], repeats: int):
    """(repeat, load, policy) in the order the runs go: repeats outermost, then loads; the policies'
    order rotates by one each repeat, so no policy always runs first or last at a load (after the
    same neighbour, on a server that has just been through the same runs)."""
    m = len(policies)
    for rep in range(repeats):
        for load in loads:
            for j in range(m):
                yield rep, load, policies[(j + rep) % m]


def report(rows: list[dict], meta: dict, *, json_path: str | None, report_path: str | None, title: str | None = None) -> str:
    from control.bench.report import (
        bar_check,
        markdown_table,
        plot_latency_vs_load,
        write_json,
        write_markdown,
    )

    title = title or f"specctl bench: {meta.get('workload', '')} on the live server"
    if json_path:
        write_json(json_path, rows, meta)
    if report_path:
        rp = Path(report_path)
        png = rp.with_suffix(".latency.png")
        plot_latency_vs_load(rows, png, title="latency vs load (live server)")
        write_markdown(rp, rows, title=title, meta=meta, plots=[("latency vs load", png.name)])
    text = markdown_table(rows)
    if any(r["policy"] == "adaptive" for r in rows):
        text += "\n" + bar_check(rows, "adaptive", tolerance=0.03, saturation_ratio=1.03)[1]
    return text
