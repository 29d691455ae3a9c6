"""The dashboard: one server-rendered HTML page with inline SVG charts (no scripts, no CDN).

It shows the goodput curve over k behind the current decision (the logic of ``specctl explain``, at
the batch size, context and acceptance the agents reported last, under the plan's cost model), and
k, batch size and acceptance over time from telemetry. It refreshes itself every few seconds.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence

from control.service.fleet import Fleet
from control.service.state import ControlState

W, H = 560, 220
PAD_L, PAD_R, PAD_T, PAD_B = 56, 16, 28, 36
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
Y_HEADROOM = 0.05  # share of the y range left free above the highest point
CURVE_BATCH, CURVE_CTX = 8, 1024  # the goodput curve's batch and context before any telemetry


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(step))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= step), default=step)
    start = math.ceil(lo / step) * step
    out, v = [], start
    while v <= hi + 1e-9 * step:
        out.append(round(v, 10))
        v += step
    return out


def line_chart(title: str, series: Sequence[tuple[str, Sequence[float], Sequence[float]]], *, xlabel: str,
               ylabel: str, ylim: tuple[float, float] | None = None, marks: Sequence[tuple[float, float, str]] = (),
               hollow: Sequence[tuple[float, float]] = ()) -> str:
    """An SVG line chart; ``series`` = (label, xs, ys), NaN ys break the line."""
    xs_all = [x for _, xs, ys in series for x, y in zip(xs, ys, strict=True) if y == y]
    ys_all = [y for _, _, ys in series for y in ys if y == y]
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
             f'aria-label="{html.escape(title)}"><title>{html.escape(title)}</title>',
             f'<text x="{PAD_L}" y="18" class="t">{html.escape(title)}</text>']
    if not xs_all:
        parts.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" class="muted">no data yet</text></svg>')
        return "".join(parts)
    x0, x1 = min(xs_all), max(xs_all)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = ylim if ylim else (min(0.0, min(ys_all)), max(ys_all))
    if y1 <= y0:
        y1 = y0 + 1
    y1 += (y1 - y0) * Y_HEADROOM

    def px(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R)

    def py(y: float) -> float:
        return H - PAD_B - (y - y0) / (y1 - y0) * (H - PAD_T - PAD_B)

    for t in _ticks(y0, y1):
        parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="grid"/>'
                     f'<text x="{PAD_L - 6}" y="{py(t) + 4:.1f}" text-anchor="end" class="ax">{_fmt(t)}</text>')
    for t in _ticks(x0, x1, 6):
        parts.append(f'<text x="{px(t):.1f}" y="{H - PAD_B + 16}" text-anchor="middle" class="ax">{_fmt(t)}</text>')
    parts.append(f'<text x="{(PAD_L + W - PAD_R) / 2}" y="{H - 4}" text-anchor="middle" class="ax">{html.escape(xlabel)}</text>'
                 f'<text x="12" y="{(PAD_T + H - PAD_B) / 2}" transform="rotate(-90 12 {(PAD_T + H - PAD_B) / 2})" '
                 f'text-anchor="middle" class="ax">{html.escape(ylabel)}</text>')
    for i, (label, xs, ys) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        seg: list[str] = []
        for x, y in zip(xs, ys, strict=True):
            if y != y:
                if len(seg) > 1:
                    parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(seg)}"/>')
                seg = []
                continue
            seg.append(f"{px(x):.1f},{py(y):.1f}")
        if len(seg) > 1:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(seg)}"/>')
        elif len(seg) == 1:
            parts.append(f'<circle cx="{seg[0].split(",")[0]}" cy="{seg[0].split(",")[1]}" r="3" fill="{color}"/>')
        if len(series) > 1:
            parts.append(f'<text x="{W - PAD_R - 4}" y="{PAD_T + 4 + 14 * i}" text-anchor="end" fill="{color}" '
                         f'class="ax">{html.escape(label)}</text>')
    for x, y in hollow:
        parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="white" stroke="#888"/>')
    for x, y, label in marks:
        parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="6" fill="none" stroke="#000" stroke-width="2"/>'
                     f'<text x="{px(x):.1f}" y="{py(y) - 10:.1f}" text-anchor="middle" class="t">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bucketed(points, now: float, window_s: float, max_points: int = 300) -> dict[str, list[float]]:
    """Telemetry windows from every agent, merged into time buckets (weighted by what each measured)."""
    width = max(1.0, window_s / max_points)
    groups: dict[int, list] = {}
    for p in points:
        groups.setdefault(int((p.t - now) // width), []).append(p)
    out: dict[str, list[float]] = {k: [] for k in ("t", "k", "batch", "max_batch", "acceptance", "measured", "predicted")}
    nan = float("nan")
    for key in sorted(groups):
        g = groups[key]
        steps = sum(p.steps for p in g)
        rs = sum(p.request_steps for p in g)
        trials = sum(p.trials for p in g)
        pred = [(p.predicted_ms, p.steps) for p in g if p.predicted_ms == p.predicted_ms]
        out["t"].append((key + 0.5) * width)
        out["k"].append(sum(p.mean_k * p.request_steps for p in g) / rs if rs else nan)
        out["batch"].append(rs / steps if steps else nan)
        out["max_batch"].append(float(max(p.max_batch for p in g)))
        out["acceptance"].append(sum(p.acceptance * p.trials for p in g if p.trials) / trials if trials else nan)
        out["measured"].append(sum(p.measured_ms * p.steps for p in g if p.steps) / steps if steps else nan)
        w = sum(n for _, n in pred)
        out["predicted"].append(sum(v * n for v, n in pred) / w if w else nan)
    return out


def curve_inputs(state: ControlState) -> tuple[int, int, float]:
    """Batch size, context and acceptance of the current decision: the latest window's, else defaults."""
    plan = state.plan
    last = state.history[-1] if state.history else None
    batch = max(int(round(last.mean_batch)), 1) if last is not None and last.steps else CURVE_BATCH
    ctx = max(int(round(last.mean_ctx)), 1) if last is not None and last.mean_ctx else CURVE_CTX
    # An agent's window is validated but can still describe a batch or context the deployment cannot
    # have (a corrupt or hostile report); the curve is drawn within the profile's limits.
    lim = plan.profile.limits
    return min(batch, lim.max_batch), min(ctx, lim.max_ctx), float(plan.prior_rate())


def _cell(v) -> str:
    if isinstance(v, bool):
        return "stale" if v else "fresh"
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3g}"
    return html.escape(str(v))


def replica_table(fleet: Fleet | None, group: str, now: float) -> str:
    """One row per replica of the group: its plan, own acceptance and step time, freshness."""
    if fleet is None:
        return ""
    cols = ("replica", "stale", "plan_delivered", "plan_version", "acceptance", "step_ms", "mean_batch", "mean_k", "slo_attainment",
            "windows", "last_seen_s_ago")
    rows = [fleet.replicas.describe(r, now) for r in fleet.replicas.in_group(group)]
    agg = fleet.replicas.aggregate(group, now)
    head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r[c])}</td>" for c in cols) + "</tr>" for r in rows)
    pooled = "".join(f"<td>{_cell(agg.get(c, ''))}</td>" for c in cols[4:9])
    groups = " ".join(f'<a href="/?group={html.escape(g)}">{html.escape(g)}</a>' for g in fleet.groups)
    return (f'<h2>replicas of {html.escape(group)}: {agg["fresh"]} fresh, {agg["stale"]} stale</h2>'
            f'<p class="ax">groups: {groups}</p>'
            f'<table class="replicas"><tr>{head}</tr>{body}'
            f'<tr><th>fresh replicas pooled</th><td></td><td></td><td></td>{pooled}<td></td><td></td></tr></table>')


def render(state: ControlState, explained: dict, *, refresh_s: int = 5, window_s: float = 600.0,
           fleet: Fleet | None = None, group: str = "") -> str:
    plan = state.plan
    now = time.time()
    curve = explained["curve"]
    ks = [r["k"] for r in curve]
    gs = [r["goodput_tok_s"] for r in curve]
    best = explained["best_k"]
    goodput = line_chart(
        f"goodput over k: batch {explained['batch']}, ctx {explained['ctx']}, acceptance {explained['acceptance']:.2f}, "
        f"drafter {explained['drafter']}",
        [("goodput", ks, gs)], xlabel="draft length k", ylabel="tokens / s",
        marks=[(best, gs[best], f"k={best}")] if gs else [],
        hollow=[(r["k"], r["goodput_tok_s"]) for r in curve if not r["feasible"]],
    )
    b = bucketed([p for p in state.history if now - p.t <= window_s], now, window_s)
    xs = b["t"]
    charts = [
        line_chart("draft length k (mean per request)", [("k", xs, b["k"])], xlabel="seconds", ylabel="k",
                   ylim=(0.0, max([k for k in b["k"] if k == k] + [float(max(plan.max_k, 1))]))),
        line_chart("decode batch size (per agent)", [("mean", xs, b["batch"]), ("max", xs, b["max_batch"])],
                   xlabel="seconds", ylabel="requests"),
        line_chart("acceptance (accepted / evaluated draft positions)", [("acceptance", xs, b["acceptance"])],
                   xlabel="seconds", ylabel="rate", ylim=(0.0, 1.0)),
        line_chart("step time", [("measured", xs, b["measured"]), ("predicted (service model)", xs, b["predicted"])],
                   xlabel="seconds", ylabel="ms"),
    ]
    st = state.status()
    rows = [
        ("plan", f"v{plan.version} ({html.escape(state.plan_id)}), {html.escape(plan.reason or '-')}"),
        ("policy", html.escape(plan.policy)),
        ("max k", str(plan.max_k) + (" (speculation forced off)" if plan.force_off else "")),
        ("SLO", f"TPOT {plan.slo.tpot_ms} ms" + (f" at p{plan.slo.quantile * 100:g}" if plan.slo.quantile else " (mean)")
         if plan.slo.tpot_ms else "none"),
        ("drafters", html.escape(", ".join(plan.drafters)) + f" (default {html.escape(plan.default_drafter or '')})"),
        ("gate", f"off above batch {plan.gate.b_off or 'never'}, on below {plan.gate.b_on or '-'}"),
        ("overrides", html.escape(state.overrides.describe())),
        ("acceptance", html.escape(", ".join(f"{d} {v['pooled']:.3f} ({v['trials']:.0f} trials)"
                                            for d, v in st["acceptance"].items()))),
        ("cost model", html.escape("; ".join(
            f"{k}: a={v['a_ms_per_ctx_token']:.3g} b={v['b_ms_per_batched_token']:.3g} c={v['c_ms']:.3g}"
            + (f" d={v['d_ms_per_request']:.3g}" if v.get("d_ms_per_request") else "") + " ms"
            for k, v in st["cost_model"].items()))),
        ("telemetry", f"{st['telemetry']['windows']} windows, {st['telemetry']['steps']} steps from "
                      f"{st['telemetry']['agents']} agent(s); dropped {st['telemetry']['dropped_windows']}"),
        ("why this k", html.escape(explained["why"])),
    ]
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{int(refresh_s)}">
<title>specctl control plane</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 18px; margin: 0 0 8px; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; }}
th {{ text-align: left; padding: 2px 12px 2px 0; color: #555; font-weight: 500; vertical-align: top; }}
td {{ padding: 2px 0; }}
.grid {{ stroke: #eee; }} .ax {{ font-size: 11px; fill: #555; }} .t {{ font-size: 12px; fill: #222; }}
.muted {{ fill: #999; font-size: 12px; }} .charts {{ display: flex; flex-wrap: wrap; gap: 8px; }}
.chart {{ border: 1px solid #ddd; background: #fff; }}
h2 {{ font-size: 15px; margin: 8px 0 4px; }} table.replicas td, table.replicas th {{ padding: 2px 10px 2px 0; }}
</style></head><body>
<h1>specctl control plane: {html.escape(plan.profile.sku)}/{html.escape(plan.profile.pair)}</h1>
<table>{table}</table>
{replica_table(fleet, group, now)}
<div class="charts">{goodput}{"".join(charts)}</div>
<p class="ax">Refreshes every {int(refresh_s)} s. JSON: <a href="/v1/status">/v1/status</a>, <a href="/v1/plan">/v1/plan</a>,
<a href="/v1/explain">/v1/explain</a>, <a href="/metrics">/metrics</a>, <a href="/openapi.json">/openapi.json</a>.</p>
</body></html>"""
