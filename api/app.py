"""The FastAPI app: OpenEnv's HTTP/WebSocket/MCP faces plus the episode log and catalogue.

`create_app()` (no arguments) reads its settings from the environment, which is how
`companyos serve --workers N` builds the same app in every Uvicorn worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http import HTTPStatus
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Body, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, StringConstraints
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from api import catalog, mcp
from api import models as api_models
from api.analytics_routes import analytics_router
from api.apidocs import add_api_docs, with_exact_bounds
from api.config import ServerConfig
from api.episodes import EpisodeLog
from api.guard import BodyTooLarge, Guard, deny_websocket, no_websocket_at, proxy_root, route_path
from api.jsonbody import JsonRoute
from api.models import (
    ERROR_RESPONSES,
    EpisodeEvents,
    EpisodeList,
    EpisodeRerun,
    EpisodeSummary,
    EpisodeViews,
    ErrorBody,
    HealthResponse,
    MetadataResponse,
    ReadyResponse,
    ResetRequest,
    SchemaResponse,
    StepRequest,
    StepResponse,
    TasksResponse,
)
from api.querystring import STRICT_QUERY, whole_number_in
from api.readiness import Readiness
from api.sessions import (
    ApiError,
    SessionManager,
    chosen_token,
    outage_classes,
    pooler_classes,
    split_session_key,
    store_outage,
    write_refused_classes,
)
from api.ui import MAX_POSITION, ui_router
from api.ui_html import ROOT_PATH, error_page, is_ui_path
from api.ws import websocket_app
from companyos.catalogue import task_catalogue
from companyos.config import resolve_db
from companyos.lifecycle import end_with
from domain import FAILURE_MODES, TASK_FAMILIES
from eventstore import EventStore, WriterBusy
from eventstore.backends import writers_waited_for
from eventstore.encoding import parse_json as loads
from eventstore.encoding import reply_json
from projections.episodes import MAX_AGENT_LABEL, OUTCOMES

T = TypeVar("T")
EpisodeId = Annotated[str, Path(max_length=200)]
Outcome = Literal[OUTCOMES]  # the episode listing's own list: one list for every reader
TaskFamily = Literal[tuple(TASK_FAMILIES)]  # a misspelt task is a 422, not an empty list
FailureMode = Literal[tuple(FAILURE_MODES)]  # as a task: a misspelt mode is a 422
EpisodesLimit = whole_number_in(1, 500)
EventsLimit = whole_number_in(1, 1000)
Offset = whole_number_in(0, 10**9)
LogPosition = whole_number_in(0, MAX_POSITION)
"""A position in the log, as a page's cursors (`next_before`, `prev_after`) give it."""
StepNumber = whole_number_in(0, 10**6)
RulesFilter = whole_number_in(0, 10**9)
"""A rules version in a query: digits, as every whole number there; no range, so a version that is
none is refused by the episode log in the words every surface uses (400), not as a bound (422)."""
AgentFilter = Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_AGENT_LABEL)]
"""An agent label in a query, measured without its surrounding spaces (which the filter drops):
a 100-character label with a space before it was a 422 here, and found by the UI and the CLI."""
IDLE_SWEEP_MIN_S = 1.0


class JSON(JSONResponse):
    """orjson-encoded JSON response (FastAPI's default encoder is several times slower)."""

    def render(self, content: Any) -> bytes:
        return reply_json(content)


class CompanyOSApp(FastAPI):
    """FastAPI, except that `/ws` goes straight to its plain-ASGI handler (auth checked first):
    the hottest path skips the framework's per-message wrappers."""

    server: Server
    guard: Guard

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and route_path(scope) == "/ws":
            error = self.guard.auth_error(scope)
            if error is not None:
                await deny_websocket(scope, receive, send, *error)
                return
            await websocket_app(self.server, scope, receive, send)
            return
        if scope["type"] == "websocket":  # Starlette refused it with a bare 403, as if forbidden
            await deny_websocket(scope, receive, send, *(
                self.guard.auth_error(scope) or no_websocket_at(route_path(scope))))
            return
        if scope["type"] == "http" and scope["method"] == "HEAD":
            # HEAD is GET without the body (RFC 9110): link checkers and uptime monitors send it,
            # and FastAPI's routes answered them 405
            await super().__call__({**scope, "method": "GET"}, receive, _headers_only(send))
            return
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            models = {name: model for name, model in vars(api_models).items()
                      if isinstance(model, type) and issubclass(model, BaseModel)}
            self.openapi_schema = with_exact_bounds(super().openapi(), models)
        return self.openapi_schema


def _headers_only(send: Any) -> Any:
    """`send` for a HEAD request: the GET answer's status and headers, its body left out."""
    async def send_headers(message: dict) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return send_headers


BATCH_THREADS = 2
"""Threads for long work (MCP batches, over HTTP or a WebSocket; a WebSocket's views of its episode):
more of it than this waits for one to end, and never for a step."""


class Server:
    """Per-process state shared by the routes: the store, the session cache, the episode log."""

    def __init__(self, config: ServerConfig, store: EventStore) -> None:
        self.config = config
        self.store = store
        self.sessions = SessionManager(store, config.cache_size, config.idle_timeout_s)
        self.log = EpisodeLog(store)
        self.ws_sessions = 0
        inline = config.inline_steps
        if inline is None:
            inline = store.engine.dialect.name == "sqlite"
        self.inline = inline
        self.executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="companyos-step")
        # long work (an MCP batch of up to a thousand steps, the fold of a long episode's views)
        # queues apart: sixteen batches in the step pool held every other socket's step for seconds
        self.batch_executor = ThreadPoolExecutor(max_workers=BATCH_THREADS,
                                                 thread_name_prefix="companyos-batch")
        self.readiness = Readiness(store)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Store work for a WebSocket message. Inline on SQLite: a step is ~0.15 ms of CPU and
        SQLite takes one writer at a time, so a thread hop would only add GIL and lock hand-offs
        (measured: slower). But never waiting for a lock there: a write that finds another
        writer holding the file stops before writing anything (WriterBusy) and runs again on a
        thread, or one waiting step froze the worker's every socket and /health. In a thread
        for PostgreSQL, where appends wait on the network."""
        if self.inline:
            try:
                with writers_waited_for(False):
                    return fn(*args)
            except WriterBusy:
                pass  # another writer holds the file: wait for it on a thread, not on the loop
            return await self.in_thread(_waiting_for_writers, fn, *args)
        return await self.in_thread(fn, *args)

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await _off_loop(self.executor, fn, *args)

    async def in_batch_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Long work off the loop and out of the step pool, so it never delays a single step."""
        return await _off_loop(self.batch_executor, fn, *args)

    async def run_step(self, session: Any, action: Any, after_step: int | None = None) -> dict[str, Any]:
        """A WebSocket step (no freshness query: the socket's episode is cached right here)."""
        return await self.run(self.sessions.step, session, action, False, after_step)

    def close(self) -> None:
        self.executor.shutdown(wait=False)
        self.batch_executor.shutdown(wait=False)


async def _sweep_idle(server: Server) -> None:
    """Idle sessions leave the cache (never the log)."""
    interval = max(IDLE_SWEEP_MIN_S, server.config.idle_timeout_s / 4)
    while True:
        await asyncio.sleep(interval)
        server.sessions.evict_idle()


def create_app(config: ServerConfig | None = None, store: EventStore | None = None) -> CompanyOSApp:
    """The server app. Without arguments: settings from COMPANYOS_* variables (see ServerConfig)."""
    config = config or ServerConfig.from_env()
    owns_store = store is None
    store = store or EventStore.open(resolve_db(config.db))
    server = Server(config, store)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep_idle(server))
        if config.exit_with_parent:  # shut down gracefully, as on the supervisor's own SIGTERM
            end_with(config.exit_with_parent, lambda: os.kill(os.getpid(), signal.SIGTERM))
        try:
            yield
        finally:
            sweeper.cancel()
            server.close()
            if owns_store:
                store.close()

    app = CompanyOSApp(title="CompanyOS agent server", version=catalog.version(),
                  description=catalog.DESCRIPTION + "\n\nOpenEnv-compatible: `/reset`, `/step`, "
                  "`/state`, `/ws`, `/mcp`. Request bodies are limited to "
                  f"{config.max_body_bytes} bytes (413 above).",
                  default_response_class=JSON, lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # both from local files: api.apidocs
    app.state.server = server
    app.router.route_class = JsonRoute
    app.add_middleware(Guard, api_key=config.api_key, max_body_bytes=config.max_body_bytes)
    _register_errors(app)
    _register_openenv(app, server)
    _register_log(app, server)
    add_api_docs(app)
    # the URL as given: the engine's lacks what the store's create_engine took out of it
    # (`?prepare_threshold=none`, which the analytics' own connections behind a pooler need too)
    store_url = (resolve_db(config.db) if owns_store
                 else store.engine.url.render_as_string(hide_password=False))
    app.include_router(analytics_router(store_url, config.warehouse))
    app.include_router(ui_router(server.log, store_url, config.warehouse))
    app.server = server
    app.guard = Guard(None, config.api_key, config.max_body_bytes)
    return app


async def _off_loop(executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(executor, partial(fn, *args))


def _waiting_for_writers(fn: Callable[..., T], *args: Any) -> T:
    """`fn` told to wait for the write lock, whatever context its thread runs in."""
    with writers_waited_for(True):
        return fn(*args)


OUTAGE_RETRY = {"Retry-After": "1"}
"""What every `store_unavailable` answer carries: the client may try again at once."""


def _error(exc: ApiError) -> JSON:
    retry = OUTAGE_RETRY if exc.code == "store_unavailable" else None
    return JSON(exc.body(), status_code=exc.status, headers=retry)


def _register_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSON:
        return _error(exc)

    async def database_outage(request: Request, exc: Exception) -> Response:
        failure = store_outage(exc)
        if failure is None:  # a ProgrammingError that is no lost prepared statement: a bug, a 500
            raise exc
        if is_ui_path(route_path(request.scope)):  # a person's page: said as a page
            page = error_page(failure.status, failure.message)
            page.headers.update(OUTAGE_RETRY)
            return page
        return _error(failure)

    for outage in (*outage_classes(), *pooler_classes(), *write_refused_classes()):
        app.add_exception_handler(outage, database_outage)

    @app.exception_handler(BodyTooLarge)
    async def too_large(_: Request, exc: BodyTooLarge) -> JSON:
        return JSON({"detail": str(exc), "code": "body_too_large"}, status_code=413)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        cause = exc.__cause__  # FastAPI's "error parsing the body" hides what went wrong
        if isinstance(cause, BodyTooLarge):  # a chunked body, cut off at the limit
            return await too_large(request, cause)
        headers = _with_head(exc.headers)
        if is_ui_path(route_path(request.scope)):  # a person's page (POST /ui): said as a page
            # no UI route ran to set the links' prefix (a 405 is the router's), so set it here
            ROOT_PATH.set(proxy_root(request.scope))
            allowed = (headers or {}).get("Allow")
            message = (f"{request.method} is not allowed here: this page answers {allowed}"
                       if exc.status_code == 405 and allowed else str(exc.detail))
            page = error_page(exc.status_code, message)
            page.headers.update(headers or {})
            return page
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_").replace("-", "_")
        return JSON({"detail": str(exc.detail), "code": code}, status_code=exc.status_code,
                    headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSON:
        json_body = _is_json(request.headers.get("content-type"))
        errors = [{"loc": list(e.get("loc", ())), "msg": _said(e, json_body),
                   "type": str(e.get("type", ""))} for e in exc.errors()]
        return JSON({"detail": errors}, status_code=422)


def _with_head(headers: dict[str, str] | None) -> dict[str, str] | None:
    """A 405's `Allow` with HEAD wherever GET is: every GET route answers HEAD (see `App`), and
    the router's list said only GET."""
    allowed = (headers or {}).get("Allow")
    if not allowed:
        return headers
    methods = [m.strip() for m in allowed.split(",")]
    if "GET" in methods and "HEAD" not in methods:
        methods.insert(methods.index("GET") + 1, "HEAD")
    return {**(headers or {}), "Allow": ", ".join(methods)}


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _said(error: dict, json_body: bool) -> str:
    """A validation error's message; for a body that is not JSON, what the parser found wrong
    (FastAPI's own message is only "JSON decode error"), and for one sent without a JSON content
    type, that (FastAPI leaves such a body unparsed and calls it 'not a valid dictionary')."""
    msg = str(error.get("msg", ""))
    if error.get("type") == "json_invalid" and (error.get("ctx") or {}).get("error"):
        msg = f"the body is not valid JSON: {error['ctx']['error']}"
    elif not json_body and list(error.get("loc", ())) == ["body"]:
        msg = "the body must be JSON, sent with Content-Type: application/json"
    return msg


def _token(http: Request, given: str | None) -> str | None:
    """The request's episode token (see `chosen_token`). The routes declare X-Episode-Token for
    the API's schema; it is read here, every repeat of it included."""
    return chosen_token(http.headers.getlist("x-episode-token"), given)


def _register_openenv(app: FastAPI, server: Server) -> None:
    sessions = server.sessions
    errors = ERROR_RESPONSES

    @app.get("/ws", include_in_schema=False, status_code=426)
    async def ws_over_http() -> JSONResponse:
        """A plain GET of the WebSocket endpoint (a browser, curl, a client missing its upgrade
        headers) was a bare 404, as if there were no /ws."""
        return JSONResponse({"detail": "/ws is a WebSocket endpoint: open it with a WebSocket "
                                       "client (an HTTP request with Upgrade: websocket)",
                             "code": "upgrade_required"}, status_code=426,
                            headers={"Upgrade": "websocket", "Connection": "Upgrade"})

    @app.get("/health", response_model=HealthResponse, tags=["OpenEnv"])
    async def health() -> JSON:
        """Liveness: the process answers. Needs no API key."""
        return JSON({"status": "healthy"})

    @app.get("/ready", response_model=ReadyResponse, tags=["Operations"], responses=errors(503))
    async def ready() -> JSON:
        """Readiness: the store's database answers a query within 5 s, so steps can be logged.
        503 `store_unavailable` while it does not (a load balancer stops sending agents here;
        `/health` still says the process lives). Needs no API key."""
        return JSON({"status": "ready", "position": await server.readiness.position()})

    @app.get("/metadata", dependencies=STRICT_QUERY, response_model=MetadataResponse, tags=["OpenEnv"],
             responses=errors(400, 401, 403))
    async def metadata() -> JSON:
        return JSON(catalog.env_metadata())

    @app.get("/schema", dependencies=STRICT_QUERY, response_model=SchemaResponse, tags=["OpenEnv"],
             responses=errors(400, 401, 403))
    async def schema() -> JSON:
        """JSON schemas of action, observation and state."""
        return JSON(catalog.schemas())

    @app.post("/reset", response_model=StepResponse, tags=["OpenEnv"],
              responses=errors(400, 401, 403, 409, 413, 500, 503))
    def reset(request: Annotated[ResetRequest | None, Body()] = None) -> JSON:
        """Start an episode. `metadata` carries `episode_id` and `episode_token`: send the token
        with every step (header `X-Episode-Token` or body `episode_token`)."""
        options = request.model_dump(exclude_none=True) if request is not None else {}
        _, _, payload = sessions.start(options)
        return JSON(payload)

    @app.post("/step", response_model=StepResponse, tags=["OpenEnv"],
              responses=errors(400, 401, 403, 404, 409, 413, 500, 503))
    def step(request: StepRequest, http: Request,
             x_episode_token: Annotated[str | None, Header()] = None) -> JSON:
        """One action. A bad action (unknown tool, wrong params) is not an HTTP error: it is
        rejected in the episode with a penalty, and the observation says why. 409: another step
        on this episode is running, or the episode has finished."""
        session = sessions.get(request.episode_id, _token(http, request.episode_token))
        kind, action = catalog.tool_envelope(request.action)
        if kind == "tools":
            return JSON(action)
        return JSON(sessions.step(session, action))

    @app.get("/state", dependencies=STRICT_QUERY, tags=["OpenEnv"], responses={200: {"model": dict[str, Any]},
                                                    **errors(400, 401, 403, 404, 500, 503)})
    def state(http: Request, episode_id: Annotated[str, Query(max_length=128)],
              episode_token: Annotated[str | None, Query(max_length=200)] = None,
              x_episode_token: Annotated[str | None, Header()] = None) -> JSON:
        """The episode's id, step count, task, seed, chaos, outcome, ..."""
        session = sessions.get(episode_id, _token(http, episode_token))
        return JSON(sessions.state(session))

    @app.post("/mcp", tags=["MCP"], responses={200: {"description": "a JSON-RPC 2.0 response"},
                                               202: {"description": "notification accepted"},
                                               **errors(401, 403, 404, 413, 500, 503)},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"type": "object"}}}}})
    async def mcp_post(request: Request) -> Response:
        """MCP (streamable HTTP, JSON responses) and OpenEnv's JSON-RPC: initialize, tools/list,
        tools/call, ping, openenv/session/create|close. Headers: Mcp-Session-Id, or
        X-Episode-Id + X-Episode-Token."""
        try:
            body = await request.body()
        except ClientDisconnect:  # gone mid-body (or answered 408): no one to answer, nothing to log
            return Response(status_code=400)
        headers = request.headers
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in mcp.PROTOCOL_VERSIONS:  # MCP: 400, not ignored
            return JSON(mcp.error(mcp.INVALID_REQUEST, f"MCP-Protocol-Version {version[:40]!r} is "
                                  f"not one this server speaks: {', '.join(mcp.PROTOCOL_VERSIONS)}"),
                        status_code=400)
        # a batch may hold a thousand steps: on the step pool, forty of them held every socket's
        # steps for seconds; it queues apart, as over the WebSocket
        run = server.in_batch_thread if body.lstrip()[:1] == b"[" else server.in_thread
        return await run(_mcp_http, server, body, headers.get("mcp-session-id"),
                         headers.get("x-episode-id"), headers.get("x-episode-token"),
                         request.query_params.multi_items())

    @app.get("/mcp", tags=["MCP"], include_in_schema=False)
    async def mcp_get() -> JSON:
        return JSON({"detail": "no server-to-client stream here: POST JSON-RPC messages",
                     "code": "method_not_allowed"}, status_code=405,
                    headers={"Allow": "POST"})

    @app.delete("/mcp", tags=["MCP"], include_in_schema=False)
    def mcp_delete(mcp_session_id: Annotated[str | None, Header()] = None) -> JSON:
        """405, as MCP lets a server answer when clients may not end sessions: a session is its
        episode, which lives in the log and any worker serves, so no one process could end it.
        The episode leaves this process's cache (it is reloaded from the log if used again)."""
        if mcp_session_id:
            sessions.forget(split_session_key(mcp_session_id)[0])
        return JSON({"detail": "an MCP session is its episode, which lives in the log: it cannot be "
                               "ended, and stays usable until the episode ends",
                     "code": "method_not_allowed"}, status_code=405, headers={"Allow": "POST"})


def _mcp_http(server: Server, body: bytes, session_key: str | None, episode_id: str | None,
              token: str | None, query: list[tuple[str, str]]) -> Response:
    try:
        message = loads(body) if body else None
    except json.JSONDecodeError as exc:
        return JSON(mcp.error(mcp.PARSE_ERROR, f"Parse error: the body is not JSON: {exc.msg}"))
    if message is None:
        return JSON(mcp.error(mcp.INVALID_REQUEST, "empty request"))
    ctx = mcp.McpContext(session_key=session_key, episode_id=episode_id, episode_token=token,
                         query=query)
    reply = mcp.handle(server.sessions, message, ctx)
    if reply.body is None:
        return Response(status_code=reply.status)
    headers = {"Mcp-Session-Id": reply.session_key} if reply.session_key else None
    return JSON(reply.body, status_code=reply.status, headers=headers)


def _register_log(app: FastAPI, server: Server) -> None:
    log = server.log
    errors = ERROR_RESPONSES

    @app.get("/tasks", dependencies=STRICT_QUERY, response_model=TasksResponse, tags=["Catalogue"],
             responses=errors(400, 401, 403))
    async def tasks() -> JSON:
        """Task families, chaos levels, reward profiles and the failure-mode taxonomy."""
        return JSON(task_catalogue())

    @app.get("/tools", dependencies=STRICT_QUERY, tags=["Catalogue"],
             responses={200: {"model": list[dict[str, Any]]}, **errors(400, 401, 403)})
    async def tools() -> JSON:
        """The tools in OpenAI function-calling format."""
        return JSON(catalog.openai_tools())

    @app.get("/episodes", dependencies=STRICT_QUERY, response_model=EpisodeList, tags=["Episode log"],
             responses=errors(400, 401, 403, 503))
    def list_episodes(task: Annotated[TaskFamily | None, Query()] = None,
                      agent: Annotated[AgentFilter | None, Query()] = None,
                      outcome: Annotated[Outcome | None, Query()] = None,
                      rules: Annotated[RulesFilter | None, Query(description="only episodes judged by "
                                                                             "this rules version")] = None,
                      failure_mode: Annotated[FailureMode | None, Query(
                          description="only episodes that failed so")] = None,
                      limit: Annotated[EpisodesLimit, Query()] = 50,
                      offset: Annotated[Offset, Query()] = 0,
                      before: Annotated[LogPosition | None, Query(
                          description="only episodes that began before this log position: a "
                                      "page's `next_before`, for the next older page")] = None,
                      after: Annotated[LogPosition | None, Query(
                          description="only episodes that began after this log position: a page's "
                                      "`prev_after` for the next newer page, 0 for the oldest")] = None,
                      ) -> JSON:
        """Logged episodes, newest first (`outcome=running` for unfinished ones). Page with the
        cursors `before`/`after`, which hold still while episodes are logged, or with `offset`,
        which shifts by every episode logged meanwhile."""
        return JSON(log.list(task=task, agent=agent, outcome=outcome, rules=rules,
                             failure_mode=failure_mode, limit=limit, offset=offset,
                             before=before, after=after))

    @app.get("/episodes/{episode_id}", dependencies=STRICT_QUERY, response_model=EpisodeSummary,
             tags=["Episode log"],
             responses=errors(400, 401, 403, 404, 500, 503))
    def get_episode(episode_id: EpisodeId) -> JSON:
        return JSON(log.get(episode_id))

    @app.get("/episodes/{episode_id}/events", dependencies=STRICT_QUERY, response_model=EpisodeEvents,
             tags=["Episode log"], responses=errors(400, 401, 403, 404, 500, 503))
    def episode_events(episode_id: EpisodeId,
                       from_version: Annotated[Offset, Query()] = 0,
                       limit: Annotated[EventsLimit, Query()] = 100) -> JSON:
        """The episode's events in stream order (secrets removed from their meta)."""
        return JSON(log.events(episode_id, from_version, limit))

    @app.get("/episodes/{episode_id}/rerun", dependencies=STRICT_QUERY, response_model=EpisodeRerun,
             tags=["Episode log"],
             responses=errors(400, 401, 403, 404, 500, 503))
    def episode_rerun(episode_id: EpisodeId) -> JSON:
        """Deterministic replay, checked: the episode re-simulated in memory from its seed, options
        and actions (nothing is written), and whether it gives the stored digest."""
        return JSON(log.rerun(episode_id))

    @app.get("/episodes/{episode_id}/views", dependencies=STRICT_QUERY, response_model=EpisodeViews,
             tags=["Episode log"],
             responses=errors(400, 401, 403, 404, 500, 503))
    def episode_views(episode_id: EpisodeId,
                      step: Annotated[StepNumber | None, Query()] = None) -> JSON:
        """Time travel: the three apps' views after step K (default: the last), from the log."""
        return JSON(log.views(episode_id, step))


__all__ = ["ErrorBody", "Server", "create_app"]
