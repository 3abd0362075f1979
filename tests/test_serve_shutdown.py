"""`companyos serve` shutting down (Ctrl-C, SIGTERM, a rolling restart) under WebSocket clients: the
log holds exactly the steps they got answers for, and `RemoteCompanyEnv` carries on elsewhere."""

from __future__ import annotations

import fcntl
import threading

import orjson
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from api.handshake import SERVICE_RESTART, AnsweringWebSocketProtocol
from companyos.client import RemoteCompanyEnv
from eventstore import EventStore
from eventstore.backends import SqliteBackend
from tests.conftest import live_uvicorn

ACTION = {"app": "ticketdesk", "method": "list_tickets", "params": {}}


def _logged_steps(url: str, episode_id: str) -> int:
    with EventStore.open(url) as store:
        return sum(e.type == "ActionTaken" for e in store.read_stream(episode_id))


@pytest.mark.parametrize("waiting", [0, 1], ids=["nothing-queued", "a-step-queued-behind"])
def test_shutdown_answers_the_websocket_step_under_way_and_applies_none_not_begun(
        tmp_path, waiting):
    """Shutdown closed every socket with 1012 at once: a step waiting for the store's write lock
    was logged a moment later, but its answer never reached the client, which could not tell
    whether it had been applied. Now the step under way is answered before the close, and a
    message queued behind it is neither applied nor answered: the log holds exactly the steps
    the client got answers for."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    entered, shutting_down = threading.Event(), threading.Event()
    real_append, real_shutdown = SqliteBackend.append, AnsweringWebSocketProtocol.shutdown

    def append(self, *args, **kwargs):
        entered.set()
        return real_append(self, *args, **kwargs)

    def shutdown(self):
        real_shutdown(self)
        shutting_down.set()

    answers: list[dict] = []
    with pytest.MonkeyPatch.context() as patch, live_uvicorn(url) as (base, server):
        patch.setattr(AnsweringWebSocketProtocol, "shutdown", shutdown)
        with connect(f"{base.replace('http', 'ws')}/ws", open_timeout=10) as ws:
            ws.send(orjson.dumps({"type": "reset", "data": {"seed": 3, "task": "expense_report"}}))
            episode_id = orjson.loads(ws.recv(timeout=30))["data"]["metadata"]["episode_id"]
            with open(f"{tmp_path / 'store.db'}-writer.lock", "a+") as held:  # another writer
                fcntl.flock(held.fileno(), fcntl.LOCK_EX)
                patch.setattr(SqliteBackend, "append", append)
                try:
                    ws.send(orjson.dumps({"type": "step", "data": ACTION}))
                    assert entered.wait(10)  # the step is under way, waiting for the lock
                    for _ in range(waiting):
                        ws.send(orjson.dumps({"type": "step", "data": ACTION}))
                    server.should_exit = True  # what Ctrl-C and SIGTERM do
                    assert shutting_down.wait(10)
                finally:
                    fcntl.flock(held.fileno(), fcntl.LOCK_UN)
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    answers.append(orjson.loads(ws.recv(timeout=30)))
            assert closed.value.rcvd is not None and closed.value.rcvd.code == SERVICE_RESTART
    assert [a["data"]["metadata"]["step"] for a in answers] == [1], answers
    assert _logged_steps(url, episode_id) == 1


def test_remote_env_sends_again_a_step_that_a_shutting_down_server_did_not_begin(tmp_path):
    """The step reaches a socket its server has begun to shut down (Uvicorn's per-connection
    `shutdown`, as on Ctrl-C or a rolling restart of workers). The server neither applies nor
    answers it and closes with 1012, which tells the client it was not applied; the client
    used to raise "may or may not have been applied". RemoteCompanyEnv now sends it again on a
    new socket, which resumes the episode: the agent sees its answer, and the log holds it once."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    real_arrival = AnsweringWebSocketProtocol.send_receive_event_to_app
    shut: list[AnsweringWebSocketProtocol] = []

    def arrival(self):
        if not shut and b'"step"' in self.frames[0]:
            shut.append(self)
            self.shutdown()  # the frame arrives just after the server began to shut down
        real_arrival(self)

    with pytest.MonkeyPatch.context() as patch, live_uvicorn(url) as (base, _server):
        patch.setattr(AnsweringWebSocketProtocol, "send_receive_event_to_app", arrival)
        env = RemoteCompanyEnv(base, transport="ws")
        try:
            env.reset(seed=5, options={"task": "expense_report"})
            _, _, _, _, info = env.step(ACTION)
            episode_id = env.state["episode_id"]
            assert shut and info["step"] == 1
            _, _, _, _, info = env.step(ACTION)
            assert info["step"] == 2
        finally:
            env.close()
    assert _logged_steps(url, episode_id) == 2


def test_a_client_that_stopped_reading_does_not_hold_the_server_open_at_shutdown(tmp_path):
    """A client that sends and never reads fills the server's buffers, so its socket never
    finished closing: shutdown waited for it for ever ("Waiting for connections to close"), and
    a rolling restart of workers with it. After a grace period the socket is dropped."""
    import base64
    import os
    import socket
    import time

    from api import handshake

    def frame(text: str) -> bytes:  # a masked text frame, as a client sends it
        data, mask = text.encode(), os.urandom(4)
        assert len(data) < 126  # a one-byte length
        size = bytes([0x80 | len(data)])
        return bytes([0x81]) + size + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(data))

    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pytest.MonkeyPatch.context() as patch, live_uvicorn(url) as (base, server):
        patch.setattr(handshake, "SHUTDOWN_GRACE_S", 0.5)
        client = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        key = base64.b64encode(os.urandom(16)).decode()
        client.sendall(f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        client.settimeout(30)
        assert client.recv(4096).startswith(b"HTTP/1.1 101")  # frames go after the handshake
        client.sendall(frame('{"type": "reset", "data": {"seed": 1, "task": "handbook_update"}}'))
        assert b'"observation"' in client.recv(65536)
        client.setblocking(False)
        sent, stuck = 0, 0
        while stuck < 50:  # until the server has stopped reading: its answers fill every buffer
            try:
                client.send(frame('{"type": "views"}'))
                sent, stuck = sent + 1, 0
            except BlockingIOError:
                stuck += 1
                time.sleep(0.02)
        assert sent > 10
        server.should_exit = True
        deadline = time.monotonic() + 30
        while server.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server.server_state.connections, "the unread socket held the server open"
        client.close()


def _listening(port: int = 0):
    """A loopback listening socket that a restarted server can bind again at once."""
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def test_remote_env_waits_for_a_server_restarted_on_the_same_port(tmp_path):
    """One `companyos serve`, stopped and started again on its port (a deploy, a crash loop under
    systemd). The socket was closed with 1012, so the next step was never sent; the client used to
    reconnect once, at once, and raise `unreachable`. Now it tries again until the server listens
    (within its timeout), resumes the episode and plays on."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    first = _listening()
    port = first.getsockname()[1]
    env = RemoteCompanyEnv(f"http://127.0.0.1:{port}", transport="ws", timeout=30)
    try:
        with live_uvicorn(url, sock=first):
            env.reset(seed=5, options={"task": "expense_report"})
            env.step(ACTION)
        restarted = threading.Event()

        def restart() -> None:
            with live_uvicorn(url, sock=_listening(port)):
                restarted.set()
                stepped.wait(30)

        stepped = threading.Event()
        threading.Timer(1.0, lambda: threading.Thread(target=restart, daemon=True).start()).start()
        _, _, _, _, info = env.step(ACTION)  # sent while nothing listens on the port
        assert restarted.is_set() and info["step"] == 2
        episode_id = env.state["episode_id"]
    finally:
        stepped.set()
        env.close()
    assert _logged_steps(url, episode_id) == 2


def test_a_message_a_server_keeps_closing_on_with_1012_is_said_not_applied():
    """Every socket closed with 1012 at once (each worker of a server shutting down): the client
    said "may or may not have been applied" of a message the server never began. It is definite."""
    from websockets.sync.server import serve

    from companyos.client import RemoteConnectionError, _WebSocketWire

    def handler(ws) -> None:
        ws.close(SERVICE_RESTART)  # before reading anything

    with serve(handler, "127.0.0.1", 0, process_request=None) as fake:
        threading.Thread(target=fake.serve_forever, daemon=True).start()
        port = fake.socket.getsockname()[1]
        wire = _WebSocketWire(f"http://127.0.0.1:{port}", 1.0, {})
        with pytest.raises(RemoteConnectionError) as failed:
            wire.call({"type": "step", "data": ACTION})
        fake.shutdown()
    assert failed.value.code == "not_applied" and "it was not applied" in str(failed.value), failed.value


def test_a_server_closing_during_the_handshake_is_unreachable_not_a_raw_websockets_error():
    """A peer that accepts the TCP connection and closes it (a server going down) made the
    handshake raise websockets' own ConnectionClosedError out of RemoteCompanyEnv."""

    from companyos.client import RemoteConnectionError, _WebSocketWire

    listener = _listening()
    listener.listen(16)
    stop = threading.Event()

    def accept_and_close() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.close()  # gone before the handshake, or during it

    acceptor = threading.Thread(target=accept_and_close, daemon=True)
    acceptor.start()
    try:
        for _ in range(100):
            wire = _WebSocketWire(f"http://127.0.0.1:{listener.getsockname()[1]}", 5.0, {})
            with pytest.raises(RemoteConnectionError) as failed:
                wire.call({"type": "reset", "data": {}})
            assert failed.value.code == "unreachable", failed.value
    finally:
        stop.set()
        acceptor.join(10)  # out of accept() before its socket closes
        listener.close()
