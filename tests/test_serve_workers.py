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

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc")


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


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
            if when == "starting" and len(_children(server.pid)) >= 2:
                break
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        workers = [p for p in _children(server.pid) if _alive(p)]
        assert workers
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    deadline = time.monotonic() + 15
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [p for p in workers if _alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, "workers outlived the server process"
