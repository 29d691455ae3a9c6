"""Issue 21's replay bar: adaptive against the best fixed configuration on exact replays of the CPU pair.

For each batch size, every fixed configuration (no speculation, and fixed k = 1..max_k with each
recorded drafter) and ``adaptive`` run on the same record (``specctl record-acceptance``) with a
measured profile's step times; the best fixed configuration is chosen in hindsight per batch size.
Tokens per modelled second = generated tokens / the simulator's busy time. The replay is exact and
deterministic: a second run prints the same table. ``--seeds N`` runs each policy with policy seeds
0..N-1 (its exploration draws) and reports the mean ratio and the worst seed: one seed hid a seed
at 0.80 of the best fixed configuration (docs/validation.md, "The full pair's replay").
``--orders N`` also serves the requests in N - 1 fixed permutations of the record's order, each against
its own best fixed configuration: one arrival order's mean over seeds still rests on one path (which
request comes first decides what the drafter choice learns first; docs/validation.md, "Stop 57").
``--repeat N`` serves the record's requests N times over: a longer run of the same workload, over
which what exploring costs grows slower than the run. ``--breakdown`` adds where each run's busy time
went, for the best fixed configuration and each policy's seed 0: prefill iterations and their time (draft prefill included), decode steps and theirs.
Without chunked prefill the engine runs a prefill iteration at each step where a request finished,
so a policy that spreads finishing times pays the target's per-pass constant more often.

    python benchmarks/replay_bar.py --record control/bench/data/replay-stdlib-quick.npz \
        --profile profiles/cpu/stdlib-quick.yaml [--batches 1,4,16,32] [--policies adaptive,adaptive@ngram]
    python benchmarks/replay_bar.py --record control/bench/data/replay-stdlib-full.npz \
        --profile profiles/cpu/stdlib-full.yaml        # the full pair (or profiles/h100/stdlib-full.yaml)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECORD = ROOT / "control" / "bench" / "data" / "replay-stdlib-quick.npz"
DEFAULT_PROFILE = ROOT / "profiles" / "cpu" / "stdlib-quick.yaml"
BAR = 1.00
ORDER_SEED = 100  # arrival order i >= 1 is the permutation of the record drawn with seed ORDER_SEED + i


def arrival_orders(n_rows: int, repeat: int, orders: int) -> list:
    """(n * repeat,) record rows in arrival order for each of ``orders`` orders: the record's own order
    first, then fixed permutations of it (``ORDER_SEED`` + i), each served ``repeat`` times over."""
    import numpy as np

    own = np.arange(n_rows)
    perms = [own] + [np.random.default_rng(ORDER_SEED + i).permutation(n_rows) for i in range(1, orders)]
    return [np.tile(p, repeat) for p in perms]


def bar_rows(record, profile, batches: list[int], policies: list[str], progress=None, seeds: int = 1,
             plan_profile=None, repeat: int = 1, orders: int = 1) -> list[dict]:
    """Per batch: every fixed configuration and each policy at policy seeds 0..seeds-1 (mean ratio
    ``vs_best``, worst seed ``vs_best_min``; ``mean_k`` of seed 0). ``plan_profile``: the policies'
    plans come from it instead of ``profile`` (the clock); fixed configurations need no prices.
    ``repeat``: the record's requests arrive that many times over, in the same order (a longer run of
    the same workload; per-request state starts afresh each time, pooled state carries on).
    ``orders``: also in that many arrival orders (``arrival_orders``), each against the best fixed
    configuration of its own order; the mean and the worst are then over orders x seeds, and the
    other fields are the record's own order's."""
    from control.bench.replay import fixed_configs, replay_run, tokens_per_s

    rows = []
    for b in batches:
        t0 = time.perf_counter()
        per_order = []
        for order in arrival_orders(record.n, repeat, orders):
            fixed, results = {}, {}
            for spec in fixed_configs(record):
                results[spec] = replay_run(record, profile, spec, b, rows=order)
                fixed[spec] = tokens_per_s(results[spec])
            best = max(fixed, key=fixed.get)
            runs = {pol: [replay_run(record, profile, pol, b, seed=s, plan_profile=plan_profile, rows=order)
                          for s in range(seeds)] for pol in policies}
            per_order.append((fixed, results, best, runs))
        fixed, results, best, runs = per_order[0]
        row = {"batch": b, "none": fixed["none"], "best_fixed": best, "best_fixed_tok_s": fixed[best], "fixed": fixed,
               "best_fixed_split": busy_split(results[best]), "best_fixed_by_order": [o[2] for o in per_order]}
        for pol in policies:
            ratios = [tokens_per_s(r) / f[bf] for f, _, bf, rr in per_order for r in rr[pol]]  # order-major
            first = runs[pol][0]
            mean_k = float((first.k_hist * range(first.k_hist.size)).sum() / max(first.k_hist.sum(), 1))
            row[pol] = {"tok_s": sum(tokens_per_s(r) for r in runs[pol]) / seeds, "vs_best": sum(ratios) / len(ratios),
                        "vs_best_min": min(ratios), "per_seed": ratios, "mean_k": mean_k, "split": busy_split(first)}
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        if progress:
            progress(f"batch {b}: {(len(fixed) + len(policies) * seeds) * orders} runs in {row['wall_s']:.1f} s")
    return rows


def busy_split(res) -> dict:
    """Where a run's busy time went: prefill iterations (draft prefill included) and decode steps."""
    return {"busy_s": res.busy_s, "prefill_iters": res.steps - res.decode_steps,
            "prefill_s": res.busy_s - res.decode_busy_s, "decode_steps": res.decode_steps, "decode_s": res.decode_busy_s}


def breakdown(rows: list[dict], policies: list[str]) -> str:
    """Per batch, the best fixed configuration's and each policy's (seed 0) busy-time split."""
    head = ["batch", "run", "busy s", "prefill iterations", "prefill s", "decode steps", "decode s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        for name, sp in [(r["best_fixed"], r["best_fixed_split"])] + [(p, r[p]["split"]) for p in policies]:
            lines.append(f"| {r['batch']} | {name} | {sp['busy_s']:.2f} | {sp['prefill_iters']} | {sp['prefill_s']:.2f} | "
                         f"{sp['decode_steps']} | {sp['decode_s']:.2f} |")
    return "\n".join(lines)


def markdown(rows: list[dict], policies: list[str], seeds: int = 1, orders: int = 1) -> str:
    runs = seeds * orders
    over = f"{seeds} seeds" if orders == 1 else f"{orders} orders x {seeds} seed" + ("s" if seeds > 1 else "")
    head = ["batch", "none tok/s", "best fixed", "best fixed tok/s"]
    for p in policies:
        head += [f"{p} tok/s", f"{p} / best fixed"] + ([f"{p} worst of {over}"] if runs > 1 else [])
        head += [f"{p} mean k"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["batch"]), f"{r['none']:.0f}", r["best_fixed"], f"{r['best_fixed_tok_s']:.0f}"]
        for p in policies:
            cells += [f"{r[p]['tok_s']:.0f}", f"{r[p]['vs_best']:.3f}"]
            cells += [f"{r[p]['vs_best_min']:.3f}"] if runs > 1 else []
            cells += [f"{r[p]['mean_k']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", default=str(DEFAULT_RECORD), help="replay record (.npz) from specctl record-acceptance")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE), help="measured profile of the same pair")
    ap.add_argument("--plan-profile", help="compile the policies' plans from this profile instead (e.g. one "
                                           "measured under load): how well the policy corrects a stale profile "
                                           "online, on the --profile clock")
    ap.add_argument("--batches", default="1,4,16,32", help="batch sizes (default 1,4,16,32)")
    ap.add_argument("--policies", default="adaptive", help="policies compared to the best fixed (default adaptive; "
                                                            "POLICY@D1+D2 restricts its drafters)")
    ap.add_argument("--seeds", type=int, default=1, help="policy seeds per policy, 0..N-1 (default 1): the mean "
                                                          "ratio and the worst seed")
    ap.add_argument("--repeat", type=int, default=1, help="serve the record's requests this many times over "
                                                           "(default 1): how the ratio moves with the run's length")
    ap.add_argument("--orders", type=int, default=1, help="arrival orders (default 1, the record's own): the "
                                                           "record's order, then fixed permutations of it, each "
                                                           "against its own best fixed configuration")
    ap.add_argument("--breakdown", action="store_true", help="also print where each run's busy time went "
                                                                 "(prefill iterations, decode steps)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        print(f"--seeds {args.seeds}: give at least 1 policy seed", file=sys.stderr)
        return 2
    if args.orders < 1:
        print(f"--orders {args.orders}: give at least 1 (the record's own arrival order)", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"--repeat {args.repeat}: give at least 1 (each request of the record once)", file=sys.stderr)
        return 2

    from control.bench.replay import ReplayRecord
    from control.errors import SpecctlError
    from control.profile import load_profile

    try:
        batches = [int(x) for x in args.batches.split(",")]
        if any(b < 1 for b in batches):
            raise ValueError
    except ValueError:
        print(f"--batches {args.batches!r}: write positive integers, e.g. 1,4,16,32", file=sys.stderr)
        return 2
    policies = [p for p in args.policies.split(",") if p]
    try:
        record = ReplayRecord.load(args.record)
        profile = load_profile(args.profile)
        planned = load_profile(args.plan_profile) if args.plan_profile else None
        rows = bar_rows(record, profile, batches, policies, progress=lambda m: print(m, file=sys.stderr),
                        seeds=args.seeds, plan_profile=planned, repeat=args.repeat, orders=args.orders)
    except SpecctlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"record: {record.engine}, prompt set {record.prompt_set}, {record.n} requests x "
          f"{int(record.output_tokens.max())} tokens" + (f", served {args.repeat} times over" if args.repeat > 1 else "")
          + f", drafters {', '.join(record.drafters)}, max_k {record.max_k}; "
          f"profile {profile.sku}/{profile.pair}" + (f"; plans from {args.plan_profile}" if args.plan_profile else ""))
    if args.orders > 1:
        print(f"arrival orders: the record's own and {args.orders - 1} permutations (seeds {ORDER_SEED + 1}.."
              f"{ORDER_SEED + args.orders - 1}); ratios against each order's own best fixed configuration")
    print(markdown(rows, policies, args.seeds, args.orders))
    if args.breakdown:
        print("\nbusy time, best fixed and each policy's seed 0:")
        print(breakdown(rows, policies))
    runs = args.seeds * args.orders
    over = (f", mean of {args.seeds} seeds" if args.orders == 1 else f", mean of {args.orders} orders x {args.seeds} seed" + ("s" if args.seeds > 1 else "")) if runs > 1 else ""
    for p in policies:
        ok = all(r[p]["vs_best"] >= BAR for r in rows)
        print(f"bar ({p} / best fixed >= {BAR:.2f} at every batch{over}): {'met' if ok else 'not met'}")
        if runs > 1:
            worst = min(r[p]["vs_best_min"] for r in rows)
            print(f"  every {'seed' if args.orders == 1 else 'order and seed'}: {'met' if worst >= BAR else 'not met'} (worst {worst:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
