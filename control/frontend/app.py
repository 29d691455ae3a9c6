"""The front end's FastAPI application: OpenAI routes, the KServe proxy, health, and limits on every body."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from control.frontend import openai_routes, proxy
from control.frontend.chat import ChatTemplate
from control.frontend.limits import BodyLimits, LimitsMiddleware
from control.frontend.protocol import UNAVAILABLE, OpenAIError, now, retry_after
from control.frontend.text import TokenCounter
from control.policyspec import DEFAULT_MAX_K

PROXY_TIMEOUT_S = 600.0  # generations can be long; connection attempts are bounded separately
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class FrontendConfig:
    triton_grpc: str  # host:port
    triton_http: str  # http://host:port
    tokenizer_dir: Path | None = None  # tokenizer.json (+ tokenizer_config.json, config.json)
    model: str = "llm"
    max_k: int = DEFAULT_MAX_K
    spec_metrics: bool = False
    chat_max_tokens: int = 256
    limits: BodyLimits = field(default_factory=BodyLimits)


def create_app(cfg: FrontendConfig) -> FastAPI:
    from control.frontend.backend import TritonBackend

    served = openai_routes.ServedModel(name=cfg.model, max_k=cfg.max_k, spec_metrics=cfg.spec_metrics,
                                       chat_max_tokens=cfg.chat_max_tokens, counter=TokenCounter(cfg.tokenizer_dir),
                                       template=ChatTemplate.from_tokenizer_dir(cfg.tokenizer_dir), created=now())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.backend = TritonBackend(cfg.triton_grpc, cfg.model)
        app.state.triton_http = httpx.AsyncClient(
            base_url=cfg.triton_http, timeout=httpx.Timeout(PROXY_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        try:
            yield
        finally:
            await app.state.triton_http.aclose()
            await app.state.backend.close()

    app = FastAPI(title="specctl front end", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, e: OpenAIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers())

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        msg = f"{request.method} {request.url.path}: {e.detail}"
        if e.status_code == 404:
            msg += "; the API is under /v1 (models, completions, chat/completions) and /v2 (KServe)"
        return JSONResponse(OpenAIError(e.status_code, msg).body(), status_code=e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, e: RequestValidationError):
        return JSONResponse(OpenAIError(400, str(e.errors()[0].get("msg", "invalid request"))).body(), status_code=400)

    @app.get("/health")
    async def health(request: Request):
        ok = await request.app.state.backend.ready()
        status = 200 if ok else UNAVAILABLE
        return JSONResponse({"ready": ok}, status_code=status, headers=retry_after(status))

    openai_routes.register(app, served)
    proxy.register(app)
    app.add_middleware(LimitsMiddleware, limits=cfg.limits)
    return app
