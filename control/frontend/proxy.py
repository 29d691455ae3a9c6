"""Triton's KServe HTTP API (``/v2/...``) forwarded to Triton on its internal loopback port.

Bodies reach this code only after ``limits`` has checked them. Responses stream through unchanged
(``generate_stream`` is server-sent events). Hop-by-hop headers are not forwarded.
"""

from __future__ import annotations

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from control.frontend.protocol import OpenAIError

HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
                         "content-length", "proxy-authorization", "proxy-authenticate"})
METHODS = ["GET", "POST", "HEAD"]


def register(app: FastAPI) -> None:
    @app.api_route("/v2", methods=METHODS)
    @app.api_route("/v2/{path:path}", methods=METHODS)
    async def kserve(request: Request, path: str = ""):
        client: httpx.AsyncClient = request.app.state.triton_http
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
        url = httpx.URL(path="/v2" + (f"/{path}" if path else ""), query=request.url.query.encode())
        upstream = client.build_request(request.method, url, headers=headers, content=await request.body())
        try:
            r = await client.send(upstream, stream=True)
        except httpx.HTTPError as e:
            raise OpenAIError(503, f"Triton's HTTP endpoint is not reachable ({type(e).__name__}: {e})") from None
        out = {k: v for k, v in r.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(r.aiter_raw(), status_code=r.status_code, headers=out, background=BackgroundTask(r.aclose))
