"""TurboSpec Tables 4-5 on the simulator: where each fixed k stops paying, and the ranking per QPS.

TurboSpec (Tables 1-5) serves Vicuna-7B/13B + Llama-160M on one L40S, Vicuna-33B (TP 2) +
Llama-160M on two H100s and Llama-3.1-70B (TP 4) + Llama-3.2-1B on four H100s, on vLLM, with
Poisson arrivals and greedy sampling. For every draft-model row we can model (ShareGPT and Sonnet;
the PLD rows draft on the CPU, which we have no cost figure for) this script builds a roofline
profile of the pair with the framework constants of the vLLM TurboSpec ran (``vllm-0.6``: batch-expansion
verification, async output processing without speculation only, host preparation of each step's
first draft pass; ``--framework vllm`` for mid-2024 vLLM's terms),
draws lengths from Table 2 (lognormal with the table's mean and deviation), fixes the token
acceptance at Table 3's rate, simulates Org (k = 0) and k = 1, 3, 5, 7 at the table's QPS, and
compares with the paper:

- crossover: the QPS at which a k's speedup (Org latency / its latency) falls to 1, interpolated
  linearly between the table's QPS points, as `crossover_rate` does for both; a match is within 25%
  of the paper's;
- ranking: at each QPS, the configuration with the lowest mean latency, and whether the paper's
  best is within 10% of the simulator's best.

There is no per-table constant: the hardware, model shapes, framework and lengths are the only
inputs.

    python benchmarks/validate_turbospec_tables.py [--requests 1000] [--seeds 1] [--rows l40s-7b-sharegpt,...]
        [--framework vllm-0.6|vllm|vllm-mqa] [--verify framework|expansion|mqa]
        [--draft-host-prep framework|on|off|split] [--host-scale X] [--extra adaptive]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from control.bench.acceptance import AcceptanceTable  # noqa: E402
from control.bench.simrun import SimSetup, crossover_rate, run_policy, workload_at  # noqa: E402
from control.bench.workloads import poisson  # noqa: E402
from control.buildsys.roofline import Framework, roofline_profile, scaled_framework  # noqa: E402
from control.errors import ConfigError  # noqa: E402
from control.policyspec import parse_policy_spec  # noqa: E402

CONFIGS = ("none", "fixed:1", "fixed:3", "fixed:5", "fixed:7")
LABELS = ("Org", "k=1", "k=3", "k=5", "k=7")
TS = "TS"  # the turbospec policy, against the paper's TurboSpec column
DRAFT_HOST_PREP = {"framework": None, "on": True, "off": False, "split": None}


@dataclass(frozen=True)
class Row:
    """One block of Table 4 or 5: hardware, pair, lengths (Table 2), acceptance (Table 3), latencies."""

    key: str
    sku: str
    tp: int
    target: str
    draft: str
    prompt: tuple[float, float]  # mean, std
    output: tuple[float, float]
    acceptance: float
    qps: tuple[float, ...]
    latency_s: dict[str, tuple[float, ...]]  # label -> latency at each QPS (paper)


def _lat(*cols):
    """Columns Org, k=1, k=3, k=5, k=7, TS per QPS -> label: latencies."""
    return dict(zip((*LABELS, TS), zip(*cols, strict=True), strict=True))


# Table 4 (L40S) and Table 5 (H100): rows are (Org, k=1, k=3, k=5, k=7) at each QPS.
ROWS = (
    Row("l40s-7b-sharegpt", "l40s", 1, "vicuna-7b", "llama-160m", (227, 264), (256, 249), 0.62, (1, 4, 8, 16),
        _lat((2.63, 1.85, 1.36, 1.34, 1.31, 1.34), (3.39, 2.51, 1.91, 1.92, 2.05, 1.9), (4.86, 3.78, 2.91, 3.25, 4.19, 2.98),
             (13.73, 15.91, 15.01, 23.50, 33.40, 13.62))),
    Row("l40s-7b-sonnet", "l40s", 1, "vicuna-7b", "llama-160m", (517, 10), (141, 22), 0.53, (1, 4, 8, 16),
        _lat((2.77, 2.08, 1.71, 1.76, 1.84, 1.74), (4.36, 3.36, 2.73, 3.08, 3.69, 2.82), (13.30, 12.81, 13.02, 21.64, 33.26, 12.8),
             (72.38, 74.74, 74.4, 96.07, 120.74, 74.03))),
    Row("l40s-13b-sharegpt", "l40s", 1, "vicuna-13b", "llama-160m", (227, 264), (274, 255), 0.56, (0.5, 1, 2, 4),
        _lat((8.43, 5.51, 4.09, 3.83, 3.83, 3.87), (9.98, 6.66, 5.07, 4.85, 5.05, 4.94), (12.90, 8.66, 6.43, 6.32, 6.92, 6.37),
             (34.89, 20.67, 12.70, 18.34, 28.00, 13.31))),
    Row("l40s-13b-sonnet", "l40s", 1, "vicuna-13b", "llama-160m", (517, 10), (145, 19), 0.62, (0.5, 1, 2, 4),
        _lat((6.40, 3.94, 2.57, 2.07, 1.96, 2.05), (7.36, 4.54, 2.99, 2.45, 2.36, 2.5), (10.35, 6.08, 3.88, 3.19, 3.16, 3.27),
             (45.67, 24.89, 9.71, 7.20, 8.97, 7.6))),
    Row("h100x2-33b-sharegpt", "h100", 2, "vicuna-33b", "llama-160m", (227, 264), (269, 233), 0.59, (1, 4, 8, 16),
        _lat((2.88, 2.14, 1.73, 1.73, 1.81, 1.73), (3.73, 3.06, 2.51, 2.65, 3.10, 2.65), (4.69, 4.61, 4.24, 6.67, 12.63, 4.44),
             (11.21, 24.31, 32.82, 47.29, 62.22, 11.67))),
    Row("h100x2-33b-sonnet", "h100", 2, "vicuna-33b", "llama-160m", (517, 10), (139, 15), 0.65, (1, 4, 8, 16),
        _lat((2.37, 1.66, 1.20, 1.10, 1.05, 1.04), (3.32, 2.47, 1.74, 1.64, 1.60, 1.61), (5.64, 5.35, 4.18, 5.35, 7.77, 4.21),
             (43.32, 49.38, 49.43, 57.46, 68.02, 46.16))),
    Row("h100x4-70b-sharegpt", "h100", 4, "llama-3.1-70b", "llama-3.2-1b", (227, 264), (227, 208), 0.78,
        (1, 4, 8, 16),
        _lat((3.56, 2.44, 1.76, 1.69, 1.69, 1.69), (4.77, 3.52, 2.48, 2.39, 2.42, 2.38), (5.58, 4.96, 3.61, 3.58, 4.14, 3.64),
             (15.67, 23.20, 21.43, 25.93, 31.67, 16.41))),
    Row("h100x4-70b-sonnet", "h100", 4, "llama-3.1-70b", "llama-3.2-1b", (517, 10), (135, 18), 0.92, (1, 4, 8, 16),
        _lat((2.83, 1.80, 1.14, 0.94, 0.86, 0.86), (3.63, 2.47, 1.55, 1.29, 1.19, 1.19), (5.42, 4.35, 2.74, 2.16, 2.09, 2.11),
             (18.24, 32.48, 27.84, 27.37, 29.18, 18.6))),
)

TABLE = AcceptanceTable({
    "schema": "specctl.acceptance/v1",
    "families": {"chat": {"drafters": {"draft_model": {
        "mean": 0.7, "concentration": 1e6, "decay": 1.0,
        "source": "TurboSpec Table 3: token acceptance rate per pair and dataset (overridden per row)"}}}},
})


def simulate(row: Row, requests: int, seeds: int, framework: Framework,
             expansion: bool | None = None, extra: tuple[str, ...] = ()) -> dict[str, list[float]]:
    """Mean request latency (s) of every configuration (and each ``extra`` policy) at each of the row's QPS."""
    prof = roofline_profile(row.sku, row.target, [row.draft], tp=row.tp, framework=framework)
    base = poisson(requests, 1.0, f"lognormal:{row.prompt[0]}:{row.prompt[1]}",
                   f"lognormal:{row.output[0]}:{row.output[1]}", seed=0)
    setup = SimSetup(prof, base, max_k=8, table=TABLE, max_batch=256,
                     acceptance_overrides={row.draft: row.acceptance}, verify_expansion=expansion)
    out: dict[str, list[float]] = {lab: [] for lab in (*LABELS, TS, *extra)}
    for q in row.qps:
        for lab, pol in zip((*LABELS, TS, *extra), (*CONFIGS, "turbospec", *extra), strict=True):
            vals = []
            for seed in range(seeds):
                w = workload_at(setup, q, requests, seed)
                res = run_policy(setup, w, pol, seed)
                vals.append(float(np.mean(res.finish_s - res.arrival_s)))
            out[lab].append(float(np.mean(vals)))
    return out


def crossovers(qps, lat: dict) -> dict[str, float | None]:
    org = np.asarray(lat["Org"])
    return {lab: crossover_rate(list(qps), list(org / np.asarray(lat[lab]))) for lab in LABELS[1:]}


def best(lat: dict, i: int) -> str:
    return min(LABELS, key=lambda lab: lat[lab][i])


def compare(row: Row, sim: dict) -> dict:
    """Crossover QPS per k (paper, simulator) and best configuration per QPS."""
    cp, cs = crossovers(row.qps, row.latency_s), crossovers(row.qps, sim)
    rank = []
    for i, q in enumerate(row.qps):
        pb, sb = best(row.latency_s, i), best(sim, i)
        # the paper's best is as good as the simulator's pick within 10% in the simulator's own terms
        near = sim[pb][i] <= 1.10 * sim[sb][i]
        rank.append({"qps": q, "paper_best": pb, "sim_best": sb, "agree": pb == sb, "near": bool(near)})
    return {"crossover_paper": cp, "crossover_sim": cs, "ranking": rank}


def _fmt(x):
    return "none" if x is None else f"{x:.1f}"


def crossover_verdict(p: float | None, s: float | None, tol: float = 0.25) -> str:
    """``match`` (both cross, within ``tol`` of the paper), ``neither`` (neither crosses in the
    table's range) or ``miss``."""
    if p is None and s is None:
        return "neither"
    if p is None or s is None:
        return "miss"
    return "match" if abs(s / p - 1) <= tol else "miss"


def row_holds(cmp: dict) -> bool:
    """Whether a row's crossovers agree with the paper's in more than half of its k (a cell agrees
    when both cross within 25% or neither crosses in the table's QPS range)."""
    ok = [crossover_verdict(cmp["crossover_paper"][lab], cmp["crossover_sim"][lab]) != "miss" for lab in LABELS[1:]]
    return 2 * sum(ok) > len(ok)


def markdown(results: list[tuple[Row, dict, dict]]) -> str:
    lines = ["| row | k | paper crossover QPS | simulator | verdict |", "|---|---|---:|---:|:-:|"]
    counts = {"match": 0, "neither": 0, "miss": 0}
    crossing = 0
    for row, _sim, cmp in results:
        for lab in LABELS[1:]:
            p, s = cmp["crossover_paper"][lab], cmp["crossover_sim"][lab]
            v = crossover_verdict(p, s)
            counts[v] += 1
            crossing += p is not None
            lines.append(f"| {row.key} | {lab} | {_fmt(p)} | {_fmt(s)} | {v if v != 'miss' else '**miss**'} |")
    lines.append(f"\ncrossover within 25%: {counts['match']} of the {crossing} cells where the paper crosses; "
                 f"neither crosses in {counts['neither']}; misses {counts['miss']}")
    held = [row.key for row, _sim, cmp in results if row_holds(cmp)]
    lines.append(f"rows whose crossovers agree in most cells (within 25%, or neither crossing): {len(held)} of "
                 f"{len(results)}{': ' + ', '.join(held) if held else ''}\n")
    lines += ["| row | QPS | paper best | simulator best | same | paper's best within 10% in the simulator |",
              "|---|---:|---|---|:-:|:-:|"]
    a_ok = a_near = m = 0
    for row, _sim, cmp in results:
        for r in cmp["ranking"]:
            a_ok += r["agree"]
            a_near += r["near"]
            m += 1
            lines.append(f"| {row.key} | {r['qps']:g} | {r['paper_best']} | {r['sim_best']} | "
                         f"{'yes' if r['agree'] else 'no'} | {'yes' if r['near'] else '**no**'} |")
    lines.append(f"\nbest configuration: same in {a_ok}/{m}; paper's best within 10% of the simulator's in {a_near}/{m}\n")
    extra = [lab for lab in (results[0][1] if results else {}) if lab not in (*LABELS, TS)]
    lines += ["| row | QPS | TurboSpec / best static, paper | turbospec / best static, simulator |"
              + "".join(f" {p} / best static, simulator |" for p in extra),
              "|---|---:|---:|---:|" + "---:|" * len(extra)]
    gaps = []
    for row, sim, _ in results:
        for i, q in enumerate(row.qps):
            rp, rs = ts_ratio(row.latency_s, i), ts_ratio(sim, i)
            gaps.append(rs - rp)
            lines.append(f"| {row.key} | {q:g} | {rp:.3f} | {rs:.3f} |"
                         + "".join(f" {ts_ratio(sim, i, p):.3f} |" for p in extra))
    if gaps:
        g = np.abs(gaps)
        lines.append(f"\nturbospec vs the paper's TurboSpec (latency over the best static configuration): "
                     f"within 0.05 in {int((g <= 0.05).sum())}/{g.size} cells, median gap {np.median(gaps):+.3f}\n")
    cols = (*LABELS, TS)
    lines += ["| row | QPS | " + " | ".join(f"{lab} paper / sim" for lab in cols) + " |",
              "|---|---:|" + "---:|" * len(cols)]
    for row, sim, _ in results:
        for i, q in enumerate(row.qps):
            cells = " | ".join(f"{row.latency_s[lab][i]:.2f} / {sim[lab][i]:.2f}" for lab in cols)
            lines.append(f"| {row.key} | {q:g} | {cells} |")
    return "\n".join(lines)


def row_framework(fw: Framework, row: Row, draft_host_prep: str) -> Framework:
    """The framework row ``row`` runs on: ``fw``, except that ``--draft-host-prep split`` prepares every
    draft pass on the host where the target is split over GPUs. vLLM 0.6 splits the draft as the target
    unless ``speculative_draft_tensor_parallel_size`` says 1, and only an unsplit draft gets the runner
    that advances passes 2..k on the GPU (``TP1DraftModelRunner``); TurboSpec does not say which it ran."""
    return replace(fw, draft_host_prep=row.tp > 1) if draft_host_prep == "split" else fw


def ts_ratio(lat: dict, i: int, policy: str = TS) -> float:
    """TurboSpec's (or ``policy``'s) latency over the best static configuration (Org or a fixed k) at QPS index i."""
    return lat[policy][i] / min(lat[lab][i] for lab in LABELS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--framework", default="vllm-0.6", help="roofline framework (control/buildsys/roofline.py FRAMEWORKS)")
    ap.add_argument("--host-scale", type=float, default=1.0,
                    help="multiply the framework's host time per sequence and per token (sensitivity)")
    ap.add_argument("--draft-host-prep", choices=tuple(DRAFT_HOST_PREP), default="framework",
                    help="host input preparation (per sequence) on every draft pass: as the framework has it, "
                         "forced on or off, or 'split': on for the rows whose target is split over GPUs "
                         "(vLLM 0.6 splits the draft as the target unless told otherwise, and prepares every pass "
                         "of a split draft on the host; sensitivity)")
    ap.add_argument("--rows", default=",".join(r.key for r in ROWS))
    ap.add_argument("--verify", choices=("framework", "expansion", "mqa"), default="framework",
                    help="verification as the framework does it (vLLM: batch expansion), or forced either way")
    ap.add_argument("--extra", default="", help="more policies to run beside turbospec, e.g. adaptive (their "
                    "latency over the best static configuration joins the TurboSpec table)")
    ap.add_argument("--json")
    args = ap.parse_args()
    for flag, value in (("--requests", args.requests), ("--seeds", args.seeds)):
        if value < 1:
            raise SystemExit(f"{flag} {value}: give a whole number >= 1")
    want = args.rows.split(",")
    extra = tuple(x.strip() for x in args.extra.split(",") if x.strip())
    try:
        for pol in extra:
            parse_policy_spec(pol)
    except ConfigError as e:
        raise SystemExit(f"--extra {args.extra!r}: {e}") from None
    unknown = sorted(set(want) - {r.key for r in ROWS})
    if unknown:
        raise SystemExit(f"--rows: unknown {', '.join(unknown)}; known: {', '.join(r.key for r in ROWS)}")
    try:
        fw = scaled_framework(args.framework, args.host_scale, DRAFT_HOST_PREP[args.draft_host_prep])
    except ConfigError as e:
        raise SystemExit(f"--framework/--host-scale: {e}") from None
    expansion = {"framework": None, "expansion": True, "mqa": False}[args.verify]
    results = []
    for row in ROWS:
        if row.key not in want:
            continue
        sim = simulate(row, args.requests, args.seeds, row_framework(fw, row, args.draft_host_prep), expansion, extra)
        cmp = compare(row, sim)
        results.append((row, sim, cmp))
        print(f"{row.key}: crossover paper {cmp['crossover_paper']} sim {cmp['crossover_sim']}", flush=True)
    print(markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"row": r.key, "sim_latency_s": s, **c} for r, s, c in results], f, indent=1)


if __name__ == "__main__":
    main()
