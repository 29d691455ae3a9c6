"""How much a request's last draft run says about its next one, on a replay record, and what following it could give.

Walks every recorded request at a fixed draft length k on one drafter (each step drafts k, keeps the
record's run, moves on by run + 1) and tabulates the next run by the last one: the streakiness a
posterior that counts all of a request's steps alike cannot follow. Then an upper bound on following
it: a lockstep batch (continuous admission, the profile's target and draft costs, draft passes shared by
the batch: max k of them) with k chosen in hindsight per state (last run full or not), against the best
fixed k in the same model. docs/validation.md, "Stop 46".

    python benchmarks/replay_streaks.py --record control/bench/data/replay-stdlib-full.npz \
        --profile profiles/cpu/stdlib-full.yaml --drafter draft-tiny --k 6 --batches 1,4,16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FULL, SHORT, NEW = 1, 0, -1  # a request's state: its last run was full, shorter, or it has none yet


def walk(lead: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps,) last run and (steps,) next run over every request's walk at draft length ``k``
    (``lead`` (requests, positions): the record's run at each output position)."""
    last, nxt = [], []
    for row in lead:
        p, prev = 0, None
        while p < row.size:
            run = min(int(row[p]), k)
            if prev is not None:
                last.append(prev)
                nxt.append(run)
            prev, p = run, p + run + 1
    return np.array(last), np.array(nxt)


def lockstep(lead: np.ndarray, prompt: np.ndarray, costs: dict, batch: int, k_short: int, k_full: int) -> float:
    """Tokens per ms of a lockstep batch drafting ``k_full`` after a full run and ``k_short`` otherwise."""
    t, d = costs["target"], costs["draft"]
    queue, active, tokens, ms = list(range(lead.shape[0])), [], 0, 0.0
    while queue or active:
        while len(active) < batch and queue:
            active.append([queue.pop(0), 0, NEW])
        ks = np.array([k_full if a[2] == FULL else k_short for a in active])  # (n,)
        ctx = np.array([prompt[a[0]] + a[1] for a in active], dtype=np.float64)  # (n,)
        n, passes = len(active), int(ks.max())
        ms += t.c_ms + t.b_ms_per_batched_token * float((ks + 1).sum()) + t.a_ms_per_ctx_token * float(ctx.sum())
        ms += passes * (d.c_ms + d.b_ms_per_batched_token * n + d.a_ms_per_ctx_token * float(ctx.sum()))
        for a, k in zip(active, ks, strict=True):
            run = min(int(lead[a[0], a[1]]), int(k))
            tokens += run + 1
            a[1] += run + 1
            a[2] = FULL if (k > 0 and run == k) else SHORT
        active = [a for a in active if a[1] < lead.shape[1]]
    return tokens / ms


def main() -> int:
    from control.bench.replay import ReplayRecord
    from control.errors import SpecctlError
    from control.profile import load_profile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", required=True, help="replay record (.npz) from specctl record-acceptance")
    ap.add_argument("--profile", required=True, help="measured profile of the same pair")
    ap.add_argument("--drafter", default="draft-tiny", help="a draft model of the record (default draft-tiny)")
    ap.add_argument("--k", type=int, default=6, help="draft length of the streak table's walk (default 6)")
    ap.add_argument("--batches", default="1,4,16", help="batch sizes of the bound (default 1,4,16)")
    a = ap.parse_args()
    try:
        batches = [int(x) for x in a.batches.split(",")]
        if any(b < 1 for b in batches):
            raise ValueError
    except ValueError:
        ap.error(f"--batches {a.batches!r}: write positive integers, e.g. 1,4,16")
    try:
        rec, prof = ReplayRecord.load(a.record), load_profile(a.profile)
        if a.drafter not in rec.drafters:
            ap.error(f"--drafter {a.drafter!r}: the record has {', '.join(rec.drafters)}")
        entry = prof.drafter(a.drafter)
    except SpecctlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if entry.model is None:
        ap.error(f"--drafter {a.drafter!r} is not a draft model: the bound prices draft passes")
    if not 1 <= a.k <= rec.max_k:
        ap.error(f"--k {a.k}: must be 1..{rec.max_k} (the record's max_k)")
    lead = rec.lead[:, :, rec.drafters.index(a.drafter)]  # (requests, positions)
    last, nxt = walk(lead, a.k)
    print(f"{a.drafter} at k = {a.k}: {last.size} request-steps, correlation of consecutive runs "
          f"{np.corrcoef(last, nxt)[0, 1]:.2f}")
    print("| last run | steps | mean next run | next run full |\n|---|---|---|---|")
    for v in range(a.k + 1):
        sel = last == v
        if sel.any():
            print(f"| {v} | {int(sel.sum())} | {nxt[sel].mean():.2f} | {(nxt[sel] == a.k).mean():.2f} |")
    costs = {"target": prof.models["target"], "draft": prof.models[entry.model]}
    K = rec.max_k
    print("\n| batch | best fixed k | tokens/ms | best k (short, full) | tokens/ms | ratio |\n|---|---|---|---|---|---|")
    for b in batches:
        fixed = {k: lockstep(lead, rec.prompt_tokens, costs, b, k, k) for k in range(1, K + 1)}
        kb = max(fixed, key=fixed.get)
        states = {(s, f): lockstep(lead, rec.prompt_tokens, costs, b, s, f)
                  for s in range(1, K + 1) for f in range(1, K + 1)}
        sb = max(states, key=states.get)
        print(f"| {b} | {kb} | {fixed[kb]:.4f} | {sb} | {states[sb]:.4f} | {states[sb] / fixed[kb]:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
