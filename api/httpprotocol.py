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
_REQUEST_LINE_BYTES = len(b"OPTIONS  HTTP/1.1\r\n\r\n")
"""What a request line and the head's end add to its URL and headers, at most (the method's word,
two spaces, the version, the line ends)."""


class TimelyHttpProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol that drops a connection slow to send its request, refuses
    a request head over MAX_HEAD_BYTES (431), and says what is wrong with a request that is not
    HTTP in the API's JSON (Uvicorn answered plain text)."""

    _deadline: asyncio.TimerHandle | None = None
    _in_head = True  # the current request's line and headers are still arriving
    _head_bytes = 0  # of the head still arriving, in the chunks before the one being parsed
    _began_here = False  # the current request began in the chunk being parsed
    _taken = 0  # bytes of the chunk being parsed that earlier requests took (heads and bodies)
    _refused: asyncio.TimerHandle | None = None  # the close after a refusal, while input drains
    _answered = False  # refused: nothing more of this connection is parsed into a request
    _owed: tuple[int, str, str, str] | None = None  # a refusal that waits for earlier answers

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._answered:  # refused and half-closed: the rest is read and dropped
            return
        self._taken = 0
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            # a head still arriving, counted before it ends (one 143 MB header line stalled the
            # worker): the chunk it began in, but for what requests before it took (a pipelined
            # request's body), then every chunk whole. One that ends is measured in
            # on_headers_complete, however it arrived
            self._head_bytes += len(data) - (self._taken if self._began_here else 0)
            self._began_here = False
            if self._head_bytes > MAX_HEAD_BYTES:
                self._too_large()

    def _parsed_head(self) -> int:
        """The bytes of the request line and the headers parsed so far (a header still arriving
        is not counted yet)."""
        return len(self.url) + _REQUEST_LINE_BYTES + sum(len(name) + len(value) + 4
                                                        for name, value in self.headers)

    def _too_large(self) -> None:
        self._refuse(431, "Request Header Fields Too Large", "headers_too_large",
                     f"the request line and headers are over {MAX_HEAD_BYTES // 1024} KiB")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._began_here = True, 0, True
        self._arm()  # a keep-alive connection's next request

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._answered:  # the rest of a refused connection's chunk: not served
            return
        head = self._parsed_head()
        if head > MAX_HEAD_BYTES:  # however it arrived: in one chunk, or several
            self._too_large()
            return
        self._taken += max(head - self._head_bytes, 0)  # its part of the chunk being parsed
        if self.parser.should_upgrade() and self._should_upgrade():
            self._disarm()  # a WebSocket handshake: the connection leaves HTTP
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._taken += len(body)
        if not self._answered:
            super().on_body(body)

    def send_400_response(self, msg: str) -> None:
        """A request httptools cannot parse (a Content-Length that is no number or given twice, a
        URL past its limit): the API's JSON refusal, not Uvicorn's plain text."""
        self._abandon_body()
        self._refuse(400, "Bad Request", "bad_request",
                     "the request is not valid HTTP/1.1 (its request line, a header such as "
                     "Content-Length, or its framing)")

    def on_message_complete(self) -> None:
        self._disarm()
        if not self._answered:
            super().on_message_complete()

    def _answering(self) -> bool:
        """Whether a request before this one is still being answered, or waits to be."""
        cycle = getattr(self, "cycle", None)
        return bool(self.pipeline) or (cycle is not None and not cycle.response_complete
                                       and not cycle.disconnected)

    def _abandon_body(self) -> None:
        """The request whose body failed to parse (a bad chunk size) is being served, its
        application waiting for the rest of a body that will never come: it is told the client
        went away, so the refusal goes out now (it waited for that answer, and the deadline's 408
        came 30 s later, naming the wrong fault)."""
        cycle = getattr(self, "cycle", None)
        if (cycle is not None and not self.pipeline and cycle.more_body
                and not cycle.response_started):
            cycle.disconnected = True
            cycle.message_event.set()

    def on_response_complete(self) -> None:
        """After each answer, a refusal owed to a later request, once nothing comes before it."""
        super().on_response_complete()
        if self._owed is not None and not self._answering() and not self.transport.is_closing():
            owed, self._owed = self._owed, None
            self._answered = False
            self._refuse(*owed)

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
        if self._answered:  # a refusal found while the parser ends its chunk: one answer
            return
        self._answered = True
        if self._answering():  # pipelined after requests still being answered: it comes after them
            self._owed = (status, reason, code, detail)
            return
        self.logger.info("refused a request: %s", detail)
        self._disarm()
        self.transport.write(refusal(status, reason, code, detail))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._refused = self.loop.call_later(LINGER_S, self.transport.close)


def _timeout_response() -> bytes:
    return refusal(408, "Request Timeout", "request_timeout",
                    f"the request's body did not arrive within {REQUEST_TIMEOUT_S:g} s of its start")


def refusal(status: int, reason: str, code: str, detail: str) -> bytes:
    """A refusal with the reason in words, as the API's other refusals say theirs (`detail`,
    `code`), closing the connection."""
    body = orjson.dumps({"detail": detail, "code": code})
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n".encode()
            + b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
