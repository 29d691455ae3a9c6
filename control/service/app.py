"""The control-plane service: a FastAPI app over one ``ControlState``.

Endpoints (the OpenAPI schema is at ``/openapi.json``):

- ``GET /healthz`` liveness; ``GET /readyz`` readiness (a plan is compiled and the replanner runs).
- ``GET /v1/plan``: the current plan (``specctl.plan/v1``); ``GET /v1/plan/stream``: Server-Sent
  Events, one ``plan`` event (``id: <instance>:<version>``, data = the plan JSON) per version, the
  current one first (skipped when the client's ``Last-Event-ID`` is already current), comments as
  keepalives.
- ``POST /v1/telemetry`` (token): one ``specctl.telemetry/v1`` window; 202 when folded in.
- ``GET /v1/overrides``; ``PUT /v1/overrides`` (token): replace the operator overrides, publish.
- ``GET /v1/status``, ``GET /v1/explain`` (the goodput curve over k under the current plan),
  ``GET /metrics`` (Prometheus), ``GET /`` (the dashboard).
- ``GET /v1/replicas``: every replica heard from, its group, plan version, acceptance, step time, and
  whether it is stale.

Groups: a control plane serves one group (``<sku>/<pair>``) per profile it was given. The plan,
stream, overrides, status, explain and dashboard endpoints take ``?group=<sku>/<pair>`` (default: the
first group); telemetry names its group in the body. The plan stream also takes ``?replica=<id>`` so
the replica counts as present while its stream is open.

Every write (any method but GET/HEAD/OPTIONS) needs ``Authorization: Bearer <token>``; the check runs
before the body is read. Bodies above the size limit get 413 before they are parsed; a body with a
Content-Type other than JSON gets 415 (no Content-Type is read as JSON). Types are strict and numbers
must be finite (NaN, Infinity, 1e400 get 422 naming the field). Every 4xx
carries ``{"detail": "<one line naming the value and what is accepted>"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
from typing import Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from control import __version__
from control.agent.wire import SOURCE_PATTERN, TelemetryBatch
from control.errors import SpecctlError, describe_validation_error
from control.plan import Plan
from control.service.fleet import Fleet, UnknownGroup
from control.service.overrides import Overrides
from control.service.state import ControlState

log = logging.getLogger("specctl.service")

MAX_EXPLAIN_BATCH = 4096
MAX_EXPLAIN_CTX = 10_000_000  # context tokens /v1/explain and the dashboard accept
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
TOKEN_HINT = ("send 'Authorization: Bearer <token>' with the service's token "
              "(the one given by --token or SPECCTL_TOKEN, or printed at start)")


# -- response models (for the OpenAPI schema) -------------------------------------------------------
class Health(BaseModel):
    status: str


class Ready(BaseModel):
    ready: bool
    plan_version: int
    plan_id: str


class TelemetryAck(BaseModel):
    accepted: bool
    plan_version: int
    plan_id: str


class OverridesAck(BaseModel):
    overrides: Overrides
    plan_version: int
    plan_id: str
    reason: str


class ErrorBody(BaseModel):
    detail: str


class ExplainPoint(BaseModel):
    k: int
    expected_tokens: float
    verified_tokens: int  # per request, as the executor verifies (control.goodput.granularity)
    verify_ms: float
    step_ms: float
    goodput_tok_s: float
    feasible: bool


class Explained(BaseModel):
    profile: str
    drafter: str
    batch: int
    ctx: int
    acceptance: float
    best_k: int
    curve: list[ExplainPoint]
    why: str
    verify: str
    verify_note: str
    plan_version: int


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or invalid bearer token"},
    413: {"model": ErrorBody, "description": "body larger than the service's limit"},
    415: {"model": ErrorBody, "description": "body not sent as JSON"},
    422: {"model": ErrorBody, "description": "invalid input; detail names the value and what is accepted"},
}


# -- the plan stream ---------------------------------------------------------------------------------
class PlanHub:
    """Wakes plan-stream subscribers when the state publishes; caches the encoded event."""

    def __init__(self, state: ControlState) -> None:
        self.state = state
        self.subscribers = 0
        self.closing = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()
        self._cache: tuple[str, bytes] | None = None
        self._json: tuple[str, str] | None = None
        state.listeners.append(self._on_publish)

    def close(self) -> None:
        """End every stream (the server is shutting down); subscribers reconnect elsewhere or later."""
        self.closing = True
        self._event.set()

    def close_threadsafe(self) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.close)

    def _on_publish(self, plan: Plan) -> None:
        self._cache = None
        ev, self._event = self._event, asyncio.Event()
        ev.set()

    @property
    def event(self) -> asyncio.Event:
        return self._event

    def message_json(self) -> str:
        pid = self.state.plan_id
        if self._json is None or self._json[0] != pid:
            self._json = (pid, self.state.plan.to_json())
        return self._json[1]

    def message(self) -> tuple[str, bytes]:
        pid = self.state.plan_id
        if self._cache is None or self._cache[0] != pid:
            self._cache = (pid, f"id: {pid}\nevent: plan\ndata: {self.message_json()}\n\n".encode())
        return self._cache

    async def stream(self, last_event_id: str | None, keepalive_s: float, on_close=None, on_send=None):
        self.subscribers += 1
        try:
            sent = last_event_id
            yield b": specctl plan stream\n\n"
            while not self.closing:
                ev = self._event  # taken before the check: a publish after it sets this event
                pid, msg = self.message()
                if pid != sent:
                    yield msg
                    sent = pid
                    if on_send is not None:
                        on_send(self.state.version)
                try:
                    await asyncio.wait_for(ev.wait(), timeout=keepalive_s)
                except TimeoutError:
                    yield b": keepalive\n\n"
            yield b": the service is shutting down\n\n"
        finally:
            self.subscribers -= 1
            if on_close is not None:
                on_close()


# -- write guard: token first, then the size limit, before any parsing --------------------------------
class WriteGuard:
    """ASGI middleware: writes need the bearer token (401) and bodies must fit the limit (413).

    It also answers a valid telemetry post itself (``fleet`` given): with many agents that post is most
    of the service's traffic, and routing, dependency injection and response models cost more than
    folding the window in. Anything it does not accept (invalid JSON, an unknown group or drafter)
    goes on to the app, whose route gives the usual error.
    """

    def __init__(self, app, *, token: str, max_body_bytes: int, state: ControlState, fleet: Fleet | None = None) -> None:
        self.app = app
        self.token = token.encode()
        self.max = max_body_bytes
        self.state = state
        self.fleet = fleet

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in READ_METHODS:
            await self.app(scope, receive, send)
            return
        telemetry = scope.get("path") == "/v1/telemetry"
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        scheme, _, cred = auth.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(cred.strip(), self.token):
            if telemetry:
                self.state.reject("unauthorized")
            what = "no bearer token" if not auth else "an invalid bearer token"
            await _send_json(send, 401, {"detail": f"{scope['method']} {scope.get('path')} needs the service token "
                                                   f"and got {what}; {TOKEN_HINT}"},
                             extra=[(b"www-authenticate", b"Bearer")])
            return
        ctype = headers.get(b"content-type")
        if not _json_content_type(ctype):
            if telemetry:
                self.state.reject("invalid")
            await _send_json(send, 415, {"detail": f"{scope['method']} {scope.get('path')}: Content-Type "
                                                   f"{ctype.decode('latin-1')[:100]!r} is not accepted; send the body as "
                                                   "JSON with 'Content-Type: application/json'"})
            return
        if ctype is None:  # read as JSON: the app parses a body as JSON only when told so
            scope = {**scope, "headers": [*scope.get("headers", []), (b"content-type", b"application/json")]}
        length = headers.get(b"content-length")
        try:
            declared = int(length) if length is not None else None
        except ValueError:
            await _send_json(send, 400, {"detail": f"Content-Length {length.decode('latin-1')!r} is not an integer"})
            return
        if declared is not None and declared > self.max:
            await self._too_large(send, declared, telemetry)
            return
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > self.max:
                await self._too_large(send, size, telemetry)
                return
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        data = b"".join(chunks)
        if telemetry and scope["method"] == "POST" and self.fleet is not None and await self._ingest(data, send):
            return
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _ingest(self, data: bytes, send) -> bool:
        """Fold a valid window in and answer 202; False (nothing changed) when the app must answer."""
        try:
            batch = TelemetryBatch.model_validate_json(data)
            st = self.fleet.ingest(batch)
        except (ValidationError, SpecctlError):
            return False  # the ingest checks names before it changes anything
        ack = f'{{"accepted":true,"plan_version":{st.version},"plan_id":{json.dumps(st.plan_id)}}}'.encode()
        await send({"type": "http.response.start", "status": 202,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(ack)).encode())]})
        await send({"type": "http.response.body", "body": ack})
        return True

    async def _too_large(self, send, size: int, telemetry: bool) -> None:
        if telemetry:
            self.state.reject("too_large")
        await _send_json(send, 413, {"detail": f"request body of {size} bytes (or more) exceeds the limit of "
                                               f"{self.max} bytes; send smaller telemetry windows (fewer step samples)"})


def _json_content_type(value: bytes | None) -> bool:
    """True for a JSON media type (``application/json``, ``application/*+json``) or no Content-Type.

    A body without the header is read as JSON (what API clients that omit it mean); a form or text
    type is refused rather than guessed at.
    """
    if value is None:
        return True
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its text (``nan``, ``inf``), so it encodes as JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


async def _send_json(send, status: int, body: dict, extra: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


# -- the app -------------------------------------------------------------------------------------------
class Hubs:
    """One ``PlanHub`` per group; closing it ends every group's streams."""

    def __init__(self, fleet: Fleet) -> None:
        self.by_group = {name: PlanHub(st) for name, st in fleet.groups.items()}

    @property
    def subscribers(self) -> int:
        return sum(h.subscribers for h in self.by_group.values())

    def set_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        for h in self.by_group.values():
            h.loop = loop

    def close_threadsafe(self) -> None:
        for h in self.by_group.values():
            h.close_threadsafe()


def _replan_once(name: str, state: ControlState) -> None:
    try:
        plan = state.maybe_replan()
        if plan is not None:
            log.info("group %s: published plan v%d: %s", name, plan.version, plan.reason)
    except Exception:  # keep replanning; the failure shows in the log and in /metrics
        state.totals.replans["error"] = state.totals.replans.get("error", 0) + 1
        log.exception("group %s: replan failed", name)


GROUP_QUERY_DOC = "'<sku>/<pair>' (default: the first group)"


def create_app(target: ControlState | Fleet, *, token: str) -> FastAPI:
    """The service's ASGI app over one group's ``ControlState`` or a ``Fleet`` of groups; ``token``
    guards every write."""
    if not token:
        raise SpecctlError("the control-plane service needs a token for its write endpoints")
    fleet = target if isinstance(target, Fleet) else Fleet([target])
    state = fleet.default  # where requests without a group go, and where refused telemetry is counted
    cfg = state.config
    hubs = Hubs(fleet)
    runner: dict[str, asyncio.Task | None] = {"task": None}
    app = FastAPI(
        title="specctl control plane", version=__version__, lifespan=_lifespan(fleet, hubs, runner),
        docs_url=None, redoc_url=None,
        description="Plans, telemetry, overrides and metrics for specctl's speculative-decoding controllers. "
                    "Writes need `Authorization: Bearer <token>`.",
    )
    app.add_middleware(WriteGuard, token=token, max_body_bytes=cfg.max_body_bytes, state=state)
    # What the server runs: the same guard in front of FastAPI's own layers, answering valid telemetry
    # itself (see WriteGuard); everything else goes on to the app and its guard.
    app.state.asgi = WriteGuard(app, token=token, max_body_bytes=cfg.max_body_bytes, state=state, fleet=fleet)
    app.state.control = state
    app.state.fleet = fleet
    app.state.hub = hubs
    _add_error_handlers(app, state)
    _add_plan_routes(app, fleet, hubs, runner)
    _add_write_routes(app, fleet)
    _add_status_routes(app, fleet, hubs)
    return app


def _lifespan(fleet: Fleet, hubs: Hubs, runner: dict[str, asyncio.Task | None]):
    """The app's lifespan: the replanner runs while the app serves."""
    cfg = fleet.default.config

    async def replanner() -> None:
        while True:
            await asyncio.sleep(cfg.replan_interval_s)
            for name, st in fleet.groups.items():
                _replan_once(name, st)
            fleet.forget_departed()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        hubs.set_loop(asyncio.get_running_loop())
        runner["task"] = asyncio.create_task(replanner())
        try:
            yield
        finally:
            runner["task"].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner["task"]

    return lifespan


def _add_error_handlers(app: FastAPI, state: ControlState) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        if request.url.path == "/v1/telemetry":
            state.reject("invalid")
        where = f"{request.method} {request.url.path}"
        errors = json_safe(jsonable_encoder(exc.errors()[:10]))
        return JSONResponse(status_code=422, content={"detail": describe_validation_error(where, exc),
                                                      "errors": errors})

    @app.exception_handler(SpecctlError)
    async def _specctl(request: Request, exc: SpecctlError):
        if request.url.path == "/v1/telemetry":
            state.reject("unknown_group" if isinstance(exc, UnknownGroup) else "invalid")
        status_code = 404 if isinstance(exc, UnknownGroup) and request.method in READ_METHODS else 422
        return JSONResponse(status_code=status_code, content={"detail": str(exc)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            detail = f"no endpoint at {request.url.path}; see /openapi.json for the API"
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}; see /openapi.json"
        return JSONResponse(status_code=exc.status_code, content={"detail": detail}, headers=exc.headers)



def _add_plan_routes(app: FastAPI, fleet: Fleet, hubs: Hubs, runner: dict[str, asyncio.Task | None]) -> None:
    state, cfg = fleet.default, fleet.default.config
    group_q = Query(default=None, max_length=200, description=GROUP_QUERY_DOC)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Ready, tags=["health"], responses={503: {"model": Ready}})
    async def readyz():
        task = runner["task"]
        ready = task is not None and not task.done()
        body = Ready(ready=ready, plan_version=state.version, plan_id=state.plan_id)
        return JSONResponse(status_code=200 if ready else 503, content=body.model_dump())

    @app.get("/v1/plan", response_model=Plan, tags=["plans"], responses={304: {"description": "the plan is unchanged"}})
    async def get_plan(if_none_match: str | None = Header(default=None, max_length=256), group: str | None = group_q):
        name = fleet.name_of(group)
        st, hub = fleet.groups[name], hubs.by_group[name]
        headers = {"ETag": f'"{st.plan_id}"', "X-Specctl-Plan-Id": st.plan_id, "X-Specctl-Group": name}
        if if_none_match is not None and headers["ETag"] in (t.strip() for t in if_none_match.split(",")):
            return Response(status_code=304, headers=headers)
        return Response(content=hub.message_json(), media_type="application/json", headers=headers)

    @app.get("/v1/plan/stream", tags=["plans"], response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "Server-Sent Events: one `plan` event per version, "
                                             "`id: <instance>:<version>`, data = the plan JSON"}})
    async def plan_stream(last_event_id: str | None = Header(default=None, max_length=128), group: str | None = group_q,
                          replica: str | None = Query(default=None, pattern=SOURCE_PATTERN,
                                                      description="the subscriber's replica id")):
        name = fleet.name_of(group)
        on_close = on_send = None
        if replica is not None:
            table = fleet.replicas
            table.stream_opened(replica, name, fleet.clock())
            on_close = lambda: table.stream_closed(replica, fleet.clock())  # noqa: E731
            on_send = lambda version: table.delivered(replica, version)  # noqa: E731
        return StreamingResponse(hubs.by_group[name].stream(last_event_id, cfg.keepalive_s, on_close, on_send),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})



def _add_write_routes(app: FastAPI, fleet: Fleet) -> None:
    bearer = HTTPBearer(auto_error=False, description="the service token")
    group_q = Query(default=None, max_length=200, description=GROUP_QUERY_DOC)

    telemetry_body = {"required": True, "content": {"application/json": {"schema": TelemetryBatch.model_json_schema()}}}

    @app.post("/v1/telemetry", response_model=TelemetryAck, status_code=202, tags=["telemetry"], responses=ERRORS,
              openapi_extra={"requestBody": telemetry_body, "security": [{"HTTPBearer": []}]})
    async def post_telemetry(request: Request) -> Response:  # the token was checked by WriteGuard
        # The hot path of many agents: pydantic parses and validates the raw bytes in one pass (no
        # dict in between), and the ack is written without a response model.
        try:
            batch = TelemetryBatch.model_validate_json(await request.body())
        except ValidationError as e:
            raise RequestValidationError(e.errors(include_url=False)) from None
        st = fleet.ingest(batch)
        ack = f'{{"accepted":true,"plan_version":{st.version},"plan_id":{json.dumps(st.plan_id)}}}'
        return Response(content=ack, status_code=202, media_type="application/json")

    @app.get("/v1/overrides", response_model=Overrides, tags=["overrides"])
    async def get_overrides(group: str | None = group_q) -> Overrides:
        return fleet.state(group).overrides

    @app.put("/v1/overrides", response_model=OverridesAck, tags=["overrides"], responses=ERRORS)
    async def put_overrides(ov: Overrides, _=Depends(bearer), group: str | None = group_q) -> OverridesAck:
        st = fleet.state(group)
        plan = st.set_overrides(ov)
        log.info("group %s: published plan v%d: %s", fleet.name_of(group), plan.version, plan.reason)
        return OverridesAck(overrides=st.overrides, plan_version=plan.version, plan_id=st.plan_id,
                            reason=plan.reason)



def _add_status_routes(app: FastAPI, fleet: Fleet, hubs: Hubs) -> None:
    from control.service.metrics import make_registry

    registry = make_registry(fleet, hubs)
    group_q = Query(default=None, max_length=200, description=GROUP_QUERY_DOC)

    @app.get("/v1/status", tags=["status"])
    async def status(group: str | None = group_q) -> dict[str, Any]:
        name = fleet.name_of(group)
        now = fleet.clock()
        return {**fleet.groups[name].status(), "group": name, "groups": list(fleet.groups),
                "replicas": fleet.replicas.aggregate(name, now)}

    @app.get("/v1/replicas", tags=["status"])
    async def replicas(group: str | None = Query(default=None, max_length=200,
                                                 description="only this group (default: all)")) -> dict[str, Any]:
        now = fleet.clock()
        names = [fleet.name_of(group)] if group else list(fleet.groups)
        return json_safe({"groups": {n: {"plan_version": fleet.groups[n].version, **fleet.replicas.aggregate(n, now),
                                         "replicas": [fleet.replicas.describe(r, now)
                                                      for r in fleet.replicas.in_group(n)]}
                                     for n in names},
                          "joined": fleet.replicas.joined, "left": fleet.replicas.left})

    def _explain(batch: int | None, ctx: int | None, acceptance: float | None, drafter: str | None,
                 group: str | None = None) -> dict:
        from control.goodput.explain import explain
        from control.service.dashboard import curve_inputs

        state = fleet.state(group)
        plan = state.plan
        if drafter is not None and drafter not in plan.drafters:
            raise SpecctlError(f"drafter '{drafter}' is not active in plan v{plan.version}; active: {', '.join(plan.drafters)}")
        b0, c0, a0 = curve_inputs(state)
        name = drafter or plan.default_drafter
        acc = acceptance if acceptance is not None else (plan.prior_rate(name) if drafter else a0)
        out = explain(plan.profile, batch or b0, ctx or c0, acc, name, plan.max_k, plan.slo.tpot_ms, plan.slo.quantile)
        out["plan_version"] = plan.version
        return out

    @app.get("/v1/explain", response_model=Explained, tags=["status"], responses={422: ERRORS[422]})
    async def explain_now(
        batch: int | None = Query(default=None, ge=1, le=MAX_EXPLAIN_BATCH, description="decode batch size (default: latest telemetry)"),
        ctx: int | None = Query(default=None, ge=1, le=MAX_EXPLAIN_CTX, description="context tokens per request"),
        acceptance: float | None = Query(default=None, ge=0.0, lt=1.0, allow_inf_nan=False,
                                         description="per-token acceptance (default: the plan's estimate)"),
        drafter: str | None = Query(default=None, max_length=64),
        group: str | None = group_q,
    ) -> dict:
        return _explain(batch, ctx, acceptance, drafter, group)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["status"])
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(content=generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, tags=["status"], responses={422: ERRORS[422]})
    async def dashboard(
        batch: int | None = Query(default=None, ge=1, le=MAX_EXPLAIN_BATCH),
        ctx: int | None = Query(default=None, ge=1, le=MAX_EXPLAIN_CTX),
        acceptance: float | None = Query(default=None, ge=0.0, lt=1.0, allow_inf_nan=False),
        group: str | None = group_q,
    ) -> HTMLResponse:
        from control.service.dashboard import render

        name = fleet.name_of(group)
        return HTMLResponse(render(fleet.groups[name], _explain(batch, ctx, acceptance, None, name),
                                   fleet=fleet, group=name))


