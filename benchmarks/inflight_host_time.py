"""The served model's own host work per engine step, outside the forward passes, by requests in flight.

    python benchmarks/inflight_host_time.py --engine-dir ENGINES [--inflight 32,200,1000]
        [--window-s 3] [--max-batch 32] [--json OUT]

Starts a real deployment (``specctl serve``'s: control plane + tritonserver with the ``llm`` model on
the given CPU pair, policy ``adaptive``), then for each count N keeps N streaming gRPC requests in
flight (``max_tokens`` large enough that none finishes during the window; at most ``--max-batch``
run, the rest wait in the engine's queue) and reads the model's ``{"stats": true}`` counters at the
start and end of a window. The loop never idles meanwhile, so the window's wall time is the loop's
time, and host work per step = (wall - prefill - draft - verify) / steps: the policy, the engine's
bookkeeping, delivering outputs and the cancellation checks. Then the requests are cancelled and
the next N starts once the model has let them all go.

The model code is the one this script is run from (the deployment puts its repository on the
server's PYTHONPATH), so running it from two checkouts on the same machine compares them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from control.clients.triton import GenParams, model_stats, stream_generate  # noqa: E402
from control.triton.deploy import Deployment, DeploymentConfig  # noqa: E402

PROMPT = "def parse_config(path):\n    "
NEVER_EMITTED = 2  # end_id: the CPU pair's padding token, so no request stops early on its own
STREAMS_PER_CLIENT = 64  # gRPC streams per channel (servers cap concurrent streams per connection)
FORWARD_KEYS = ("prefill_ms", "draft_ms", "verify_ms")


async def hold(url: str, http: str, n: int, max_tokens: int, window_s: float, say) -> dict:
    """Keep ``n`` requests in flight, measure one window, cancel them."""
    import tritonclient.grpc.aio as aio

    clients = [aio.InferenceServerClient(url.removeprefix("grpc://")) for _ in range((n + STREAMS_PER_CLIENT - 1)
                                                                               // STREAMS_PER_CLIENT)]
    tasks = [asyncio.create_task(stream_generate(clients[i // STREAMS_PER_CLIENT], PROMPT,
                                                 GenParams(max_tokens=max_tokens, end_id=NEVER_EMITTED))) for i in range(n)]
    return_value: dict = {}
    try:
        deadline = time.monotonic() + 120
        while True:
            await asyncio.sleep(0.5)
            st = await asyncio.to_thread(model_stats, http)
            if st["active_requests"] >= n or time.monotonic() > deadline:
                break
        await asyncio.sleep(1.0)  # admission settles
        t0, a = time.perf_counter(), await asyncio.to_thread(model_stats, http)
        await asyncio.sleep(window_s)
        t1, b = time.perf_counter(), await asyncio.to_thread(model_stats, http)
        steps = b["steps"] - a["steps"]
        wall_ms = (t1 - t0) * 1e3
        forward = sum(b[k] - a[k] for k in FORWARD_KEYS)
        return_value = {
            "inflight": n, "active_requests": min(a["active_requests"], b["active_requests"]), "steps": steps,
            "step_ms": wall_ms / max(steps, 1), "host_ms_per_step": (wall_ms - forward) / max(steps, 1),
            "policy_ms_per_step": (b["policy_ms"] - a["policy_ms"]) / max(steps, 1),
            "deliver_ms_per_step": (b["deliver_ms"] - a["deliver_ms"]) / max(steps, 1),
            "completed_in_window": b["completed"] - a["completed"],
        }
        say(f"  {n} in flight: {return_value}")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()
    return return_value


def drain(http: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if model_stats(http)["active_requests"] == 0:
            return
        time.sleep(0.5)
    raise SystemExit("inflight_host_time: the model still holds requests after cancelling them all")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--inflight", default="32,200,1000")
    ap.add_argument("--window-s", type=float, default=3.0)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=1000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not Path(args.engine_dir).is_dir():
        print(f"inflight_host_time: engine dir '{args.engine_dir}' not found; build one with "
              "`specctl build --sku cpu --quick --out DIR`", file=sys.stderr)
        return 2
    counts = [int(x) for x in args.inflight.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as run:
        cfg = DeploymentConfig(engine_dir=Path(args.engine_dir), run_dir=Path(run), http_port=0, grpc_port=0,
                               metrics_port=0, control_port=0, max_batch=args.max_batch,
                               max_tokens=max(args.max_tokens, 1024))
        with Deployment(cfg) as dep:
            loop = asyncio.new_event_loop()  # one for every count (as ``control.bench.live.run_once``'s)
            try:
                for n in counts:
                    rows.append(loop.run_until_complete(hold(dep.grpc_url, dep.http_url, n, args.max_tokens,
                                                             args.window_s, print)))
                    drain(dep.http_url)
            finally:
                loop.close()
    print(f"model code from {ROOT.name}; max_batch {args.max_batch}, window {args.window_s:g} s")
    print(f"{'in flight':>9s} {'active':>7s} {'steps':>6s} {'step ms':>8s} {'host ms/step':>13s} {'policy ms':>10s} "
          f"{'deliver ms':>11s}")
    for r in rows:
        print(f"{r['inflight']:9d} {r['active_requests']:7d} {r['steps']:6d} {r['step_ms']:8.2f} "
              f"{r['host_ms_per_step']:13.2f} {r['policy_ms_per_step']:10.2f} {r['deliver_ms_per_step']:11.2f}")
    for r in rows:
        if r["completed_in_window"]:
            print(f"warning: at {r['inflight']} in flight {r['completed_in_window']} requests reached --max-tokens "
                  f"({args.max_tokens}) inside the window, so it ran with fewer in flight (active "
                  f"{r['active_requests']} at one end): shorten --window-s, or raise --max-tokens where the "
                  "pair's context allows", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
