"""Triton's KServe HTTP API (``/v2/...``) forwarded to Triton on its internal loopback port.

Bodies reach this code only after ``limits`` has checked them. ``generate`` / ``generate_stream``
bodies for the llm model and its aliases are checked against the request contract first
(``check_generate_body``): Triton's JSON layer would answer a wrong type with a 500 that names no
field, truncate integers to int32 and ignore a misspelt field; those get a 400 naming the field.
A non-streamed ``generate`` for those models carries a stop id (``STOP_ID_PARAMETER``: Triton
2.51's HTTP generate cannot carry a request id), and a client that leaves before its answer has the
request stopped by that id over gRPC; a ``generate_stream`` whose reader leaves is cancelled by
Triton's HTTP frontend itself.
Responses stream through unchanged (``generate_stream`` is server-sent events), except a ``generate``
error, which keeps only the model's own words (Triton wraps what a Python model raised in
``Failed to process the request(s) ...`` and its frames). Hop-by-hop headers are not forwarded.
POSTs other than inference (``USER_POST``) get a 403: they are Triton's administration (logging,
tracing, shared-memory regions, the model repository).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from control.errors import ConfigError
from control.frontend.connection import CLIENT_CLOSED, while_connected
from control.frontend.protocol import UNAVAILABLE, OpenAIError, retry_after
from control.triton.forward_model import model_message
from control.triton.llm_request import STOP_ID_PARAMETER, STOPPING, check_generate_body

HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
                         "content-length", "proxy-authorization", "proxy-authenticate"})
METHODS = ["GET", "POST", "HEAD"]
LLM_MODELS = ("llm", "ensemble", "tensorrt_llm_bls")
GENERATE_PATH = re.compile(r"models/([^/]+)(?:/versions/\d+)?/(generate|generate_stream)")
# the POSTs a user sends: inference. Triton's others are its administration (logging, tracing,
# shared-memory regions, the model repository), which answers only its admin key (triton_launch.ADMIN_HEADER)
USER_POST = re.compile(r"models/[^/]+(?:/versions/\d+)?/(?:infer|generate|generate_stream)")


@dataclass(frozen=True)
class Forward:
    """What the proxy sends upstream for one POST: the body, and for a non-streamed ``generate`` of
    the llm model the id it can be stopped by (``STOP_ID_PARAMETER``) if its client leaves."""

    body: bytes
    stop_id: str = ""


def _forward(path: str, body: bytes) -> Forward:
    """A generate body for the llm model checked (``ConfigError`` names what is wrong), and a
    non-streamed one given a stop id; any other body as it came."""
    m = GENERATE_PATH.fullmatch(path)
    if m is None or m.group(1) not in LLM_MODELS:
        return Forward(body)
    try:
        doc = json.loads(body)
    except ValueError:
        return Forward(body)  # Triton names a body that is not JSON itself
    streamed = m.group(2) == "generate_stream"
    check_generate_body(doc, stream_endpoint=streamed)
    if streamed:  # Triton's HTTP frontend cancels a stream whose reader left
        return Forward(body)
    # A stop or stats request starts no generation; and a stop given an id would end nothing quietly
    # instead of being told that HTTP cannot name the request it means.
    if doc.get("stop") is True or doc.get("stats") is True:
        return Forward(body)
    stop_id = f"kserve-{uuid.uuid4().hex}"
    return Forward(json.dumps({**doc, STOP_ID_PARAMETER: stop_id}).encode(), stop_id)


async def _model_error(r: httpx.Response) -> JSONResponse:
    """Triton's error for a generate request, with the model's own words only (no ``Failed to process
    the request(s)`` wrapper, no Python frames)."""
    try:
        raw = await r.aread()
    finally:
        await r.aclose()
    try:
        doc = json.loads(raw)
    except ValueError:
        return Response(raw, status_code=r.status_code, media_type=r.headers.get("content-type"))
    status = r.status_code
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        doc["error"] = model_message(doc["error"])
        if STOPPING in doc["error"]:  # drained at shutdown: not the client's fault, retry elsewhere or later
            status = UNAVAILABLE
    return JSONResponse(doc, status_code=status, headers=retry_after(status))


def register(app: FastAPI) -> None:
    @app.api_route("/v2", methods=METHODS)
    @app.api_route("/v2/{path:path}", methods=METHODS)
    async def kserve(request: Request, path: str = ""):
        client: httpx.AsyncClient = request.app.state.triton_http
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
        url = httpx.URL(path="/v2" + (f"/{path}" if path else ""), query=request.url.query.encode())
        if request.method == "POST" and not USER_POST.fullmatch(path):
            return JSONResponse({"error": f"POST /v2/{path} is not served on this port: it is Triton's "
                                          "administration; inference (infer, generate, generate_stream) is"},
                                status_code=403)
        fwd = Forward(await request.body())
        if request.method == "POST":
            try:
                fwd = _forward(path, fwd.body)
            except ConfigError as e:
                return JSONResponse({"error": str(e)}, status_code=400)
        upstream = client.build_request(request.method, url, headers=headers, content=fwd.body)
        try:
            if not fwd.stop_id:
                r = await client.send(upstream, stream=True)
            else:  # one answer at the end: a client that leaves before it stops the request
                connected, r = await while_connected(request, client.send(upstream, stream=True))
                if not connected:
                    request.app.state.backend.stop(fwd.stop_id)
                    return Response(status_code=CLIENT_CLOSED)
        except httpx.HTTPError as e:
            raise OpenAIError(UNAVAILABLE, f"Triton's HTTP endpoint is not reachable ({type(e).__name__}: {e})") from None
        out = {k: v for k, v in r.headers.items() if k.lower() not in HOP_HEADERS}
        if r.status_code >= 400 and GENERATE_PATH.fullmatch(path) and "json" in r.headers.get("content-type", ""):
            return await _model_error(r)
        return StreamingResponse(r.aiter_raw(), status_code=r.status_code, headers=out, background=BackgroundTask(r.aclose))
