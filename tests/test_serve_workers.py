"""`companyos serve --workers N` as a process tree: its workers do not outlive it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import alive, get_once_listening, live_children

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("when", ["serving", "starting"])
def test_workers_stop_when_the_server_process_is_killed_outright(tmp_path, when):
    """kill -9 of the supervisor left both workers serving the port: a restart could not
    listen, and the orphans kept writing to the store. A worker still starting then must stop
    too: it already has another parent when it begins to watch."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "companyos", "serve", "--workers", "2",
                               "--port", str(port), "--log-level", "warning",
                               "--db", f"sqlite:///{tmp_path / 's.db'}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if when == "starting" and len(live_children(server.pid)) >= 2:
                break
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        workers = live_children(server.pid)
        assert workers
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    deadline = time.monotonic() + 15
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [p for p in workers if alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, "workers outlived the server process"


def test_serve_on_port_0_names_the_port_it_listens_on(tmp_path):
    """`--port 0` (let the kernel pick) printed `http://127.0.0.1:0` in the banner: no one could
    find the server. The banner now names the port it serves, and that port answers."""
    import re

    server = subprocess.Popen([sys.executable, "-m", "companyos", "serve", "--port", "0",
                               "--db", f"sqlite:///{tmp_path / 's.db'}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        banner = server.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+) ", banner)
        assert found and found[1] != "0", banner
        assert get_once_listening(f"http://127.0.0.1:{found[1]}/health").status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_stopping_server_with_workers_refuses_new_connections_and_finishes_the_answers_it_owes(tmp_path):
    """Uvicorn's supervisor kept the listening socket open until every worker had ended, so the
    kernel accepted connections no one would serve, and reset them seconds later: a client could
    not tell that from a step lost mid-way. A stop now refuses them at once, while the step under
    way (waiting for the store's lock here) is still answered and logged."""
    import sqlite3
    import threading

    port = _free_port()
    db = tmp_path / "s.db"
    server = subprocess.Popen([sys.executable, "-m", "companyos", "serve", "--workers", "2",
                               "--port", str(port), "--log-level", "warning", "--db", f"sqlite:///{db}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        assert get_once_listening(f"{base}/health").status_code == 200
        reset = httpx.post(f"{base}/reset", json={"seed": 1}, timeout=30).json()
        episode = reset["metadata"]["episode_id"]
        body = {"episode_id": episode, "episode_token": reset["metadata"]["episode_token"],
                "action": {"app": "ticketdesk", "method": "list_tickets", "params": {}}}
        holder.execute("BEGIN IMMEDIATE")  # the store's writer waits for it
        answered = []
        stepping = threading.Thread(target=lambda: answered.append(
            httpx.post(f"{base}/step", json=body, timeout=60)))
        stepping.start()
        time.sleep(1.0)  # the step is under way, waiting for the lock
        server.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # the supervisor and both workers have begun to stop
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/health", timeout=5)
        holder.execute("COMMIT")
        stepping.join(60)
        assert answered and answered[0].status_code == 200, answered
        assert answered[0].json()["metadata"]["step"] == 1
    finally:
        holder.close()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
