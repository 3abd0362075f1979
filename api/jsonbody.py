"""FastAPI routes whose JSON bodies are read by the one parser of every door
(`eventstore.encoding.parse_json`), so the same bytes are the same action over HTTP, WebSocket and
MCP (and so log the same episode); FastAPI's own parser is the stdlib's.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute

from eventstore.encoding import parse_json as loads


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
