"""The WebSocket protocol `companyos serve` runs: Uvicorn's sans-I/O one, answering refused
handshakes and finishing the step under way at shutdown.

The `websockets` library refuses an upgrade request whose URL or one header line is over 8 KiB,
or that has more than 128 headers, and prepares an answer (414, 431 or 400). Uvicorn's
`websockets-sansio` protocol only looks for a parsed request or a parser error, so it never sends
that answer and the client waits on an open connection. This subclass sends it and closes. An
upgrade the library refuses without preparing an answer (one carrying a body or a transfer coding)
is answered 400 in the API's words.

It also counts a handshake the application refused with an HTTP answer (`websocket.http.response`,
e.g. a missing API key) as complete: Uvicorn logged each such refusal as the error "ASGI
callable returned without completing handshake", a false alarm per refused client.

A text message that is not UTF-8 closes the socket with 1007, as Uvicorn closes it, but without the
error and traceback Uvicorn logged for each such message: the client's mistake, not the server's.

At shutdown Uvicorn sends close code 1012 and drops the socket at once, so a step the application
was working on was logged without its answer ever reaching the client. Here shutdown drops only
the messages the application has not begun (they are never applied), lets it finish and answer
the one under way, and sends 1012 when it next asks for a message: every logged step is answered.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Message
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from api.httpprotocol import refusal

# The code a socket is closed with when the server shuts down: "service restart" (RFC 6455, IANA).
SERVICE_RESTART = 1012
# The code for a text message that is not UTF-8: "invalid frame payload data" (RFC 6455, 7.4.1).
INVALID_PAYLOAD = 1007

SHUTDOWN_GRACE_S = 65.0
"""How long shutdown waits for the step under way to be answered and its answer read (a step waits
up to 60 s for a store another process holds locked) before it drops the socket: a client that
stopped reading held the server open for ever."""


class AnsweringWebSocketProtocol(WebSocketsSansIOProtocol):
    """Uvicorn's sans-I/O WebSocket protocol (keepalive pings included) that answers a handshake
    the `websockets` library refused while reading it, instead of leaving the client waiting, and
    that answers the message under way before it closes a socket at shutdown."""

    stopping = False  # shutdown began while the application held the socket open

    def shutdown(self) -> None:
        if not self.handshake_complete or self.close_sent or self.disconnected:
            super().shutdown()
            return
        self.stop_keepalive()
        self.stopping = True
        while not self.queue.empty():  # received but not begun: never applied, never answered
            self.queue.get_nowait()
        self.queue.put_nowait({"type": "websocket.disconnect", "code": SERVICE_RESTART})
        self.loop.call_later(SHUTDOWN_GRACE_S, self._drop_if_open)

    def _drop_if_open(self) -> None:
        if not self.disconnected:
            self.transport.abort()  # what it has not read is lost: it stopped reading long ago

    async def receive(self) -> Message:
        message = await super().receive()
        if self.stopping and not self.close_sent and not self.disconnected:
            self._close_for_shutdown()  # the application is between messages: nothing is under way
        return message

    def _close_for_shutdown(self) -> None:
        self.close_sent = True
        self.conn.send_close(SERVICE_RESTART)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()  # after writing what is buffered, the step's answer included

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.handshake_initiated or self.conn.handshake_exc is None or self.transport.is_closing():
            return
        self.handshake_complete = True
        self.close_sent = True
        answer = b"".join(self.conn.data_to_send())
        if not answer:  # refused without an answer (a body, a transfer coding): the client is told why
            cause = self.conn.handshake_exc.__cause__ or self.conn.handshake_exc
            answer = refusal(400, "Bad Request", "bad_request",
                             f"not a WebSocket upgrade this server reads: {cause}")
        self.transport.write(answer)
        self.transport.close()

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:  # checked before Uvicorn decodes it (a step's message is ~200 bytes: cheap)
                (self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)).decode()
            except UnicodeDecodeError:
                self.frames = []
                self.conn.send_close(INVALID_PAYLOAD)
                self.handle_parser_exception()  # writes the close frame and ends the socket
                return
        super().send_receive_event_to_app()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True  # answered over HTTP, as the application chose
