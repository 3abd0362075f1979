"""MCP over JSON-RPC 2.0: `initialize`, `tools/list`, `tools/call` (one step of an episode), `ping`,
plus OpenEnv's `openenv/session/create|close`.

An MCP session is an episode. `initialize` starts one (options from the URL query, e.g.
`/mcp?task=expense_report&seed=7&chaos=low`) or binds to an existing one (headers
`X-Episode-Id` + `X-Episode-Token`), and answers with `Mcp-Session-Id: <episode_id>.<token>`.
Since the token is inside the session id, any worker process can serve the session from the log.
Plain JSON-RPC callers can instead pass `episode_id` + `episode_token` (or OpenEnv's
`session_id`) in the `tools/call` params.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api import catalog
from api.querystring import RepeatedParameter, single_valued, whole_number
from api.sessions import ApiError, Session, SessionManager, refusal

PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL = PROTOCOL_VERSIONS[-1]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000

_INT_OPTIONS = ("seed", "max_steps", "rules")
ID_MIN, ID_MAX = -(2**63), 2**64 - 1
"""The integer ids a reply can echo (what the JSON encoder writes)."""
MAX_BATCH = 1000
"""Messages in one JSON-RPC batch: each is a step or more, answered in one reply of up to ~5 KB
a call, which a client's default 1 MiB message limit refuses long before."""


@dataclass(slots=True)
class McpContext:
    """Where a JSON-RPC message came from: HTTP headers and query, or a WebSocket session."""

    session_key: str | None = None  # Mcp-Session-Id
    episode_id: str | None = None  # X-Episode-Id
    episode_token: str | None = None  # X-Episode-Token
    query: list[tuple[str, str]] | None = None  # reset options for `initialize`, as given
    bound: Session | None = None  # the WebSocket connection's episode
    # the bound episode's step the socket last answered (None: no claim), moved by each tools/call
    # on it as by a plain step: every tools/call on a socket is a step of the socket's own
    seen_step: int | None = None


@dataclass(slots=True)
class McpReply:
    body: dict[str, Any] | list[dict[str, Any]] | None  # None: nothing to answer (HTTP 202)
    session_key: str | None = None  # a new Mcp-Session-Id to announce
    status: int = 200
    session: Session | None = None  # the episode `initialize` started or bound (a WebSocket binds it)


def error(code: int, message: str, request_id: Any = None, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": err}


def _result(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _api_error(exc: ApiError, request_id: Any) -> dict[str, Any]:
    code = INVALID_PARAMS if exc.status in (400, 404, 422) else SERVER_ERROR
    return error(code, exc.message, request_id, {"status": exc.status, "code": exc.code})


def handle(manager: SessionManager, message: Any, ctx: McpContext) -> McpReply:
    """Answer one JSON-RPC message, or a batch of them. Never raises for anything a client can
    send; a database outage is a JSON-RPC error too (an HTTP 503 ended an MCP client's session)."""
    if isinstance(message, list):
        return _batch(manager, message, ctx)
    if not isinstance(message, dict):
        return McpReply(error(INVALID_REQUEST, "a JSON-RPC request must be a JSON object"))
    if "method" not in message and "id" in message and ("result" in message or "error" in message):
        return McpReply(None, status=202)  # a client's response: this server asks nothing of clients
    request_id = message.get("id")
    if "id" in message and (request_id is None or isinstance(request_id, bool)
                            or not isinstance(request_id, str | int)):
        return McpReply(error(INVALID_REQUEST, "id must be a string or an integer (MCP: never "
                              "null)"))
    if isinstance(request_id, int) and not ID_MIN <= request_id <= ID_MAX:
        # checked before anything runs: the answer could not carry it back (a step taken, then a
        # 500 that made the client retry it)
        return McpReply(error(INVALID_REQUEST, "an integer id must fit in 64 bits"))
    method = message.get("method")
    if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
        return McpReply(error(INVALID_REQUEST, 'Invalid Request: need "jsonrpc": "2.0" and a '
                              'string "method"', request_id))
    if "id" not in message:  # a notification: acknowledged, never answered, even when its
        return McpReply(None, status=202)  # params are wrong (JSON-RPC 2.0, section 4.1)
    params = message.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return McpReply(error(INVALID_PARAMS, "params must be an object", request_id))
    try:
        return _dispatch(manager, method, params, ctx, request_id)
    except Exception as exc:
        refused = refusal(exc)  # the caller's mistake, or the database failed: said in JSON-RPC
        if refused is None:
            raise
        # MCP over HTTP: an unknown Mcp-Session-Id is a 404, and the client re-initializes
        unknown_session = bool(ctx.session_key) and refused.code == "episode_not_found"
        return McpReply(_api_error(refused, request_id), status=404 if unknown_session else 200)


def _batch(manager: SessionManager, messages: list, ctx: McpContext) -> McpReply:
    """A JSON-RPC batch (MCP 2025-03-26 has them): each message answered in turn, notifications
    and responses not at all; nothing to answer is HTTP 202, as for one notification."""
    if not messages:
        return McpReply(error(INVALID_REQUEST, "an empty JSON-RPC batch"))
    if len(messages) > MAX_BATCH:  # 5,000 tools/list in 250 KB were answered with 25 MB
        return McpReply(error(INVALID_REQUEST, f"a JSON-RPC batch of {len(messages)} messages; "
                              f"this server answers at most {MAX_BATCH} in one batch"))
    if any(isinstance(m, dict) and m.get("method") == "initialize" for m in messages):
        return McpReply(error(INVALID_REQUEST, "initialize must not be part of a JSON-RPC batch "
                              "(MCP): send it alone"))
    replies = [handle(manager, m, ctx) if not isinstance(m, list)
               else McpReply(error(INVALID_REQUEST, "a JSON-RPC batch inside a batch"))
               for m in messages]
    bodies = [reply.body for reply in replies if reply.body is not None]
    return McpReply(bodies or None, status=200 if bodies else 202)


def _dispatch(manager: SessionManager, method: str, params: dict, ctx: McpContext,
              request_id: Any) -> McpReply:
    if method == "initialize":
        return _initialize(manager, params, ctx, request_id)
    if method == "ping":
        return McpReply(_result(request_id, {}))
    if method == "tools/list":
        return McpReply(_result(request_id, {"tools": catalog.mcp_tools()}))
    if method == "tools/call":
        return McpReply(_result(request_id, _call(manager, params, ctx)))
    if method == "openenv/session/create":
        options = {k: v for k, v in params.items() if k != "session_id"}
        _, token, payload = manager.start(options)
        meta = payload["metadata"]
        return McpReply(_result(request_id, {"session_id": meta["session_id"],
                                             "episode_id": meta["episode_id"],
                                             "episode_token": token}))
    if method == "openenv/session/close":
        key = params.get("session_id")
        if not isinstance(key, str):
            return McpReply(error(INVALID_PARAMS, "'session_id' is required", request_id))
        session = manager.get_by_key(key, None)
        manager.forget(session.episode_id)
        return McpReply(_result(request_id, {"session_id": key, "closed": True}))
    return McpReply(error(METHOD_NOT_FOUND, f"Method not found: {method}", request_id))


_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
"""Query-string spellings of a boolean option."""


def _initialize(manager: SessionManager, params: dict, ctx: McpContext,
                request_id: Any) -> McpReply:
    wanted = params.get("protocolVersion")
    if wanted is not None and not isinstance(wanted, str):  # checked before an episode starts
        raise ApiError(400, "invalid_params", "params.protocolVersion must be a string, such as "
                       f"{LATEST_PROTOCOL!r}")
    version = wanted if wanted in PROTOCOL_VERSIONS else LATEST_PROTOCOL
    if ctx.bound is not None:
        session, key = ctx.bound, None
    elif ctx.episode_id is not None:
        session = manager.get(ctx.episode_id, ctx.episode_token)
        key = f"{session.episode_id}.{ctx.episode_token}"
    else:
        try:
            options: dict[str, Any] = single_valued(ctx.query or ())
        except RepeatedParameter as exc:
            raise ApiError(400, "invalid_reset", str(exc)) from None
        for name in _INT_OPTIONS:
            if name in options:
                number = whole_number(options[name], signed=True)  # as /reset and the UI read it
                if number is None:
                    raise ApiError(400, "invalid_reset", f"{name} must be an integer, not "
                                   f"{options[name][:40]!r}")
                options[name] = number
        if "text" in options:
            flag = _FLAGS.get(options["text"].lower())
            if flag is None:
                raise ApiError(400, "invalid_reset", "text must be true or false (or 1/0, yes/no), "
                               f"not {options['text'][:40]!r}")
            options["text"] = flag
        session, _, payload = manager.start(options)
        key = payload["metadata"]["session_id"]
    goal = _goal(session)
    instructions = ("You are working in CompanyOS, a company's TicketDesk, DataHub and "
                    "ApprovalFlow. Each tool call is one step of the episode; the result tells "
                    "you what happened, the reward and whether the episode is over."
                    + (f"\n\nGoal: {goal}" if goal else ""))
    result = {"protocolVersion": version,
              "capabilities": {"tools": {"listChanged": False}},
              "serverInfo": {"name": catalog.NAME, "version": catalog.version()},
              "instructions": instructions}
    return McpReply(_result(request_id, result), session_key=key, session=session)


def _goal(session: Session) -> str | None:
    runtime = session.runtime
    return runtime.state.goal if runtime is not None else None


def _call(manager: SessionManager, params: dict, ctx: McpContext) -> dict[str, Any]:
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "invalid_params", "tools/call needs params.name, the tool's name")
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ApiError(400, "invalid_params", "params.arguments must be an object")
    token = params.get("episode_token")
    if token is not None and not isinstance(token, str):
        raise ApiError(400, "invalid_params", "episode_token must be a string")
    explicit = params.get("episode_id") or params.get("session_id")
    if explicit is not None:
        if not isinstance(explicit, str):
            raise ApiError(400, "invalid_params", "episode_id must be a string")
        session = manager.get_by_key(explicit, token)
    elif ctx.bound is not None:
        session = ctx.bound
    elif ctx.session_key is not None:
        session = manager.get_by_key(ctx.session_key, token or ctx.episode_token)
    elif ctx.episode_id is not None:
        session = manager.get(ctx.episode_id, token or ctx.episode_token)
    else:
        raise ApiError(400, "no_episode",
                       "tools/call acts within an episode: call initialize first (the "
                       "Mcp-Session-Id it returns names the episode), or pass episode_id and "
                       "episode_token in params (or the X-Episode-Id / X-Episode-Token headers)")
    action = catalog.action_from_tool_call(name, arguments)
    own = session is ctx.bound  # cached right here; any other episode may have moved elsewhere
    try:
        payload = manager.step(session, action, check_fresh=not own,
                               after_step=ctx.seen_step if own else None)
    except ApiError as exc:
        if own and exc.code == "conflict":  # refused on a world that moved: the next acts on it
            ctx.seen_step = None
        raise
    if own:
        ctx.seen_step = payload["metadata"]["step"]
    return tool_result(payload)


def tool_result(payload: dict[str, Any]) -> dict[str, Any]:
    """A step as an MCP CallToolResult: text for the model, the full step as structured content;
    a rejected action is a tool error (`isError`) so the model sees what went wrong."""
    observation = payload["observation"]
    text = observation["text"]  # Observation renders it on first access
    meta = payload["metadata"]
    status = f"reward {payload['reward']:+g}" if payload["reward"] is not None else "reward -"
    status += " · episode over" if payload["done"] else f" · step {meta['step']}"
    if meta.get("outcome"):
        status += f" · outcome {meta['outcome']}"
    return {"content": [{"type": "text", "text": f"{text}\n\n[{status}]"}],
            "structuredContent": {"observation": dict(observation), "reward": payload["reward"],
                                  "done": payload["done"], "metadata": meta},
            "isError": bool(meta.get("rejected"))}
