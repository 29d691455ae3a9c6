"""What the in-process agent adds per engine step, side by side with the bare policy it wraps.

    python benchmarks/agent_overhead.py [--profile P] [--policy adaptive] [--batches 16,64,256]
        [--steps 2000] [--no-service] [--json OUT]

Three variants decide + observe the same kind of steps, in interleaved blocks of 100 steps so load
on a shared machine hits them alike: the bare policy (``build_policy``), the agent on its default
plan (no service), and the agent subscribed to a real ``specctl control-plane`` started here (plan
stream open, telemetry posted every second by its network thread). Reported: median and p99 of
decide + observe per step, and the agent's median overhead over the bare policy in microseconds and
as a ratio. The engine's own work (drafting, verifying) is not simulated: only the controller's cost.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from control.agent import Agent  # noqa: E402
from control.plan import compile_plan  # noqa: E402
from control.policy import StepOutcome, StepView, build_policy  # noqa: E402
from control.profile import load_profile  # noqa: E402

DEFAULT_PROFILE = ROOT / "profiles" / "h100" / "llama-3.1-8b+llama-3.2-1b.yaml"
BLOCK = 100
TOKEN = "agent-overhead-benchmark-token"


class Loop:
    """One controller and the steady-state batch it decides for (contexts grow, requests never end)."""

    def __init__(self, policy, drafters: tuple[str, ...], max_k: int, batch: int, seed: int) -> None:
        self.policy = policy
        self.rng = np.random.default_rng(seed)
        self.view = StepView.build(slots=np.arange(batch), request_ids=np.arange(batch),
                                   ctx_lens=self.rng.integers(256, 4096, batch), remaining=np.full(batch, 10**6),
                                   drafters=drafters, max_k=max_k, free_kv_slots=10**7, token_budget=10**7)
        self.rates = self.rng.uniform(0.4, 0.9, batch)
        self.times: list[float] = []

    def run(self, steps: int) -> None:
        v = self.view
        for _ in range(steps):
            v.step += 1
            v.ctx_lens += 1
            t0 = time.perf_counter()
            d = self.policy.decide(v)
            t1 = time.perf_counter()
            k = d.k
            acc = np.minimum(self.rng.geometric(1 - self.rates) - 1, k)
            out = StepOutcome(slots=v.slots, request_ids=v.request_ids, drafter=d.drafter, ctx_lens=v.ctx_lens,
                              drafted=k, verified=k, accepted=acc, verify_ms=10.0, draft_ms=2.0, total_ms=12.5,
                              draft_passes=int(k.max(initial=0)), draft_ctx_tokens=int(v.ctx_lens.sum()),
                              draft_batched_tokens=int(k.sum()), step=v.step)
            t2 = time.perf_counter()
            self.policy.observe(out)
            self.times.append(t1 - t0 + time.perf_counter() - t2)


def start_service(profile_path: str) -> tuple[subprocess.Popen, str]:
    # stderr (the service's log) goes to a file: an undrained pipe fills up and blocks the service
    err = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the service process
    proc = subprocess.Popen([sys.executable, "-m", "control", "control-plane", "--profile", profile_path, "--port", "0",
                             "--token", TOKEN], cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    m = re.search(r"at (http://\S+) ", line)
    if not m:
        proc.kill()
        err.seek(0)
        raise SystemExit(f"agent_overhead: the control-plane did not start: {line}{err.read().decode(errors='replace')}")
    return proc, m.group(1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    ap.add_argument("--policy", default="adaptive")
    ap.add_argument("--batches", default="16,64,256")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2000, help="steps per variant and batch size")
    ap.add_argument("--no-service", action="store_true", help="skip the variant with a live control-plane")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not Path(args.profile).is_file():
        print(f"agent_overhead: profile '{args.profile}' not found; pass --profile (specctl.profile/v1)", file=sys.stderr)
        return 2
    profile = load_profile(args.profile)
    plan = compile_plan(profile, policy=args.policy, max_k=args.max_k)
    drafters = tuple(plan.drafters)
    proc, url = (None, None) if args.no_service else start_service(args.profile)
    rows = []
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            loops = {"policy": Loop(build_policy(args.policy, plan), drafters, args.max_k, batch, seed=1),
                     "agent": Loop(Agent(profile, policy=args.policy, max_k=args.max_k), drafters, args.max_k, batch, seed=1)}
            live = None
            if url:
                live = Agent(profile, url=url, token=TOKEN, policy=args.policy, max_k=args.max_k, source=f"bench-{batch}")
                live.start()
                deadline = time.monotonic() + 20
                while live.stats().plan_source != "service" and time.monotonic() < deadline:
                    time.sleep(0.05)
                loops["agent+service"] = Loop(live, drafters, args.max_k, batch, seed=1)
            for _ in range(max(args.steps // BLOCK, 1)):
                for loop in loops.values():
                    loop.run(BLOCK)
            if live is not None:
                live.stop()
                st = live.stats()
            base = np.median(loops["policy"].times[BLOCK:]) * 1e6
            for name, loop in loops.items():
                t = np.array(loop.times[BLOCK:]) * 1e6  # the first block warms up
                row = {"batch": batch, "variant": name, "us_p50": float(np.median(t)), "us_p99": float(np.percentile(t, 99)),
                       "overhead_us_p50": float(np.median(t) - base), "ratio_p50": float(np.median(t) / base)}
                if name == "agent+service":
                    row.update(plan_source=st.plan_source, telemetry_sent=st.telemetry_sent,
                               dropped_windows=st.dropped_windows)
                rows.append(row)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    print(f"profile {profile.sku}/{profile.pair}, policy {args.policy}, K={args.max_k}, {args.steps} steps per variant")
    print(f"{'batch':>5s} {'variant':14s} {'p50 us':>8s} {'p99 us':>8s} {'+us p50':>8s} {'ratio':>6s}")
    for r in rows:
        extra = (f"  (plan from {r['plan_source']}, {r['telemetry_sent']} telemetry posts, "
                 f"{r['dropped_windows']} dropped)") if "plan_source" in r else ""
        print(f"{r['batch']:5d} {r['variant']:14s} {r['us_p50']:8.1f} {r['us_p99']:8.1f} {r['overhead_us_p50']:8.1f} "
              f"{r['ratio_p50']:6.3f}{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
