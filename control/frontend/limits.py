"""Request limits checked before any handler (or Triton) sees a body.

Triton 2.51's HTTP server crashes on a form-encoded body of about 4 MB and on JSON nested about
300,000 deep. The front end refuses both kinds before forwarding: bodies over ``max_body_bytes``
get 413, form and multipart content types 415, JSON nested deeper than ``max_json_depth`` 400.
Errors use OpenAI's error shape so both APIs answer alike.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: far below the 4 MB that crashed Triton 2.51
DEFAULT_MAX_JSON_DEPTH = 32  # OpenAI and KServe bodies nest at most ~5 deep
REFUSED_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class BodyLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH


def json_depth(raw: bytes) -> int:
    """Deepest nesting of arrays/objects in ``raw`` (strings skipped), without parsing it."""
    stripped = _JSON_STRING.sub(b'""', raw)
    b = np.frombuffer(stripped, dtype=np.uint8)  # [n]
    step = np.isin(b, _OPEN).astype(np.int32) - np.isin(b, _CLOSE).astype(np.int32)  # [n]
    return int(np.cumsum(step).max(initial=0))


def error_json(status: int, message: str, param: str | None = None) -> tuple[int, bytes]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return status, json.dumps(body).encode()


def media_type(headers: dict[bytes, bytes]) -> str:
    return headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")


def check_body(ctype: str, body: bytes, limits: BodyLimits, json_prefix_len: int | None = None) -> tuple[int, bytes] | None:
    """An error (status, body) for a body that breaks the limits, else None."""
    if ctype in REFUSED_TYPES:
        return error_json(415, f"Content-Type {ctype} is not accepted; send the body as application/json "
                               "(curl: -H 'Content-Type: application/json')", "content-type")
    head = body[:json_prefix_len] if json_prefix_len is not None else body
    if ctype != "application/octet-stream" or json_prefix_len is not None:
        depth = json_depth(head)
        if depth > limits.max_json_depth:
            return error_json(400, f"JSON nested {depth} deep; at most {limits.max_json_depth} levels are accepted")
    return None


class LimitsMiddleware:
    """ASGI middleware: reads a request body under the limits, then replays it to the app."""

    def __init__(self, app, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":  # every method: a GET may carry a body too
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        error, body = await self._read(headers, receive)
        if error is not None:
            await _respond(send, *error)
            return
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, headers: dict[bytes, bytes], receive) -> tuple[tuple[int, bytes] | None, bytes]:
        cap = self.limits.max_body_bytes
        too_big = error_json(413, f"request body over {cap} bytes; at most {cap} bytes are accepted")
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            return too_big, b""
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return error_json(400, "the client closed the connection before sending the whole body"), b""
            part = msg.get("body", b"")
            size += len(part)
            if size > cap:
                return too_big, b""
            chunks.append(part)
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        prefix = headers.get(b"inference-header-content-length")
        prefix_len = int(prefix) if prefix is not None and prefix.isdigit() else None
        return check_body(media_type(headers), body, self.limits, prefix_len), body


async def _respond(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
