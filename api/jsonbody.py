"""One JSON parser for every transport, so the same bytes are the same action over HTTP,
WebSocket and MCP (and so log the same episode).

orjson parses almost everything. It refuses one thing JSON allows: a string escape of a lone
surrogate (`"\\ud800"`), text no UTF-8 log can hold; the stdlib parser takes it and the domain
logs the escape spelled out. And it reads an integer past 64 bits as a float, losing digits, where
the stdlib (and so a caller in process) keeps the integer: a body with such a run of digits goes to
the stdlib parser too. NaN and Infinity are not JSON (RFC 8259): refused on every
transport (the stdlib would have taken them, and the log would have held null).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from fastapi import Request
from fastapi.routing import APIRoute


def _not_json(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf (NaN cannot be spelled as a number)
        raise json.JSONDecodeError(f"the number {text[:40]} is infinity when parsed as double", text, 0)
    return value


_STDLIB = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
TOO_DEEP = "nested too deeply to parse (orjson's limit: 1,024 levels)"
# 19 digits in a row: maybe an integer orjson would turn into a float (2**64 has 20 digits, and
# -2**63 - 1 only 19); a pattern for each type, so a WebSocket frame (text) is not copied to bytes
# to be searched
_LONG_DIGITS = {bytes: re.compile(rb"[0-9]{19}"), str: re.compile("[0-9]{19}")}


def loads(raw: bytes | str) -> Any:
    """The JSON value of `raw`; json.JSONDecodeError (a ValueError) saying what is wrong."""
    if _LONG_DIGITS[str if isinstance(raw, str) else bytes].search(raw) is None:
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
