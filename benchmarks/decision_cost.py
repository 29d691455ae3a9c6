"""Decision cost per engine step vs the modelled step time (the fast loop must cost < 1% of a step).

    python benchmarks/decision_cost.py [--profile profiles/h100/llama-3.1-8b+llama-3.2-1b.yaml]
        [--batches 1,32,256] [--max-k 8] [--policies adaptive,smartspec,...] [--ctx 2048] [--stages]
        [--json OUT]

For each batch size it builds a realistic StepView (mixed contexts around --ctx, a mix of drafters,
some lagging requests), runs decide + observe on steady state for many steps, and reports the median
and p99 wall time next to the profile's predicted time for the step the policy chose. Timings on a
shared machine are noisy: the ratio is what matters and is measured in the same run.

``--stages`` also times the stages of ``adaptive``'s step (mean microseconds per step, by wrapping
the methods that hold them; the wrappers add about half a microsecond per call, so the stage timings
run separately from the totals above). ``adaptive`` runs its full decision every few steps and
learns the queued outcomes then (``control/policy/adaptive/held.py``): its work per step is uneven,
so the share is the amortised time per step over the step time: the median time of a step with a
full decision (one that predicts its step time) and of a step without, weighted by how often each
ran (medians, so that another job preempting this process moves neither; the plain mean and
median are printed beside it).

``--overlap`` also runs each policy with its work off the critical path, as an engine with an overlap
scheduler would: while step t runs (a sleep of the profile's predicted step time, which releases the
GIL as an engine thread waiting on the GPU does), a worker thread observes step t-1's outcome and
decides step t+1 (one step stale, ``control/policy/stale.py``). The on-path time is what the step
loop spends handing the work over and waiting for the decision after its step; the share is that
over the step time. The plain columns are the bar; these say what overlapping would leave.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from control.errors import ConfigError  # noqa: E402
from control.plan import compile_plan  # noqa: E402
from control.policy import StepOutcome, StepView, build_policy  # noqa: E402
from control.profile import load_profile  # noqa: E402
from control.profiler.grid import parse_int_list  # noqa: E402

# the clock the decide/observe timings read (``--clock``): wall time, or this thread's CPU time, which
# leaves out the time other jobs on a shared machine hold the CPU
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
DEFAULT_PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "h100" / "llama-3.1-8b+llama-3.2-1b.yaml"


# adaptive's stages: (stage, attribute path on the policy, or "module:function" in control.policy.adaptive)
STAGES = (
    ("survival", "acceptance.survival"), ("weights", "optimise:residence_weights"),
    ("optimiser", "optimise:optimizer_call"), ("cuts", "policy:confidence_cuts"), ("pace", "optimiser.note_pace"),
    ("tried", "_tried"), ("posteriors", "acceptance.learn_request"), ("estimators", "acceptance.learn_pooled"),
    ("refit", "_refit"),
    # the multi-drafter path (the drafter bandit): inside "decide other" / "observe other" otherwise
    ("assign", "choice.assign"), ("thompson", "choice.explore_probs"), ("exploit", "choice.exploit_best"),
    # SPIN's matching on measured rewards: only with drafter capacities
    ("rewards", "choice.rewards"), ("bandit update", "bandit.update"),
    # the fast path between full decisions (control/policy/adaptive/held.py)
    ("lookup", "held.lookup"),
)
BANDIT_STAGES = ("assign", "thompson", "exploit")  # only with several drafters
MATCHING_STAGES = ("rewards", "bandit update")  # only with several drafters that have capacities
NESTED_STAGES = ("thompson", "exploit")  # inside another stage ("assign"): not subtracted again for "other"


class StageTimer:
    """Accumulates wall time per stage within a step; ``step()`` closes the step's row."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self.now: dict[str, float] = {}
        self.rows: list[dict[str, float]] = []

    def wrap(self, stage: str, fn):
        def timed(*args, **kw):
            t0 = self.clock()
            try:
                return fn(*args, **kw)
            finally:
                self.now[stage] = self.now.get(stage, 0.0) + self.clock() - t0
        return timed

    def step(self) -> None:
        self.rows.append(self.now)
        self.now = {}


def instrument(pol, timer: StageTimer) -> list:
    """Wrap adaptive's stages on this policy instance (module functions: patched; undone by the
    returned callables)."""
    import importlib

    undo = []
    for stage, attr in STAGES:
        if ":" in attr:
            mod_name, fn = attr.split(":")
            mod = importlib.import_module(f"control.policy.adaptive.{mod_name}")
            orig = getattr(mod, fn)
            setattr(mod, fn, timer.wrap(stage, orig))
            undo.append(lambda m=mod, a=fn, o=orig: setattr(m, a, o))
            continue
        owner_name, _, leaf = attr.rpartition(".")
        owner = getattr(pol, owner_name, None) if owner_name else pol
        if owner is not None and hasattr(owner, leaf):
            setattr(owner, leaf, timer.wrap(stage, getattr(owner, leaf)))
    return undo


def bench(policy_name: str, plan, batch: int, ctx: int, steps: int, seed: int = 0, timer: StageTimer | None = None,
          clock=time.perf_counter) -> dict:
    rng = np.random.default_rng(seed)
    pol = build_policy(policy_name, plan, seed=seed)
    undo = instrument(pol, timer) if timer is not None else []
    drafters = tuple(plan.drafters)
    view = _steady_view(plan, batch, ctx, rng)
    rates = rng.uniform(0.3, 0.95, batch)
    decide_s, observe_s, step_ms, predicted = [], [], [], []
    cost = plan.profile.step_cost(list(drafters))
    for step in range(steps):
        view.step = step
        view.ctx_lens += 1
        t0 = clock()
        d = pol.decide(view)
        t1 = clock()
        out = _outcome(view, d, rates, rng, cost)
        t2 = clock()
        pol.observe(out)
        t3 = clock()
        decide_s.append(t1 - t0)
        observe_s.append(t3 - t2)
        if timer is not None:
            timer.now["decide"], timer.now["observe"] = t1 - t0, t3 - t2
            timer.step()
        step_ms.append(cost.step_ms(view.ctx_lens, d.k, np.maximum(d.drafter, 0)))
        predicted.append(d.predicted_step_ms)
        if timer is not None:
            timer.rows[-1]["full"] = float(np.isfinite(d.predicted_step_ms))
    for u in undo:
        u()
    warm = steps // 5
    dec = np.array(decide_s[warm:]) * 1e6
    obs = np.array(observe_s[warm:]) * 1e6
    total = dec + obs
    model_ms = float(np.median(step_ms[warm:]))
    full = np.isfinite(np.array(predicted[warm:]))  # steps with a full decision (a prediction)
    amortised = amortised_us(total, full)
    return {
        "policy": policy_name, "batch": batch, "decide_us_p50": float(np.median(dec)), "observe_us_p50": float(np.median(obs)),
        "decide_us_mean": float(dec.mean()), "observe_us_mean": float(obs.mean()),
        "total_us_p50": float(np.median(total)), "total_us_mean": float(total.mean()),
        "total_us_amortised": amortised, "total_us_p99": float(np.percentile(total, 99)), "modelled_step_ms": model_ms,
        "share_pct": amortised / (model_ms * 1000) * 100,
        "median_share_pct": float(np.median(total)) / (model_ms * 1000) * 100,
    }


def amortised_us(x: np.ndarray, full: np.ndarray) -> float:
    """Time per step of ``x`` (n,) amortised over full and held steps (``full`` (n,) bool): each
    kind's median weighted by its share of the steps."""
    parts = [(float(m.mean()), float(np.median(x[m]))) for m in (full, ~full) if m.any()]
    return sum(f * med for f, med in parts)


def _steady_view(plan, batch: int, ctx: int, rng) -> StepView:
    """The benchmark's batch: mixed contexts around ``ctx``, 10% of requests with a lagging draft."""
    m = len(plan.drafters)
    lag = np.zeros((batch, m), dtype=np.int64)
    ctx_lens = rng.integers(max(ctx // 4, 16), ctx * 2, batch)
    lag[rng.random(batch) < 0.1, 0] = 40
    return StepView.build(slots=np.arange(batch), request_ids=np.arange(batch), ctx_lens=ctx_lens,
                          remaining=np.full(batch, 10**6), drafters=tuple(plan.drafters), max_k=plan.max_k,
                          free_kv_slots=10**7, token_budget=10**7, draft_lag=lag)


def _outcome(view: StepView, d, rates: np.ndarray, rng, cost) -> StepOutcome:
    """The step's outcome: geometric acceptance at each request's rate, the profile's step times."""
    k = d.k
    acc = np.minimum(rng.geometric(1 - rates) - 1, k)
    verify_ms = float(cost.verify_ms(view.ctx_lens, k))
    draft_ms = float(cost.step_ms(view.ctx_lens, k, np.maximum(d.drafter, 0))) - verify_ms
    return StepOutcome(slots=view.slots, request_ids=view.request_ids, drafter=d.drafter, ctx_lens=view.ctx_lens,
                       drafted=k, verified=k, accepted=acc, verify_ms=verify_ms, draft_ms=draft_ms,
                       total_ms=verify_ms + draft_ms,
                       draft_passes=int(k.max(initial=0)), draft_ctx_tokens=int(view.ctx_lens.sum()),
                       draft_batched_tokens=int(k.sum()), step=view.step)


def bench_overlap(policy_name: str, plan, batch: int, ctx: int, steps: int, seed: int = 0) -> dict:
    """decide(t+1) and observe(t-1) on a worker thread while step t runs (module docstring)."""
    rng = np.random.default_rng(seed)
    pol = build_policy(policy_name, plan, seed=seed)
    cost = plan.profile.step_cost(list(plan.drafters))
    view = _steady_view(plan, batch, ctx, rng)
    rates = rng.uniform(0.3, 0.95, batch)
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()

    def work() -> None:
        while (job := jobs.get()) is not None:
            prev, nxt = job
            t0 = time.perf_counter()
            if prev is not None:
                pol.observe(prev)
            d = pol.decide(nxt)
            done.put((d, time.perf_counter() - t0))

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    d, prev = pol.decide(view), None  # the first decision, before any step
    on_path, off_path, step_ms = [], [], []
    for step in range(steps):
        nxt = StepView(**{f: getattr(view, f) for f in view.__slots__})
        nxt.ctx_lens, nxt.step = view.ctx_lens + 1, step + 1
        t_ms = cost.step_ms(view.ctx_lens, d.k, np.maximum(d.drafter, 0))
        t0 = time.perf_counter()
        jobs.put((prev, nxt))
        t1 = time.perf_counter()
        time.sleep(t_ms / 1e3)  # step t runs
        t2 = time.perf_counter()
        d_next, busy = done.get()
        t3 = time.perf_counter()
        prev = _outcome(view, d, rates, rng, cost)
        on_path.append((t1 - t0) + (t3 - t2))
        off_path.append(busy)
        step_ms.append(t_ms)
        d, view = d_next, nxt
    jobs.put(None)
    worker.join()
    warm = steps // 5
    on = float(np.median(on_path[warm:])) * 1e6
    model_ms = float(np.median(step_ms[warm:]))
    return {"policy": policy_name, "batch": batch, "on_path_us_p50": on,
            "on_path_us_p99": float(np.percentile(on_path[warm:], 99)) * 1e6,
            "off_path_us_p50": float(np.median(off_path[warm:])) * 1e6, "modelled_step_ms": model_ms,
            "on_path_share_pct": on / (model_ms * 1000) * 100}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--policies", default="adaptive,smartspec,turbospec,specserve,static-schedule,fixed:3")
    ap.add_argument("--stages", action="store_true", help="also time adaptive's stages (a separate pass)")
    ap.add_argument("--overlap", action="store_true",
                    help="also run each policy off the critical path (decision prepared during the step)")
    ap.add_argument("--overlap-steps", type=int, default=100, help="steps per --overlap run (each sleeps a step)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="time decide/observe by wall clock (default) or by this thread's CPU time (a shared machine)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    clock = CLOCKS[args.clock]
    try:
        batches = parse_int_list(args.batches, "--batches", 1)
    except ConfigError as e:
        ap.error(str(e))
    if not Path(args.profile).is_file():
        print(f"decision_cost: profile '{args.profile}' not found; generate it with "
              "`specctl roofline --sku h100 --target llama-3.1-8b --draft llama-3.2-1b --out ...` or pass --profile",
              file=sys.stderr)
        return 2
    profile = load_profile(args.profile)
    plan = compile_plan(profile.model_copy(update={"limits": profile.limits.model_copy(update={"max_batch": 512})}),
                        max_k=args.max_k)
    rows = []
    for b in batches:
        for p in args.policies.split(","):
            rows.append(bench(p, plan, b, args.ctx, args.steps, clock=clock))
    print(f"profile {profile.sku}/{profile.pair} ({profile.source}), K={args.max_k}, ctx ~{args.ctx}, clock {args.clock}")
    print("us per step: decide and observe medians; decide + observe amortised over full and held steps "
          "(each kind's median by its share of steps), mean, median, p99; share = amortised / step time")
    print(f"{'policy':18s} {'batch':>5s} {'decide us':>10s} {'observe us':>11s} {'amort us':>9s} {'mean us':>8s} "
          f"{'p50 us':>8s} {'p99 us':>8s} {'step ms':>8s} {'share':>7s} {'p50 share':>9s}")
    for r in rows:
        print(f"{r['policy']:18s} {r['batch']:5d} {r['decide_us_p50']:10.1f} {r['observe_us_p50']:11.1f} "
              f"{r['total_us_amortised']:9.1f} {r['total_us_mean']:8.1f} {r['total_us_p50']:8.1f} {r['total_us_p99']:8.1f} "
              f"{r['modelled_step_ms']:8.2f} {r['share_pct']:6.2f}% {r['median_share_pct']:8.2f}%")
    out = {"rows": rows}
    if args.overlap:
        out["overlap"] = overlap_table(plan, args, batches)
    if args.stages:
        out["stages"] = stage_table(plan, list(batches), args.ctx, args.steps, clock)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def overlap_table(plan, args, batches: tuple[int, ...]) -> list[dict]:
    """Each policy and batch with its work prepared off the critical path, printed and returned."""
    rows = [bench_overlap(p, plan, b, args.ctx, args.overlap_steps)
            for b in batches for p in args.policies.split(",")]
    print("off the critical path (decision for step t+1 prepared during step t, one step stale):")
    print(f"{'policy':18s} {'batch':>5s} {'on-path us':>11s} {'p99 us':>8s} {'worker us':>10s} {'step ms':>8s} {'share':>7s}")
    for r in rows:
        print(f"{r['policy']:18s} {r['batch']:5d} {r['on_path_us_p50']:11.1f} {r['on_path_us_p99']:8.1f} "
              f"{r['off_path_us_p50']:10.1f} {r['modelled_step_ms']:8.2f} {r['on_path_share_pct']:6.2f}%")
    return rows


def stage_table(plan, batches: list[int], ctx: int, steps: int, clock=time.perf_counter) -> list[dict]:
    """adaptive's amortised time per stage per step (``amortised_us``), printed and returned ("other": decide + observe less the stages not nested in another)."""
    names = [s for s, _ in STAGES]
    table = []
    for b in batches:
        timer = StageTimer(clock)
        bench("adaptive", plan, b, ctx, steps, timer=timer, clock=clock)
        rows = timer.rows[steps // 5:]
        full = np.array([r["full"] > 0 for r in rows])

        def amortised(xs, full=full) -> float:
            return amortised_us(np.array(xs), full) * 1e6

        mean = {s: amortised([r.get(s, 0.0) for r in rows]) for s in names + ["decide", "observe"]}
        top = [s for s in names if s not in NESTED_STAGES]
        other = amortised([r["decide"] + r["observe"] - sum(r.get(s, 0.0) for s in top) for r in rows])
        table.append({"batch": b, **mean, "other": other, "total": mean["decide"] + mean["observe"]})
    cols = names + ["other", "total"]
    print("adaptive per stage, amortised us per step (instrumented pass):")
    print(f"{'batch':>5s} " + " ".join(f"{c[:12]:>12s}" for c in cols))
    for r in table:
        print(f"{r['batch']:5d} " + " ".join(f"{r[c]:12.1f}" for c in cols))
    return table


if __name__ == "__main__":
    raise SystemExit(main())
