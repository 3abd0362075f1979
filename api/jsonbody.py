"""One JSON parser for every transport, so the same bytes are the same action over HTTP,
WebSocket and MCP (and so log the same episode).

orjson parses almost everything. It refuses one thing JSON allows: a string escape of a lone
surrogate (`"\\ud800"`), text no UTF-8 log can hold; the stdlib parser takes it and the domain
logs the escape spelled out. NaN and Infinity are not JSON (RFC 8259): refused on every
transport (the stdlib would have taken them, and the log would have held null).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import Request
from fastapi.routing import APIRoute


def _not_json(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


_STDLIB = json.JSONDecoder(parse_constant=_not_json)
TOO_DEEP = "nested too deeply to parse (orjson's limit: 1,024 levels)"


def loads(raw: bytes | str) -> Any:
    """The JSON value of `raw`; json.JSONDecodeError (a ValueError) saying what is wrong."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise json.JSONDecodeError(TOO_DEEP, "", 0) from None
        if "surrogate" not in str(exc):
            raise
    try:
        text = raw.decode() if isinstance(raw, bytes | bytearray) else raw
        return _STDLIB.decode(text)
    except UnicodeDecodeError as exc:  # past the surrogate orjson stopped at
        raise json.JSONDecodeError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})", "", 0) from None
    except RecursionError:
        raise json.JSONDecodeError(TOO_DEEP, "", 0) from None


class _JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """Routes whose JSON bodies go through `loads` (FastAPI's own parser is the stdlib's)."""

    def get_route_handler(self):
        handle = super().get_route_handler()

        async def route(request: Request):
            return await handle(_JsonRequest(request.scope, request.receive))

        return route
