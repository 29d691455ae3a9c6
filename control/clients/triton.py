"""Clients of the ``llm`` model over tritonclient: gRPC streaming (asyncio) and HTTP generate.

- ``stream_generate(client, prompt, params)``: one request over a gRPC bidirectional stream
  (``tritonclient.grpc.aio``), timing every response (TTFT, inter-token gaps); many run concurrently
  on one event loop, each on its own stream. Cancelling the awaiting task stops the request on the
  server (a ``stop`` request with its id), which frees its KV at the next step.
- ``http_generate(url, prompt, params, stream=...)``: Triton's ``/v2/models/<m>/generate`` and
  ``generate_stream`` endpoints (httpx).
- ``model_stats(url)``: the model instance's counters (a request with ``stats`` true).

Nothing is retried: generation is not idempotent. Connection failures and the server's rejections
raise ``RequestError`` with one line saying what happened (the server's message included).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from control.errors import SpecctlError

MODEL = "llm"
ON_CANCEL = ("stop", "cancel")  # how stream_generate ends a request whose task is cancelled
STOP_GRACE_S = 2.0  # how long a stopped request's stream has to end before it is cancelled


class RequestError(SpecctlError):
    """The server refused or failed a request, or could not be reached."""


@dataclass(frozen=True)
class GenParams:
    """Per-request inputs (tensorrtllm_backend names); None = the server's default."""

    max_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    random_seed: int | None = None
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    num_draft_tokens: int | None = None
    end_id: int | None = None
    ignore_eos: bool = False  # generate max_tokens even past the end token (benchmarks' fixed lengths)
    policy: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_tokens": self.max_tokens}
        for name in ("temperature", "top_k", "top_p", "random_seed", "num_draft_tokens", "end_id", "policy"):
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        if self.stop_words:
            out["stop_words"] = list(self.stop_words)
        if self.bad_words:
            out["bad_words"] = list(self.bad_words)
        if self.ignore_eos:
            out["ignore_eos"] = True
        return out


@dataclass
class Result:
    """One request as the client saw it (times in seconds from sending)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    ttft_s: float = float("nan")
    latency_s: float = float("nan")
    chunk_times: list[float] = field(default_factory=list)  # arrival of each response with tokens
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each of those responses
    error: str | None = None
    cancelled: bool = False
    replica: str = ""  # the endpoint that answered (set by control.clients.replicas.ReplicaPool)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (NaN for a single-token output)."""
        n = len(self.token_ids)
        return (self.latency_s - self.ttft_s) / (n - 1) if n > 1 else float("nan")


def parse_url(url: str) -> tuple[str, str]:
    """(protocol, address): ``grpc://host:port`` or ``host:port`` -> grpc; ``http(s)://host:port`` -> http."""
    if "://" not in url:
        url = "grpc://" + url
    p = urlsplit(url)
    if p.scheme not in ("grpc", "http", "https") or not p.hostname:
        raise RequestError(f"url '{url}': use grpc://HOST:PORT (or HOST:PORT) for gRPC, http://HOST:PORT for HTTP")
    try:
        port = p.port
    except ValueError:
        port = None
    if port is None:
        raise RequestError(f"url '{url}' needs a port in 1..65535 (Triton's defaults: HTTP 8000, gRPC 8001)")
    if p.scheme == "grpc":
        return "grpc", f"{p.hostname}:{port}"
    return "http", f"{p.scheme}://{p.hostname}:{port}"


def grpc_addresses(urls: list[str], what: str = "url") -> list[str]:
    """``host:port`` of each gRPC URL; RequestError naming ``what`` for an HTTP URL, none, or a repeat."""
    addrs = []
    for url in urls:
        proto, addr = parse_url(url)
        if proto != "grpc":
            raise RequestError(f"{what} '{url}': requests stream over gRPC; give grpc://HOST:PORT (Triton's gRPC port)")
        addrs.append(addr)
    if not addrs or len(set(addrs)) != len(addrs):
        raise RequestError(f"{what} {', '.join(urls)!r}: give one gRPC endpoint, or several distinct ones")
    return addrs


# -- gRPC --------------------------------------------------------------------------------------------
def grpc_inputs(prompt: str | list[int], params: GenParams, stream: bool = True) -> list:
    import tritonclient.grpc as g

    def tensor(name: str, value: np.ndarray, dtype: str):
        t = g.InferInput(name, list(value.shape), dtype)
        t.set_data_from_numpy(value)
        return t

    if isinstance(prompt, str):
        ins = [tensor("text_input", np.array([prompt.encode()], dtype=object), "BYTES")]
    else:
        ins = [tensor("input_ids", np.asarray(prompt, dtype=np.int32), "INT32")]
    ins.append(tensor("max_tokens", np.array([params.max_tokens], dtype=np.int32), "INT32"))
    ins.append(tensor("stream", np.array([stream]), "BOOL"))
    for name, dt, npdt in (("temperature", "FP32", np.float32), ("top_p", "FP32", np.float32), ("top_k", "INT32", np.int32),
                           ("num_draft_tokens", "INT32", np.int32), ("end_id", "INT32", np.int32),
                           ("random_seed", "UINT64", np.uint64)):
        v = getattr(params, name)
        if v is not None:
            ins.append(tensor(name, np.array([v], dtype=npdt), dt))
    for name in ("stop_words", "bad_words"):
        words = getattr(params, name)
        if words:
            ins.append(tensor(name, np.array([w.encode() for w in words], dtype=object), "BYTES"))
    if params.ignore_eos:
        ins.append(tensor("ignore_eos", np.array([True]), "BOOL"))
    if params.policy is not None:
        ins.append(tensor("policy", np.array([params.policy.encode()], dtype=object), "BYTES"))
    return ins


def stop_inputs() -> list:
    """A stop request's inputs (``stop`` true): sent with a request's id, it ends that request."""
    import tritonclient.grpc as g

    t = g.InferInput("stop", [1], "BOOL")
    t.set_data_from_numpy(np.array([True]))
    return [t]


def _absorb(res: Result, r, t: float) -> bool:
    """Add one response to ``res``; True when it is the final one."""
    final = bool(r.get_response().parameters["triton_final_response"].bool_param)
    try:
        ids = r.as_numpy("output_ids")
    except Exception:
        ids = None
    text = r.as_numpy("text_output")
    n = 0
    if ids is not None:
        ids = ids.reshape(-1).tolist()
        res.token_ids.extend(int(x) for x in ids)
        n = len(ids)
    if text is not None:
        res.text += b"".join(x if isinstance(x, bytes) else str(x).encode() for x in text.reshape(-1)).decode("utf-8", "replace")
    for name in ("drafted_tokens", "accepted_tokens"):
        v = r.as_numpy(name)
        if v is not None:
            setattr(res, name.split("_")[0], int(v.reshape(-1)[0]))
    if n:
        if not res.chunk_times:
            res.ttft_s = t
        res.chunk_times.append(t)
        res.chunk_tokens.append(n)
    return final


class StreamBroken(Exception):
    """A stream that ended without its request's final response: ``cause`` is the exception that
    broke the channel, or None where the server ended the stream."""

    def __init__(self, cause: Exception | None) -> None:
        super().__init__(cause)
        self.cause = cause

    def channel_text(self) -> str:
        """The failed channel's status and details (``StatusCode.UNAVAILABLE: Socket closed``), not
        the ``<AioRpcError of RPC that terminated with: ...>`` repr with its debug string; "" where
        the server ended the stream."""
        e = self.cause
        if e is None:
            return ""
        code, details = getattr(e, "code", None), getattr(e, "details", None)
        if callable(code) and callable(details):
            try:
                return f"{code()}: {details()}"
            except Exception:  # noqa: BLE001 - an error object that cannot say: its type and text
                pass
        return f"{type(e).__name__}: {e}"


class StoppableStream:
    """One request on a gRPC stream of its own, read by a task of its own into ``queue``, that can be
    stopped by its request id instead of cancelled.

    The reading is not the caller's: grpc.aio cancels the whole call when the task awaiting one of its
    messages is cancelled, and callers are cancelled (a timeout, an HTTP client gone). ``next()``
    gives the responses in turn. ``stop()`` sends a stop request with the request's id on the stream (Triton 2.51's
    gRPC frontend can crash on a stream cancelled while responses are in flight: docs/decisions.md,
    2026-11-28); ``close()`` says nothing more will be sent; ``cancel()`` cancels the call."""

    END = object()

    def __init__(self, client, model: str, inputs: list, request_id: str, timeout_s: float | None = None) -> None:
        import asyncio

        self.model, self.request_id = model, request_id
        self._ended = asyncio.Event()  # nothing more to send
        self._stop: list[dict] = []
        self.it = client.stream_infer(self._requests(inputs), stream_timeout=timeout_s)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self, inputs: list):
        yield {"model_name": self.model, "inputs": inputs, "request_id": self.request_id}
        await self._ended.wait()
        for r in self._stop:
            yield r

    async def _read(self) -> None:
        try:
            async for item in self.it:
                self.queue.put_nowait(item)
            self.queue.put_nowait(self.END)
        except Exception as e:  # the channel failed
            self.queue.put_nowait(e)

    async def next(self) -> tuple:
        """The next ``(result, error)`` the server sent (``error``: its error response, the request's
        last); raises ``StreamBroken`` once the stream has nothing more."""
        got = await self.queue.get()
        if got is self.END:
            raise StreamBroken(None)
        if isinstance(got, Exception):
            raise StreamBroken(got)
        return got

    def close(self) -> None:
        self._ended.set()

    def cancel(self) -> None:
        self._ended.set()
        self.it.cancel()

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the request; the stream then ends with its final response and the stop's. One that has
        not ended within ``grace_s`` (or whose waiting is cancelled) is cancelled."""
        import asyncio

        self._stop.append({"model_name": self.model, "inputs": stop_inputs(), "request_id": self.request_id})
        self._ended.set()
        ended = False
        try:
            _, pending = await asyncio.wait({self.reader}, timeout=grace_s)
            ended = not pending
        finally:
            if not ended:
                self.it.cancel()


async def send_stop(client, request_id: str, *, model: str = MODEL, timeout_s: float = STOP_GRACE_S) -> bool:
    """End the request known by ``request_id`` with a stop request on a stream of its own (for a
    request this client cannot reach on its own stream); True once the model has answered it."""
    import asyncio

    stream = StoppableStream(client, model, stop_inputs(), request_id, timeout_s)
    stream.close()
    try:
        _, err = await asyncio.wait_for(stream.next(), timeout_s)
        return err is None
    except (StreamBroken, asyncio.TimeoutError):
        return False
    finally:
        stream.cancel()


async def stream_generate(client, prompt: str | list[int], params: GenParams, *, model: str = MODEL,
                          request_id: str = "", on_chunk=None, timeout_s: float | None = None,
                          on_cancel: str = "stop") -> Result:
    """One streaming request on its own gRPC stream; see the module docstring.

    ``client`` is a ``tritonclient.grpc.aio.InferenceServerClient``. A server-side error is recorded
    in ``Result.error``. A cancelled task ends the request on the server and re-raises: ``on_cancel``
    "stop" stops it by its id (``StoppableStream.stop``); "cancel" cancels the gRPC stream, Triton's
    own cancellation path.
    """
    import asyncio
    import uuid

    if on_cancel not in ON_CANCEL:
        raise ValueError(f"on_cancel = {on_cancel!r}: must be one of {', '.join(ON_CANCEL)}")
    res = Result()
    t0 = time.perf_counter()
    stream = StoppableStream(client, model, grpc_inputs(prompt, params, stream=True),
                             request_id or (uuid.uuid4().hex if on_cancel == "stop" else ""), timeout_s)
    try:
        await _read_result(stream, res, t0, on_chunk)
    except asyncio.CancelledError:
        res.cancelled = True
        if on_cancel == "cancel":
            stream.cancel()
        else:
            await stream.stop()
        raise
    finally:
        stream.close()
    res.latency_s = time.perf_counter() - t0
    return res


async def _read_result(stream: StoppableStream, res: Result, t0: float, on_chunk) -> None:
    """Responses into ``res`` until the final one (``stream_generate``)."""
    while True:
        try:
            r, err = await stream.next()
        except StreamBroken as e:  # the connection failed, or the server went away mid-request
            # the whole text, gRPC's debug string included: ReplicaPool tells a replica that went
            # away from a refusal by it (control/clients/replicas.py)
            res.error = (f"{type(e.cause).__name__}: {e.cause}" if e.cause is not None else
                         f"the stream ended after {len(res.token_ids)} tokens without the final response")
            return
        if err is not None:
            res.error = str(err.message() if hasattr(err, "message") else err)
            return
        final = _absorb(res, r, time.perf_counter() - t0)
        if on_chunk is not None:
            on_chunk(res)
        if final:
            return


def grpc_generate(address: str, prompt: str | list[int], params: GenParams, *, model: str = MODEL,
                  timeout_s: float = 300.0, on_chunk=None) -> Result:
    """Blocking wrapper of ``stream_generate``; raises RequestError when the server refused the request."""
    import asyncio

    import tritonclient.grpc.aio as aio

    async def run() -> Result:
        client = aio.InferenceServerClient(address)
        try:
            return await asyncio.wait_for(stream_generate(client, prompt, params, model=model, on_chunk=on_chunk), timeout_s)
        finally:
            await client.close()

    try:
        res = asyncio.run(run())
    except TimeoutError:
        raise RequestError(f"no complete answer from {address} within {timeout_s:.0f} s") from None
    if res.error:
        raise RequestError(_oneline(res.error, address))
    return res


def _oneline(msg: str, where: str) -> str:
    m = " ".join(str(msg).split())
    if "StatusCode.UNAVAILABLE" in m or "failed to connect" in m.lower() or "Connection refused" in m:
        return f"cannot reach Triton at {where}: is `specctl serve` running there? ({m[:160]})"
    return m


# -- HTTP --------------------------------------------------------------------------------------------
def http_generate(url: str, prompt: str, params: GenParams, *, stream: bool = False, model: str = MODEL,
                  timeout_s: float = 300.0, on_chunk=None) -> Result:
    """Triton's generate (one response) or generate_stream (server-sent events) endpoint."""
    import httpx

    body = {"text_input": prompt, **params.as_json()}
    res = Result()
    t0 = time.perf_counter()
    try:
        if not stream:
            r = httpx.post(f"{url}/v2/models/{model}/generate", json=body, timeout=timeout_s)
            doc = _http_doc(r)
            _absorb_json(res, doc, time.perf_counter() - t0)
        else:
            body["stream"] = True
            with httpx.stream("POST", f"{url}/v2/models/{model}/generate_stream", json=body, timeout=timeout_s) as r:
                if r.status_code != 200:
                    r.read()
                    _http_doc(r)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    doc = json.loads(line[5:])
                    if "error" in doc:
                        raise RequestError(str(doc["error"]))
                    _absorb_json(res, doc, time.perf_counter() - t0)
                    if on_chunk is not None:
                        on_chunk(res)
    except httpx.HTTPError as e:
        raise RequestError(f"cannot reach Triton at {url}: is `specctl serve` running there? ({type(e).__name__}: {e})") from None
    res.latency_s = time.perf_counter() - t0
    return res


def _http_doc(r) -> dict[str, Any]:
    try:
        doc = r.json()
    except ValueError:
        doc = {"error": r.text[:200]}
    if r.status_code != 200 or "error" in doc:
        raise RequestError(str(doc.get("error", f"HTTP {r.status_code}")))
    return doc


def _absorb_json(res: Result, doc: dict[str, Any], t: float) -> None:
    ids = doc.get("output_ids", [])
    ids = ids if isinstance(ids, list) else [ids]
    text = doc.get("text_output", "")
    res.text += "".join(text) if isinstance(text, list) else str(text)
    res.token_ids.extend(int(x) for x in ids)
    res.drafted = int(doc.get("drafted_tokens", res.drafted))
    res.accepted = int(doc.get("accepted_tokens", res.accepted))
    if ids:
        if not res.chunk_times:
            res.ttft_s = t
        res.chunk_times.append(t)
        res.chunk_tokens.append(len(ids))


def model_stats(url: str, *, model: str = MODEL, timeout_s: float = 10.0) -> dict[str, Any]:
    """The counters of the model instance that answers (HTTP generate with ``stats`` true)."""
    import httpx

    try:
        r = httpx.post(f"{url}/v2/models/{model}/generate", json={"stats": True}, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise RequestError(f"cannot reach Triton at {url}: {type(e).__name__}: {e}") from None
    doc = _http_doc(r)
    text = doc.get("text_output")
    return json.loads(text[0] if isinstance(text, list) else text)
