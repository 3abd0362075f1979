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
    with pytest.MonkeyPatch.context() as patch, live_uvicorn(url) as (base, server, _sock):
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

    with pytest.MonkeyPatch.context() as patch, live_uvicorn(url) as (base, _server, _sock):
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
