"""Benchmark reports: JSON (``specctl.bench/v1``), a Markdown table, PNG plots.

Inputs are plain result rows (dicts with ``ROW_KEYS`` plus an optional ``extra`` dict) and an
optional time series of one run, so the simulator and the live-server benchmark share this code.

JSON layout::

    {"schema": "specctl.bench/v1",
     "results": [{"policy", "load", "seed", "mean_latency_s", "p50_latency_s", "p99_latency_s",
                  "ttft_s", "tpot_s", "goodput_tok_s", "slo_attainment", "acceptance_rate",
                  "spec_step_share"}, ...],          # one row per policy x load x seed
     "details": [{"policy", "load", "seed", ...}],   # per-row extras (k histogram, p99 TTFT, ...)
     "meta": {...}}                                   # how the run was made
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from control.bench.metrics import ROW_KEYS, sum_counts
from control.errors import ConfigError

BENCH_SCHEMA = "specctl.bench/v1"
MEAN_KEYS = ROW_KEYS[3:]


def bench_document(rows: list[dict], meta: dict | None = None) -> dict:
    results, details = [], []
    for r in rows:
        missing = [k for k in ROW_KEYS if k not in r]
        if missing:
            raise ConfigError(f"result row for {r.get('policy')!r} lacks {', '.join(missing)}")
        results.append({k: r[k] for k in ROW_KEYS})
        details.append({"policy": r["policy"], "load": r["load"], "seed": r["seed"], **(r.get("extra") or {})})
    return {"schema": BENCH_SCHEMA, "results": results, "details": details, "meta": _jsonable(meta or {})}


def write_json(path: str | Path, rows: list[dict], meta: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(bench_document(rows, meta), indent=1, allow_nan=False))
    return path


def load_json(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"benchmark file '{path}' does not exist")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"'{path}' is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("schema") != BENCH_SCHEMA:
        raise ConfigError(f"'{path}': schema = {doc.get('schema') if isinstance(doc, dict) else None!r}; expected {BENCH_SCHEMA}")
    for i, r in enumerate(doc.get("results", [])):
        missing = [k for k in ROW_KEYS if k not in r]
        if missing:
            raise ConfigError(f"'{path}': results[{i}] lacks {', '.join(missing)}")
    return doc


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating | float):
        v = float(x)
        return v if math.isfinite(v) else None
    return x


# -- aggregation ------------------------------------------------------------------------------------

def aggregate(rows: list[dict]) -> dict[tuple[float, str], dict]:
    """Mean (and std) over seeds per (load, policy); the k histogram is summed."""
    groups: dict[tuple[float, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(float(r["load"]), r["policy"])].append(r)
    out = {}
    for key, rs in groups.items():
        agg = {"n": len(rs)}
        for k in MEAN_KEYS:
            vals = np.array([r[k] for r in rs if r[k] is not None], dtype=np.float64)
            agg[k] = float(vals.mean()) if vals.size else None
            agg[k + "_std"] = float(vals.std()) if vals.size > 1 else 0.0
        hists = [np.asarray(r["extra"]["k_hist"]) for r in rs if r.get("extra", {}).get("k_hist")]
        if hists:
            width = max(h.size for h in hists)
            agg["k_hist"] = sum(np.pad(h, (0, width - h.size)) for h in hists)
        mixes = [r["extra"]["drafter_steps"] for r in rs if r.get("extra", {}).get("drafter_steps")]
        if mixes:
            agg["drafter_steps"] = sum_counts(mixes)
        out[key] = agg
    return out


def _fmt(v, nd=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.{nd}g}"


def k_distribution(hist) -> str:
    h = np.asarray(hist, dtype=np.float64)
    if h.sum() <= 0:
        return "-"
    p = h / h.sum()
    return " ".join(f"{i}:{x * 100:.0f}" for i, x in enumerate(p) if x >= 0.005)


def drafter_mix(counts: dict[str, int] | None) -> str:
    """Each drafter's share of the drafting request-steps, in percent ("-" when none drafted)."""
    total = sum((counts or {}).values())
    if total <= 0:
        return "-"
    return " ".join(f"{name}:{100 * n / total:.0f}" for name, n in counts.items() if n / total >= 0.005)


def markdown_table(rows: list[dict], title: str = "", baseline: str = "none") -> str:
    """One line per load x policy (means over seeds), latency ratio to ``baseline`` at the same load."""
    agg = aggregate(rows)
    loads = sorted({k[0] for k in agg})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    lines = []
    if title:
        lines += [f"### {title}", ""]
    hdr = ("| load | policy | mean lat s | vs none | p50 s | p99 s | TTFT s | TPOT ms | goodput tok/s | SLO % | "
           "accept | spec steps % | k distribution (% of request-steps) |")
    mixes = any("drafter_steps" in a for a in agg.values())  # live runs report which drafter drafted
    if mixes:
        hdr += " drafters (% of drafting request-steps) |"
    lines += [hdr, "|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|"]
    for load in loads:
        base = agg.get((load, baseline), {}).get("mean_latency_s")
        for pol in policies:
            a = agg.get((load, pol))
            if a is None:
                continue
            ratio = a["mean_latency_s"] / base if base and a["mean_latency_s"] else None
            tpot = a["tpot_s"] * 1000 if a["tpot_s"] is not None else None
            slo = a["slo_attainment"] * 100 if a["slo_attainment"] is not None else None
            share = a["spec_step_share"] * 100 if a["spec_step_share"] is not None else None
            lines.append(
                f"| {load:g} | {pol} | {_fmt(a['mean_latency_s'])} | {_fmt(ratio)} | {_fmt(a['p50_latency_s'])} | "
                f"{_fmt(a['p99_latency_s'])} | {_fmt(a['ttft_s'])} | {_fmt(tpot)} | {_fmt(a['goodput_tok_s'])} | "
                f"{_fmt(slo)} | {_fmt(a['acceptance_rate'])} | {_fmt(share)} | {k_distribution(a.get('k_hist', []))} |"
                + (f" {drafter_mix(a.get('drafter_steps'))} |" if mixes else "")
            )
    return "\n".join(lines) + "\n"


def paired_ratio(rows: list[dict], load: float, ours: str, other: str, level: float = 0.95):
    """Ours / ``other`` on the same seeds at ``load``: (geometric mean, low, high, pairs), the interval a
    t-interval on the log ratios at ``level``; None without a pair. Runs of one seed share the arrival
    times and prompts, so pairing removes the workload's share of the noise and leaves the machine's."""
    by: dict[tuple[str, int], float] = {}
    for r in rows:
        if float(r["load"]) == load and r["policy"] in (ours, other) and r["mean_latency_s"]:
            by[(r["policy"], int(r["seed"]))] = float(r["mean_latency_s"])
    logs = np.log([by[(ours, s)] / by[(other, s)] for (p, s) in by if p == ours and (other, s) in by])
    if not logs.size:
        return None
    mid = float(np.exp(logs.mean()))
    if logs.size < 2:
        return mid, float("nan"), float("nan"), 1
    from scipy.stats import t as student_t

    half = float(student_t.ppf(0.5 + level / 2, logs.size - 1) * logs.std(ddof=1) / math.sqrt(logs.size))
    return mid, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)), int(logs.size)


def bar_check(rows: list[dict], ours: str = "adaptive", tolerance: float = 0.02, saturation_ratio: float = 1.03,
              oracle_ratio: float = 0.95) -> tuple[list[dict], str]:
    """The evaluation bar per load: ours vs the best fixed k (incl. none) with ``tolerance``; vs none
    at the highest load; goodput vs the oracle. Returns per-load verdicts and a Markdown table.

    The verdict is on the means over seeds, as the bar is stated; the paired 95% interval of ours /
    best (same seeds) says whether a miss or a pass is more than the noise of the repeats."""
    agg = aggregate(rows)
    loads = sorted({k[0] for k in agg})
    fixed = [p for p in dict.fromkeys(r["policy"] for r in rows) if p == "none" or p.startswith("fixed:")]
    out = []
    lines = ["| load | ours mean lat s | best fixed | its lat s | ours / best | paired 95% CI | ours / none | "
             "ours goodput / oracle | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    top = max(loads) if loads else None
    for load in loads:
        o = agg.get((load, ours))
        if o is None:
            continue
        cands = [(agg[(load, p)]["mean_latency_s"], p) for p in fixed if (load, p) in agg]
        best_lat, best = min(cands) if cands else (None, "-")
        none_lat = agg.get((load, "none"), {}).get("mean_latency_s")
        orc = agg.get((load, "oracle"), {}).get("goodput_tok_s")
        r_best = o["mean_latency_s"] / best_lat if best_lat else None
        r_none = o["mean_latency_s"] / none_lat if none_lat else None
        r_orc = o["goodput_tok_s"] / orc if orc else None
        paired = paired_ratio(rows, load, ours, best) if best_lat else None
        ci = (paired[1], paired[2]) if paired and paired[3] > 1 else None
        ok = (r_best is None or r_best <= 1 + tolerance) and (r_orc is None or r_orc >= oracle_ratio)
        if load == top and r_none is not None:
            ok = ok and r_none <= saturation_ratio
        verdict = {"load": load, "ours": o["mean_latency_s"], "best_fixed": best, "best_lat": best_lat,
                   "vs_best": r_best, "vs_best_ci": ci, "vs_none": r_none, "goodput_vs_oracle": r_orc,
                   "pass": bool(ok)}
        out.append(verdict)
        ci_text = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"
        lines.append(f"| {load:g} | {_fmt(o['mean_latency_s'])} | {best} | {_fmt(best_lat)} | {_fmt(r_best, 4)} | "
                     f"{ci_text} | {_fmt(r_none, 4)} | {_fmt(r_orc, 4)} | {'pass' if ok else 'MISS'} |")
    return out, "\n".join(lines) + "\n"


def k_by_batch_table(rows: list[dict], load: float) -> str:
    """Mean k per request-step by batch-size bucket for every policy at ``load`` (means over seeds);
    shows where each policy shrinks k or switches speculation off as the batch grows."""
    sel = [r for r in rows if abs(float(r["load"]) - load) < 1e-9 and r.get("extra", {}).get("k_by_batch")]
    if not sel:
        return ""
    buckets = list(dict.fromkeys(b for r in sel for b in r["extra"]["k_by_batch"]))
    buckets.sort(key=lambda b: int(b.split("-")[0].lstrip(">")))
    lines = ["| policy | " + " | ".join(f"batch {b}" for b in buckets) + " |",
             "|---|" + "---|" * len(buckets)]
    for pol in dict.fromkeys(r["policy"] for r in sel):
        vals = []
        for b in buckets:
            xs = [r["extra"]["k_by_batch"][b] for r in sel if r["policy"] == pol and b in r["extra"]["k_by_batch"]]
            vals.append(f"{np.mean(xs):.2f}" if xs else "-")
        lines.append(f"| {pol} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


# -- plots ------------------------------------------------------------------------------------------

def plot_latency_vs_load(rows: list[dict], path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(rows)
    loads = sorted({k[0] for k in agg})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 5))
    for pol in policies:
        xs = [x for x in loads if (x, pol) in agg and agg[(x, pol)]["mean_latency_s"] is not None]
        ys = [agg[(x, pol)]["mean_latency_s"] for x in xs]
        style = {"linewidth": 2.5} if pol in ("adaptive", "oracle", "none") else {"linewidth": 1.0, "alpha": 0.8}
        ax.plot(xs, ys, marker="o", markersize=3, label=pol, **style)
    ax.set_xlabel("load (fraction of no-speculation capacity)")
    ax.set_ylabel("mean request latency (s)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title or "latency vs load")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_series(series: dict, path: str | Path, title: str = "", bins: int = 400) -> Path:
    """k, batch size and acceptance over time for one run (TurboSpec Fig. 15 style).

    ``series``: arrays ``t_s``, ``batch``, ``k_sum``, ``accepted``, ``verified`` per step.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.asarray(series["t_s"], dtype=np.float64)
    if t.size == 0:
        raise ConfigError("the time series is empty (no decode steps were recorded)")
    edges = np.linspace(t.min(), t.max() + 1e-9, bins + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    cnt = np.bincount(idx, minlength=bins)

    def per_bin(x):
        return np.bincount(idx, weights=np.asarray(x, dtype=np.float64), minlength=bins)

    batch = per_bin(series["batch"])
    mid = (edges[:-1] + edges[1:]) / 2
    have = cnt > 0
    mean_batch = np.where(have, batch / np.maximum(cnt, 1), np.nan)
    mean_k = np.where(batch > 0, per_bin(series["k_sum"]) / np.maximum(batch, 1), np.nan)
    ver = per_bin(series["verified"])
    acc = np.where(ver > 0, per_bin(series["accepted"]) / np.maximum(ver, 1), np.nan)
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    axes[0].plot(mid[have], mean_k[have], color="tab:blue")
    axes[0].set_ylabel("mean k")
    axes[1].plot(mid[have], mean_batch[have], color="tab:orange")
    axes[1].set_ylabel("batch size")
    axes[2].plot(mid, acc, color="tab:green")
    axes[2].set_ylabel("acceptance")
    axes[2].set_ylim(0, 1)
    axes[2].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].set_title(title or "k, batch size and acceptance over time")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_markdown(path: str | Path, rows: list[dict], *, title: str, meta: dict | None = None,
                   plots: list[tuple[str, str]] | None = None, ours: str = "adaptive") -> Path:
    """A report: how it was run, the bar check (when ``ours`` ran), the full table, plots."""
    parts = [f"# {title}", ""]
    if meta:
        parts += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in meta.items() if not isinstance(v, dict | list)]
        parts.append("")
    if any(r["policy"] == ours for r in rows):
        _, bar = bar_check(rows, ours)
        parts += [f"## {ours} against the bar", "", bar]
    parts += ["## All policies (means over seeds)", "", markdown_table(rows)]
    top = max(float(r["load"]) for r in rows)
    kb = k_by_batch_table(rows, top)
    if kb:
        parts += [f"## Mean k by batch size at load {top:g}", "", kb]
    for caption, rel in plots or []:
        parts += [f"![{caption}]({rel})", ""]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))
    return path
