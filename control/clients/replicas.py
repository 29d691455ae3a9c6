"""A client for several Triton replicas: spreads requests over them and retries a request whose
replica died on another one.

``ReplicaPool`` sends each request (gRPC streaming, ``stream_generate``) to the next live replica in
turn, the one with the fewest requests in flight on a tie. When a request fails because its replica
went away (connection refused or reset, ``UNAVAILABLE``, or a stream that ended without its final
response), the replica is taken out of the rotation for ``cooldown_s`` and the request is sent again,
from the start, to another replica, up to ``max_attempts`` in all. A request the server refused (bad
input, a limit) is not retried: another replica would refuse it too. With greedy decoding the retried
request returns the same tokens it would have the first time.

Counts per pool: ``completed``, ``failed`` (no attempt succeeded), ``retried`` (requests sent again),
and per replica the requests that failed there.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from control.clients.triton import MODEL, GenParams, RequestError, Result, grpc_addresses, stream_generate

REPLICA_GONE = ("unavailable", "failed to connect", "connection refused", "connection reset", "socket closed",
                "without the final response", "broken pipe", "goaway", "end of tcp stream", "transport",
                # grpc.aio reports a write on a stream its connection lost as INTERNAL, 'Failed
                # "execute_batch": (SendMessageOperation,)' (grpc/grpc#36066); seen when a replica is killed
                'failed "execute_batch"')
COOLDOWN_S = 5.0
MAX_ATTEMPTS = 3


def replica_gone(error: str) -> bool:
    """True when ``error`` says the replica went away (retry elsewhere), not that it refused the request."""
    e = error.lower()
    return any(s in e for s in REPLICA_GONE)


@dataclass
class Endpoint:
    address: str
    inflight: int = 0
    sent: int = 0
    failed: int = 0  # attempts that failed here because the replica went away
    down_until: float = 0.0
    client: object | None = None


@dataclass
class PoolStats:
    completed: int = 0
    failed: int = 0
    retried: int = 0
    errors: list[str] = field(default_factory=list)


class ReplicaPool:
    """Requests spread over several replicas' gRPC endpoints (see the module docstring)."""

    def __init__(self, urls: list[str], *, model: str = MODEL, max_attempts: int = MAX_ATTEMPTS,
                 cooldown_s: float = COOLDOWN_S) -> None:
        addrs = grpc_addresses(urls, "replica url")
        if max_attempts < 1:
            raise RequestError(f"max_attempts = {max_attempts}: must be >= 1")
        self.endpoints = [Endpoint(a) for a in addrs]
        self.model = model
        self.max_attempts = max_attempts
        self.cooldown_s = cooldown_s
        self.stats = PoolStats()
        self._next = 0

    def _client(self, ep: Endpoint):
        if ep.client is None:
            import tritonclient.grpc.aio as aio

            ep.client = aio.InferenceServerClient(ep.address)
        return ep.client

    def pick(self, exclude: set[str]) -> Endpoint | None:
        """The next live replica not in ``exclude`` (round robin, fewest in flight first); a replica in
        its cool-down only when no other is left."""
        now = time.monotonic()
        n = len(self.endpoints)
        order = [self.endpoints[(self._next + i) % n] for i in range(n)]
        self._next = (self._next + 1) % n
        live = [e for e in order if e.address not in exclude and e.down_until <= now]
        cands = live or [e for e in order if e.address not in exclude]
        return min(cands, key=lambda e: e.inflight) if cands else None

    async def generate(self, prompt: str | list[int], params: GenParams, *, request_id: str = "") -> Result:
        """One request, retried on another replica if its replica goes away; the last attempt's Result."""
        tried: set[str] = set()
        res = Result(error="no replica to send to")
        for attempt in range(self.max_attempts):
            ep = self.pick(tried)
            if ep is None:
                break
            if attempt:
                self.stats.retried += 1
            tried.add(ep.address)
            ep.inflight += 1
            ep.sent += 1
            try:
                res = await stream_generate(self._client(ep), prompt, params, model=self.model, request_id=request_id)
            finally:
                ep.inflight -= 1
            res.replica = ep.address
            if res.error is None:
                self.stats.completed += 1
                return res
            if not replica_gone(res.error):
                break  # refused by the server: another replica would refuse it too
            ep.failed += 1
            ep.down_until = time.monotonic() + self.cooldown_s
        self.stats.failed += 1
        self.stats.errors.append(res.error or "")
        return res

    async def run(self, prompts: list[str], params: GenParams, *, concurrency: int) -> list[Result]:
        """All ``prompts`` with at most ``concurrency`` in flight; results in prompt order."""
        sem = asyncio.Semaphore(max(concurrency, 1))

        async def one(i: int, p: str) -> Result:
            async with sem:
                return await self.generate(p, params, request_id=f"pool-{i}")

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    async def close(self) -> None:
        for ep in self.endpoints:
            if ep.client is not None:
                await ep.client.close()
                ep.client = None
