"""The gate in front of every route: API-key auth and the request-size limit, as plain ASGI.

Plain ASGI rather than a Starlette BaseHTTPMiddleware: it costs a header scan per request, not
an extra task and body copy, and it covers WebSocket handshakes too.
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson

from api.ui_html import HEADERS, ROOT_PATH, error_document, is_ui_path

OPEN_PATHS = frozenset({"/health", "/ready"})  # probes carry no key


def proxy_root(scope: dict) -> str:
    """The prefix a reverse proxy mounts the server under (`--root-path`). Inside a mounted app
    (the docs' assets) `root_path` also holds the mount's path, which Starlette keeps apart as
    `app_root_path`: taken for the proxy's, `/docs/assets/` was a UI page whose links all 404."""
    return scope.get("app_root_path", scope.get("root_path", ""))


def route_path(scope: dict) -> str:
    """The path the app routes on: Uvicorn puts `--root-path` in front of the request's path."""
    path, root = scope["path"], proxy_root(scope)
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root):] or "/"
    return path


def _json(status: int, code: str, message: str, extra_headers: list | None = None) -> tuple:
    body = orjson.dumps({"detail": message, "code": code})
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())] + (extra_headers or [])
    return status, headers, body


def _shown(value: bytes) -> str:
    """A header's value as a refusal quotes it: decoded whatever its bytes, and not too long."""
    text = value.decode("latin-1").strip()
    return repr(text if len(text) <= 40 else f"{text[:37]}...")


def no_websocket_at(path: str) -> tuple:
    """The answer to a WebSocket handshake for a path other than /ws: 404 in words."""
    shown = path if len(path) <= 80 else f"{path[:77]}..."
    return _json(404, "not_found", f"there is no WebSocket endpoint at {shown!r}: it is /ws")


def _as_page(status: int, headers: list, body: bytes) -> tuple:
    """The same refusal as an HTML page in words, for the UI's pages: a person reads it."""
    said = orjson.loads(body)["detail"]
    if status == 401:
        said += (". A browser does not ask for Bearer keys: open the UI through a reverse proxy that "
                 "adds the header, or with an extension that sets request headers.")
    page = error_document(status, said).encode()
    kept = [(k, v) for k, v in headers if k not in (b"content-type", b"content-length")]
    return status, [(b"content-type", b"text/html; charset=utf-8"),
                    (b"content-length", str(len(page)).encode()), *kept,
                    *((k.lower().encode(), v.encode()) for k, v in HEADERS.items())], page


def _path_error(scope: dict) -> tuple | None:
    """A path holding an encoded slash (`%2F`): the server decodes it before routing, so
    `/episodes/<id>%2Fevents` was the events route, a spelling a proxy's rule on the raw path
    (exposing the environment's routes only) would not see. No route and no episode id holds one."""
    raw = scope.get("raw_path") or b""
    if b"%2f" in raw.lower():
        return _json(404, "not_found", "the path holds an encoded slash (%2F), which no route and no "
                     "episode id has")
    return None


class Guard:
    """401 without the API key (403 with a wrong one), 413 for a body over `max_body_bytes`."""

    def __init__(self, app: Any, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes

    def auth_error(self, scope: dict) -> tuple | None:
        if self.api_key is None or route_path(scope) in OPEN_PATHS:
            return None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, key = value.partition(b" ")
                if scheme.lower() != b"bearer":  # Basic, a bare key...: not a wrong key, a wrong
                    return _json(401, "unauthorized",  # form (not echoed: it may be the key itself)
                                 "the Authorization header is not of the form Bearer <key>; this "
                                 "server takes Authorization: Bearer <key>",
                                 [(b"www-authenticate", b"Bearer")])
                if hmac.compare_digest(key.strip(), self.api_key):
                    return None
                if not key.strip():  # "Bearer" alone: no key sent, not a wrong one
                    return _json(401, "unauthorized", "the Authorization header holds no key after "
                                 "Bearer; send Authorization: Bearer <key>",
                                 [(b"www-authenticate", b"Bearer")])
                return _json(403, "forbidden", "wrong API key",
                             [(b"www-authenticate", b'Bearer error="invalid_token"')])
        return _json(401, "unauthorized",
                     "this server needs an API key: send the header Authorization: Bearer <key>",
                     [(b"www-authenticate", b"Bearer")])

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            error = self.auth_error(scope) or _path_error(scope) or self._body_error(scope)
            if error is not None:
                if is_ui_path(route_path(scope)):
                    ROOT_PATH.set(proxy_root(scope))  # the page's links, under the prefix
                    error = _as_page(*error)
                await _send_http(send, *error)
                return
            await self.app(scope, self._limited(receive, send), send)
        elif kind == "websocket":
            error = self.auth_error(scope)
            if error is not None:
                await deny_websocket(scope, receive, send, *error)
                return
            await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _body_error(self, scope: dict) -> tuple | None:
        """A body over the limit by its Content-Length, or coded in a way this server never
        decodes: a gzipped body was read as its compressed bytes and refused as "not UTF-8"."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_body_bytes
                except ValueError:
                    return _json(400, "bad_request", "Content-Length is not a number")
                if too_big:
                    return self._too_big()
            elif name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                return _json(415, "unsupported_encoding",
                             f"Content-Encoding {_shown(value)} is not read here: send the body "
                             "uncompressed", [(b"accept-encoding", b"identity")])
            elif name == b"transfer-encoding" and value.strip().lower() != b"chunked":
                return _json(501, "unsupported_transfer_encoding",
                             f"Transfer-Encoding {_shown(value)} is not read here: only chunked is")
        return None

    def _too_big(self) -> tuple:
        return _json(413, "body_too_large",
                     f"request body over the {self.max_body_bytes}-byte limit")

    def _limited(self, receive: Any, send: Any) -> Any:
        """Count streamed (chunked) bodies too; past the limit the request reads as cut off."""
        seen = 0
        limit = self.max_body_bytes

        async def wrapped() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        return wrapped


class BodyTooLarge(Exception):
    """A streamed body grew past the limit; the app's handler turns it into a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over the {limit}-byte limit")


async def _send_http(send: Any, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def deny_websocket(scope: dict, receive: Any, send: Any, status: int, headers: list,
                          body: bytes) -> None:
    """Refuse a WebSocket handshake with an HTTP response where the server supports it."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": body.decode()[:120]})
