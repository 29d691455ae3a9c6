"""The agent's network side: the plan stream subscription and telemetry posts, off the engine thread.

``ServiceLink`` runs one daemon thread with its own asyncio event loop and two tasks:

- plans: ``GET /v1/plan/stream`` (Server-Sent Events, one ``plan`` event with the full plan JSON per
  version, ``id: <service instance>:<version>``). On any failure (refused, reset, a stream silent
  longer than the keepalive timeout, a non-200 answer) it reconnects after an exponential backoff
  with jitter, sending ``Last-Event-ID`` so the service resends only what is newer. Each plan is
  validated and its policy built here; the agent applies it on the engine thread.
- telemetry: closed windows wait in the agent's bounded queue; this task posts the oldest to
  ``POST /v1/telemetry`` and removes it once the service accepted it (2xx) or refused it for good
  (4xx, counted as rejected). While the service is away the queue fills and the agent drops the
  oldest windows (counted); nothing here ever makes the engine wait.

Identity: every window and the plan subscription name the agent's replica and group. The replica is
the Triton server the agent runs in: ``$SPECCTL_REPLICA`` (on Kubernetes, the pod's name from the
downward API) or ``<host>-<pid>``; the group is ``<sku>/<pair>`` of the agent's profile, which picks
the plans the service compiles for that group. A service that predates groups ignores the query
parameters; a service with several groups refuses a group it does not serve, naming the ones it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from control.agent.wire import SOURCE_PATTERN, SOURCE_RULE, group_name, host_source
from control.errors import ConfigError
from control.plan import Plan, parse_plan

log = logging.getLogger("specctl.agent")

POLL_S = 0.2  # how often the telemetry task looks at the queue
TELEMETRY_BACKOFF_S = 0.25  # first retry delay of a telemetry post (capped by the agent's backoff_max_s)
MAX_DOUBLINGS = 30  # a backoff stops doubling here (its cap is reached long before; keeps 2**n finite)
START_WAIT_S = 5.0  # how long start() waits for the network thread to come up
STOP_TIMEOUT_S = 2.0  # default time for the network thread to finish its last post on stop()
JOIN_GRACE_S = 2.0  # beyond the stop timeout, before the thread is reported as not stopping
MAX_CONNECTIONS, MAX_KEEPALIVE = 4, 2  # the link's HTTP pool: the plan stream and telemetry posts
REPLICA_ENV = "SPECCTL_REPLICA"


def replica_id(environ: dict[str, str] | None = None) -> str:
    """This process's replica id: ``$SPECCTL_REPLICA`` or ``<host>-<pid>``, cut to what the wire carries.

    ConfigError when ``$SPECCTL_REPLICA`` is set to something the wire does not carry.
    """
    env = os.environ if environ is None else environ
    given = env.get(REPLICA_ENV)
    if given is not None:
        if not re.fullmatch(SOURCE_PATTERN, given):
            raise ConfigError(f"{REPLICA_ENV}={given[:80]!r}: {SOURCE_RULE}")
        return given
    return host_source()


class Backoff:
    """Exponential backoff with jitter: the n-th delay is uniform in [d/2, d], d = min(max, initial * 2^n)."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        if not (0 < initial_s <= max_s):
            raise ConfigError(f"backoff: need 0 < initial ({initial_s}) <= max ({max_s}) seconds")
        self.initial = initial_s
        self.max = max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        d = min(self.max, self.initial * (2.0 ** min(self.attempt, MAX_DOUBLINGS)))
        self.attempt += 1
        return self._rng.uniform(d / 2.0, d)

    def reset(self) -> None:
        self.attempt = 0


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows; plans carry finite numbers only")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:40]} is out of range; plans carry finite numbers only")
    return v


def strict_json(text: str):
    """``json.loads`` that refuses NaN, Infinity and out-of-range numbers (``1e400``) with ValueError."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


@dataclass(slots=True)
class SSEEvent:
    event: str
    id: str | None
    data: str


async def iter_sse(lines: AsyncIterator[str]) -> AsyncIterator[SSEEvent]:
    """Server-Sent Events from a stream of lines (the subset of the spec the service uses)."""
    event, eid, data = "message", None, []
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield SSEEvent(event, eid, "\n".join(data))
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue  # comment (keepalive)
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            eid = value


class AgentSide(Protocol):
    """What the link needs of its agent (``control.agent.controller.Agent``); it writes none of its fields."""

    seed: int
    queue: deque  # closed telemetry windows, oldest first; the link pops what it sent

    @property
    def plan_id(self) -> str: ...

    @property
    def plan(self) -> Plan: ...

    def offer_plan(self, plan: Plan, plan_id: str) -> bool: ...

    def reject_plan(self, reason: str) -> bool: ...

    def window_payload(self, w: Any, seq: int) -> dict[str, Any]: ...


class ServiceLink:
    """Background subscription and telemetry for one ``Agent`` (see the module docstring)."""

    def __init__(self, agent: AgentSide, url: str, *, token: str | None, backoff_initial_s: float = 0.25,
                 backoff_max_s: float = 5.0, timeout_s: float = 2.0, keepalive_timeout_s: float = 20.0,
                 replica: str | None = None) -> None:
        self.agent = agent
        self.url = url
        self.replica = replica or replica_id()
        profile = agent.plan.profile
        self.group = group_name(profile.sku, profile.pair)
        self.token = token
        self.backoff = (backoff_initial_s, backoff_max_s)
        self.timeout_s = timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.connected = False
        self.subscriptions = 0
        self.connect_failures = 0
        self.sent = 0
        self.rejected = 0
        self.post_failures = 0
        self.last_error = ""
        self.last_plan_id: str | None = None
        self._seq = 0
        self._encoded: tuple[Any, bytes] | None = None  # the queue head's document, kept for retries
        self._stop_timeout = STOP_TIMEOUT_S
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._rng = random.Random(agent.seed + 1)

    # -- lifecycle (any thread) --------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specctl-agent-link", daemon=True)
        self._thread.start()
        self._started.wait(START_WAIT_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self._stop_timeout = timeout_s
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already finished
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s + JOIN_GRACE_S)
            if self._thread.is_alive():
                log.warning("specctl agent: the network thread did not stop within %.1f s", timeout_s + JOIN_GRACE_S)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as e:  # never let the thread die silently
            self.last_error = f"network thread stopped: {type(e).__name__}: {e}"
            log.error(self.last_error)

    async def _main(self) -> None:
        import httpx

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._started.set()
        headers = {"User-Agent": "specctl-agent"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE)
        async with httpx.AsyncClient(headers=headers, limits=limits, trust_env=False) as client:
            plans = asyncio.create_task(self._plan_loop(client))
            telemetry = asyncio.create_task(self._telemetry_loop(client))
            await self._stop.wait()
            plans.cancel()
            # Last chance for queued telemetry, bounded by the stop timeout.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(telemetry, timeout=self._stop_timeout)
            for t in (plans, telemetry):
                t.cancel()
            await asyncio.gather(plans, telemetry, return_exceptions=True)
        self.connected = False

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True when stopping."""
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
            return True
        except TimeoutError:
            return False

    # -- plans ---------------------------------------------------------------------------------------
    async def _plan_loop(self, client) -> None:
        import httpx

        backoff = Backoff(*self.backoff, rng=self._rng)
        timeout = httpx.Timeout(self.timeout_s, read=self.keepalive_timeout_s)
        was_up = None
        while not self._stop.is_set():
            try:
                headers = {"Accept": "text/event-stream"}
                if self.last_plan_id:
                    headers["Last-Event-ID"] = self.last_plan_id
                params = {"group": self.group, "replica": self.replica}
                async with client.stream("GET", f"{self.url}/v1/plan/stream", params=params, headers=headers,
                                         timeout=timeout) as r:
                    if r.status_code != 200:
                        body = (await r.aread()).decode("utf-8", "replace")[:200]
                        raise RuntimeError(f"plan stream answered HTTP {r.status_code}: {body}")
                    self.connected = True
                    self.subscriptions += 1
                    backoff.reset()
                    if was_up is not True:
                        log.info("specctl agent: subscribed to plans at %s", self.url)
                    was_up = True
                    async for ev in iter_sse(r.aiter_lines()):
                        if ev.event == "plan":
                            self._on_plan(ev)
                raise RuntimeError("the service closed the plan stream")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.connected = False
                self.connect_failures += 1
                msg = f"plan stream at {self.url}: {type(e).__name__}: {e}".rstrip(": ")
                self.last_error = msg
                if was_up is not False:
                    log.warning("specctl agent: %s; serving on plan %s, reconnecting with backoff",
                                msg, self.agent.plan_id)
                was_up = False
            if await self._sleep(backoff.next()):
                return

    def _on_plan(self, ev: SSEEvent) -> None:
        plan_id = ev.id or "?"
        try:
            plan = parse_plan(strict_json(ev.data), where=f"plan {plan_id} from {self.url}")
        except (ConfigError, ValueError) as e:
            self.last_error = str(e)
            self.agent.reject_plan(str(e))
            return
        if self.agent.offer_plan(plan, plan_id):
            self.last_plan_id = plan_id

    # -- telemetry -------------------------------------------------------------------------------------
    def _payload(self, w: Any) -> bytes:
        """The window's JSON document, encoded once: a retry sends the same bytes and sequence number."""
        if self._encoded is None or self._encoded[0] is not w:
            self._seq += 1
            doc = self.agent.window_payload(w, self._seq)
            doc.setdefault("replica", self.replica)
            doc.setdefault("group", self.group)
            self._encoded = (w, json.dumps(doc, separators=(",", ":"), allow_nan=False).encode())
        return self._encoded[1]

    async def _telemetry_loop(self, client) -> None:
        backoff = Backoff(min(TELEMETRY_BACKOFF_S, self.backoff[1]), max(self.backoff[1], TELEMETRY_BACKOFF_S), rng=self._rng)
        q = self.agent.queue
        url = f"{self.url}/v1/telemetry"
        while True:
            if not q:
                if (self._stop.is_set() or await self._sleep(POLL_S)) and not q:
                    return
                continue
            try:
                w = q[0]
            except IndexError:
                continue
            try:
                body = self._payload(w)
            except Exception as e:  # a window that cannot be encoded is dropped, never retried forever
                self.rejected += 1
                self.last_error = f"telemetry window not sendable: {type(e).__name__}: {e}"
                log.error("specctl agent: %s", self.last_error)
                self._pop(q, w)
                continue
            t0 = time.monotonic()
            try:
                r = await client.post(url, content=body, headers={"Content-Type": "application/json"},
                                      timeout=self.timeout_s)
                status = r.status_code
                detail = r.text[:300] if status >= 400 else ""
            except Exception as e:
                status, detail = 0, f"{type(e).__name__}: {e}"
            if 200 <= status < 300:
                self.sent += 1
                backoff.reset()
                self._pop(q, w)
            elif 400 <= status < 500 and status not in (408, 429):
                self.rejected += 1
                msg = f"telemetry refused by the service (HTTP {status}): {detail}"
                if msg != self.last_error:
                    log.warning("specctl agent: %s", msg)
                self.last_error = msg
                self._pop(q, w)
            else:
                self.post_failures += 1
                self.last_error = f"telemetry post failed: {detail or f'HTTP {status}'}"
                if self._stop.is_set():
                    return
                if await self._sleep(max(backoff.next() - (time.monotonic() - t0), 0.0)):
                    continue  # stopping: one more pass to flush if the service is back

    @staticmethod
    def _pop(q, w) -> None:
        try:
            if q[0] is w:
                q.popleft()
        except IndexError:
            pass
