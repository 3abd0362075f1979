"""Agent-server throughput: steps/s and p50/p99 step latency over WebSocket (1, 16, 64 sessions)
and HTTP, against `companyos serve` on loopback with the default SQLite store, every event logged.

Usage: python bench/serve_steps.py [--seconds S] [--sessions 1,16,64] [--http-clients 16]
The client runs on the same machine (2 cores here), so its cost is included. Every run is
bounded by --seconds; the server is stopped at the end. `server_cpu/step` is the server
process's CPU per measured step (resets included), which stays
meaningful when other work shares the cores. Last line: `ws16_steps_per_s=N`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _common import fresh_sqlite_url  # noqa: E402

HOST = "127.0.0.1"
TASKS = ("vendor_onboarding", "expense_report", "bug_escalation", "license_renewal",
         "handbook_update")
# A cheap, varied agent: reads across the three apps, plus an unknown tool now and then
# (rejected with a penalty, as a real agent's mistakes are). Episodes end by their step budget.
ACTIONS = [orjson.dumps(a) for a in (
    {"app": "ticketdesk", "method": "list_tickets", "params": {}},
    {"app": "datahub", "method": "list_metrics", "params": {}},
    {"app": "approvalflow", "method": "list_approval_types", "params": {}},
    {"app": "ticketdesk", "method": "search_tickets", "params": {"query": "renew"}},
    {"app": "approvalflow", "method": "list_approvals", "params": {}},
    {"app": "crm", "method": "lookup", "params": {}},
)]
STEP_FRAMES = [b'{"type":"step","data":' + a + b"}" for a in ACTIONS]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(db: str, port: int, max_sessions: int):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("COMPANYOS_API_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "companyos", "serve", "--host", HOST, "--port", str(port),
         "--db", db, "--max-sessions", str(max_sessions)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.2):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)
        else:
            raise RuntimeError("server did not start within 60 s")
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reset_frame(i: int) -> bytes:
    return orjson.dumps({"type": "reset", "data": {"seed": i, "task": TASKS[i % len(TASKS)],
                                                   "chaos": "medium"}})


async def ws_session(port: int, index: int, stop_at: float, latencies: list[float]) -> int:
    from websockets.asyncio.client import connect

    steps = 0
    async with connect(f"ws://{HOST}:{port}/ws", max_size=None, compression=None,
                       ping_interval=None) as ws:
        episode = index * 100_000
        await ws.send(reset_frame(episode))
        await ws.recv()
        k = index
        clock = time.perf_counter
        while clock() < stop_at:
            frame = STEP_FRAMES[k % len(STEP_FRAMES)]
            k += 1
            t0 = clock()
            await ws.send(frame.decode())
            reply = await ws.recv()
            latencies.append(clock() - t0)
            steps += 1
            if b'"done":true' in (reply if isinstance(reply, bytes) else reply.encode()):
                episode += 1
                await ws.send(reset_frame(episode))
                await ws.recv()
    return steps


async def warm_ws(port: int, sessions: int, seconds: float) -> None:
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(ws_session(port, 10_000 + i, stop_at, []) for i in range(sessions)))


async def run_ws(port: int, sessions: int, seconds: float) -> tuple[float, list[float]]:
    latencies: list[float] = []
    start = time.perf_counter()
    stop_at = start + seconds
    counts = await asyncio.gather(*(ws_session(port, i, stop_at, latencies)
                                    for i in range(sessions)))
    return sum(counts) / (time.perf_counter() - start), latencies


async def _http(reader, writer, method: str, path: str, body: bytes = b"",
                headers: str = "") -> tuple[int, bytes]:
    """A minimal HTTP/1.1 keep-alive client: the bench should measure the server, not httpx."""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n{headers}\r\n".encode() + body)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await reader.readexactly(length)


async def http_client(port: int, index: int, stop_at: float, latencies: list[float]) -> int:
    reader, writer = await asyncio.open_connection(HOST, port)
    steps = 0
    try:
        episode = index * 100_000

        async def reset() -> tuple[bytes, str]:
            body = orjson.dumps({"seed": episode, "task": TASKS[episode % len(TASKS)],
                                 "chaos": "medium"})
            _, reply = await _http(reader, writer, "POST", "/reset", body)
            meta = orjson.loads(reply)["metadata"]
            return meta["episode_id"].encode(), f"X-Episode-Token: {meta['episode_token']}\r\n"

        episode_id, token = await reset()
        k = index
        clock = time.perf_counter
        while clock() < stop_at:
            action = ACTIONS[k % len(ACTIONS)]
            k += 1
            body = b'{"episode_id":"' + episode_id + b'","action":' + action + b"}"
            t0 = clock()
            status, reply = await _http(reader, writer, "POST", "/step", body, token)
            latencies.append(clock() - t0)
            if status != 200:
                raise RuntimeError(f"step answered {status}: {reply[:200]!r}")
            steps += 1
            if b'"done":true' in reply:
                episode += 1
                episode_id, token = await reset()
    finally:
        writer.close()
    return steps


async def run_http(port: int, clients: int, seconds: float) -> tuple[float, list[float]]:
    latencies: list[float] = []
    start = time.perf_counter()
    counts = await asyncio.gather(*(http_client(port, 50_000 + i, start + seconds, latencies)
                                    for i in range(clients)))
    return sum(counts) / (time.perf_counter() - start), latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc), to report server cost per step."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per scenario")
    parser.add_argument("--sessions", default="1,16,64", help="WebSocket session counts")
    parser.add_argument("--http-clients", type=int, default=16, help="concurrent HTTP clients")
    parser.add_argument("--db", default=None, help="store URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    counts = [int(n) for n in args.sessions.split(",") if n]
    db = args.db or fresh_sqlite_url()
    port = free_port()
    results: dict[str, float] = {}
    with server(db, port, max(counts + [args.http_clients]) + 16) as proc:
        for n in counts:
            asyncio.run(warm_ws(port, n, min(1.0, args.seconds / 5)))
            before = cpu_seconds(proc.pid)
            rate, lat = asyncio.run(run_ws(port, n, args.seconds))
            results[f"ws{n}"] = rate
            cost = (cpu_seconds(proc.pid) - before) / max(1, len(lat)) * 1e6
            print(f"websocket sessions={n:<3} steps/s={rate:8.0f}  p50={pct(lat, 0.5):6.2f} ms  "
                  f"p99={pct(lat, 0.99):6.2f} ms  mean={statistics.fmean(lat) * 1000:.2f} ms  "
                  f"server_cpu/step={cost:.0f} us", flush=True)
        if args.http_clients:
            before = cpu_seconds(proc.pid)
            rate, lat = asyncio.run(run_http(port, args.http_clients, args.seconds))
            results["http"] = rate
            cost = (cpu_seconds(proc.pid) - before) / max(1, len(lat)) * 1e6
            print(f"http clients={args.http_clients:<3}     steps/s={rate:8.0f}  "
                  f"p50={pct(lat, 0.5):6.2f} ms  p99={pct(lat, 0.99):6.2f} ms  "
                  f"server_cpu/step={cost:.0f} us", flush=True)
    head = "ws16" if "ws16" in results else next(iter(results))
    print(f"{head}_steps_per_s={results[head]:.0f}")


if __name__ == "__main__":
    main()
