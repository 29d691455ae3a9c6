"""Three tritonserver replicas of the quick pair under one control plane, load spread by the
replica-pool client: every replica runs the current plan, an override reaches all three, killing
one loses only its in-flight requests (retried on the others), and /metrics and the dashboard list
all three. Prints the figures: requests completed, failed, retried; override -> all replicas."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from control.clients.replicas import ReplicaPool
from control.clients.triton import GenParams, model_stats
from control.triton.deploy import Deployment, DeploymentConfig, resolve_profile
from control.triton.repo import render_llm_repo, write_token_file
from control.triton.server import TritonServer, free_ports
from tests.e2e.conftest import AUTH, FAST_REPLAN, TOKEN
from tests.e2e.prompts import many

REPLICAS = 3
REQUESTS = 36
CONCURRENCY = 6
MAX_TOKENS = 64
STALE_AFTER_S = 2.0


def _extra_replica(dep: Deployment, name: str, root: Path) -> TritonServer:
    """A second or third tritonserver with the deployment's model, profile and control plane."""
    run = root / name
    run.mkdir(parents=True)
    token = write_token_file(run / "control-token", TOKEN)
    repo = render_llm_repo(run / "model_repository", engine_dir=Path(dep.cfg.engine_dir), profile=dep.profile_path,
                           control_url=dep.control_url, control_token_file=token, max_batch=dep.cfg.max_batch,
                           max_tokens=dep.cfg.max_tokens)
    http, grpc, metrics = free_ports(3, dep.cfg.host)
    os.environ["SPECCTL_REPLICA"] = name  # the llm model's agent names its replica from it
    try:
        return TritonServer(repo, run, http_port=http, grpc_port=grpc, metrics_port=metrics, host=dep.cfg.host,
                            pythonpath=[str(Path(__file__).resolve().parents[2])]).launch()
    finally:
        del os.environ["SPECCTL_REPLICA"]


@pytest.fixture(scope="module")
def fleet(quick_engines, tmp_path_factory):
    root = tmp_path_factory.mktemp("replicas")
    cfg = DeploymentConfig(engine_dir=Path(quick_engines), run_dir=root / "replica-0", http_port=0, grpc_port=0,
                           metrics_port=0, control_port=0, token=TOKEN, max_batch=8, max_tokens=256,
                           service_args=[*FAST_REPLAN, "--stale-after", str(STALE_AFTER_S)])
    dep = Deployment(cfg)
    dep.run_dir.mkdir(parents=True)
    dep.profile_path = cfg.profile = resolve_profile(Path(quick_engines), None, dep.run_dir)
    servers: list[TritonServer] = []
    t0 = time.monotonic()
    try:
        servers.extend(_extra_replica(dep, f"replica-{i}", root) for i in range(1, REPLICAS))  # start beside replica-0
        os.environ["SPECCTL_REPLICA"] = "replica-0"
        try:
            dep.start()
        finally:
            del os.environ["SPECCTL_REPLICA"]
        for s in servers:
            s.wait_ready(120)
        print(f"{REPLICAS} replicas + control plane ready in {time.monotonic() - t0:.1f} s")
        yield dep, [("replica-0", dep.triton), *((f"replica-{i}", s) for i, s in enumerate(servers, 1))]
    finally:
        for s in servers:
            s.stop()
        dep.stop()


def _plans(replicas) -> dict[str, dict]:
    return {name: model_stats(s.http_url)["plan_received"] for name, s in replicas}


def _wait(cond, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - t0


def test_the_live_benchmark_spreads_one_run_over_all_replicas(fleet):
    """``specctl bench --url a,b,c``'s run: requests spread by the pool, stats summed over the replicas."""
    from control.bench.live import Endpoints, clear_overrides, make_requests, run_once, switch_policy
    from control.cli import main

    dep, replicas = fleet
    ep = Endpoints(grpc=replicas[0][1].grpc_url, http=replicas[0][1].http_url, control=dep.control_url, token=TOKEN,
                   replicas=tuple((s.grpc_url, s.http_url) for _, s in replicas[1:]))
    before = [model_stats(s.http_url) for _, s in replicas]
    try:
        switch_policy(ep, "fixed:2")  # returns once every replica has the plan
        row = run_once(ep, make_requests("corpus", 9, seed=1, max_tokens=16), policy="fixed:2", load=1.0,
                       rate=float("inf"))
    finally:
        clear_overrides(ep)
    after = [model_stats(s.http_url) for _, s in replicas]
    ex = row["extra"]
    assert ex["failed"] == 0 and ex["completed"] == 9 and ex["replicas"] == REPLICAS and ex["retried"] == 0
    assert all(a["decode_steps"] > b["decode_steps"] for a, b in zip(after, before, strict=True))  # all served
    busy = sum(a["busy_ms"] - b["busy_ms"] for a, b in zip(after, before, strict=True)) / 1e3
    assert ex["busy_s"] == pytest.approx(busy)  # the row's counts are the replicas' summed
    bad = main(["bench", "--url", f"grpc://{replicas[0][1].grpc_url},grpc://{replicas[1][1].grpc_url}",
                "--http-url", replicas[0][1].http_url, "--control-url", dep.control_url, "--token", TOKEN])
    assert bad == 2  # one --http-url for two replicas is refused before anything runs


def test_three_replicas_one_plan_an_override_everywhere_and_a_killed_replica_retried(fleet):
    dep, replicas = fleet
    c = httpx.Client(base_url=dep.control_url, timeout=5)
    version = c.get("/v1/plan").json()["version"]
    _wait(lambda: all(p["version"] == version for p in _plans(replicas).values()), 30, "every replica on the plan")

    # an override reaches all three
    t0 = time.monotonic()
    r = c.put("/v1/overrides", json={"policy": "fixed:2"}, headers=AUTH)
    r.raise_for_status()
    want = r.json()["plan_version"]
    override_s = _wait(lambda: all(p["version"] == want and p["policy"] == "fixed:2" for p in _plans(replicas).values()),
                       5, "the override on every replica")
    t_override = time.monotonic() - t0

    # load over all three; replica-2 is killed while it has requests in flight
    pool = ReplicaPool([f"grpc://{s.grpc_url}" for _, s in replicas], cooldown_s=30.0)
    victim_name, victim = replicas[2]
    victim_ep = next(e for e in pool.endpoints if e.address == victim.grpc_url)
    killed = {}

    async def killer():
        while not (pool.stats.completed >= REQUESTS // 3 and victim_ep.inflight > 0):
            await asyncio.sleep(0.005)
        killed["inflight"] = victim_ep.inflight
        os.killpg(victim.proc.pid, signal.SIGKILL)

    async def load():
        k = asyncio.create_task(killer())
        try:
            return await pool.run(many(REQUESTS), GenParams(max_tokens=MAX_TOKENS), concurrency=CONCURRENCY)
        finally:
            k.cancel()
            await pool.close()

    results = asyncio.run(load())
    s = pool.stats
    print(f"requests: {s.completed} completed, {s.failed} failed, {s.retried} retried "
          f"({killed.get('inflight')} in flight on {victim_name} when it was killed); "
          f"override -> all {REPLICAS} replicas: {override_s * 1000:.0f} ms ({t_override * 1000:.0f} ms from the PUT)")
    assert "inflight" in killed, "the victim never had a request in flight"
    assert s.failed == 0 and s.completed == REQUESTS, s.errors
    # only the killed replica lost requests (at most those in flight there, plus any sent before the pool
    # saw it die), and every one was retried on another replica
    assert victim_ep.failed >= 1 and s.retried == victim_ep.failed
    assert all(e.failed == 0 for e in pool.endpoints if e is not victim_ep)
    # greedy and lossless: a prompt gives the same tokens on every replica, retried or not
    by_prompt: dict[str, set] = {}
    for p, res in zip(many(REQUESTS), results, strict=True):
        by_prompt.setdefault(p, set()).add(tuple(res.token_ids))
    assert all(len(v) == 1 for v in by_prompt.values())
    assert {sv.grpc_url for _, sv in replicas[:2]} <= {res.replica for res in results}  # load was spread

    # /metrics and the dashboard show all three; the killed one goes stale
    def rows():
        g = c.get("/v1/replicas").json()["groups"]
        return {r["replica"]: r for grp in g.values() for r in grp["replicas"]}

    _wait(lambda: rows().get(victim_name, {}).get("stale") is True, 10 + STALE_AFTER_S, "the killed replica to go stale")
    def survivors_current() -> bool:  # refits after the load may publish newer versions: follow them
        got, now = rows(), c.get("/v1/plan").json()["version"]
        return all(not got[n]["stale"] and got[n]["plan_delivered"] == now and got[n]["windows"] > 0
                   and got[n]["plan_version"] >= want and _plans([(n, s)])[n]["version"] == now
                   for n, s in replicas[:2])

    _wait(survivors_current, 10, "the live replicas reporting on the current plan")
    assert {n for n, _ in replicas} <= set(rows())
    metrics = c.get("/metrics").text
    for name, _ in replicas:
        assert f'replica="{name}"' in metrics
    assert 'specctl_replica_stale{group=' in metrics and metrics.count("specctl_replica_stale{") == REPLICAS
    page = c.get("/").text
    assert all(name in page for name, _ in replicas) and "2 fresh, 1 stale" in page
    c.put("/v1/overrides", json={}, headers=AUTH).raise_for_status()
