"""The agent server on a real loopback socket (Uvicorn in a thread), driven by the clients users
have: openenv's GenericEnvClient, `openenv validate`'s runtime checks, the MCP Python SDK, and
256 concurrent WebSocket sessions. Traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time

import httpx
import orjson
import pytest

from tests.conftest import live_server

openenv_core = pytest.importorskip("openenv.core", reason="needs the openenv package")

ACTION = {"app": "ticketdesk", "method": "list_tickets", "params": {}}


def test_generic_env_client_end_to_end(sqlite_url):
    from openenv.core import GenericEnvClient

    with live_server(sqlite_url) as base, GenericEnvClient(base_url=base).sync() as env:
        result = env.reset(seed=7, task="vendor_onboarding", chaos="low")
        assert result.done is False and result.observation["goal"]
        episode_id = result.metadata["episode_id"]
        assert result.metadata["episode_token"]
        result = env.step(ACTION)
        assert result.done is False and isinstance(result.reward, float)
        assert result.observation["result"] is not None
        result = env.step({"app": "nowhere", "method": "nothing"})
        assert result.metadata["rejected"] == "unknown_tool"
        state = env.state()
        assert state["episode_id"] == episode_id and state["step_count"] == 2
        with pytest.raises(RuntimeError, match="task"):
            env.reset(task="no_such_task")


def test_generic_env_client_with_api_key(sqlite_url):
    from openenv.core import GenericEnvClient

    with live_server(sqlite_url, api_key="k3y") as base:
        headers = {"Authorization": "Bearer k3y"}
        with GenericEnvClient(base_url=base, headers=headers).sync() as env:
            assert env.reset(seed=1).observation["goal"]
            assert env.step(ACTION).metadata["step"] == 1
        # refused at connect, so no `with` would close it: its event-loop thread would outlive
        # the test, and later tests would fork (the parallel rebuild's workers) beside it
        refused = GenericEnvClient(base_url=base).sync()
        try:
            with pytest.raises(ConnectionError):
                refused.connect()
        finally:
            refused.close()


def test_a_websocket_refused_for_its_api_key_is_answered_and_logs_no_error(sqlite_url, caplog):
    """The refusal is an HTTP 401/403 by design; Uvicorn logged each one as the error "ASGI
    callable returned without completing handshake", a false alarm for operators."""
    import logging

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with live_server(sqlite_url, api_key="k3y") as base:
        uvicorn_log = logging.getLogger("uvicorn.error")  # configured by the server: no propagation
        uvicorn_log.addHandler(caplog.handler)
        try:
            url = f"{base.replace('http', 'ws')}/ws"
            for headers, status in (({}, 401), ({"Authorization": "Bearer nope"}, 403)):
                with pytest.raises(InvalidStatus) as refused:
                    connect(url, additional_headers=headers, open_timeout=10)
                assert refused.value.response.status_code == status
            with connect(url, additional_headers={"Authorization": "Bearer k3y"}, open_timeout=10) as ws:
                ws.send(orjson.dumps({"type": "reset", "data": {"seed": 1}}).decode())
                assert orjson.loads(ws.recv())["type"] == "observation"
        finally:
            uvicorn_log.removeHandler(caplog.handler)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_text_message_that_is_not_utf8_closes_its_socket_1007_and_logs_no_error(sqlite_url, caplog):
    """Uvicorn closed such a socket rightly but logged an error with a traceback per message: a
    client's mistake read as a server fault. Other sockets keep being served."""
    import logging

    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    with live_server(sqlite_url) as base:
        uvicorn_log = logging.getLogger("uvicorn.error")  # configured by the server: no propagation
        uvicorn_log.addHandler(caplog.handler)
        try:
            url = f"{base.replace('http', 'ws')}/ws"
            with connect(url, open_timeout=10) as other, connect(url, open_timeout=10) as ws:
                ws.send(orjson.dumps({"type": "reset", "data": {"seed": 1}}).decode())
                assert orjson.loads(ws.recv())["type"] == "observation"
                ws.send(b'{"type": "step", "data": "\xff"}', text=True)  # a text frame, not UTF-8
                with pytest.raises(ConnectionClosedError) as closed:
                    ws.recv(timeout=10)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
                other.send(orjson.dumps({"type": "reset", "data": {"seed": 2}}).decode())
                assert orjson.loads(other.recv(timeout=10))["type"] == "observation"
        finally:
            uvicorn_log.removeHandler(caplog.handler)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_openenv_validate_passes(sqlite_url):
    from openenv.cli._validation import validate_running_environment

    with live_server(sqlite_url) as base:
        report = validate_running_environment(base)
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert report["passed"], failed
    assert report["mode"] == "simulation"


def test_mcp_sdk_client(sqlite_url):
    mcp = pytest.importorskip("mcp")
    try:
        from mcp.client.streamable_http import streamable_http_client
    except ImportError:  # mcp < 1.24
        from mcp.client.streamable_http import streamablehttp_client as streamable_http_client

    async def session(base: str) -> tuple[list[str], object, str | None]:
        url = f"{base}/mcp?task=license_renewal&seed=4&chaos=none"
        async with streamable_http_client(url) as (read, write, get_session_id), \
                mcp.ClientSession(read, write) as client:
            init = await client.initialize()
            assert "Goal" in (init.instructions or "")
            tools = await client.list_tools()
            result = await client.call_tool("datahub_list_metrics", {})
            return [t.name for t in tools.tools], result, get_session_id()

    with live_server(sqlite_url) as base:
        names, result, session_id = asyncio.run(session(base))
        episode_id = session_id.rpartition(".")[0]
        summary = httpx.get(f"{base}/episodes/{episode_id}").json()
    assert "ticketdesk_update_ticket" in names
    assert result.isError is False and result.content[0].type == "text"
    assert result.structuredContent["metadata"]["step"] == 1
    assert summary["task"] == "license_renewal" and summary["steps"] == 1


def test_restart_the_real_server_and_continue(sqlite_url):
    with live_server(sqlite_url) as base:
        first = httpx.post(f"{base}/reset", json={"seed": 2, "task": "expense_report"}).json()
    meta = first["metadata"]
    body = {"episode_id": meta["episode_id"], "episode_token": meta["episode_token"],
            "action": ACTION}
    with live_server(sqlite_url) as base:
        r = httpx.post(f"{base}/step", json=body)
        assert r.status_code == 200 and r.json()["metadata"]["step"] == 1


@pytest.mark.parametrize("request_lines", [
    ["GET /ws?session_id=" + "a" * 9000 + " HTTP/1.1"],  # URL over 8 KiB
    ["GET /ws HTTP/1.1", "X-Long: " + "b" * 9000],  # one header line over 8 KiB
    ["GET /ws HTTP/1.1", *(f"X-{i}: 1" for i in range(200))],  # over 128 headers
], ids=["long-url", "long-header", "many-headers"])
def test_a_websocket_handshake_too_big_to_read_is_answered(sqlite_url, request_lines):
    """The websockets library refuses these; the client gets a 4xx at once, not a silent socket."""
    from websockets.sync.client import connect

    head = [*request_lines, "Host: localhost", "Upgrade: websocket", "Connection: Upgrade",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    with live_server(sqlite_url) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            answer = b""
            while chunk := sock.recv(4096):  # the server closes after its answer
                answer += chunk
        status = answer.split(b"\r\n", 1)[0]
        assert status.split()[1] in (b"400", b"414", b"431"), status
        with connect(f"{base.replace('http', 'ws')}/ws", open_timeout=10) as ws:  # still serving
            ws.send(orjson.dumps({"type": "reset", "data": {"seed": 1}}).decode())
            assert orjson.loads(ws.recv())["type"] == "observation"


@pytest.mark.parametrize("framing", [["Content-Length: 5"], ["Transfer-Encoding: chunked"]],
                         ids=["content-length", "chunked"])
def test_a_websocket_upgrade_carrying_a_body_is_answered_400_in_words(sqlite_url, framing):
    """The websockets library refuses an upgrade with a body without preparing an answer, so the
    connection closed with no answer at all and nothing in the log."""
    head = ["GET /ws HTTP/1.1", "Host: localhost", "Upgrade: websocket", "Connection: Upgrade",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13", *framing]
    with live_server(sqlite_url) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            answer = _read_to_close(sock)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400 "), answer[:200]
    refused = orjson.loads(body)
    assert refused["code"] == "bad_request" and "not a WebSocket upgrade" in refused["detail"], refused


def test_256_concurrent_websocket_sessions(sqlite_url):
    from websockets.asyncio.client import connect

    sessions = 256

    async def one(base: str, i: int, ready: asyncio.Barrier) -> int:
        async with connect(f"{base.replace('http', 'ws')}/ws", ping_interval=None,
                           open_timeout=60) as ws:
            await ready.wait()  # all sockets open at once
            await ws.send(orjson.dumps({"type": "reset", "data": {"seed": i}}).decode())
            assert orjson.loads(await ws.recv())["type"] == "observation"
            for _ in range(2):
                await ws.send(orjson.dumps({"type": "step", "data": ACTION}).decode())
                reply = orjson.loads(await ws.recv())
                assert reply["type"] == "observation", reply
            return reply["data"]["metadata"]["step"]

    async def main(base: str) -> list[int]:
        ready = asyncio.Barrier(sessions)
        return await asyncio.gather(*(one(base, i, ready) for i in range(sessions)))

    with live_server(sqlite_url, max_sessions=300) as base:
        steps = asyncio.run(main(base))
        listing = httpx.get(f"{base}/episodes", params={"limit": 1}).json()
    assert steps == [2] * sessions
    assert listing["total"] == sessions


def test_a_socket_that_pipelines_its_steps_does_not_hold_up_another(sqlite_url):
    """A step on SQLite runs on the event loop, and a client that sends many messages without
    waiting keeps the next one ready: the loop served that socket alone until its backlog was
    gone, so another socket's step (and /health) waited seconds. Read by the log's order, not a
    clock: the other step must land among the pipelined ones, not after them."""
    from websockets.asyncio.client import connect

    from eventstore import EventStore

    pipelined = 1_500

    async def main(ws_url: str) -> tuple[str, str]:
        async with connect(ws_url, ping_interval=None) as hog, connect(ws_url, ping_interval=None) as other:
            ids = []
            reset = orjson.dumps({"type": "reset", "data": {"seed": 1, "max_steps": 10_000}}).decode()
            for ws in (hog, other):
                await ws.send(reset)
                ids.append(orjson.loads(await ws.recv())["data"]["metadata"]["episode_id"])
            step = orjson.dumps({"type": "step", "data": ACTION}).decode()
            for _ in range(pipelined):
                await hog.send(step)
            assert orjson.loads(await hog.recv())["type"] == "observation"  # the backlog is being served
            await other.send(step)
            assert orjson.loads(await other.recv())["type"] == "observation"
            for _ in range(pipelined - 1):
                await hog.recv()
        return ids[0], ids[1]

    with live_server(sqlite_url) as base:
        hog_id, other_id = asyncio.run(main(f"{base.replace('http', 'ws')}/ws"))
    with contextlib.closing(EventStore.open(sqlite_url)) as store:
        steps, after = _steps_logged_after(store, [hog_id], other_id)
    assert steps == pipelined
    assert after > pipelined // 2, f"only {after} of {pipelined} pipelined steps came after the other's"


def test_a_long_mcp_batch_on_a_socket_does_not_hold_up_another(sqlite_url):
    """A JSON-RPC batch over the WebSocket ran all its tool calls on the event loop in one go, so
    another socket's step waited for the whole batch. Read by the log's order, as above."""
    from websockets.asyncio.client import connect

    from eventstore import EventStore

    calls = 1_000  # the most a batch may hold

    async def main(ws_url: str, store: EventStore) -> tuple[str, str]:
        async with connect(ws_url, ping_interval=None, max_size=None) as batcher, \
                connect(ws_url, ping_interval=None) as other:
            ids = []
            reset = orjson.dumps({"type": "reset", "data": {"seed": 1, "max_steps": 10_000}}).decode()
            for ws in (batcher, other):
                await ws.send(reset)
                ids.append(orjson.loads(await ws.recv())["data"]["metadata"]["episode_id"])
            batch = [{"jsonrpc": "2.0", "id": i, "method": "tools/call",
                      "params": {"name": "ticketdesk_list_tickets", "arguments": {}}} for i in range(calls)]
            reset_version = store.stream_version(ids[0])
            await batcher.send(orjson.dumps({"type": "mcp", "data": batch}).decode())
            while store.stream_version(ids[0]) == reset_version:  # under way once it moves
                await asyncio.sleep(0.001)
            await other.send(orjson.dumps({"type": "step", "data": ACTION}).decode())
            assert orjson.loads(await other.recv())["type"] == "observation"
            answers = orjson.loads(await batcher.recv())["data"]
            assert len(answers) == calls and all("result" in a for a in answers), answers[:2]
        return ids[0], ids[1]

    with contextlib.closing(EventStore.open(sqlite_url)) as store:
        with live_server(sqlite_url) as base:
            batch_id, other_id = asyncio.run(main(f"{base.replace('http', 'ws')}/ws", store))
        steps, after = _steps_logged_after(store, [batch_id], other_id)
    assert steps == calls
    assert after >= calls // 10, f"only {after} of {calls} batched steps came after the other's"


def test_many_mcp_batches_at_once_do_not_hold_up_another_sockets_step(sqlite_url):
    """Each batch took a thread of the pool every thread-hopping step needs: with sixteen batches
    under way, another socket's step waited seconds, until a batch ended. Read by the log's order."""
    from websockets.asyncio.client import connect

    from api.app import BATCH_THREADS
    from eventstore import EventStore

    sockets, calls = 17, 100
    assert sockets > 16 > BATCH_THREADS

    async def one_batch(ws_url: str, started: asyncio.Event, ids: list[str]) -> int:
        async with connect(ws_url, ping_interval=None, max_size=None) as ws:
            reset = orjson.dumps({"type": "reset", "data": {"seed": 1, "max_steps": 1_000}}).decode()
            await ws.send(reset)
            ids.append(orjson.loads(await ws.recv())["data"]["metadata"]["episode_id"])
            await started.wait()
            batch = [{"jsonrpc": "2.0", "id": i, "method": "tools/call",
                      "params": {"name": "ticketdesk_list_tickets", "arguments": {}}} for i in range(calls)]
            await ws.send(orjson.dumps({"type": "mcp", "data": batch}).decode())
            return len(orjson.loads(await ws.recv())["data"])

    async def main(ws_url: str, store: EventStore) -> tuple[list[str], str]:
        started, ids = asyncio.Event(), []
        batches = [asyncio.create_task(one_batch(ws_url, started, ids)) for _ in range(sockets)]
        async with connect(ws_url, ping_interval=None) as other:
            await other.send(orjson.dumps({"type": "reset", "data": {"seed": 2}}).decode())
            other_id = orjson.loads(await other.recv())["data"]["metadata"]["episode_id"]
            while len(ids) < sockets:
                await asyncio.sleep(0.01)
            reset_versions = [store.stream_version(i) for i in ids]
            started.set()
            while [store.stream_version(i) for i in ids] == reset_versions:  # under way once it moves
                await asyncio.sleep(0.001)
            await other.send(orjson.dumps({"type": "step", "data": ACTION}).decode())
            assert orjson.loads(await other.recv())["type"] == "observation"
        assert await asyncio.gather(*batches) == [calls] * sockets
        return ids, other_id

    with contextlib.closing(EventStore.open(sqlite_url)) as store:
        with live_server(sqlite_url) as base:
            batch_ids, other_id = asyncio.run(main(f"{base.replace('http', 'ws')}/ws", store))
        steps, after = _steps_logged_after(store, batch_ids, other_id)
    assert steps == sockets * calls
    assert after > 3 * steps // 4, f"only {after} of {steps} batched steps came after the other's"


def _steps_logged_after(store, streams: list[str], other: str) -> tuple[int, int]:
    """(steps the `streams` logged, how many of them the log holds after `other`'s one step): the
    order the server took them in, read from the log rather than a clock."""
    def actions(stream: str) -> list[int]:
        return [e.position for e in store.read_stream(stream) if e.type == "ActionTaken"]

    (other_step,) = actions(other)
    steps = [position for stream in streams for position in actions(stream)]
    return len(steps), sum(position > other_step for position in steps)


def test_a_socket_resumed_with_two_differing_token_headers_is_refused(sqlite_url):
    """/ws took the last X-Episode-Token header of two that differ, where HTTP refuses them."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async def main(base: str) -> list[dict]:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            meta = (await http.post("/reset", json={"seed": 1})).json()["metadata"]
        episode_id, token = meta["episode_id"], meta["episode_token"]
        answers = []
        for tokens in ([token[::-1], token], [token, token]):
            async with connect(f"{base.replace('http', 'ws')}/ws?session_id={episode_id}",
                               additional_headers=[("X-Episode-Token", t) for t in tokens]) as ws:
                with contextlib.suppress(ConnectionClosed):  # a refusal closes the socket at once
                    await ws.send(orjson.dumps({"type": "state"}).decode())
                answers.append(orjson.loads(await ws.recv()))
        return answers

    with live_server(sqlite_url) as base:
        refused, taken = asyncio.run(main(base))
    assert refused["data"]["reason"] == "conflicting_tokens", refused
    assert "X-Episode-Token headers that differ" in refused["data"]["message"]
    assert taken["type"] == "state" and taken["data"]["step_count"] == 0


def test_head_answers_as_get_without_the_body(sqlite_url):
    """Link checkers and uptime monitors send HEAD; every route answered it 405."""
    with live_server(sqlite_url) as base, httpx.Client(base_url=base, timeout=10) as http:
        for path in ("/health", "/ui", "/episodes?limit=5", "/tasks", "/ui/analytics"):
            got, head = http.get(path), http.head(path)
            assert head.status_code == got.status_code == 200, (path, head.status_code)
            assert head.content == b"" and head.headers["content-length"] == str(len(got.content))
            assert head.headers["content-type"] == got.headers["content-type"]
        assert http.head("/episodes?limt=5").status_code == 400  # refused as the GET would be
        assert http.get("/health").json() == {"status": "healthy"}  # the connection still serves


def test_a_connection_slow_to_send_its_request_headers_is_closed(sqlite_url, monkeypatch):
    """Uvicorn waited forever for a request's headers: idle or half-sent connections piled up until
    a worker had no file descriptors left and refused everyone."""
    import api.httpprotocol

    monkeypatch.setattr(api.httpprotocol, "REQUEST_TIMEOUT_S", 0.3)
    with live_server(sqlite_url) as base:
        port = int(base.rsplit(":", 1)[1])
        idle = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        for conn in (idle, half):
            conn.settimeout(20)  # a guard: the server closes it long before
            assert conn.recv(1024) == b""  # closed by the server, no request answered
            conn.close()
        with socket.create_connection(("127.0.0.1", port)) as whole:  # a prompt request is served,
            whole.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # and kept alive after it
            whole.settimeout(20)
            assert _read_response(whole).startswith(b"HTTP/1.1 200")
            whole.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_response(whole).startswith(b"HTTP/1.1 200")
        assert httpx.get(f"{base}/health").status_code == 200


def _read_response(conn: socket.socket) -> bytes:
    """One whole response with a Content-Length body: its headers and body may come in separate
    reads (one recv then left the body to be taken for the next response)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(4096)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += conn.recv(4096)
    return head + b"\r\n\r\n" + body


def _read_to_close(conn: socket.socket) -> bytes:
    answer = b""
    while chunk := conn.recv(4096):
        answer += chunk
    return answer


def test_an_oversized_request_head_is_431_and_a_request_that_is_not_http_a_json_400(sqlite_url):
    """httptools has no limit on a request's headers: 143 MB of one header line arrived within the
    deadline, and parsing it stalled every connection of the worker. A request it cannot parse was
    answered in plain text, not as the API's other refusals are."""
    from api.httpprotocol import MAX_HEAD_BYTES

    with live_server(sqlite_url) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as big:
            big.settimeout(20)
            big.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            with contextlib.suppress(OSError):  # the server may close before the last bytes
                for _ in range(MAX_HEAD_BYTES // 8192 + 2):
                    big.sendall(b"a" * 8192)
            answer = _read_to_close(big)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["code"] == "headers_too_large"
        for framing in (b"Content-Length: abc\r\n", b"Content-Length: 3\r\nContent-Length: 4\r\n"):
            with socket.create_connection(("127.0.0.1", port)) as bad:
                bad.settimeout(20)
                bad.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n{}")
                answer = _read_to_close(bad)
            assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
            head, _, body = answer.partition(b"\r\n\r\n")
            assert b"application/json" in head and orjson.loads(body)["code"] == "bad_request"
        with socket.create_connection(("127.0.0.1", port)) as chunked:  # a bad chunk after the head
            chunked.settimeout(20)  # waited for a body that would never come: 408 after 30 s
            chunked.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
            answer = _read_to_close(chunked)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["code"] == "bad_request"
        with socket.create_connection(("127.0.0.1", port)) as fine:  # a big but allowed head is served
            fine.settimeout(20)
            fine.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 16_000 + b"\r\n\r\n")
            assert _read_response(fine).startswith(b"HTTP/1.1 200")
        assert httpx.get(f"{base}/health").status_code == 200


def test_a_request_head_over_64_kib_sent_whole_is_431_also_on_a_kept_alive_connection(sqlite_url):
    """The README: "a request line and headers over 64 KiB together get 431". Counted only after
    a chunk was parsed, a head that arrived whole (70 KiB in one write, or one 60 KiB chunk and
    the rest) had already ended when it was measured, and was served 200."""
    from api.httpprotocol import MAX_HEAD_BYTES

    head = (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 6_000)
            + b"\r\n\r\n")
    with live_server(sqlite_url) as base:
        port = int(base.rsplit(":", 1)[1])
        for first, then in ((b"", head), (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", head)):
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.settimeout(20)
                if first:  # a kept-alive connection's second request
                    conn.sendall(first)
                    assert _read_response(conn).startswith(b"HTTP/1.1 200")
                with contextlib.suppress(OSError):
                    conn.sendall(then)
                answer = _read_to_close(conn)
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        with socket.create_connection(("127.0.0.1", port)) as conn:  # in two chunks, the second
            conn.settimeout(20)  # ending the head
            conn.sendall(head[:60_000])
            with contextlib.suppress(OSError):
                conn.sendall(head[60_000:])
            assert _read_to_close(conn).startswith(b"HTTP/1.1 431 ")
        body = b"{" + b" " * 200_000 + b"}"  # a big body is no part of the head
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.settimeout(20)
            conn.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            assert _read_response(conn).startswith(b"HTTP/1.1 200")


def test_a_request_head_is_measured_alone_however_its_bytes_are_cut(sqlite_url):
    """The head is the request line and headers of one request, wherever the chunks fall: a head
    whose blank line came a byte at a time was taken for one that never ended (its body counted
    in: 431), a pipelined request's body was counted into the next head (431), and a second head
    over 64 KiB in the same write as a first request was served."""
    from api.httpprotocol import MAX_HEAD_BYTES

    body = b"{" + b" " * 100_000 + b"}"
    post = (b"POST /reset HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n")
    pad = b"X-Pad: " + b"p" * 5_000 + b"\r\n"
    closing = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    cases = {  # the pieces, sent apart; the statuses, in order
        "blank line a byte at a time": ([post, b"\r", b"\n" + body], [200]),
        "a body, then the next head": ([post + b"Connection: keep-alive\r\n\r\n" + body + closing,
                                        pad + b"\r\n"], [200, 200]),
        "a second head too big": ([b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + closing + b"X-Big: "
                                   + b"a" * (MAX_HEAD_BYTES + 6_000) + b"\r\n\r\n"], [200, 431]),
    }
    with live_server(sqlite_url) as base:
        port = int(base.rsplit(":", 1)[1])
        for case, (pieces, statuses) in cases.items():
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(20)
                for piece in pieces:
                    conn.sendall(piece)
                    time.sleep(0.3)  # the server reads each piece as a chunk of its own
                answer = _read_to_close(conn)
            found = [int(s) for s in re.findall(rb"HTTP/1.1 (\d{3}) ", answer)]
            assert found == statuses, (case, answer[:300])


def test_a_request_whose_body_stalls_is_answered_408_and_closed(sqlite_url, monkeypatch):
    """A body sent a byte at a time held its connection for good, as slow headers did: the request
    as a whole has the deadline, and the client is told why its request was dropped."""
    import api.httpprotocol

    monkeypatch.setattr(api.httpprotocol, "REQUEST_TIMEOUT_S", 0.5)
    body = orjson.dumps({"seed": 3})
    with live_server(sqlite_url) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:3])
            slow.settimeout(20)
            answer = _read_to_close(slow)
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        assert orjson.loads(payload)["code"] == "request_timeout"
        with socket.create_connection(("127.0.0.1", port)) as prompt:  # a whole body in time is
            prompt.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"  # served
                           b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n")
            prompt.sendall(body)
            prompt.settimeout(20)
            assert _read_to_close(prompt).startswith(b"HTTP/1.1 200")
        assert httpx.get(f"{base}/health").status_code == 200


def test_the_request_deadline_does_not_close_an_open_websocket(sqlite_url, monkeypatch):
    """A WebSocket handshake is an HTTP request whose connection then stays open for the session:
    the deadline ends with the handshake's headers."""
    import time

    from websockets.sync.client import connect

    import api.httpprotocol

    monkeypatch.setattr(api.httpprotocol, "REQUEST_TIMEOUT_S", 0.3)
    with live_server(sqlite_url) as base, connect(f"{base.replace('http', 'ws')}/ws", open_timeout=10) as ws:
        ws.send(orjson.dumps({"type": "reset", "data": {"seed": 1}}).decode())
        assert orjson.loads(ws.recv(timeout=10))["type"] == "observation"
        time.sleep(1.0)  # past the deadline, several times over
        ws.send(orjson.dumps({"type": "state"}).decode())
        assert orjson.loads(ws.recv(timeout=10))["type"] == "state"


def test_the_request_deadline_does_not_count_the_wait_for_100_continue(monkeypatch):
    """A client that sends `Expect: 100-continue` waits for the server's go-ahead before its body:
    an application slow to ask for the body got the client a 408 for the server's own delay."""
    import threading
    import time

    import uvicorn

    import api.httpprotocol
    from companyos.commands.serve import HTTP_PROTOCOL

    monkeypatch.setattr(api.httpprotocol, "REQUEST_TIMEOUT_S", 0.3)

    async def slow_to_read(scope, receive, send):  # busy for a while before it takes the body
        if scope["type"] != "http":
            return
        await asyncio.sleep(1.0)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(slow_to_read, http=HTTP_PROTOCOL, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        with socket.create_connection(sock.getsockname()) as conn:
            conn.settimeout(20)
            conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                         b"content-length: 5\r\nconnection: close\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 100 Continue")
            conn.sendall(b"hello")
            assert _read_to_close(conn).startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()

