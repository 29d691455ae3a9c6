"""The live-server benchmark: a load generator over gRPC streaming against a running deployment.

For each policy the benchmark switches the deployment through the control plane (``PUT
/v1/overrides`` with the token) and waits until the llm model reports the new plan; for each load
level it replays the same requests (same prompts, same arrival pattern scaled to the level) and
records per request the arrival, first-token and finish times and the tokens generated, plus the
model's per-step counters around the run (busy time, decode and speculative steps, k histogram,
verified and accepted draft tokens). Rows follow the ``specctl.bench/v1`` schema
(``control.bench.metrics.run_row``), so ``control.bench.report`` serves the simulator and this.

Load levels are fractions of the measured no-speculation capacity: a short saturation run with
policy ``none`` (all requests at once, the engine's KV slots full) gives the completion rate in
requests per second; level f sends Poisson arrivals (or the trace's own arrival pattern, rescaled)
at f times that rate.

Prompts: on the CPU pair, windows of the held-out part of the pair's corpus (Python standard
library sources the models never trained on), or any text file given; lengths in characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from control.bench.metrics import SLOTargets, run_row, sum_counts
from control.clients.triton import GenParams, Result, model_stats, stream_generate
from control.errors import ConfigError, SpecctlError

FALLBACK_TEXT = '''
def read_config(path, defaults=None):
    """Read a configuration file and return a dict of its values."""
    result = dict(defaults or {})
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result


class Cache(object):
    def __init__(self, maxsize=128):
        self.maxsize = maxsize
        self.data = {}

    def get(self, key, default=None):
        try:
            return self.data[key]
        except KeyError:
            return default
'''


@dataclass(frozen=True)
class Endpoints:
    grpc: str  # host:port
    http: str  # http://host:port (model stats)
    control: str | None = None  # http://host:port (overrides); None: no policy switching
    token: str | None = None
    # More replicas under the same control plane, (grpc host:port, http URL) each: requests are spread
    # over all of them by ``control.clients.replicas.ReplicaPool`` (retried elsewhere if one dies) and
    # the model stats are summed over them.
    replicas: tuple[tuple[str, str], ...] = ()

    @property
    def https(self) -> list[str]:
        return [self.http, *(h for _, h in self.replicas)]


SUMMED_STATS = ("busy_ms", "decode_steps", "spec_steps", "step_verified", "step_accepted", "generated", "completed",
                "failed", "cancelled")


def fleet_stats(ep: Endpoints) -> dict[str, Any]:
    """The llm model's stats, summed over every replica when there are several (plan version: the oldest)."""
    if not ep.replicas:
        return model_stats(ep.http)
    docs = [model_stats(h) for h in ep.https]
    out = dict(docs[0])
    for k in (*SUMMED_STATS, *TIME_KEYS):
        if all(k in d for d in docs):
            out[k] = sum(d[k] for d in docs)
    out["k_hist"] = np.sum([np.asarray(d["k_hist"]) for d in docs], axis=0).tolist()
    out["drafter_steps"] = sum_counts(d.get("drafter_steps", {}) for d in docs)
    out["plan_version"] = min(d.get("plan_version", 0) for d in docs)
    return out


@dataclass
class Requests:
    """The requests of one run: prompt texts, max_tokens, and arrival offsets at rate 1 req/s."""

    prompts: list[str]
    max_tokens: np.ndarray
    unit_arrivals: np.ndarray  # seconds at a mean rate of 1 request/s
    notes: dict[str, Any] = field(default_factory=dict)
    ignore_eos: bool = True  # each request generates its max_tokens (the workload's lengths), past any end token

    @property
    def n(self) -> int:
        return len(self.prompts)


def corpus_texts(max_files: int = 24) -> list[str]:
    """Held-out Python sources of the CPU pair's corpus (the standard library), or a built-in snippet."""
    try:
        from control.buildsys.cpu.corpus import load_corpus

        corpus = load_corpus(heldout_only=True, max_heldout_files=max_files)
        texts = [f.text for f in corpus.heldout if len(f.text) > 400]
        if texts:
            return texts
    except (SpecctlError, OSError):
        pass
    return [FALLBACK_TEXT]


def prompt_windows(texts: list[str], n: int, chars: np.ndarray, rng: np.random.Generator) -> list[str]:
    """``n`` prompts: windows of ``chars[i]`` characters starting at line boundaries of the texts."""
    out = []
    for i in range(n):
        t = texts[int(rng.integers(len(texts)))]
        want = int(max(chars[i], 16))
        if len(t) <= want:
            out.append(t)
            continue
        start = int(rng.integers(0, len(t) - want))
        nl = t.rfind("\n", 0, start)
        start = nl + 1 if nl >= 0 else 0
        out.append(t[start:start + want])
    return out


def make_requests(workload: str, n: int, *, seed: int = 0, prompt_chars: float = 400.0, max_tokens: float = 64.0,
                  texts: list[str] | None = None, ignore_eos: bool = True) -> Requests:
    """Requests for a workload name.

    - ``corpus`` (default): Poisson arrivals, prompt lengths lognormal around ``prompt_chars``
      characters, output lengths lognormal around ``max_tokens``;
    - a trace or prompt set of ``control.bench.workloads`` (``azure-code``, ``azure-conv``,
      ``mooncake``, ``sharegpt``, ``spec-bench``, ``poisson:in=..,out=..``): its arrival pattern and
      the shape of its length distributions, rescaled so the means are ``prompt_chars`` characters and
      ``max_tokens`` tokens (the CPU pair's context is short); the scale factors go into the notes.

    ``ignore_eos``: every request generates its ``max_tokens`` (the workload's output lengths, as a
    trace replay needs; greedy decoding makes the tokens the same for every policy either way); False
    lets a request end at the model's end token, which makes the load lighter than the workload's.
    """
    if n < 1:
        raise ConfigError(f"requests = {n}: must be >= 1")
    rng = np.random.default_rng([seed, 7])
    texts = texts or corpus_texts()
    notes: dict[str, Any] = {"workload": workload, "seed": seed}
    if workload == "corpus":
        gaps = rng.exponential(1.0, size=n)
        unit = np.cumsum(gaps) - gaps[0]
        sigma = 0.5
        chars = rng.lognormal(math.log(prompt_chars) - sigma**2 / 2, sigma, size=n)
        outs = rng.lognormal(math.log(max_tokens) - sigma**2 / 2, sigma, size=n)
        notes.update({"arrivals": "Poisson", "prompt_chars": f"lognormal mean {prompt_chars:g}",
                      "max_tokens": f"lognormal mean {max_tokens:g}", "prompts": "held-out corpus windows"})
    else:
        from control.bench.workloads import load_workload

        w = load_workload(workload, requests=n, rate=1.0, seed=seed)
        if w.n < n:
            raise ConfigError(f"workload '{workload}' has {w.n} requests; ask for at most that many")
        w = w.head(n)
        t = w.arrival_s - w.arrival_s[0]
        span = float(t[-1]) if n > 1 else 1.0
        unit = t * ((n - 1) / span) if span > 0 else np.arange(n, dtype=float)
        p_scale = prompt_chars / max(float(w.prompt_tokens.mean()), 1.0)
        o_scale = max_tokens / max(float(w.output_tokens.mean()), 1.0)
        chars = w.prompt_tokens * p_scale
        outs = w.output_tokens * o_scale
        notes.update({"arrivals": f"{workload} arrival pattern, rescaled to each load's rate",
                      "prompt_scale": f"prompt chars = trace prompt tokens x {p_scale:.4g}",
                      "output_scale": f"max_tokens = trace output tokens x {o_scale:.4g}",
                      "prompts": "held-out corpus windows", **{f"trace_{k}": v for k, v in w.notes.items()}})
    mt = np.clip(np.round(outs), 2, 4 * max_tokens).astype(np.int64)
    notes["output_lengths"] = "max_tokens exactly (ignore_eos)" if ignore_eos else "up to max_tokens (ends at the end token)"
    return Requests(prompt_windows(texts, n, chars, rng), mt, unit, notes, ignore_eos)


# -- the control plane ------------------------------------------------------------------------------
def switch_policy(ep: Endpoints, policy: str, timeout_s: float = 15.0, drafters: list[str] | None = None) -> float:
    """Set the deployment's policy (and, when given, its drafter set) through the override API; seconds
    until the model has the plan."""
    if ep.control is None:
        raise ConfigError("switching policies needs --control-url (the control-plane service) and its token")
    if not ep.token:
        raise ConfigError("switching policies needs the control plane's token: pass --token or set SPECCTL_TOKEN")
    t0 = time.monotonic()
    try:
        body = {"policy": policy} if not drafters else {"policy": policy, "drafters": list(drafters)}
        r = httpx.put(f"{ep.control}/v1/overrides", json=body, timeout=10,
                      headers={"Authorization": f"Bearer {ep.token}"})
    except httpx.HTTPError as e:
        raise SpecctlError(f"cannot reach the control plane at {ep.control}: {type(e).__name__}: {e}") from None
    if r.status_code == 401:
        raise ConfigError(f"the control plane at {ep.control} refused the token (401); pass the token `specctl serve` printed")
    if r.status_code != 200:
        raise SpecctlError(f"PUT {ep.control}/v1/overrides policy={policy}: HTTP {r.status_code}: {r.text[:200]}")
    while time.monotonic() - t0 < timeout_s:
        if all(model_stats(h)["plan_received"]["policy"] == policy for h in ep.https):
            return time.monotonic() - t0
        time.sleep(0.05)
    raise SpecctlError(f"the llm model did not receive the plan for policy {policy} within {timeout_s:.0f} s; is its "
                       "agent connected to this control plane? (see the model's stats)")


def clear_overrides(ep: Endpoints) -> None:
    if ep.control and ep.token:
        with contextlib.suppress(httpx.HTTPError):
            httpx.put(f"{ep.control}/v1/overrides", json={}, timeout=10, headers={"Authorization": f"Bearer {ep.token}"})


# -- one run ----------------------------------------------------------------------------------------
async def _run_async(ep: Endpoints, reqs: Requests, arrivals: np.ndarray, timeout_s: float,
                     on_done: Callable[[int], None] | None, pool_stats: dict | None = None) -> tuple[list[Result], np.ndarray]:
    import tritonclient.grpc.aio as aio

    from control.clients.replicas import ReplicaPool

    pool = ReplicaPool([f"grpc://{g}" for g in (ep.grpc, *(g for g, _ in ep.replicas))]) if ep.replicas else None
    client = aio.InferenceServerClient(ep.grpc) if pool is None else None
    sent = np.full(reqs.n, np.nan)
    t0 = time.perf_counter()
    done = [0]

    async def one(i: int) -> Result:
        delay = arrivals[i] - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        sent[i] = time.perf_counter() - t0
        params = GenParams(max_tokens=int(reqs.max_tokens[i]), ignore_eos=reqs.ignore_eos)
        try:
            call = (stream_generate(client, reqs.prompts[i], params) if pool is None
                    else pool.generate(reqs.prompts[i], params, request_id=f"bench-{i}"))
            return await asyncio.wait_for(call, timeout_s)
        except TimeoutError:
            return Result(error=f"no complete answer within {timeout_s:.0f} s")
        finally:
            done[0] += 1
            if on_done is not None:
                on_done(done[0])

    try:
        results = await asyncio.gather(*(one(i) for i in range(reqs.n)))
    finally:
        await (client.close() if pool is None else pool.close())
    if pool is not None and pool_stats is not None:
        pool_stats.update(replicas=len(pool.endpoints), retried=pool.stats.retried)
    return list(results), sent


# policy_ms is the step loop's own time in the policy; with the policy off the critical path
# (overlap_policy) that is the hand-over plus the wait for the worker (policy_wait_ms, within it), and
# the worker's observe + decide runs beside the passes, outside busy time: policy_worker_ms its wall
# time (waits for the GIL included), policy_worker_cpu_ms its thread's CPU time.
TIME_KEYS = ("policy_ms", "prefill_ms", "draft_ms", "verify_ms", "deliver_ms", "policy_wait_ms", "policy_worker_ms",
             "policy_worker_cpu_ms")


def _delta(after: dict, before: dict) -> dict[str, Any]:
    d = {k: after[k] - before[k] for k in SUMMED_STATS}
    for k in TIME_KEYS:  # an executor that does not time these parts leaves them out
        if k in after and k in before:
            d[k] = after[k] - before[k]
    d["k_hist"] = (np.asarray(after["k_hist"]) - np.asarray(before["k_hist"])).tolist()
    was = before.get("drafter_steps", {})
    d["drafter_steps"] = {name: int(n) - int(was.get(name, 0)) for name, n in after.get("drafter_steps", {}).items()}
    return d


def run_once(ep: Endpoints, reqs: Requests, *, policy: str, load: float, rate: float, seed: int = 0,
             slo: SLOTargets | None = None, timeout_s: float = 600.0,
             on_done: Callable[[int], None] | None = None, loop: asyncio.AbstractEventLoop | None = None) -> dict:
    """Send ``reqs`` at ``rate`` req/s (arrival pattern scaled); one ``specctl.bench/v1`` row.

    ``loop``: the event loop to run on, one for all the runs of a session (None: a loop of its own).
    grpc.aio's completion queue is one per process and hands a closed channel's late events to the
    loop the channel was made on; a session that closes a loop per run gets them on a closed loop,
    each an 'Event loop is closed' traceback on stderr."""
    arrivals = reqs.unit_arrivals / rate if math.isfinite(rate) and rate > 0 else np.zeros(reqs.n)
    before = fleet_stats(ep)
    pool: dict[str, int] = {}
    work = _run_async(ep, reqs, arrivals, timeout_s, on_done, pool)
    results, sent = asyncio.run(work) if loop is None else loop.run_until_complete(work)
    after = fleet_stats(ep)
    d = _delta(after, before)
    arrival = np.where(np.isfinite(sent), np.minimum(sent, arrivals), arrivals)  # a late send counts from its schedule
    ok = np.array([r.error is None and not r.cancelled for r in results])
    # First token and finish on the run's clock (the client timed them from its own send).
    finish = np.array([sent[i] + r.latency_s if ok[i] else np.nan for i, r in enumerate(results)])
    first = np.array([sent[i] + r.ttft_s if ok[i] else np.nan for i, r in enumerate(results)])
    out_tokens = np.array([len(r.token_ids) for r in results])
    errors = [r.error for r in results if r.error]
    itl = [np.diff(r.chunk_times) / np.asarray(r.chunk_tokens[1:]) for r in results if len(r.chunk_times) > 1]
    itl_all = np.concatenate(itl) if itl else np.array([])
    drafted = sum(r.drafted for r in results)
    accepted = sum(r.accepted for r in results)
    row = run_row(policy, load, seed, arrival, first, finish, out_tokens, busy_s=d["busy_ms"] / 1e3,
                  verified=d["step_verified"], accepted=d["step_accepted"], decode_steps=d["decode_steps"],
                  spec_steps=d["spec_steps"], slo=slo, k_hist=d["k_hist"],
                  extra={"rate_req_s": round(rate, 4) if math.isfinite(rate) else None, "failed": len(errors),
                         "errors": errors[:3], "mean_itl_s": float(itl_all.mean()) if itl_all.size else None,
                         "p99_itl_s": float(np.percentile(itl_all, 99)) if itl_all.size else None,
                         "client_drafted": drafted, "client_accepted": accepted,
                         "mean_accepted_per_step": (d["step_accepted"] + d["decode_steps"]) / d["decode_steps"]
                         if d["decode_steps"] else None,
                         "drafter_steps": d["drafter_steps"],
                         "busy_s": d["busy_ms"] / 1e3, "plan_version": after.get("plan_version"),
                         "time_s": {k[:-3]: round(d[k] / 1e3, 4) for k in TIME_KEYS if k in d},
                         **policy_shares(d), **pool})
    return row


def policy_shares(d: dict) -> dict[str, float]:
    """The policy's time as shares of busy time: ``policy_share`` on the step loop (the critical
    path), and with the policy off it, ``policy_worker_share`` (the worker's observe + decide)."""
    busy = d.get("busy_ms") or 0.0
    if busy <= 0 or "policy_ms" not in d:
        return {}
    out = {"policy_share": round(d["policy_ms"] / busy, 5)}
    if "policy_worker_ms" in d:
        out["policy_worker_share"] = round(d["policy_worker_ms"] / busy, 5)
    return out


def measure_capacity(ep: Endpoints, reqs: Requests, timeout_s: float = 600.0,
                     on_done: Callable[[int], None] | None = None,
                     loop: asyncio.AbstractEventLoop | None = None) -> tuple[float, dict]:
    """Completion rate (req/s) with every request sent at once under the current policy (``loop``: as
    ``run_once``'s)."""
    t0 = time.perf_counter()
    row = run_once(ep, reqs, policy="capacity", load=0.0, rate=float("inf"), timeout_s=timeout_s, on_done=on_done,
                   loop=loop)
    wall = time.perf_counter() - t0
    done = row["extra"]["completed"]
    if done == 0:
        raise SpecctlError(f"the capacity run completed no request: {row['extra']['errors']}")
    return done / wall, row
