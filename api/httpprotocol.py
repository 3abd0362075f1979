"""The HTTP protocol `companyos serve` runs: Uvicorn's httptools one, with a deadline for headers.

Uvicorn closes a keep-alive connection idle after a response, but waits forever for a request's
headers: a client that connects and sends nothing, or half a request line, holds the connection
and a file descriptor for good (the load QA held 3,000 such for minutes, and a worker at its
descriptor limit refused everyone). This subclass closes a connection whose request headers are
not complete HEADER_TIMEOUT_S after it opened, or after the request began, as nginx's
`client_header_timeout` does. A slow body is the application's to read; a reverse proxy in front
bounds that.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = 30.0


class TimelyHttpProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol that drops a connection slow to send its request headers."""

    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a keep-alive connection's next request

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()
