"""Per-run metrics from per-request times: one row of the ``specctl.bench/v1`` schema.

Shared by the simulator and the live-server benchmark: the inputs are arrays of arrival, first
token and finish times plus token counts, and run totals; nothing simulator-specific.

Definitions:
- latency: finish - arrival; TTFT: first token - arrival; TPOT: (finish - first token) /
  (output tokens - 1) over requests with more than one output token;
- goodput_tok_s: generated tokens per second of engine busy time (SmartSpec's goodput: tokens per
  second of execution; equal to throughput when the engine never idles);
- throughput_tok_s: generated tokens per second of wall time from the first arrival to the last finish;
- slo_attainment: share of requests meeting both the TTFT and the TPOT target;
- acceptance_rate: accepted / verified draft tokens; spec_step_share: decode steps with any k > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROW_KEYS = ("policy", "load", "seed", "mean_latency_s", "p50_latency_s", "p99_latency_s", "ttft_s", "tpot_s",
            "goodput_tok_s", "slo_attainment", "acceptance_rate", "spec_step_share")


@dataclass(frozen=True, slots=True)
class SLOTargets:
    ttft_s: float = 2.0
    tpot_ms: float = 100.0


def run_row(policy: str, load: float, seed: int, arrival, first, finish, output_tokens, *, busy_s: float,
            verified: int = 0, accepted: int = 0, decode_steps: int = 0, spec_steps: int = 0,
            slo: SLOTargets | None = None, k_hist=None, extra: dict | None = None) -> dict:
    slo = slo or SLOTargets()
    arrival = np.asarray(arrival, dtype=np.float64)
    first = np.asarray(first, dtype=np.float64)
    finish = np.asarray(finish, dtype=np.float64)
    out = np.asarray(output_tokens, dtype=np.float64)
    ok = np.isfinite(finish)
    lat = (finish - arrival)[ok]
    ttft = (first - arrival)[ok]
    multi = ok & (out > 1)
    tpot = ((finish - first)[multi] / (out[multi] - 1.0))
    tpot_all = np.where(out > 1, (finish - first) / np.maximum(out - 1.0, 1.0), 0.0)[ok]
    meets = (ttft <= slo.ttft_s) & (tpot_all * 1000.0 <= slo.tpot_ms)
    tokens = float(out[ok].sum())
    span = float(finish[ok].max() - arrival.min()) if ok.any() else 0.0
    row = {
        "policy": policy,
        "load": round(float(load), 4),
        "seed": int(seed),
        "mean_latency_s": _f(lat.mean() if lat.size else np.nan),
        "p50_latency_s": _f(np.percentile(lat, 50) if lat.size else np.nan),
        "p99_latency_s": _f(np.percentile(lat, 99) if lat.size else np.nan),
        "ttft_s": _f(ttft.mean() if ttft.size else np.nan),
        "tpot_s": _f(tpot.mean() if tpot.size else np.nan),
        "goodput_tok_s": _f(tokens / busy_s if busy_s > 0 else np.nan),
        "slo_attainment": _f(meets.mean() if meets.size else np.nan),
        "acceptance_rate": _f(accepted / verified if verified else np.nan),
        "spec_step_share": _f(spec_steps / decode_steps if decode_steps else 0.0),
    }
    ext = {
        "p99_ttft_s": _f(np.percentile(ttft, 99) if ttft.size else np.nan),
        "throughput_tok_s": _f(tokens / span if span > 0 else np.nan),
        "completed": int(ok.sum()),
        "requests": int(arrival.size),
    }
    if k_hist is not None:
        kh = np.asarray(k_hist, dtype=np.float64)
        ext["k_hist"] = [int(x) for x in kh]
        ext["mean_k"] = _f(float((kh * np.arange(kh.size)).sum() / kh.sum()) if kh.sum() else 0.0)
    if extra:
        ext.update(extra)
    row["extra"] = ext
    return row


def _f(x) -> float | None:
    x = float(x)
    return round(x, 6) if np.isfinite(x) else None


def sum_counts(docs) -> dict[str, int]:
    """Name -> count maps added up (replicas of one fleet, repeats of one run), names in first-seen order."""
    out: dict[str, int] = {}
    for doc in docs:
        for name, n in doc.items():
            out[name] = out.get(name, 0) + int(n)
    return out
