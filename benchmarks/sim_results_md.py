"""Summarise sim_bar.py outputs (specctl.bench/v1 JSON) into Markdown tables for docs/sim-results.md.

    python benchmarks/sim_results_md.py runs/sim-bar/*.json > section.md
    python benchmarks/sim_results_md.py --summary runs/sim-bar/*.json   # one line per configuration
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from control.bench.report import aggregate, bar_check, k_by_batch_table, markdown_table  # noqa: E402


def load_rows(path: Path) -> tuple[list[dict], dict]:
    doc = json.loads(path.read_text())
    rows = []
    for r, x in zip(doc["results"], doc["details"], strict=True):
        rows.append({**r, "extra": x})
    return rows, doc.get("meta", {})


def goodput_table(rows: list[dict]) -> str:
    """Goodput of every policy relative to the oracle's, per load (means over seeds)."""
    agg = aggregate(rows)
    loads = sorted({k[0] for k in agg})
    pols = [p for p in dict.fromkeys(r["policy"] for r in rows) if p != "oracle"]
    lines = ["| load | " + " | ".join(pols) + " |", "|---|" + "---|" * len(pols)]
    for load in loads:
        o = agg.get((load, "oracle"), {}).get("goodput_tok_s")
        if not o:
            continue
        cells = []
        for p in pols:
            g = agg.get((load, p), {}).get("goodput_tok_s")
            cells.append(f"{g / o:.3f}" if g else "-")
        lines.append(f"| {load:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seed_spread(rows: list[dict], policy: str = "adaptive") -> str:
    """Per-load ratio of ours to the best fixed k for each seed (min..max), to show the noise."""
    out = []
    loads = sorted({float(r["load"]) for r in rows})
    seeds = sorted({int(r["seed"]) for r in rows})
    fixed = [p for p in dict.fromkeys(r["policy"] for r in rows) if p == "none" or p.startswith("fixed:")]
    for load in loads:
        ratios = []
        for s in seeds:
            by = {r["policy"]: r["mean_latency_s"] for r in rows if float(r["load"]) == load and int(r["seed"]) == s}
            if policy in by and all(p in by for p in fixed):
                ratios.append(by[policy] / min(by[p] for p in fixed))
        if ratios:
            out.append(f"{load:g}: {min(ratios):.3f}..{max(ratios):.3f}")
    return "; ".join(out)


def summary_line(tag: str, rows: list[dict]) -> str:
    """One row of the overview: loads passing, worst ratio to the best fixed k, ratio to none at the
    top load, lowest goodput / oracle (adaptive's and, where it ran, the rate oracle's)."""
    verdicts, _ = bar_check(rows)
    agg = aggregate(rows)
    top = max(v["load"] for v in verdicts)
    worst = max(verdicts, key=lambda v: v["vs_best"])
    low = min(verdicts, key=lambda v: v["goodput_vs_oracle"])
    rate = [agg[(v["load"], "rate-oracle")]["goodput_tok_s"] / agg[(v["load"], "oracle")]["goodput_tok_s"]
            for v in verdicts if (v["load"], "rate-oracle") in agg and (v["load"], "oracle") in agg]
    sat = next(v["vs_none"] for v in verdicts if v["load"] == top)
    return (f"| {tag} | {sum(v['pass'] for v in verdicts)}/{len(verdicts)} | {worst['vs_best']:.3f} (load {worst['load']:g}) | "
            f"{sat:.3f} | {low['goodput_vs_oracle']:.3f} (load {low['load']:g}) | "
            f"{f'{min(rate):.3f}' if rate else '-'} |")


def main() -> None:
    if sys.argv[1:2] == ["--summary"]:
        print("| configuration | loads passing | worst adaptive / best fixed k | adaptive / none at top load | "
              "lowest adaptive goodput / oracle | lowest rate-oracle goodput / oracle |")
        print("|---|---|---|---|---|---|")
        for f in sys.argv[2:]:
            if not f.endswith("-bar.json"):
                print(summary_line(Path(f).stem, load_rows(Path(f))[0]))
        return
    for f in sys.argv[1:]:
        p = Path(f)
        if p.name.endswith("-bar.json"):
            continue
        rows, meta = load_rows(p)
        tag = p.stem
        print(f"## {tag}\n")
        print(f"Profile `{meta.get('profile')}`, workload `{meta.get('workload')}`, no-speculation capacity "
              f"{meta.get('capacity_req_s', float('nan')):.3f} req/s (measured), {meta.get('requests_per_run')} "
              f"requests per run, {meta.get('seeds')} seeds, length scale {meta.get('length_scale', 1.0)}, "
              f"{meta.get('clipped_to_max_ctx', 0)} requests clipped to the model's context.\n")
        _, bar = bar_check(rows)
        print("Adaptive against the bar (means over seeds):\n")
        print(bar)
        print(f"Adaptive / best fixed k per seed: {seed_spread(rows)}\n")
        print("Goodput relative to the oracle (means over seeds):\n")
        print(goodput_table(rows))
        top = max(float(r["load"]) for r in rows)
        kb = k_by_batch_table(rows, top)
        if kb:
            print(f"Mean k by batch size at load {top:g}:\n")
            print(kb)
        print("<details><summary>All policies</summary>\n")
        print(markdown_table(rows))
        print("</details>\n")


if __name__ == "__main__":
    main()
