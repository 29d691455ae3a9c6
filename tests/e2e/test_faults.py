"""Fault injection on ``specctl serve`` under a steady load of 20 gRPC streams: SIGKILL the control plane,
then the llm model's Python stub, then tritonserver, and count what the clients saw. Nothing accepted
may go unanswered."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc.aio as aio

from control.clients.triton import GenParams, model_stats, stream_generate
from control.triton.supervisor import descendants, process_alive, stub_pids
from tests.e2e.prompts import many

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "fault-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STREAMS = 20
MAX_TOKENS = 96
ANSWER_DEADLINE_S = 30.0  # a request not answered (tokens or an error) within this is lost
ERROR_WITHIN_S = 5.0
NOT_READY_WITHIN_S = 1.0  # health may say ready this long after the stub died, as the test measures it
# (checks every 50 ms: 0.22 s measured alone, 0.52 s beside another test worker's load; checks every
# 0.5 s gave 0.25-0.75 s plus the polling here, and before the supervisor's check it stayed ready)
AGENT_BACK_WITHIN_S = 10.0
SERVING_AGAIN_WITHIN_S = 60.0
SERVED_AGAIN = 3  # requests sent after a restart that must end before the next fault


@dataclass
class Tally:
    """What the load generator saw: (start, end, error) per request, and the requests still open."""

    done: list[tuple[float, float, str | None]] = field(default_factory=list)
    lost: int = 0
    open: int = 0

    def between(self, t0: float, t1: float) -> list[tuple[float, float, str | None]]:
        return [d for d in self.done if t0 <= d[0] and d[1] <= t1]


def _start_serve(engines: Path, run: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    out = run.parent / "serve.out"
    cmd = [sys.executable, "-m", "control", "serve", "--engine-dir", str(engines), "--run-dir", str(run),
           "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--control-port", "0", "--max-batch", "32",
           "--token", TOKEN, "--policy", "adaptive"]
    with open(out, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        text = out.read_text(errors="replace")
        if "\nready" in text:
            urls = {ln.split()[0]: ln.split()[-1] for ln in text.splitlines() if ln.startswith("  ")}
            return proc, urls
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"specctl serve did not get ready: {out.read_text(errors='replace')[-2000:]}")


def _client(grpc_url: str) -> aio.InferenceServerClient:
    """A client whose channel has its own subchannels: gRPC shares them process-wide by default, and a
    shared one still backing off from a refused connection fails new calls long after the restart."""
    return aio.InferenceServerClient(grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])


async def _worker(i: int, grpc_url: str, prompts: list[str], tally: Tally, stop: asyncio.Event) -> None:
    client = _client(grpc_url)
    n = 0
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            tally.open += 1
            try:
                res = await asyncio.wait_for(stream_generate(client, prompts[(i + n) % len(prompts)],
                                                             GenParams(max_tokens=MAX_TOKENS)), ANSWER_DEADLINE_S)
                tally.done.append((t0, time.monotonic(), res.error))
            except TimeoutError:
                tally.lost += 1
                res = None
            finally:
                tally.open -= 1
            n += 1
            if res is None or res.error:  # a fresh channel: gRPC's reconnect backoff would lag a restart
                await client.close()
                await asyncio.sleep(0.2)
                client = _client(grpc_url)
    finally:
        await client.close()


def _poll_ready(http_url: str, path: str = "/v2/health/ready") -> int:
    try:
        return httpx.get(f"{http_url}{path}", timeout=1).status_code
    except httpx.HTTPError:
        return 0  # nothing listens: not ready


def _both_not_ready(http_url: str) -> bool:
    """Server health and the llm model's readiness both refuse (the issue saw both say 200)."""
    return _poll_ready(http_url) != 200 and _poll_ready(http_url, "/v2/models/llm/ready") != 200


def _grpc_ready(grpc_url: str) -> bool:
    import tritonclient.grpc as grpcclient

    try:
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            return bool(client.is_server_ready(client_timeout=1))
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means not ready
        return False


async def _wait_for(pred, timeout_s: float, step_s: float = 0.1) -> float | None:
    """Seconds until ``pred()`` (run in a thread) holds, or None after ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await asyncio.to_thread(pred):
            return time.monotonic() - t0
        await asyncio.sleep(step_s)
    return None


def _left_behind(run: Path) -> list[str]:
    """Live processes whose command line names ``run`` (orphaned stubs, servers)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and process_alive(int(d.name)):
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(run) in cmd:
                out.append(f"{d.name}: {cmd[:120]}")
    return out


def _agent(http_url: str) -> dict:
    try:
        return model_stats(http_url, timeout_s=5)["agent"]
    except Exception:  # noqa: BLE001 - a restarting server has no stats
        return {}


async def _scenario(serve: subprocess.Popen, urls: dict[str, str]) -> dict:
    http, grpc, control = urls["http"], urls["grpc"], urls["control"]
    tally, stop = Tally(), asyncio.Event()
    workers = [asyncio.create_task(_worker(i, grpc, many(STREAMS), tally, stop)) for i in range(STREAMS)]
    out: dict = {"tally": tally}
    await asyncio.sleep(4)
    # 1. the control plane dies under load
    cp = [p for p in descendants(serve.pid) if b"control-plane" in Path(f"/proc/{p}/cmdline").read_bytes()]
    subs = _agent(http).get("subscriptions", 0)
    out["cp_kill"] = time.monotonic()
    os.kill(cp[0], signal.SIGKILL)
    out["agent_back_s"] = await _wait_for(lambda: (a := _agent(http)).get("connected")
                                          and a.get("subscriptions", 0) > subs, AGENT_BACK_WITHIN_S + 5)
    out["overrides_after"] = httpx.get(f"{control}/v1/overrides", timeout=5).json()
    out["plan_after"] = httpx.get(f"{control}/v1/plan", timeout=5).json()["version"]
    await asyncio.sleep(2)
    out["cp_phase_end"] = time.monotonic()
    # 2. the model's Python stub dies under load
    triton = [p for p in descendants(serve.pid) if stub_pids(p)][0]
    stub = sorted(stub_pids(triton))[0]
    out["open_at_stub_kill"] = tally.open
    out["stub_kill"] = time.monotonic()
    os.kill(stub, signal.SIGKILL)
    out["not_ready_s"] = await _wait_for(lambda: _both_not_ready(http), 10, step_s=0.01)
    out["ready_again_s"] = await _wait_for(lambda: _poll_ready(http) == 200 and _grpc_ready(grpc), SERVING_AGAIN_WITHIN_S)
    out["stub_dead"] = not process_alive(stub)
    # the load runs on the restarted server: wait for requests sent after it came back to end (a fixed
    # 4 s here ended none on a busy CI machine, where a 96-token stream beside 19 others takes longer)
    back = time.monotonic()
    out["served_again_s"] = await _wait_for(lambda: len(tally.between(back, time.monotonic())) >= SERVED_AGAIN,
                                            SERVING_AGAIN_WITHIN_S)
    # 3. tritonserver itself dies (as a crashing request would take it down)
    triton = [p for p in descendants(serve.pid) if stub_pids(p)][0]
    out["server_kill"] = time.monotonic()
    os.kill(triton, signal.SIGKILL)
    out["server_down_s"] = await _wait_for(lambda: _poll_ready(http) != 200, 10, step_s=0.05)  # the kill landed
    out["server_ready_again_s"] = await _wait_for(lambda: _poll_ready(http) == 200 and _grpc_ready(grpc),
                                                  SERVING_AGAIN_WITHIN_S)
    # the new model instance follows the control plane again, overrides included
    out["override_back_s"] = await _wait_for(lambda: _agent(http).get("policy") == "fixed:2", AGENT_BACK_WITHIN_S)
    await asyncio.sleep(2)
    out["end"] = time.monotonic()
    stop.set()
    await asyncio.wait_for(asyncio.gather(*workers), ANSWER_DEADLINE_S + 10)
    return out


def test_killing_the_control_plane_and_the_stub_under_load_loses_nothing(quick_engines, tmp_path):
    serve, urls = _start_serve(Path(quick_engines), tmp_path / "run")
    try:
        r = httpx.put(f"{urls['control']}/v1/overrides", json={"policy": "fixed:2"}, headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
        version = r.json()["plan_version"]
        out = asyncio.run(asyncio.wait_for(_scenario(serve, urls), 240))
        log = (tmp_path / "serve.out").read_text(errors="replace")
        assert serve.poll() is None, log[-2000:]
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    time.sleep(1)
    assert _left_behind(tmp_path) == [], "processes of the deployment outlived specctl serve"
    tally = out["tally"]
    errors = sum(1 for d in tally.done if d[2])
    print(f"\nfault injection: {len(tally.done)} requests answered ({errors} with an error), {tally.lost} lost; "
          f"agent back {out['agent_back_s']:.1f} s after the control plane died; stub killed with "
          f"{out['open_at_stub_kill']} in flight; health and model not ready after {out['not_ready_s']:.3f} s, ready again "
          f"{out['ready_again_s']:.1f} s later, requests sent then ended within {out['served_again_s'] or float('nan'):.1f} s; tritonserver killed, serving again after "
          f"{out['server_ready_again_s']:.1f} s")
    assert tally.lost == 0 and tally.open == 0, "requests accepted but never answered"
    # Control plane: no request failed, the agent was back within 10 s, overrides and versions kept.
    cp_phase = tally.between(out["cp_kill"] - 10, out["cp_phase_end"])
    assert cp_phase and [e for _, _, e in cp_phase if e] == []
    assert out["agent_back_s"] is not None and out["agent_back_s"] < AGENT_BACK_WITHIN_S, out
    assert out["overrides_after"]["policy"] == "fixed:2" and out["plan_after"] > version
    # Stub: the requests in flight got an error within 5 s, health went not-ready, serving resumed.
    assert out["stub_dead"] and out["open_at_stub_kill"] > 0
    # The requests the server held with a dead stub (in flight at the kill, or sent before health
    # turned not ready) ended within 5 s of the kill: with an error, or complete (their final
    # response was already on its way; a stream cut short counts as an error in stream_generate).
    kill = out["stub_kill"]
    hit = [(t1 - kill, e) for t0, t1, e in tally.done if t1 > kill and t0 < kill + out["not_ready_s"]]
    assert sum(1 for _, e in hit if e) > 0, hit
    assert max(dt for dt, _ in hit) < ERROR_WITHIN_S, hit
    assert out["not_ready_s"] is not None and out["not_ready_s"] < NOT_READY_WITHIN_S, out["not_ready_s"]
    assert out["ready_again_s"] is not None and out["ready_again_s"] < SERVING_AGAIN_WITHIN_S
    back = out["stub_kill"] + out["not_ready_s"] + out["ready_again_s"]
    # Requests sent while the model was down were refused at once, not held.
    down = [(t1 - t0, e) for t0, t1, e in tally.done if kill < t0 < back and e]
    assert down and max(dt for dt, _ in down) < ERROR_WITHIN_S, down[:5]
    assert out["served_again_s"] is not None, "no request sent after the stub's restart ended"
    after = [d for d in tally.done if back < d[0] and d[1] < out["server_kill"]]
    assert after and all(e is None for _, _, e in after), after[:5]
    # Server: killed outright, it is started again and serves.
    assert out["server_down_s"] is not None
    assert out["server_ready_again_s"] is not None and out["server_ready_again_s"] < SERVING_AGAIN_WITHIN_S
    hit = [t1 - out["server_kill"] for t0, t1, _ in tally.done if t0 < out["server_kill"] < t1]
    assert hit and max(hit) < ERROR_WITHIN_S, hit
    assert out["override_back_s"] is not None, "the restarted model never took the overridden plan"
    last = [d for d in tally.done if d[0] > out["server_kill"] + out["server_down_s"] + out["server_ready_again_s"]]
    assert last and all(e is None for _, _, e in last), last[:5]
    assert "restarting tritonserver" in log and "control plane exited" in log and "tritonserver exited" in log
