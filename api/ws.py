"""WebSocket `/ws`: OpenEnv's persistent-session protocol, one episode at a time per connection.

Client messages: `{"type": "reset", "data": {seed, task, chaos, ...}}`, `{"type": "step",
"data": <action>}`, `{"type": "state"}`, `{"type": "mcp", "data": <JSON-RPC>}`,
`{"type": "close"}`, and CompanyOS's own `{"type": "views"}` (the session's three apps as
`GET /episodes/{id}/views` gives them, so a WebSocket client renders without a second
connection). Replies: `observation`, `state`, `views`, `mcp` or `error` (with OpenEnv's error
codes). `/ws?session_id=<episode_id>.<token>` (or `?session_id=<episode_id>` with the token in
`X-Episode-Token` / `?episode_token=`) resumes an existing episode, e.g. after a restart.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qsl

from api import catalog, mcp
from api.querystring import RepeatedParameter, single_valued, unknown_parameter
from api.sessions import ApiError, Session, chosen_token, refusal
from eventstore.encoding import parse_json as loads
from eventstore.encoding import reply_json

INVALID_JSON = "INVALID_JSON"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"
CAPACITY_REACHED = "CAPACITY_REACHED"
SESSION_ERROR = "SESSION_ERROR"
NO_REPLY = ""
"""What `handle` returns for a message that gets no frame back (an MCP notification)."""
MESSAGE_TYPES = "reset, step, state, views, close or mcp"
"""The message types `handle` answers, said when a message has none of them."""
WS_QUERY = ("episode_token", "session_id")
"""The query parameters `/ws` takes: a session to resume, and its token."""

_dumps = reply_json


def _error(message: str, code: str, **extra: Any) -> str:
    return _dumps({"type": "error", "data": {"message": message, "code": code, **extra}}).decode()


TURN_EVERY = 8
"""Messages a socket handles back to back before the loop serves the others (~1–2 ms of steps)."""


def _api_error(exc: ApiError) -> str:
    code = VALIDATION_ERROR if exc.status in (400, 422) else EXECUTION_ERROR
    return _error(exc.message, code, reason=exc.code, status=exc.status)


def _no_episode() -> str:
    return _error("no episode yet: send a reset first", EXECUTION_ERROR, reason="no_episode", status=409)


async def websocket_app(server: Any, scope: dict, receive: Any, send: Any) -> None:
    """The /ws session as plain ASGI: per message it costs one receive and one send, with no
    framework wrappers in between (a step is ~0.15 ms of work, so they would show)."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    config = server.config
    if server.ws_sessions >= config.max_sessions:
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": _error(
            f"server at capacity: {server.ws_sessions} of {config.max_sessions} sessions in "
            "use; retry later or use another server", CAPACITY_REACHED,
            active_sessions=server.ws_sessions, max_sessions=config.max_sessions)})
        await send({"type": "websocket.close", "code": 1013})
        return
    server.ws_sessions += 1
    conn = _Connection(server)
    try:
        await send({"type": "websocket.accept"})
        # a repeated session_id resumed the first silently, and a misspelt one (`sesion_id`)
        # started without the session: the other routes refuse both
        try:
            query = single_valued(parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                            keep_blank_values=True))
            problem = unknown_parameter("/ws", query, WS_QUERY)
        except RepeatedParameter as exc:
            problem = str(exc)
        if not problem and query.get("session_id") == "":  # an unset variable: not a fresh start
            problem = ("session_id is empty; give <episode_id>.<token> to resume an episode, or "
                       "leave it out to start afresh")
        if not problem and "episode_token" in query and "session_id" not in query:
            # the caller meant to resume: starting a fresh session instead hid the mistake
            problem = ("episode_token resumes an episode only beside session_id=<episode_id>; "
                       "give both, or neither to start afresh")
        if problem:
            await send({"type": "websocket.send", "text": _error(
                problem, SESSION_ERROR, reason="invalid_query", status=400)})
            await send({"type": "websocket.close", "code": 1008})
            return
        key = query.get("session_id")
        if key:
            headers = [value.decode("latin-1") for name, value in scope.get("headers", ())
                       if name == b"x-episode-token"]
            try:
                await conn.resume(key, chosen_token(headers, query.get("episode_token")))
            except Exception as exc:
                refused = refusal(exc)
                if refused is None:
                    raise
                await send({"type": "websocket.send", "text": _error(
                    refused.message, SESSION_ERROR, reason=refused.code, status=refused.status)})
                await send({"type": "websocket.close", "code": 1008 if refused.status < 500 else 1011})
                return
        handle = conn.handle
        handled = 0
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                break
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            reply = await handle(raw)
            if reply is None:
                await send({"type": "websocket.close", "code": 1000})
                break
            if reply:  # NO_REPLY (empty): nothing to send
                await send({"type": "websocket.send", "text": reply})
            # A client that pipelines its messages keeps `receive` ready, and a step on SQLite runs
            # inline: without a turn now and then one socket froze every other and /health for
            # seconds. Every few messages, so a client that waits for its answers (whose `receive`
            # gives the loop its turn anyway) pays almost nothing for it.
            handled += 1
            if handled % TURN_EVERY == 0:
                await asyncio.sleep(0)
    except OSError:  # the client went away mid-send
        pass
    finally:
        server.ws_sessions -= 1
        conn.release()


def _mcp_answer(sessions: Any, data: Any, ctx: mcp.McpContext) -> tuple[mcp.McpReply, str]:
    """An MCP message's reply and its frame, encoded where it was answered (off the loop for a
    batch). A notification gets no frame: JSON-RPC answers none (a reply without an id was no
    JSON-RPC message at all)."""
    reply = mcp.handle(sessions, data, ctx)
    if reply.body is None:
        return reply, NO_REPLY
    return reply, _dumps({"type": "mcp", "data": reply.body}).decode()


class _Connection:
    """The state of one socket: the episode it is playing, if any."""

    __slots__ = ("seen_step", "server", "session")

    def __init__(self, server: Any) -> None:
        self.server = server
        self.session: Session | None = None
        self.seen_step: int | None = None  # the step this socket last answered: its world

    def _bind(self, session: Session, step: int | None) -> None:
        self.release()
        self.server.sessions.attach(session)
        self.session = session
        self.seen_step = step

    def release(self) -> None:
        if self.session is not None:
            self.server.sessions.detach(self.session)
            self.session = None

    async def resume(self, key: str, token: str | None) -> None:
        sessions = self.server.sessions
        session = await self.server.run(sessions.get_by_key, key, token)
        runtime = await self.server.run(sessions.refresh, session)
        self._bind(session, runtime.state.step)

    async def handle(self, raw: str | bytes) -> str | None:
        """One client message -> the reply frame (None: the client asked to close; NO_REPLY: no
        frame, for an MCP notification)."""
        try:
            message = loads(raw)
        except json.JSONDecodeError as exc:
            return _error(f"Invalid JSON: {exc}", INVALID_JSON)
        if not isinstance(message, dict) or "type" not in message:  # not "Unknown message type: None"
            return _error(f"a message must be a JSON object with a 'type': {MESSAGE_TYPES}",
                          VALIDATION_ERROR)
        kind = message["type"]
        try:
            if kind == "step":
                return await self._step(message)
            if kind == "reset":
                return await self._reset(message)
            if kind == "state":
                return await self._state()
            if kind == "views":
                return await self._views()
            if kind == "close":
                return None
            if kind == "mcp":
                return await self._mcp(message)
        except Exception as exc:  # the caller's mistake, or the database failed (the socket stays
            refused = refusal(exc)  # open for a retry); anything else is a bug
            if refused is None:
                raise
            return _api_error(refused)
        return _error(f"Unknown message type: {kind}; the types are {MESSAGE_TYPES}", UNKNOWN_TYPE)

    async def _reset(self, message: dict) -> str:
        data = message.get("data", {})
        if data is None:
            data = {}
        if not isinstance(data, dict):
            return _error("reset data must be an object of reset options", VALIDATION_ERROR)
        session, _, payload = await self.server.run(self.server.sessions.start, data)
        self._bind(session, payload["metadata"]["step"])
        return _dumps({"type": "observation", "data": payload}).decode()

    async def _step(self, message: dict) -> str:
        if "data" not in message:
            return _error("a step message carries the action as its 'data'", VALIDATION_ERROR)
        # any JSON value: one that is no action is rejected in the episode
        kind, data = catalog.tool_envelope(message["data"])
        if kind == "tools":
            return _dumps({"type": "observation", "data": data}).decode()
        session = self.session
        if session is None:
            return _no_episode()
        try:
            payload = await self.server.run_step(session, data, self.seen_step)
        except ApiError as exc:
            if exc.code == "conflict":  # refused on a world that moved: the next step acts on it
                self.seen_step = None
            raise
        self.seen_step = payload["metadata"]["step"]
        return _dumps({"type": "observation", "data": payload}).decode()

    async def _views(self) -> str:
        """The apps after the session's last step, folded from the log like the HTTP route: on a
        thread, since a long episode's fold (~0.3 s at 8,000 steps) would hold up every socket, and
        on the long work's, since 32 sockets asking for views held other sockets' steps for seconds."""
        if self.session is None:
            return _no_episode()
        views = await self.server.in_batch_thread(self.server.log.views, self.session.episode_id)
        return _dumps({"type": "views", "data": views}).decode()

    async def _state(self) -> str:
        if self.session is None:
            state: dict[str, Any] = {"episode_id": None, "step_count": 0}
        else:
            state = await self.server.run(self.server.sessions.state, self.session)
        return _dumps({"type": "state", "data": state}).decode()

    async def _mcp(self, message: dict) -> str:
        ctx = mcp.McpContext(bound=self.session, seen_step=self.seen_step)
        data = message.get("data")
        # a JSON-RPC batch may hold a thousand steps: inline, it held every other socket and
        # /health for as long (~0.6 s for 2,300 calls), and so did encoding its reply (MBs); one
        # message is a step, inline as any
        if isinstance(data, list) and len(data) > 1:
            reply, frame = await self.server.in_batch_thread(_mcp_answer, self.server.sessions, data, ctx)
        else:
            reply, frame = await self.server.run(_mcp_answer, self.server.sessions, data, ctx)
        if reply.session is not None and reply.session is not self.session:
            # `initialize` started this socket's episode: its tools/call act there (steps the socket
            # is not answered as its own, so a plain step after them is not held to a seen step)
            self._bind(reply.session, None)
        else:  # its tools/call on the socket's episode were the socket's own steps
            self.seen_step = ctx.seen_step
        return frame
