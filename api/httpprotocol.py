"""The HTTP protocol `companyos serve` runs: Uvicorn's httptools one, with a deadline per request.

Uvicorn closes a keep-alive connection idle after a response, but waits forever for a request's
headers and body: a client that connects and sends nothing, half a request line, or a body a
byte at a time holds the connection and a file descriptor for good (the load QA held 3,000 such
for minutes, and a worker at its descriptor limit refused everyone). This subclass gives each
request REQUEST_TIMEOUT_S from its first byte (or from the connection's opening) to arrive whole,
headers and body, as nginx's `client_header_timeout` and `client_body_timeout` do. Bodies are
capped (`max_body_bytes`, 256 KiB by default, which the deadline asks a client to send at 9 KiB/s).

A connection still sending headers is closed without an answer (it may never have been a
request); one whose body stalls is answered 408 `request_timeout`, in words, then closed, unless
the application already began its response. A WebSocket handshake leaves the deadline behind once
its headers are in: the connection is no longer HTTP. While the server itself stops reading (a
pipelined request waits for the one before it; the application has yet to take the body it has,
or to ask for it with `100 Continue`), the clock starts again: the delay is not the client's.
"""

from __future__ import annotations

import asyncio

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REQUEST_TIMEOUT_S = 30.0


class TimelyHttpProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol that drops a connection slow to send its request."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a keep-alive connection's next request

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and self._should_upgrade():
            self._disarm()  # a WebSocket handshake: the connection leaves HTTP
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(REQUEST_TIMEOUT_S, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = getattr(self, "cycle", None)
        if self.flow.read_paused or getattr(cycle, "waiting_for_100_continue", False):
            # the server holds the request back (a pipelined one waits for the one before, the app
            # has yet to read the body it has, or to ask for it with 100 Continue): not the
            # client's delay
            self._arm()
            return
        # the body under way (the request's cycle exists once its headers are in, and wants
        # more until the message is complete), and no answer begun: say why it is dropped
        if cycle is not None and cycle.more_body and not cycle.response_started:
            self.transport.write(_timeout_response())
        self.transport.close()


def _timeout_response() -> bytes:
    """408 with the reason in words, as the API's other refusals say theirs (`detail`, `code`)."""
    body = orjson.dumps({
        "detail": f"the request's body did not arrive within {REQUEST_TIMEOUT_S:g} s of its start",
        "code": "request_timeout"})
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
