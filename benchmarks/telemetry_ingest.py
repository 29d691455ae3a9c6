"""How much of a core one control-plane process needs for many agents' telemetry.

Starts a real ``specctl control-plane`` (its own process), then simulates ``--agents`` agents from
this process: each holds the plan stream open (``GET /v1/plan/stream?group=..&replica=..``, as the
agent's link does) and posts one ``specctl.telemetry/v1`` window every ``--interval`` seconds (the
agent's default window is 1 s) with ``--samples`` step samples (the agent's default is 256), at a
random phase so the posts spread over the second as real agents' do. After a warm-up it reads the
control plane's CPU time (``/proc/<pid>/stat``: user + system) over ``--duration`` seconds and
reports it as a share of one core, with the windows it accepted per second and the post latency.
The simulated agents' own CPU is not counted: they run in this process, not the control plane's.

    python benchmarks/telemetry_ingest.py [--agents 100] [--interval 1.0] [--samples 256]
        [--steps-per-s 40] [--duration 30] [--profile profiles/cpu/stdlib-full.yaml] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from control.agent.wire import K_BUCKETS, TELEMETRY_SCHEMA, group_name  # noqa: E402
from control.profile import load_profile  # noqa: E402

TOKEN = "ingest-bench-token-0123456789"
CLK_TCK = os.sysconf("SC_CLK_TCK")
WARMUP_S = 5.0
BODIES_PER_AGENT = 4


def window(rng: np.random.Generator, *, source: str, replica: str, group: str, seq: int, drafters: list[str],
           samples: int, interval_s: float, plan_version: int, steps_per_s: float = 40.0) -> dict:
    """A window as a replica at batch ~8 would send it: ``steps_per_s`` steps (a CPU replica makes ~40 a
    second, a GPU one ~100), k up to 4, acceptance ~0.7, ``samples`` of its steps sampled (at most all)."""
    steps = max(int(steps_per_s * interval_s), 1)
    batch = rng.integers(4, 13, size=steps)  # [steps]
    request_steps = int(batch.sum())
    ctx = rng.integers(200, 1500, size=request_steps)  # [request_steps]
    k = rng.integers(0, 5, size=request_steps)  # [request_steps]
    d = rng.integers(0, len(drafters), size=request_steps)  # [request_steps]
    trials, accepted = np.zeros((len(drafters), 4), dtype=np.int64), np.zeros((len(drafters), 4), dtype=np.int64)
    for j in range(4):
        t = np.bincount(d[k > j], minlength=len(drafters))
        trials[:, j] = t
        accepted[:, j] = rng.binomial(t, 0.7)
        if j:
            accepted[:, j] = np.minimum(accepted[:, j], accepted[:, j - 1])
            trials[:, j] = np.minimum(trials[:, j], accepted[:, j - 1])
            accepted[:, j] = np.minimum(accepted[:, j], trials[:, j])
    ds = []
    for i, name in enumerate(drafters):
        drafted = int(k[d == i].sum())
        ds.append({"name": name, "requests": int(((d == i) & (k > 0)).sum()), "drafted": drafted, "verified": drafted,
                   "accepted": int(accepted[i].sum()), "position_trials": trials[i].tolist(),
                   "position_accepted": accepted[i].tolist()})
    n = min(samples, steps)
    idx = rng.choice(steps, size=n, replace=False) if n else np.zeros(0, dtype=np.int64)
    sb = batch[idx]
    verify = rng.uniform(20, 40, size=n)
    draft = rng.uniform(2, 8, size=n)
    samp = {"batch": sb.tolist(), "ctx_tokens": (sb * 800).tolist(), "verify_tokens": (sb * 3).tolist(),
            "verify_ms": verify.round(3).tolist(), "draft_ms": draft.round(3).tolist(),
            "total_ms": (verify + draft + 0.5).round(3).tolist(), "predicted_ms": (verify + draft).round(3).tolist(),
            "draft_passes": [3] * n, "draft_ctx_tokens": (sb * 2400).tolist(), "draft_batched_tokens": (sb * 3).tolist(),
            "drafter": [0] * n, "drafted": (sb * 3).tolist(), "accepted": (sb * 2).tolist()}
    return {"schema": TELEMETRY_SCHEMA, "source": source, "replica": replica, "group": group, "seq": seq,
            "plan_version": plan_version, "window_s": interval_s, "steps": steps,
            "spec_steps": steps, "request_steps": request_steps, "ctx_tokens": int(ctx.sum()),
            "max_batch": int(batch.max()), "finished": int(rng.integers(0, 4)),
            "k_hist": np.bincount(k, minlength=K_BUCKETS).tolist(),
            "measured_ms_sum": float(verify.mean() + draft.mean()) * steps, "drafters": ds,
            "samples": samp if n else None}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15 of stat)


def start_control_plane(profile: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "control", "control-plane", "--profile", str(profile), "--port", "0",
           "--token", TOKEN]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"at (http://\S+) \(dashboard", line)
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"the control plane did not start: {line}")


async def agent(client, url: str, i: int, group: str, drafters: list[str], args, stats: dict, stop: asyncio.Event):
    import httpx

    replica = f"sim-replica-{i:03d}"
    rng = np.random.default_rng(i)

    async def plans():
        while not stop.is_set():
            try:
                async with client.stream("GET", f"{url}/v1/plan/stream", params={"group": group, "replica": replica},
                                         timeout=httpx.Timeout(5.0, read=30.0)) as r:
                    async for _ in r.aiter_lines():
                        if stop.is_set():
                            return
            except httpx.HTTPError:
                await asyncio.sleep(0.5)

    sub = asyncio.create_task(plans())
    # A few distinct windows per agent, encoded once: this process must keep up with the posting rate
    # on a loaded machine; only the sequence number changes between posts.
    bodies = [json.dumps(window(rng, source="triton-llm_0_0", replica=replica, group=group, seq=0, drafters=drafters,
                                samples=args.samples, interval_s=args.interval, plan_version=1,
                                steps_per_s=args.steps_per_s),
                         separators=(",", ":")) for _ in range(BODIES_PER_AGENT)]
    await asyncio.sleep(random.Random(i).uniform(0, args.interval))
    seq = 0
    next_t = time.monotonic()
    while not stop.is_set():
        seq += 1
        body = bodies[seq % len(bodies)].replace('"seq":0,', f'"seq":{seq},', 1)
        t0 = time.monotonic()
        r = await client.post(f"{url}/v1/telemetry", content=body, headers={"Content-Type": "application/json"})
        if stats["measuring"]:
            stats["latency"].append(time.monotonic() - t0)
            stats["ok" if r.status_code == 202 else "refused"] += 1
        if r.status_code != 202:
            stats["last_error"] = r.text[:300]
        next_t += args.interval
        await asyncio.sleep(max(next_t - time.monotonic(), 0.0))
    sub.cancel()


async def run(args, url: str, pid: int, profile) -> dict:
    import httpx

    group = group_name(profile.sku, profile.pair)
    drafters = [d.name for d in profile.drafters]
    stats = {"measuring": False, "latency": [], "ok": 0, "refused": 0, "last_error": ""}
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=args.agents * 2 + 10, max_keepalive_connections=args.agents * 2)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, limits=limits, timeout=10.0,
                                 trust_env=False) as client:
        tasks = [asyncio.create_task(agent(client, url, i, group, drafters, args, stats, stop)) for i in range(args.agents)]
        await asyncio.sleep(WARMUP_S + args.interval)
        w0 = (await client.get(f"{url}/v1/status")).json()["telemetry"]["windows"]
        c0, t0 = cpu_seconds(pid), time.monotonic()
        stats["measuring"] = True
        await asyncio.sleep(args.duration)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        stats["measuring"] = False
        status = (await client.get(f"{url}/v1/status")).json()
        replicas = (await client.get(f"{url}/v1/replicas")).json()["groups"][group]
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    lat = np.array(stats["latency"]) * 1000.0
    wall = t1 - t0
    windows = status["telemetry"]["windows"] - w0
    cpu_ms = (c1 - c0) * 1000.0 / max(windows, 1)
    nominal = args.agents / args.interval  # windows/s the agents would send if this process kept up
    return {"agents": args.agents, "interval_s": args.interval, "steps_per_s": args.steps_per_s,
            "samples_per_window": min(args.samples, max(int(args.steps_per_s * args.interval), 1)),
            "duration_s": round(wall, 2), "cpu_share_of_one_core": round((c1 - c0) / wall, 4),
            "windows_per_s": round(windows / wall, 1), "cpu_ms_per_window": round(cpu_ms, 3),
            "cpu_share_at_nominal_rate": round(cpu_ms * nominal / 1000.0, 4),
            "posts_ok": stats["ok"], "posts_refused": stats["refused"], "last_error": stats["last_error"],
            "post_ms_p50": round(float(np.percentile(lat, 50)), 2) if lat.size else None,
            "post_ms_p99": round(float(np.percentile(lat, 99)), 2) if lat.size else None,
            "replicas_fresh": replicas["fresh"], "replicas_stale": replicas["stale"],
            "plan_version": status["plan_version"], "replans": status["replans"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between an agent's windows (agent default 1)")
    ap.add_argument("--samples", type=int, default=256, help="step samples per window at most (agent default 256)")
    ap.add_argument("--steps-per-s", type=float, default=40.0,
                    help="decode steps per second per replica (default 40, a CPU replica; ~100 on a GPU)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds measured after a warm-up")
    ap.add_argument("--profile", default=str(ROOT / "profiles" / "cpu" / "stdlib-full.yaml"))
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    proc, url = start_control_plane(Path(args.profile))
    try:
        out = asyncio.run(run(args, url, proc.pid, profile))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(json.dumps(out, indent=1))
    print(f"control plane: {out['agents']} agents, {out['windows_per_s']} windows/s, "
          f"{out['cpu_share_of_one_core'] * 100:.1f}% of one core ({out['cpu_ms_per_window']:.2f} ms CPU per window; "
          f"{out['cpu_share_at_nominal_rate'] * 100:.1f}% at the nominal {args.agents / args.interval:g} windows/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
