"""Mooncake switch-off: does adaptive keep speculating at batch sizes where a short-context policy
switches speculation off, and does it win there? (issue 4; docs/sim-results.md, Mooncake section)

The short-context baseline is what users deploy: a fixed draft length switched off above a batch
size (TensorRT-LLM's max_concurrency, vLLM's disable_by_batch_size), both set from a short-context
(ShareGPT) view of the cost model (``control/bench/switchoff.py``); it runs as the existing policy
``static-schedule:N=K``. ``--survey`` prints, for the catalog's SKU / model / TP candidates, whether a
Mooncake batch can reach that N at all and whether speculation still pays beyond it at Mooncake's
contexts (the reasoning behind the default profile); the run prints mean latency per load and the
speculative-step share by batch size, and writes JSON.

    SPECCTL_WORKLOADS=... python benchmarks/sim_switch_off.py --survey
    SPECCTL_WORKLOADS=... python benchmarks/sim_switch_off.py --out runs/sim-switch-off \
        --loads 0.5,0.8,1.0,1.15,1.3 --seeds 3 --requests 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_long_context import run_recording  # noqa: E402

from control.bench import report  # noqa: E402
from control.bench.simrun import SimSetup, measure_capacity, result_row, workload_at  # noqa: E402
from control.bench.switchoff import (  # noqa: E402
    breakeven_batch,
    decode_ctx,
    kv_batch_reach,
    short_context_switch_off,
)
from control.bench.workloads import load_workload  # noqa: E402
from control.profile import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles/h200/llama-3.1-70b+eagle3-llama-3.1-70b.tp8-fp8.yaml"
BASELINE = "switch-off"  # placeholder in --policies for the computed static-schedule:N=K
POLICIES = ("none", "fixed:3", "fixed:4", BASELINE, "static-schedule", "smartspec", "adaptive")
# (sku, target, draft, tp, fp8): the catalog's pairs at the TPs that fit, bf16 and fp8
SURVEY = [(s, "llama-3.1-8b", d, 1, f) for s in ("h100", "h200", "b200", "a100")
          for d in ("llama-3.2-1b", "eagle3-llama-3.1-8b") for f in (False, True) if not (f and s == "a100")]
SURVEY += [(s, "llama-3.1-70b", d, tp, f) for s in ("h100", "h200", "b200", "a100")
           for d in ("llama-3.2-1b", "eagle3-llama-3.1-70b") for tp in (4, 8) for f in (False, True)
           if not (f and s == "a100")]


def survey(long_wl, short_ctx: float, requests: int) -> None:
    """Per candidate: KV capacity, the batch a saturated Mooncake reaches, the short-context switch-off
    point, and whether the same k still pays above it at Mooncake's mean decode context."""
    from control.buildsys.roofline import roofline_profile

    head = long_wl.head(requests)
    lctx = decode_ctx(head)
    print(f"short context (ShareGPT decode mean) {short_ctx:.0f} tokens; Mooncake first {requests}: decode mean "
          f"{lctx:.0f} tokens\n")
    print("| SKU | target + draft | TP | precision | a_draft / a_target | KV tokens | Mooncake batch reach | "
          "short-ctx k | off above N | threshold_batch | k pays at Mooncake ctx up to | reached? | pays beyond N? |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for sku, target, draft, tp, fp8 in SURVEY:
        try:
            prof = roofline_profile(sku, target, [draft], tp, fp8=fp8)
        except Exception as e:  # noqa: BLE001 - a configuration that does not fit is reported, not fatal
            print(f"| {sku} | {target} + {draft} | {tp} | {'fp8' if fp8 else 'bf16'} | - | - | - | - | - | - | - | "
                  f"does not fit: {e} | - |")
            continue
        acc = SimSetup(prof, head).plan().prior_rate()
        so = short_context_switch_off(prof, short_ctx, acc)
        cost = prof.step_cost([prof.drafter_names[0]])
        reach = kv_batch_reach(prof, head)
        mb = prof.limits.max_batch
        n_long = breakeven_batch(cost, lctx, acc, so.k, mb) if so.k else 0
        n = so.max_concurrency
        reached = n is not None and n < reach
        beyond = n is not None and (n_long is None or n_long > n)
        ratio = cost.drafters[0].model.a / cost.target.a
        print(f"| {sku} | {target} + {draft} | {tp} | {'fp8' if fp8 else 'bf16'} | {ratio:.2f} | "
              f"{prof.limits.kv_tokens} | {reach:.0f} | {so.k} | {_upto(n, mb)} | {_upto(so.threshold, mb)} | {_upto(n_long, mb)} | "
              f"{'yes' if reached else 'no'} | {'yes' if beyond else 'no'} |", flush=True)


def _upto(batch: int | None, max_batch: int) -> str:
    return f"> {max_batch}" if batch is None else str(batch)


def _rel(path: str) -> str:
    """A profile path as the report records it: relative to the repository where it lies inside."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name


def step_buckets(steps: list[int], k: np.ndarray, edges: list[int]):
    """Per batch-size bucket (edges[i-1] < n <= edges[i]): decode steps, and the share of them in which
    at least one request drafts."""
    n = np.asarray(steps, dtype=np.int64)
    if n.size == 0:
        z = np.zeros(len(edges) - 1)
        return z, z
    starts = np.concatenate(([0], np.cumsum(n)[:-1]))
    spec = np.maximum.reduceat((k > 0).astype(np.int64), starts) > 0
    b = np.searchsorted(edges, n, side="left") - 1
    cnt = np.bincount(b, minlength=len(edges) - 1).astype(np.float64)
    on = np.bincount(b, weights=spec, minlength=len(edges) - 1)
    return cnt, on


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(PROFILE))
    ap.add_argument("--workload", default="mooncake")
    ap.add_argument("--short-workload", default="sharegpt", help="where the baseline's switch-off point comes from")
    ap.add_argument("--loads", default="0.5,0.8,1.0,1.15,1.3")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"'{BASELINE}' is the computed baseline")
    ap.add_argument("--capacity", type=float, default=None, help="no-speculation capacity in req/s (default: measure)")
    ap.add_argument("--out", default="runs/sim-switch-off")
    ap.add_argument("--survey", action="store_true", help="print the configuration survey and exit")
    args = ap.parse_args()
    short_ctx = decode_ctx(load_workload(args.short_workload, requests=None))
    base = load_workload(args.workload, requests=None)
    if args.survey:
        survey(base, short_ctx, args.requests)
        return
    t0 = time.perf_counter()
    prof = load_profile(args.profile)
    setup = SimSetup(prof, base)
    acc = setup.plan().prior_rate()
    so = short_context_switch_off(prof, short_ctx, acc, max_k=setup.max_k)
    policies = [so.spec if p == BASELINE else p for p in args.policies.split(",")]
    cap = args.capacity or measure_capacity(setup)
    mb = prof.limits.max_batch
    n_off = so.max_concurrency or mb
    edges = sorted({0, 32, 64, 128, n_off, mb} - {x for x in (32, 64, 128) if x >= mb})
    names = [f"{edges[i] + 1}-{edges[i + 1]}" for i in range(len(edges) - 1)]
    print(f"{prof.sku}/{prof.pair} ({_rel(args.profile)}); {setup.workload.describe()}")
    print(f"capacity {cap:.3f} req/s (no speculation); acceptance prior {acc:.2f}; short context {so.ctx:.0f} tokens: "
          f"k = {so.k}, off above batch {so.max_concurrency} -> baseline {so.spec} "
          f"(threshold_batch there: {so.threshold}); {args.requests} requests, seeds 0..{args.seeds - 1}\n", flush=True)
    rows, lat = [], {}
    steps_b: dict = {}
    for load in (float(x) for x in args.loads.split(",")):
        for seed in range(args.seeds):
            w = workload_at(setup, load * cap, args.requests, seed)
            for pol in policies:
                steps: list[int] = []
                t = time.perf_counter()
                res, _, k = run_recording(setup, w, pol, seed, steps=steps)
                cnt, on = step_buckets(steps, k, edges)
                row = result_row(setup, res, load, seed, {
                    "sim_wall_s": round(time.perf_counter() - t, 3), "rate_req_s": round(load * cap, 5),
                    "steps_by_batch": dict(zip(names, cnt.astype(int).tolist(), strict=True)),
                    "spec_steps_by_batch": dict(zip(names, on.astype(int).tolist(), strict=True))})
                rows.append(row)
                lat.setdefault((load, pol), []).append(row["mean_latency_s"])
                acc_b = steps_b.setdefault((load, pol), [np.zeros(len(names)), np.zeros(len(names))])
                acc_b[0] += cnt
                acc_b[1] += on
            print(f"load {load:g} seed {seed} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    loads = sorted({lo for lo, _ in lat})
    ref = so.spec
    print("\nMean latency s (mean over seeds); last columns: adaptive / baseline, adaptive / best fixed k\n")
    print("| load | " + " | ".join(policies) + " | adaptive / baseline | adaptive / best fixed |")
    print("|---|" + "---|" * (len(policies) + 2))
    for lo in loads:
        m = {p: float(np.mean(lat[(lo, p)])) for p in policies}
        fixed = [p for p in policies if p.startswith("fixed:")]
        best = min(fixed, key=lambda p: m[p]) if fixed else None
        a = m.get("adaptive")
        r1 = f"{a / m[ref]:.3f}" if a is not None and ref in m else "-"
        r2 = f"{a / m[best]:.3f} ({best})" if a is not None and best else "-"
        print(f"| {lo:g} | " + " | ".join(f"{m[p]:.2f}" for p in policies) + f" | {r1} | {r2} |")
    print(f"\nSpeculative-step share by batch size (steps in the bucket, all seeds); baseline {ref} is off above {n_off}\n")
    show = [p for p in (ref, "static-schedule", "smartspec", "adaptive") if p in policies]
    print("| load | policy | " + " | ".join(f"batch {n}" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for lo in loads:
        for p in show:
            cnt, on = steps_b[(lo, p)]
            cells = [f"{on[i] / cnt[i]:.0%} of {int(cnt[i])}" if cnt[i] else "-" for i in range(len(names))]
            print(f"| {lo:g} | {p} | " + " | ".join(cells) + " |")
    meta = {"profile": _rel(args.profile), "workload": args.workload, "capacity_req_s": cap,
            "requests_per_run": args.requests, "seeds": args.seeds,
            "baseline": {"spec": so.spec, "short_workload": args.short_workload, "short_ctx": round(so.ctx, 1),
                         "acceptance": acc, "k": so.k, "max_concurrency": so.max_concurrency,
                         "threshold_batch": so.threshold},
            "batch_buckets": names, "wall_s": round(time.perf_counter() - t0, 1)}
    out = Path(args.out)
    path = report.write_json(out / f"{prof.sku}-{args.workload}-switch-off.json", rows, meta)
    print(f"\nwrote {path} ({meta['wall_s']} s)")


if __name__ == "__main__":
    main()
