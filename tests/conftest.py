"""Shared fixtures: a fresh store URL per backend (SQLite always, PostgreSQL when configured)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid

import pytest
import sqlalchemy as sa


def pytest_configure(config) -> None:
    """A shell starts a background job (`… &`, `nohup`) with SIGINT ignored, and Python then
    installs no handler: the tests of Ctrl-C, in this process and in the commands it starts (an
    ignored signal stays ignored across exec), would see no Ctrl-C at all. They get SIGINT as a
    terminal delivers it."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

PG_URL = os.environ.get("COMPANYOS_TEST_PG_URL")
PG_FIXTURES = frozenset({"pg_database_url", "fresh_pg_url"})


def _uses_postgresql(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec else ()
    return (item.get_closest_marker("pg") is not None
            or not PG_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
            or any(isinstance(p, str) and p == "postgresql" for p in params))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the marks
def pytest_collection_modifyitems(config, items) -> None:
    """Mark every PostgreSQL test `pg` and put them all in one xdist group, so they run one after
    another on one worker. A PostgreSQL reader sees only commits below the oldest transaction
    still running anywhere on the server (README, "The event store"): another worker's open transaction,
    even in its own database, would hold a test's reads back (late, never wrong)."""
    for item in items:
        if _uses_postgresql(item):
            item.add_marker(pytest.mark.pg)
            item.add_marker(pytest.mark.xdist_group("postgresql"))


def _pg_engine(database: str | None = None) -> sa.Engine:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    if os.environ.get("PYTEST_XDIST_WORKER") and current and "@postgresql" not in current:
        # a test that reaches the server by hand, not through the fixtures, ran beside the group
        raise RuntimeError(f"{current.split(' ')[0]} uses PostgreSQL: mark it `pg` (tests/conftest.py)")
    url = sa.make_url(PG_URL).set(drivername="postgresql+psycopg")
    if database:
        url = url.set(database=database)
    return sa.create_engine(url, isolation_level="AUTOCOMMIT")


@contextlib.contextmanager
def _throwaway_pg_database(options: str = ""):
    """Create an empty PostgreSQL database (`options`: the rest of its CREATE DATABASE), yield its
    URL, drop it afterwards."""
    if not PG_URL:
        pytest.skip("COMPANYOS_TEST_PG_URL is not set")
    name = f"companyos_test_{uuid.uuid4().hex[:12]}"
    admin = _pg_engine()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name} {options}")
    try:
        yield sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


@pytest.fixture(scope="session")
def pg_database_url():
    """One throwaway PostgreSQL database for the session; tests keep apart by unique stream ids."""
    with _throwaway_pg_database() as url:
        yield url


@pytest.fixture
def fresh_pg_url():
    """A brand-new empty PostgreSQL database for tests that must start from nothing."""
    with _throwaway_pg_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A store URL on each backend; PostgreSQL ones share a session database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_database_url")


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_store_url(request, tmp_path):
    """An empty store URL on each backend (PostgreSQL: a brand-new database, when configured)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("fresh_pg_url")


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'store.db'}"


def unique_stream(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def poll_count(conn: sa.Connection, sql: str, tries: int = 200) -> int:
    """Run a counting query every 50 ms until it counts something or `tries` run out: how a test
    waits for another session to reach a point it can only see in `pg_stat_activity`."""
    for _ in range(tries):
        count = conn.execute(sa.text(sql)).scalar()
        if count:
            return count
        if conn.in_transaction():  # PostgreSQL keeps one view of pg_stat_activity per transaction:
            conn.rollback()        # polled inside one, it never saw the other session arrive
        time.sleep(0.05)
    return 0


def append_behind_a_held_lock(store, stream: str, lock_url: str) -> list[BaseException]:
    """Append to `stream` (at version 0) while a session of `lock_url` holds `commits` locked
    ACCESS EXCLUSIVE; what the append raised. A test failure if it still waits after 60 s: with
    no lock timeout in force it never returns."""
    import threading

    import psycopg

    from eventstore import NewEvent

    with psycopg.connect(lock_url) as holder:
        holder.execute("LOCK TABLE commits IN ACCESS EXCLUSIVE MODE")
        failed: list[BaseException] = []

        def appending() -> None:
            try:
                store.append(stream, [NewEvent("Noted", {})], 0)
            except BaseException as exc:  # noqa: BLE001 - the caller inspects it
                failed.append(exc)

        attempt = threading.Thread(target=appending, daemon=True)
        attempt.start()
        attempt.join(60)  # a guard, not a measurement
        assert not attempt.is_alive(), "the append still waits for the lock"
        holder.rollback()
    return failed


def command_runner(register, *prefix: str):
    """Invoke a command group's commands in-process, as `companyos <prefix> ...` would."""
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    register(app)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [*prefix, *args], catch_exceptions=False)

    return invoke


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first, then the parent's pid);
    None once the process is gone. The name is cut at its last ')': it may hold ') ' itself."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie has ended, whoever has yet to reap it)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def live_children(parent: int) -> list[int]:
    """Processes running (not zombies) whose parent is `parent`, whichever of its threads started
    them (/proc/<pid>/task/<tid>/children lists one thread's only)."""
    stats = ((int(entry), _proc_stat(int(entry))) for entry in os.listdir("/proc") if entry.isdigit())
    return [pid for pid, fields in stats if fields is not None and int(fields[1]) == parent
            and fields[0] != "Z"]


def get_once_listening(url: str, tries: int = 400):
    """GET `url` from a server still starting (a `companyos serve` subprocess): its first answer."""
    import time

    import httpx

    for _ in range(tries - 1):
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            time.sleep(0.05)
    return httpx.get(url, timeout=2)


@contextlib.contextmanager
def live_server(url: str, **config):
    """Uvicorn on a free loopback port in a background thread; yields the base URL."""
    with live_uvicorn(url, **config) as (base, _server):
        yield base


@contextlib.contextmanager
def live_uvicorn(url: str, sock=None, **config):
    """`live_server` that also yields the `uvicorn.Server`, for tests that shut it down themselves
    (`server.should_exit = True` is what Ctrl-C and SIGTERM do). `sock`: a listening socket to
    serve (bound with SO_REUSEADDR, a server restarted on the port of one that stopped)."""
    import socket
    import threading
    import time

    import uvicorn

    from api.app import create_app
    from api.config import ServerConfig
    from companyos.commands.serve import HTTP_PROTOCOL, WS_PROTOCOL

    if sock is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(ServerConfig(db=url, **config))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=HTTP_PROTOCOL, ws=WS_PROTOCOL,
                                           lifespan="on", backlog=1024))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


_SLOW_SYNC = """
import sys, time
from analytics.sync import sync
said = []
def progress(done, total):
    if not said:
        said.append(print("syncing", flush=True))
sync(sys.argv[1], sys.argv[2], batch_events=int(sys.argv[3]), progress=progress,
     after_batch=lambda _: time.sleep(float(sys.argv[4])))
"""


def start_slow_sync(url: str, warehouse, batch_events: int, pause_s: float):
    """Another process syncing `warehouse` slowly (a pause after each batch), once it holds the file."""
    import subprocess
    import sys

    other = subprocess.Popen([sys.executable, "-c", _SLOW_SYNC, url, str(warehouse), str(batch_events),
                              str(pause_s)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    if other.stdout.readline().strip() != "syncing":
        other.kill()
        raise AssertionError(f"the slow sync did not start (exit code {other.wait()})")
    return other


@pytest.fixture
def held_sync(monkeypatch):
    """The service's syncs held until the test sets the returned event, having said "1,500 of
    3,000 events"; returns (release, calls: the store URL of each sync started)."""
    import threading

    from analytics import service

    release, calls = threading.Event(), []
    real_sync = service.sync

    def slow_sync(db_url, wh, *, store, progress=None):
        if progress is not None:
            progress(1500, 3000)
        calls.append(db_url)  # after the figure: a test that sees the call sees the figure
        release.wait(60)
        return real_sync(db_url, wh, store=store, progress=progress)

    monkeypatch.setattr(service, "sync", slow_sync)
    return release, calls


def two_at_a_time(run, calls):
    """`run(call)` of each independent call, two at a time, in order: for calls that each start a
    fresh interpreter (mostly loading modules), which leave the suite's second core idle."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(run, calls))
