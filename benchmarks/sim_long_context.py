"""Long-context diagnosis for the simulator bar: how each policy's k depends on a request's context
length, and who pays for it in latency (docs/sim-results.md, Mooncake section).

Per policy, on one workload at the given loads and seeds (runs of ``benchmarks/sim_bar.py``'s setup):
mean k by context-length bucket (over request-steps), and mean latency by prompt-length quartile.

``--weighted`` adds ``adaptive-weighted``: adaptive whose optimiser values a request's expected
tokens by that request's own per-step residence cost (its KV read a * ctx + one verify token + its
share of the pass's fixed cost) relative to the batch mean. It is a proposal evaluated here, not a
policy of the project: an accepted token of a long-context request saves one future step in which
that request's whole KV is read again, so it is worth more than a token of a short request, while
the per-step objective (n + sum p) / T counts every token alike.

    SPECCTL_WORKLOADS=... python benchmarks/sim_long_context.py --pair h100-8b --workload mooncake \
        --loads 0.5,0.9 --seeds 0,1,2 --requests 300 --weighted
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from control.bench import simrun  # noqa: E402
from control.bench.simrun import SimSetup, measure_capacity, workload_at  # noqa: E402
from control.bench.workloads import load_workload  # noqa: E402
from control.profile import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {
    "h100-8b": ROOT / "profiles/h100/llama-3.1-8b+llama-3.2-1b.yaml",
    "a100-7b": ROOT / "profiles/a100/llama-2-7b+llama-160m.yaml",
}
CTX_EDGES = (0, 2000, 4000, 8000, 16000, 32000, 64000, 1 << 40)
WEIGHTED = "adaptive-weighted"


@contextmanager
def weighted_adaptive():
    """Adaptive with residence-cost-weighted token values (see the module doc), for this block only."""
    import control.goodput.optimizer as adaptive_mod  # adaptive calls admit_parametric through this module

    orig = adaptive_mod.admit_parametric

    def admit(cost, ctx, surv, cap, cons, drafter=None, lag=None, g0=None, **kw):
        ctx = np.asarray(ctx, dtype=np.float64)
        t = cost.target
        own = t.a * ctx + t.b + t.d + (t.c + cost.overhead_ms) / max(ctx.shape[0], 1)
        w = own / own.mean()
        # g0 is the previous step's unweighted goodput scale: start the Dinkelbach iteration afresh
        return orig(cost, ctx, surv * w[:, None], cap, cons, drafter=drafter, lag=lag, g0=None, **kw)

    adaptive_mod.admit_parametric = admit
    try:
        yield
    finally:
        adaptive_mod.admit_parametric = orig


def run_recording(setup: SimSetup, w, spec: str, seed: int, pred: list | None = None, steps: list | None = None):
    """Run ``spec`` and record every decode step's (context lengths, chosen k); with ``pred``, also
    append (predicted step ms, simulated step ms, predicted tokens, generated tokens) per step where
    the policy made a prediction; with ``steps``, append each recorded step's batch size (the
    returned arrays split into steps at its cumulative sums)."""
    ctxs, ks = [], []
    orig = simrun.make_policy
    last = {}

    def make(s, plan, engine, sd, *more):  # make_policy's own arguments, whatever they grow to
        pol = orig(s, plan, engine, sd, *more)
        decide, observe = pol.decide, pol.observe

        def recording(view):
            d = decide(view)
            if view.n:
                ctxs.append(view.ctx_lens.copy())
                ks.append(np.asarray(d.k, dtype=np.int64).copy())
                if steps is not None:
                    steps.append(view.n)
                last["d"] = d
            return d

        def observing(outcome):
            d = last.pop("d", None)
            if pred is not None and d is not None and np.isfinite(d.predicted_step_ms) and np.isfinite(d.predicted_tokens):
                pred.append((d.predicted_step_ms, outcome.draft_ms + outcome.verify_ms, d.predicted_tokens,
                             float(outcome.accepted.sum() + outcome.n)))
            observe(outcome)

        pol.decide, pol.observe = recording, observing
        return pol

    simrun.make_policy = make
    try:
        if spec == WEIGHTED:
            with weighted_adaptive():
                res = simrun.run_policy(setup, w, "adaptive", seed)
        else:
            res = simrun.run_policy(setup, w, spec, seed)
    finally:
        simrun.make_policy = orig
    # the engine clips k to remaining - 1 and the budget; the decision is what the policy wanted
    empty = np.zeros(0, dtype=np.int64)  # ``none`` never asks the policy (the engine fast-forwards)
    return res, np.concatenate(ctxs) if ctxs else empty, np.concatenate(ks) if ks else empty


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="h100-8b", choices=sorted(PAIRS))
    ap.add_argument("--workload", default="mooncake")
    ap.add_argument("--loads", default="0.5,0.9")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--policies", default="fixed:3,smartspec,adaptive,rate-oracle,oracle")
    ap.add_argument("--weighted", action="store_true", help=f"also run {WEIGHTED} (a proposal; see the module doc)")
    ap.add_argument("--capacity", type=float, default=None, help="no-speculation capacity in req/s (default: measure)")
    args = ap.parse_args()
    prof = load_profile(PAIRS[args.pair])
    base = load_workload(args.workload, requests=None if args.workload in ("azure-conv", "mooncake") else args.requests)
    setup = SimSetup(prof, base)
    cap = args.capacity or measure_capacity(setup)
    policies = args.policies.split(",") + ([WEIGHTED] if args.weighted else [])
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{args.pair} {args.workload}: capacity {cap:.3f} req/s, {args.requests} requests per run, seeds {seeds}\n")
    for load in (float(x) for x in args.loads.split(",")):
        kc = {p: [np.zeros(len(CTX_EDGES) - 1), np.zeros(len(CTX_EDGES) - 1)] for p in policies}
        lat = {p: [] for p in policies}
        quart = {p: np.zeros(4) for p in policies}
        preds: dict[str, list] = {}
        for seed in seeds:
            w = workload_at(setup, load * cap, args.requests, seed)
            q = np.quantile(w.prompt_tokens, [0.25, 0.5, 0.75])
            qi = np.searchsorted(q, w.prompt_tokens, side="left")
            for p in policies:
                res, ctx, k = run_recording(setup, w, p, seed, preds.setdefault(p, []))
                b = np.searchsorted(CTX_EDGES, ctx, side="right") - 1
                kc[p][0] += np.bincount(b, weights=k, minlength=len(CTX_EDGES) - 1)
                kc[p][1] += np.bincount(b, minlength=len(CTX_EDGES) - 1)
                L = res.finish_s - res.arrival_s
                lat[p].append(float(L.mean()))
                quart[p] += np.array([L[qi == i].mean() for i in range(4)]) / len(seeds)
        have = kc[policies[0]][1] > 0
        names = [f"{CTX_EDGES[i] // 1000}k-{CTX_EDGES[i + 1] // 1000}k" if CTX_EDGES[i + 1] < (1 << 40)
                 else f">{CTX_EDGES[i] // 1000}k" for i in range(len(CTX_EDGES) - 1)]
        ref = "fixed:3" if "fixed:3" in policies else policies[0]
        print(f"### load {load:g}\n")
        print("| policy | mean lat s | vs " + ref + " | " + " | ".join(f"k @ ctx {n}" for n, h in zip(names, have, strict=True) if h)
              + " | lat by prompt quartile s (Q1..Q4) |")
        print("|---|---|---|" + "---|" * int(have.sum()) + "---|")
        for p in policies:
            s, c = kc[p]
            ks = " | ".join(f"{s[i] / c[i]:.2f}" if c[i] else "-" for i in range(len(names)) if have[i])
            m = float(np.mean(lat[p]))
            print(f"| {p} | {m:.3f} | {m / np.mean(lat[ref]):.3f} | {ks} | {' / '.join(f'{x:.2f}' for x in quart[p])} |")
        for p in policies:
            a = np.array(preds.get(p) or [], dtype=np.float64)
            if a.size:
                print(f"{p}: predicted / simulated step time {a[:, 0].sum() / a[:, 1].sum():.3f} "
                      f"(median per step {np.median(a[:, 0] / a[:, 1]):.3f}), predicted / generated tokens "
                      f"{a[:, 2].sum() / a[:, 3].sum():.3f}, over {len(a)} steps")
        print(flush=True)


if __name__ == "__main__":
    main()
