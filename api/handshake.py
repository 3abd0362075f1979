"""The WebSocket protocol `companyos serve` runs: Uvicorn's sans-I/O one, answering refused handshakes.

The `websockets` library refuses an upgrade request whose URL or one header line is over 8 KiB,
or that has more than 128 headers, and prepares an answer (414, 431 or 400). Uvicorn's
`websockets-sansio` protocol only looks for a parsed request or a parser error, so it never sends
that answer and the client waits on an open connection. This subclass sends it and closes.

It also counts a handshake the application refused with an HTTP answer (`websocket.http.response`,
e.g. a missing API key) as complete: Uvicorn logged each such refusal as the error "ASGI
callable returned without completing handshake", a false alarm per refused client.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class AnsweringWebSocketProtocol(WebSocketsSansIOProtocol):
    """Uvicorn's sans-I/O WebSocket protocol (keepalive pings included) that answers a handshake
    the `websockets` library refused while reading it, instead of leaving the client waiting."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.handshake_initiated or self.conn.handshake_exc is None or self.transport.is_closing():
            return
        self.handshake_complete = True
        self.close_sent = True
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True  # answered over HTTP, as the application chose
