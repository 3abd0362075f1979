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
LINGER_S = 2.0
"""How long a refused connection's input is still read (and dropped) before it is closed."""
MAX_HEAD_BYTES = 64 * 1024
"""A request's line and headers, together: nginx allows 32 KiB by default. httptools has no limit
(a client sent 143 MB of one header line within the deadline, and parsing it, in time that grows
faster than its length, stalled every other connection of the worker)."""


class TimelyHttpProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol that drops a connection slow to send its request, refuses
    a request head over MAX_HEAD_BYTES (431), and says what is wrong with a request that is not
    HTTP in the API's JSON (Uvicorn answered plain text)."""

    _deadline: asyncio.TimerHandle | None = None
    _in_head = True  # the current request's line and headers are still arriving
    _head_bytes = 0
    _head_tail = b""  # the last bytes of a head still arriving, for an end split between chunks
    _between = False  # the last request is complete, and no byte of the next has been parsed
    _refused: asyncio.TimerHandle | None = None  # the close after a refusal, while input drains

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:  # answered and half-closed: the rest is read and dropped
            return
        if self._in_head or self._between:
            # a chunk that completes a head is measured before it is parsed: counted after, a head
            # of 70 KiB sent in one go was served, since parsing it had ended the head
            so_far, tail = (0, b"") if self._between else (self._head_bytes, self._head_tail)
            if so_far + _head_end(tail, data) > MAX_HEAD_BYTES:
                self._too_large()
                return
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)  # a chunk that ends inside a head (rarely, a pipelined
            self._head_tail = data[-2:]  # request's body came first: counted too)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._too_large()

    def _too_large(self) -> None:
        self._refuse(431, "Request Header Fields Too Large", "headers_too_large",
                     f"the request line and headers are over {MAX_HEAD_BYTES // 1024} KiB")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_tail, self._between = True, 0, b"", False
        self._arm()  # a keep-alive connection's next request

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self.parser.should_upgrade() and self._should_upgrade():
            self._disarm()  # a WebSocket handshake: the connection leaves HTTP
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        """A request httptools cannot parse (a Content-Length that is no number or given twice, a
        URL past its limit): the API's JSON refusal, not Uvicorn's plain text."""
        self._refuse(400, "Bad Request", "bad_request",
                     "the request is not valid HTTP/1.1 (its request line, a header such as "
                     "Content-Length, or its framing)")

    def on_message_complete(self) -> None:
        self._between = True  # the connection's next bytes begin a head
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._refused is not None:
            self._refused.cancel()
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

    def _refuse(self, status: int, reason: str, code: str, detail: str) -> None:
        """Answer and end the connection without losing the answer: closed while the client was
        still sending, the socket reset the connection, and the reset could discard the answer
        before the client read it. So the answer is followed by a half-close, and what the client
        still sends is read and dropped until it closes, or LINGER_S have passed (nginx's
        lingering close)."""
        self.logger.info("refused a request: %s", detail)
        self._disarm()
        self.transport.write(_refusal(status, reason, code, detail))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._refused = self.loop.call_later(LINGER_S, self.transport.close)


def _head_end(tail: bytes, data: bytes) -> int:
    """How many bytes of `data` belong to the head under way: up to the empty line that ends it
    (CRLF or a bare LF, possibly begun in `tail`, the end of the chunk before), else all."""
    window = tail + data
    ends = [at + len(mark) for mark in (b"\n\r\n", b"\n\n") if (at := window.find(mark)) >= 0]
    return max(min(ends) - len(tail), 0) if ends else len(data)


def _timeout_response() -> bytes:
    return _refusal(408, "Request Timeout", "request_timeout",
                    f"the request's body did not arrive within {REQUEST_TIMEOUT_S:g} s of its start")


def _refusal(status: int, reason: str, code: str, detail: str) -> bytes:
    """A refusal with the reason in words, as the API's other refusals say theirs (`detail`,
    `code`), closing the connection."""
    body = orjson.dumps({"detail": detail, "code": code})
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n".encode()
            + b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
