"""RemoteCompanyEnv: CompanyEnv's face over a `companyos serve` server, so code written against the
in-process environment runs unchanged against a remote one.

Two transports: `"ws"` keeps one WebSocket (`/ws`) per environment, the fast path (one frame per
step); `"http"` uses `POST /reset`, `POST /step` and `GET /state` on one `httpx.Client`, sending the
episode token the server hands out at reset with every step. Both give back exactly what CompanyEnv
gives for the same seed, options and actions (the server runs the same runtime); where the wire
cannot carry something, `RemoteCompanyEnv`'s docstring says what differs.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
import time
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import orjson
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection, connect

import domain
from companyos.config import api_key_problem
from companyos.env import RESET_OPTIONS, spec_from_options
from companyos.observation import Observation
from companyos.runtime import TOOL_NAMES, episode_id_problem
from domain.events import to_json_value
from projections.episodes import new_agent_label_problem
from projections.render import render_views

TRANSPORTS = ("ws", "http")
ENVELOPE_TYPES = ("list_tools", "call_tool")
_INFO_KEYS = ("episode_id", "step", "outcome", "failure_mode", "rejected")
# OpenEnv's WebSocket error codes that carry no HTTP status of their own
_WS_STATUS = {"INVALID_JSON": 400, "UNKNOWN_TYPE": 400, "VALIDATION_ERROR": 400, "CAPACITY_REACHED": 503}
_WS_CLOSING_ERRORS = frozenset({"CAPACITY_REACHED", "SESSION_ERROR"})
"""Error frames the server closes the socket after (a full server, a resume it refused)."""
_WS_TOO_BIG = 1009  # the close code of a frame over the server's --max-body
_WS_SERVICE_RESTART = 1012  # a shutting-down server answers the message under way, drops the rest


# -- errors ------------------------------------------------------------------------------------


class RemoteEnvError(Exception):
    """The server refused a request or gave no answer: its HTTP `status` (None when there was no
    answer), its machine-readable `code` and its words (`detail`), kept apart so callers can
    branch on them; `str()` shows all three."""

    def __init__(self, status: int | None, code: str, detail: str, url: str = "") -> None:
        where = f"HTTP {status} {code}" if status is not None else code
        super().__init__(f"{detail} ({where})")
        self.status = status
        self.code = code
        self.detail = detail
        self.url = url


class RemoteRequestError(RemoteEnvError, ValueError):
    """4xx: the caller's mistake (a bad seed or task, a wrong token or API key, an action too big),
    a ValueError as CompanyEnv raises for the same mistakes."""


class RemoteEpisodeFinished(RemoteRequestError, domain.EpisodeFinished):
    """409 episode_finished: a step after the episode ended, the server's word for what CompanyEnv
    raises as `domain.EpisodeFinished`, so one `except` catches both."""


class RemoteServerError(RemoteEnvError, RuntimeError):
    """5xx, or an answer the client cannot read: nothing the caller did wrong."""


class RemoteConnectionError(RemoteServerError):
    """No answer at all: the server is not there, the connection dropped, or it timed out."""


def remote_error(status: int | None, code: str, detail: str, url: str = "") -> RemoteEnvError:
    """The exception class that fits a refusal: caller mistakes are ValueErrors, the rest not."""
    if status is None:
        return RemoteConnectionError(status, code, detail, url)
    if status == 409 and code == "episode_finished":
        return RemoteEpisodeFinished(status, code, detail, url)
    if 400 <= status < 500:
        return RemoteRequestError(status, code, detail, url)
    return RemoteServerError(status, code, detail, url)


def _refusal(status: int, body: bytes, url: str) -> RemoteEnvError:
    """An HTTP error answer -> the exception; the server's `{"detail", "code"}` when it sent one
    (a 422's detail is a list of field errors: joined as `where: what`)."""
    try:
        reply = orjson.loads(body)
    except orjson.JSONDecodeError:
        reply = None
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
    fallback = phrase.lower().replace(" ", "_").replace("-", "_")
    if not isinstance(reply, dict):
        text = body.decode("utf-8", "replace").strip()[:300] or phrase
        return remote_error(status, fallback, f"{url} answered {status}: {text}", url)
    detail = reply.get("detail")
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', '')}"
                           if isinstance(e, dict) else str(e) for e in detail)
        return remote_error(status, str(reply.get("code") or "validation_error"), detail, url)
    return remote_error(status, str(reply.get("code") or fallback), str(detail), url)


def _unreachable(url: str, exc: BaseException) -> RemoteConnectionError:
    said = str(exc) or type(exc).__name__
    return RemoteConnectionError(None, "unreachable", f"cannot reach the CompanyOS server at {url}: "
                                 f"{said}; is `companyos serve` running there?", url)


def _not_sent(url: str, why: object) -> RemoteConnectionError:
    """The connection closed before the message went out, or before the server began it: it was
    not applied, so sending it again is safe."""
    return RemoteConnectionError(None, "not_applied", f"the connection to {url} closed before the "
                                 f"server began the message ({why}); it was not applied", url)


def _restarting(exc: ConnectionClosed) -> bool:
    """The server closed the socket saying it is restarting (1012): it will listen again."""
    return exc.rcvd is not None and exc.rcvd.code == _WS_SERVICE_RESTART


def _lost(url: str, exc: BaseException, changes: bool = True) -> RemoteConnectionError:
    """`changes`: the request may change the episode, so whether it did is in doubt."""
    doubt = ("; the action may or may not have been applied: `state` tells (the next call "
             "reconnects)") if changes else ""
    return RemoteConnectionError(None, "connection_lost", f"the connection to {url} was lost before it "
                                 f"answered ({exc}){doubt}", url)


DEFAULT_TIMEOUT_S = 75.0
"""Longer than a server waits for a store another process holds locked (60 s, then 503: not
applied): at 30 s a step under such a lock was "may have been applied" here, then applied."""


def _timed_out(url: str, timeout: float, changes: bool = True) -> RemoteConnectionError:
    doubt = "; the request may or may not have been applied: `state` tells" if changes else ""
    return RemoteConnectionError(None, "timeout", f"no answer from {url} within {timeout:g} s{doubt}", url)


def _unreadable(url: str, status: int | None, body: bytes) -> RemoteServerError:
    text = body.decode("utf-8", "replace")[:200]
    return RemoteServerError(status, "bad_reply", f"{url} answered with something that is not a "
                             f"CompanyOS reply: {text!r}", url)


def server_url(base_url: str, timeout: float) -> str:
    """A client's server URL without a trailing slash, once it and the timeout are checked."""
    # at most threading.TIMEOUT_MAX (~292 years): past it the socket refused it only on first use,
    # with an OverflowError about time_t
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) \
            or not 0 < timeout <= threading.TIMEOUT_MAX:
        raise ValueError(f"timeout must be a positive number of seconds (at most "
                         f"{threading.TIMEOUT_MAX:.0f}), not {timeout!r}")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must be the server's http:// or https:// URL, not {base_url!r}")
    if parts.query or parts.fragment or base_url.endswith(("?", "#")):  # paths are appended to it
        raise ValueError(f"base_url must be the server's URL without a query or fragment, not {base_url!r}")
    return base_url.rstrip("/")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """What a server started with an API key asks of every request. A key that no header can carry
    is refused here, in words: sent, it failed inside the HTTP library as a lost connection."""
    if api_key is None or api_key == "":
        return {}
    if not isinstance(api_key, str) or (problem := api_key_problem(api_key)):
        raise ValueError(problem if isinstance(api_key, str) else
                         f"api_key must be a string, not {type(api_key).__name__}")
    return {"Authorization": f"Bearer {api_key}"}


# -- the two wires -----------------------------------------------------------------------------


def _dumps(value: Any) -> bytes:
    """JSON for the wire; NumPy scalars (as Gymnasium code has them) as their numbers."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:  # only reset values can get here: actions went through to_json_value
        raise ValueError(f"not JSON, so it cannot be sent to the server: {exc}") from None


class HttpWire:
    """One httpx.Client: JSON in and out (orjson both ways), refusals turned into RemoteEnvError."""

    def __init__(self, base_url: str, timeout: float, headers: dict[str, str]) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.client = httpx.Client(base_url=base_url, timeout=timeout,
                                   headers={**headers, "Content-Type": "application/json"})

    def call(self, method: str, path: str, *, body: Any = None, params: dict | None = None,
             token: str | None = None) -> Any:
        content = None if body is None else _dumps(body)
        headers = {"X-Episode-Token": token} if token else None
        response = self.request(method, path, content=content, params=params, headers=headers)
        return self.json(response)

    def request(self, method: str, path: str, *, content: bytes | None = None,
                params: dict | None = None, headers: dict[str, str] | None = None,
                timeout: float | None = None) -> httpx.Response:
        """A successful answer (below 400); no answer and refusals raised as RemoteEnvError. A GET
        changes nothing, so its lost answer leaves nothing in doubt."""
        url = self.base_url + path
        timeout = self.timeout if timeout is None else timeout
        changes = method != "GET"
        try:
            response = self.client.request(method, path, content=content, params=params,
                                           headers=headers, timeout=timeout)
        except httpx.TimeoutException:
            raise _timed_out(url, timeout, changes) from None
        except httpx.ConnectError as exc:
            raise _unreachable(self.base_url, exc) from None
        except httpx.TransportError as exc:
            raise _lost(url, exc, changes) from None
        if response.status_code >= 400:
            raise _refusal(response.status_code, response.content, url)
        return response

    def json(self, response: httpx.Response) -> Any:
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise _unreadable(str(response.url), response.status_code, response.content) from None

    def close(self) -> None:
        self.client.close()


def _ws_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/ws", "", ""))


class _WebSocketWire:
    """One WebSocket, opened on first use. A message the socket refused to send (it was closed)
    goes out again on a new connection that resumes the episode; a lost or late answer is an
    error, never a resend, since the server may have applied the step."""

    def __init__(self, base_url: str, timeout: float, headers: dict[str, str]) -> None:
        self.url = _ws_url(base_url)
        self.timeout = timeout
        self.headers = headers
        # (episode_id, token): what a new socket resumes. The token goes in a header, not glued to
        # the id as `<id>.<token>`: ids may hold dots, so a short or dotted token was read as part
        # of the id (404 quoting the token, where HTTP said 403 wrong_token)
        self.resume_as: tuple[str, str] | None = None
        self._conn: ClientConnection | None = None
        self._scope = contextlib.ExitStack()  # holds the socket as `with connect(...)` would

    def _connect(self, resume: bool = True, until: float | None = None) -> ClientConnection:
        """A new socket; `resume` binds it to the episode this wire last had (a reset needs none:
        it starts another, and the server may no longer hold the old one). `until`: a server that
        said it is restarting may take a while to listen again; try again until then."""
        delay = 0.05
        while True:
            try:
                return self._open(resume)
            except RemoteConnectionError as exc:
                left = (until or 0.0) - time.monotonic()
                if exc.code != "unreachable" or left <= 0:
                    raise
                time.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)

    def _open(self, resume: bool) -> ClientConnection:
        url, headers = self.url, self.headers
        if resume and self.resume_as is not None:
            episode_id, token = self.resume_as
            url = f"{self.url}?session_id={quote(episode_id)}"
            headers = {**headers, "X-Episode-Token": token}
        try:
            # entered as a context manager, as websockets >= 17.1 asks (`legacy=` is 17.1+ only)
            return self._scope.enter_context(connect(
                url, open_timeout=self.timeout, close_timeout=self.timeout,
                additional_headers=headers, max_size=None, compression=None))
        except InvalidStatus as exc:  # refused at the handshake: a wrong or missing API key
            raise _refusal(exc.response.status_code, exc.response.body or b"", self.url) from None
        except TimeoutError:  # no handshake, so nothing was sent
            raise _timed_out(self.url, self.timeout, changes=False) from None
        # closed during the handshake (a server going down): nothing was sent either
        except (OSError, InvalidHandshake, InvalidURI, ConnectionClosed) as exc:
            raise _unreachable(self.url, exc) from None

    def call(self, message: dict[str, Any]) -> Any:
        """Send one message and return the data of its reply frame.

        A message that never went out (the socket was found closed) or that a shutting-down server
        did not begin (close code 1012) was not applied, so it is sent again on a new socket: once
        for a socket found closed, and while a restarting server comes back (within `timeout`)."""
        text = _dumps(message).decode()
        resume = message.get("type") != "reset"
        restarting_until: float | None = None  # set when the server said it is restarting (1012)
        resent = False
        pause = 0.0  # between sends to a server that keeps closing with 1012: none the first time
        while True:
            if self._conn is None:
                if restarting_until is not None:
                    time.sleep(min(pause, max(restarting_until - time.monotonic(), 0.0)))
                    pause = min(max(pause * 2, 0.05), 1.0)
                self._conn = self._connect(resume, restarting_until)
            try:
                self._conn.send(text)
            except ConnectionClosed as exc:  # closed before anything went out: not applied
                self._drop_closed()  # raises the error frame the server sent before closing, if any
                if restarting_until is None and _restarting(exc):
                    restarting_until = time.monotonic() + self.timeout
                given_up = resent if restarting_until is None else time.monotonic() > restarting_until
                if given_up:
                    raise _not_sent(self.url, exc) from None
                resent = True
                continue
            raw = self._answer(text)
            if raw is not None:
                return self._read(raw)
            if restarting_until is None:  # the server shut down before it began it: not applied
                restarting_until = time.monotonic() + self.timeout
            elif time.monotonic() > restarting_until:
                raise _not_sent(self.url, "the server shut down before it began the message, again")

    def _answer(self, text: str) -> str | bytes | None:
        """The reply frame to `text`, or None if a shutting-down server closed the socket before
        it began it (it answers the message under way first, and applies none after it)."""
        try:
            return self._conn.recv(timeout=self.timeout)
        except TimeoutError:
            self.drop(abandon=True)  # a late answer must not be read as the next one's
            raise _timed_out(self.url, self.timeout) from None
        except ConnectionClosed as exc:
            self.drop()
            received = exc.rcvd
            if received is not None and received.code == _WS_TOO_BIG:
                raise RemoteRequestError(413, "message_too_big", f"the server refused a {len(text)}-"
                                         f"character message: {received.reason or 'too big'}",
                                         self.url) from None
            if received is not None and received.code == _WS_SERVICE_RESTART:
                return None
            raise _lost(self.url, exc) from None

    def _drop_closed(self) -> None:
        """Drop a socket the server closed, first raising the error frame it sent before closing
        (a full server's CAPACITY_REACHED, a resume it refused): its words, not "connection lost"."""
        try:
            said = self._conn.recv(timeout=0)
        except (ConnectionClosed, TimeoutError):
            said = None
        self.drop()
        if said is not None:
            self._read(said)  # raises for an error frame; anything else was no answer to this message

    def _read(self, raw: str | bytes) -> Any:
        try:
            reply = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise _unreadable(self.url, None, raw if isinstance(raw, bytes) else raw.encode()) from None
        if not isinstance(reply, dict) or "data" not in reply:
            raise _unreadable(self.url, None, orjson.dumps(reply))
        data = reply["data"]
        if reply.get("type") == "error":
            code = data.get("code", "error")
            if code in _WS_CLOSING_ERRORS and self._conn is not None:
                # the server closes this socket next: a call right after sent on it before its
                # close arrived, and read the close as a step lost ("may have been applied")
                self.drop()
            status = data.get("status") or _WS_STATUS.get(code, 500)
            raise remote_error(status, str(data.get("reason") or code), str(data.get("message")), self.url)
        return data

    def drop(self, abandon: bool = False) -> None:
        """Close the socket; `abandon` skips waiting for the server's half of the closing handshake
        (a server that did not answer in time would not answer that either: the call would take
        twice its timeout)."""
        if abandon and self._conn is not None:
            self._conn.close_timeout = 0
        self._conn = None
        self._scope.close()  # closes the socket

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(ConnectionClosed):
                self._conn.send(orjson.dumps({"type": "close"}).decode())
            self.drop()


# -- the environment ---------------------------------------------------------------------------


class RemoteCompanyEnv:
    """CompanyEnv's public shape over the network: `reset(seed, options) -> (obs, info)`,
    `step(action) -> (obs, reward, terminated, truncated, info)`, `state`, `render()`, `close()`,
    and a context manager. Observations (an `Observation`: `obs["text"]` renders locally),
    rewards, flags and info equal CompanyEnv's for the same seed, options and actions, and the
    logged streams have equal digests.

    What the wire cannot carry, and so differs from CompanyEnv:

    - `state["agent"]` is the label the log holds: the `agent` given here, else `"api"` (the server
      labels unlabelled episodes so; in process it is None);
    - no `store` or `durability`: the server logs every step before it answers (`"step"`);
    - an action shaped like OpenEnv's MCP envelope (a dict with no "app" and no "method" whose
      "type" is "list_tools" or "call_tool") is refused with a ValueError before it is sent: the
      server reads it as a tool listing or tool call, so it cannot be sent as the malformed action
      CompanyEnv would reject;
    - limits of the server: a request over its `--max-body` (256 KiB by default) is a 413
      `RemoteRequestError`, where CompanyEnv takes actions up to ~1 MiB of JSON.

    Errors: 4xx refusals raise `RemoteRequestError` (a ValueError; `RemoteEpisodeFinished`, also a
    `domain.EpisodeFinished`, for a step after the end), 5xx `RemoteServerError` (a RuntimeError),
    no answer `RemoteConnectionError` (a RuntimeError naming the URL). Each has `status`, `code`
    and `detail`. A lost WebSocket is reopened on the next call and resumes the episode; an action
    whose answer was lost is never resent.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, base_url: str, *, transport: str = "ws", agent: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, api_key: str | None = None) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if agent is not None and (problem := new_agent_label_problem(agent)):
            raise ValueError(problem)
        self.base_url = server_url(base_url, timeout)
        self.transport = transport
        self.agent = agent
        self.timeout = timeout
        self.tools = domain.TOOLS
        self.episode_id: str | None = None
        self.episode_token: str | None = None
        self._headers = auth_headers(api_key)
        self._ws = _WebSocketWire(self.base_url, timeout, self._headers) if transport == "ws" else None
        self._http_wire: HttpWire | None = None
        self._closed = False

    # -- the Gymnasium-shaped calls ------------------------------------------------------------

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Start an episode on the server; options as CompanyEnv's (`task`, `chaos`, ...)."""
        self._check_open()
        data = self._reset_data(seed, options)
        # as in process, a failed reset leaves no episode to step: not the one before it
        self.episode_id = self.episode_token = None
        if self._ws is not None:  # a reset never resumes an episode (see _WebSocketWire.call)
            payload = self._ws.call({"type": "reset", "data": data})
        else:
            payload = self._http().call("POST", "/reset", body=data)
        metadata = payload["metadata"]
        self.episode_id = metadata["episode_id"]
        self.episode_token = metadata["episode_token"]
        if self._ws is not None:
            self._ws.resume_as = (self.episode_id, self.episode_token)
        return _observation(payload), _info(metadata)

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """One action. Sent as the JSON the domain would log for it (`domain.events.to_json_value`:
        tuples as lists, NaN as null, ...), so the remote episode logs what CompanyEnv logs."""
        self._check_open()
        if self.episode_id is None:
            raise RuntimeError("call reset() before step()")
        action = to_json_value(action)
        _check_not_envelope(action)
        if self._ws is not None:
            payload = self._ws.call({"type": "step", "data": action})
        else:
            payload = self._http().call("POST", "/step", token=self.episode_token,
                                        body={"action": action, "episode_id": self.episode_id})
        metadata = payload["metadata"]
        truncated = metadata["outcome"] == "truncated"  # the domain ends by budget only so
        terminated = bool(payload["done"]) and not truncated
        return _observation(payload), float(payload["reward"]), terminated, truncated, _info(metadata)

    def attach(self, episode_id: str, episode_token: str) -> dict[str, Any]:
        """Continue an episode another client or process started (its id and the token its reset
        answered with): the next `step` acts on it. Returns its state as the server's log holds it;
        an unknown episode or a wrong token is the server's refusal (404, 403)."""
        self._check_open()
        if problem := episode_id_problem(episode_id):
            raise ValueError(problem)
        if not isinstance(episode_token, str) or not episode_token:
            raise ValueError("episode_token must be the token the episode's reset answered with")
        self.episode_id, self.episode_token = episode_id, episode_token
        if self._ws is not None:  # the open socket is bound to the episode before: a new one resumes this
            self._ws.drop()
            self._ws.resume_as = (episode_id, episode_token)
        try:
            return self.state
        except BaseException:
            self.episode_id = self.episode_token = None  # not attached: as before any reset
            if self._ws is not None:
                self._ws.drop()
                self._ws.resume_as = None
            raise

    @property
    def state(self) -> dict[str, Any]:
        """The episode's identity, progress and outcome, as the server's log holds them (after
        `close()` too, as CompanyEnv's)."""
        if self.episode_id is None:
            return {"episode_id": None, "step_count": 0}
        if self._ws is not None and not self._closed:
            return self._ws.call({"type": "state"})
        return self._read("/state", params={"episode_id": self.episode_id}, token=self.episode_token)

    def render(self) -> str:
        """The three apps as they are now, as text (as CompanyEnv.render, after `close()` too):
        folded by the server from the log (a `views` message on the WebSocket, `GET
        /episodes/{id}/views` over HTTP)."""
        if self.episode_id is None:
            return ""
        if self._ws is not None and not self._closed:
            return render_views(self._ws.call({"type": "views"}))
        return render_views(self._read(f"/episodes/{quote(self.episode_id, safe='')}/views"))

    def close(self) -> None:
        """Close the connection; the episode stays in the server's log (and can be resumed)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._ws is not None:
                self._ws.close()
        finally:
            if self._http_wire is not None:
                self._http_wire.close()

    def __enter__(self) -> RemoteCompanyEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this RemoteCompanyEnv is closed")

    def _read(self, path: str, **how: Any) -> Any:
        """A GET of the episode; once closed, on a connection of its own, closed again at once:
        code that reads the outcome after a `with` block ran in process only (CompanyEnv's
        `state` and `render` answer after `close()`)."""
        if not self._closed:
            return self._http().call("GET", path, **how)
        wire = HttpWire(self.base_url, self.timeout, self._headers)
        try:
            return wire.call("GET", path, **how)
        finally:
            wire.close()

    def _http(self) -> HttpWire:
        self._check_open()
        if self._http_wire is None:
            self._http_wire = HttpWire(self.base_url, self.timeout, self._headers)
        return self._http_wire

    def _reset_data(self, seed: Any, options: dict[str, Any] | None) -> dict[str, Any]:
        """The server's reset fields. Unknown options are refused here in CompanyEnv's words, since
        the server has fields (agent, text) that are not options in process; values are the
        server's to judge. NumPy scalars travel as the Python numbers CompanyEnv reads from them."""
        if options is not None and not isinstance(options, Mapping):  # as CompanyEnv refuses it
            raise TypeError(f"options must be a dict of reset options, not {type(options).__name__}")
        given = dict(options or {})
        unknown = set(given) - RESET_OPTIONS
        if unknown:
            raise ValueError(f"unknown reset options: {sorted(unknown)}")
        if any(map(_unsendable, (seed, *given.values()))):
            # JSON has no NaN or infinity (orjson writes null, which the server reads as "the
            # default"), nor orjson an integer beyond 64 bits: refuse in CompanyEnv's own words
            # rather than start another episode
            spec_from_options(seed, given)
            raise ValueError("NaN, infinity and integers beyond 64 bits cannot be sent to the server")
        data = {name: _python_scalar(value) for name, value in given.items()}
        seed = _python_scalar(seed)
        if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
            seed = int(seed)
        data["seed"] = seed
        if self.agent is not None:
            data["agent"] = self.agent
        return data


def _python_scalar(value: Any) -> Any:
    """A NumPy scalar as the Python value it holds, as CompanyEnv reads it (`float(np.float32(0.3))`
    is 0.30000001192092896, where orjson writes 0.3: another chaos level, another episode)."""
    return value.item() if type(value).__module__ == "numpy" and hasattr(value, "item") else value


def _unsendable(value: Any) -> bool:
    """A float NaN or infinity, which has no JSON form, or an integer orjson cannot write."""
    if isinstance(value, numbers.Integral):
        return not isinstance(value, bool) and not -2**63 <= int(value) < 2**64
    return isinstance(value, numbers.Real) and not math.isfinite(value)


def _observation(payload: dict[str, Any]) -> Observation:
    """The server's observation as CompanyEnv gives it: the tool names as the shared tuple, and
    the text rendered locally on demand (the same function renders it in process)."""
    observation = Observation(payload["observation"])
    tools = observation.get("tools")
    if tools is not None:
        observation["tools"] = TOOL_NAMES if tuple(tools) == TOOL_NAMES else tuple(tools)
    return observation


def _info(metadata: dict[str, Any]) -> dict[str, Any]:
    """CompanyEnv's info keys only (the server's token and session id are kept on the env)."""
    return {key: metadata.get(key) for key in _INFO_KEYS}


def _check_not_envelope(action: Any) -> None:
    if (isinstance(action, dict) and "app" not in action and "method" not in action
            and action.get("type") in ENVELOPE_TYPES):
        raise ValueError(f"the server reads {{'type': {action['type']!r}}} without 'app' and 'method' "
                         "as OpenEnv's MCP envelope, not as an action, so it cannot be sent as one "
                         "(in process it would be rejected as malformed_action); the tools are "
                         "listed in `env.tools`")


__all__ = ["RemoteCompanyEnv", "RemoteConnectionError", "RemoteEnvError", "RemoteEpisodeFinished",
           "RemoteRequestError", "RemoteServerError", "remote_error"]
