"""SmartSpec Fig. 11 on the simulator: the goodput policies against fixed k on SmartSpec's own settings.

SmartSpec (arXiv 2406.14066v2, Sec. 7.1.1, Fig. 11) serves Vicuna-7B on one A100, Vicuna-33B on four
and Llama2-70B on eight, with Llama-160M (7B, 33B) or TinyLlama-1.1B (70B) drafting unsplit, on the
vLLM of June 2024, Poisson arrivals, greedy sampling, and reports the speedup over no speculation of
SmartSpec and of fixed k = 1, 3, 5 per request rate on Arena, ShareGPT and Spider. Its claim: SmartSpec
matches or beats the best of them at every rate (at low rates a longer fixed k is "marginally" ahead
on a few points), and tracks no speculation where speculation stops paying.

This script builds each panel's roofline profile (framework ``vllm-0.5``, as the Fig. 1 check), draws
the lengths of Fig. 10 (lognormal with its mean and deviation), fixes the token acceptance, and runs
no speculation, fixed k = 1, 3, 5, ``smartspec``, ``turbospec`` and ``adaptive`` on the same arrivals
at each of the panel's rates. It prints each policy's mean latency over the best of the four static
configurations (below 1: better than all of them).

The paper gives no acceptance rate per dataset. ShareGPT takes TurboSpec Table 3's for the same pairs
(Vicuna-7B 0.62, Vicuna-33B 0.59 with Llama-160M); the other panels take SmartSpec Fig. 1's 0.7
(``--acceptance`` overrides all). The figure is a plot without printed values, so the comparison is
the paper's claim, not its numbers.

    python benchmarks/validate_smartspec_fig11.py [--panels a,b,c,...] [--requests 600] [--workers 2]
        [--acceptance 0.7] [--framework vllm-0.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from control.bench.acceptance import AcceptanceTable  # noqa: E402
from control.errors import ConfigError  # noqa: E402

STATIC = ("none", "fixed:1", "fixed:3", "fixed:5")
POLICIES = ("smartspec", "turbospec", "adaptive")
MATCH = 1.03  # "matches": within 3% of the best static configuration
FIG1_ACCEPTANCE = 0.7  # SmartSpec Fig. 1's fixed token acceptance rate


@dataclass(frozen=True)
class Panel:
    """One panel of Fig. 11: hardware, pair, Fig. 10's lengths, the acceptance we assume, its rates."""

    key: str
    target: str
    draft: str
    tp: int
    dataset: str
    prompt: tuple[float, float]  # mean, std (Fig. 10)
    output: tuple[float, float]
    acceptance: float
    rates: tuple[float, ...]


ARENA = ((31.34, 66.0), (359.34, 170.51))
SHAREGPT = ((303.48, 349.28), (307.29, 205.97))
SPIDER = ((32.86, 5.44), (39.91, 27.88))
PANELS = {p.key: p for p in (
    Panel("a", "vicuna-7b", "llama-160m", 1, "arena", *ARENA, FIG1_ACCEPTANCE, (2, 4, 6, 8, 10)),
    Panel("b", "vicuna-7b", "llama-160m", 1, "sharegpt", *SHAREGPT, 0.62, (2, 4, 6, 8, 10)),
    Panel("c", "vicuna-7b", "llama-160m", 1, "spider", *SPIDER, FIG1_ACCEPTANCE, (4, 8, 16, 24, 32)),
    Panel("d", "vicuna-33b", "llama-160m", 4, "arena", *ARENA, FIG1_ACCEPTANCE, (0.5, 1, 2, 3)),
    Panel("e", "vicuna-33b", "llama-160m", 4, "sharegpt", *SHAREGPT, 0.59, (0.5, 1, 2, 3)),
    Panel("f", "vicuna-33b", "llama-160m", 4, "spider", *SPIDER, FIG1_ACCEPTANCE, (1, 2, 4, 6)),
    Panel("g", "llama-2-70b", "tinyllama-1.1b", 8, "arena", *ARENA, FIG1_ACCEPTANCE, (0.5, 1, 2, 3)),
    Panel("h", "llama-2-70b", "tinyllama-1.1b", 8, "sharegpt", *SHAREGPT, FIG1_ACCEPTANCE, (0.5, 1, 2, 3)),
)}

TABLE = AcceptanceTable({
    "schema": "specctl.acceptance/v1",
    "families": {"chat": {"drafters": {"draft_model": {
        "mean": FIG1_ACCEPTANCE, "concentration": 1e6, "decay": 1.0,
        "source": "SmartSpec Fig. 11 panels (overridden per panel)"}}}},
})


def setup_for(panel: Panel, requests: int, framework: str, acceptance: float | None):
    from control.bench.simrun import SimSetup
    from control.bench.workloads import poisson
    from control.buildsys.roofline import roofline_profile

    prof = roofline_profile("a100", panel.target, [panel.draft], tp=panel.tp, framework=framework)
    base = poisson(requests, 1.0, f"lognormal:{panel.prompt[0]}:{panel.prompt[1]}",
                   f"lognormal:{panel.output[0]}:{panel.output[1]}", seed=0)
    rate = panel.acceptance if acceptance is None else acceptance
    return SimSetup(prof, base, max_k=8, table=TABLE, max_batch=256, acceptance_overrides={panel.draft: rate})


def _cell(job) -> tuple[str, float, dict[str, float], float]:
    """Every configuration at one rate of one panel, on the same arrivals: mean latency (s) each."""
    from control.bench.simrun import run_policy, workload_at

    key, rate, requests, framework, acceptance = job
    t0 = time.perf_counter()
    setup = setup_for(PANELS[key], requests, framework, acceptance)
    w = workload_at(setup, rate, requests, 0)
    lat = {}
    for spec in (*STATIC, *POLICIES):
        res = run_policy(setup, w, spec, 0)
        lat[spec] = float(np.mean(res.finish_s - res.arrival_s))
    return key, rate, lat, time.perf_counter() - t0


def run_cells(jobs: list, workers: int) -> list:
    if workers <= 1:
        return [_progress(_cell(j)) for j in jobs]
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers) as ex:
        futs = [ex.submit(_cell, j) for j in jobs]
        return [_progress(f.result()) for f in as_completed(futs)]


def _progress(cell):
    key, rate, lat, wall = cell
    best = min(STATIC, key=lat.get)
    print(f"  panel {key} rate {rate:g}: best static {best}, "
          + ", ".join(f"{p} {lat[p] / lat[best]:.3f}" for p in POLICIES) + f" ({wall:.0f} s)", file=sys.stderr, flush=True)
    return cell


def markdown(cells: list) -> str:
    order = {k: i for i, k in enumerate(PANELS)}
    cells = sorted(cells, key=lambda c: (order[c[0]], c[1]))
    head = "| panel | pair, dataset | rate req/s | " + " | ".join(STATIC) + " | best static | " + \
        " | ".join(f"{p} / best" for p in POLICIES) + " |"
    lines = [head, "|" + "---|" * (4 + len(STATIC) + len(POLICIES))]
    ratios = {p: [] for p in POLICIES}
    for key, rate, lat, _ in cells:
        pn = PANELS[key]
        best = min(STATIC, key=lat.get)
        for p in POLICIES:
            ratios[p].append(lat[p] / lat[best])
        lines.append(f"| {key} | {pn.target} TP{pn.tp} + {pn.draft}, {pn.dataset} | {rate:g} | "
                     + " | ".join(f"{lat[s]:.2f}" for s in STATIC) + f" | {best} | "
                     + " | ".join(f"{lat[p] / lat[best]:.3f}" for p in POLICIES) + " |")
    lines.append("")
    for p in POLICIES:
        r = np.array(ratios[p])
        lines.append(f"- `{p}`: within {MATCH - 1:.0%} of the best static configuration or better in "
                     f"{int((r <= MATCH).sum())} of {r.size} cells; median {np.median(r):.3f}, worst {r.max():.3f}")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--panels", default=",".join(PANELS), help=f"panels of Fig. 11 ({','.join(PANELS)})")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--framework", default="vllm-0.5", help="roofline framework (control/buildsys/roofline.py)")
    ap.add_argument("--acceptance", type=float, help="token acceptance for every panel (default: per panel)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.panels.split(",") if k.strip()]
    bad = [k for k in keys if k not in PANELS]
    if bad or not keys:
        ap.error(f"--panels {args.panels!r}: expected a comma-separated subset of {','.join(PANELS)}")
    if args.requests < 1 or args.workers < 1:
        ap.error("--requests and --workers must be >= 1")
    if args.acceptance is not None and not 0.0 < args.acceptance < 1.0:
        ap.error(f"--acceptance {args.acceptance}: must be between 0 and 1")
    args.keys = keys
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    jobs = [(k, r, args.requests, args.framework, args.acceptance) for k in args.keys for r in PANELS[k].rates]
    try:
        setup_for(PANELS[args.keys[0]], 1, args.framework, args.acceptance)  # a bad framework fails here, once
    except ConfigError as e:
        raise SystemExit(f"--framework {args.framework!r}: {e}") from None
    cells = run_cells(jobs, args.workers)
    print(markdown(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"panel": k, "rate": r, "latency_s": lat} for k, r, lat, _ in cells], f, indent=1)


if __name__ == "__main__":
    main()
