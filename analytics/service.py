"""What the CLI and the HTTP API call: sync what is new, then answer a named question or ad-hoc SQL.

Answers are never stale because every entry point syncs first. DuckDB lets one process hold the
warehouse file at a time, so each call opens it, works and closes it; within a process a lock
serialises calls (the HTTP server runs handlers on threads).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from analytics import adhoc, named
from analytics.adhoc import SqlRefused
from analytics.named import QueryError
from analytics.sync import Progress, open_store, sync, warehouse_path
from analytics.warehouse import Warehouse, WarehouseBusy, WarehouseError, open_for_sync, store_label

_LOCK = threading.Lock()
log = logging.getLogger(__name__)

__all__ = ["BackgroundSync", "QueryError", "SqlRefused", "WarehouseError", "answer", "as_objects",
           "describe", "run_named", "run_sql", "rows_of", "sync_in_background", "synced"]


def describe() -> list[dict[str, Any]]:
    """Every named query with its description and parameters (for `query --list` and the API)."""
    return [{"name": q.name, "description": q.description,
             "params": [{"name": p.name, "type": p.type.lower(), "required": p.required,
                         "default": p.default, "min": p.lo, "max": p.hi, "description": p.doc}
                        for p in q.params]}
            for q in named.registry().values()]


def rows_of(cursor) -> list[dict[str, Any]]:
    """A DuckDB result as JSON-able row objects (non-finite floats become null)."""
    return as_objects([d[0] for d in cursor.description], cursor.fetchall())


def as_objects(names: list[str], rows: list[tuple]) -> list[dict[str, Any]]:
    """Rows as JSON-able objects keyed by column name (non-finite floats become null). Names
    that repeat (`SELECT a.agent, b.agent ...`) get suffixes (`unique_names`): keyed as given,
    the later column replaced the earlier."""
    keys = unique_names(names)
    return [{k: _clean(v) for k, v in zip(keys, row, strict=True)} for row in rows]


def unique_names(names: list[str]) -> list[str]:
    """Column names made unique for every output format alike (JSON keys, the CSV header and the
    table's): `agent, agent` is `agent, agent_1`, skipping a suffix a later column already has."""
    taken = set(names)
    seen: set[str] = set()
    keys = []
    for name in names:
        key, n = name, 0
        while key in seen or (n and key in taken):  # nor a name a later column has
            n += 1
            key = f"{name}_{n}"
        seen.add(key)
        keys.append(key)
    return keys


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def run_named(warehouse: Warehouse, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows of the named query over an open warehouse; QueryError for a bad name or parameter."""
    query = named.get(name)
    bound = query.bind(params)
    return rows_of(warehouse.con.execute(query.sql, bound))


def run_sql(warehouse: Warehouse, sql: str) -> tuple[list[str], list[tuple]]:
    """Ad-hoc SQL for the local command line (never exposed over the network).

    Only on a warehouse opened read-only: the tables are a projection the sync owns, and a stray
    DELETE would leave them disagreeing with the checkpoint, so every later answer would be wrong.
    Anything but one statement that only reads is SqlRefused before it runs.
    """
    if not warehouse.read_only:
        raise ValueError("ad-hoc SQL runs on a read-only warehouse: open it with read_only=True")
    adhoc.check(sql)  # one statement that only reads: a read-only file still lets COPY ... TO write
    result = warehouse.con.sql(sql)
    if result is None:
        return [], []
    names = result.columns
    if any(str(kind) in AS_DUCKDB_TEXT for kind in result.types):  # by position: names may repeat
        result = result.project(", ".join(
            f"CAST(#{i} AS VARCHAR)" if str(kind) in AS_DUCKDB_TEXT else f"#{i}"
            for i, kind in enumerate(result.types, 1)))
    try:
        return names, result.fetchall()
    except OverflowError as exc:  # a value inside a list or struct that Python has no type for
        raise duckdb.ConversionException(
            f"a value in the result has no Python equivalent ({exc}); cast it to VARCHAR in the "
            "query") from None


AS_DUCKDB_TEXT = frozenset({
    "INTERVAL", "DATE", "TIME", "TIME WITH TIME ZONE", "TIME_NS", "TIMESTAMP", "TIMESTAMP_S",
    "TIMESTAMP_MS", "TIMESTAMP_NS", "TIMESTAMP WITH TIME ZONE", "BLOB"})
"""Column types `run_sql` hands over as DuckDB's own text: Python's values lose an interval's
months (a timedelta has none: a month was 30 days), nanoseconds and infinite dates (9999-12-31),
and a 10⁹-day interval stopped the command with an OverflowError."""


def answer(db_url: str, name: str, params: dict[str, Any] | None = None,
           warehouse: str | Path | None = None) -> list[dict[str, Any]]:
    """Sync the warehouse with the store, then answer the named query: what `GET /analytics/{name}` runs.

    Raises QueryError (the caller's mistake: HTTP 400/404) before touching the warehouse, and
    WarehouseError when the warehouse is busy, another store's or cannot be written (HTTP 503).
    """
    query = named.get(name)
    bound = query.bind(params)
    with synced(db_url, warehouse) as wh:
        return rows_of(wh.con.execute(query.sql, bound))


@contextmanager
def synced(db_url: str, warehouse: str | Path | None = None,
           progress: Progress | None = None) -> Iterator[Warehouse]:
    """The warehouse of the store at `db_url`, synced with it, held under this process's lock
    (a server answers on threads; DuckDB lets one connection write the file) until the block ends.

    The store is opened first, as the CLI does: a store that cannot be opened leaves no warehouse
    file. WarehouseError when the warehouse is busy, another store's or cannot be written. With
    `progress`, a sync that another process runs on the warehouse is waited for to its end, and
    `progress` hears how far it got (then how far this one gets).
    """
    path = warehouse_path(db_url, warehouse)
    with _LOCK, open_store(db_url) as store, open_for_sync(path, follow=progress) as wh:
        sync(db_url, wh, store=store, progress=progress)
        yield wh


class SyncStopped(Exception):
    """The process is exiting: a background sync stops after the batch in flight, which commits or
    rolls back whole, and the next sync resumes from the checkpoint."""


EXIT_WAIT_S = 120.0
"""How long an exiting process waits for its background syncs to stop (each finishes the batch
in flight, seconds on a slow machine)."""


class BackgroundSync:
    """A sync running on its own thread, so a web page can say how far it got instead of keeping
    the browser waiting for minutes (88.9M events take minutes to sync)."""

    def __init__(self, db_url: str, warehouse: str | Path | None) -> None:
        self.db_url, self.warehouse = db_url, warehouse
        self.done = 0
        self.total: int | None = None
        self.heard = False  # a figure arrived: the warehouse is open, or another process's sync is followed
        self.error: BaseException | None = None
        self.began = time.monotonic()
        self._ended: Future[None] = Future()
        self._ended.set_running_or_notify_cancel()  # so a waiter that gives up cannot cancel it
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="analytics-background-sync", daemon=True)
        with _RUNNING_LOCK:
            _RUNNING.append(self)
        self._thread.start()

    def _run(self) -> None:
        try:
            with synced(self.db_url, self.warehouse, progress=self._progress):
                pass
        except BaseException as exc:  # the request that polls next says it
            self.error = exc
            if self._stopping.is_set():  # the process is exiting: whatever broke off is no news
                pass
            elif isinstance(exc, WarehouseError):  # said in words (busy, unfit file): no traceback
                if not isinstance(exc, WarehouseBusy):
                    log.warning("the analytics sync of %s failed: %s", store_label(self.db_url), exc)
            else:
                log.warning("the analytics sync of %s failed", store_label(self.db_url), exc_info=exc)
        finally:
            with _RUNNING_LOCK:
                _RUNNING.remove(self)
            self._ended.set_result(None)

    def _progress(self, done: int, total: int | None) -> None:
        if self._stopping.is_set():  # called between batches, and while following another process
            raise SyncStopped("the process is exiting")
        self.done, self.total = done, total
        self.heard = True

    def described(self) -> str:
        """How far it got, in words: "1,500 of 3,000 events so far (50.0%)"; before any figure,
        that it is still waiting to open the warehouse (another process may hold the file)."""
        if not self.heard:
            return "not begun yet: waiting to open the warehouse, which another process may hold"
        share = f" ({self.done / self.total:.1%})" if self.total else ""
        of = f" of {self.total:,}" if self.total is not None else ""
        return f"{self.done:,}{of} events so far{share}"

    def ended(self) -> bool:
        """Whether it has ended, well or not."""
        return self._ended.done()

    def stale(self) -> bool:
        """Ended in a way that says nothing about now: well (another process may have taken the
        file since), or giving up on a file another process held (it may be free since). Any
        other failure is still news, for the next request to report."""
        return self.ended() and (self.error is None or isinstance(self.error, WarehouseBusy))

    async def ended_within(self, seconds: float) -> bool:
        """Whether the sync has ended (well or not) within `seconds`, awaited on the event loop: a
        request waiting minutes for it (`Prefer: wait=600`) holds no server thread meanwhile."""
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._ended)), seconds)
        except TimeoutError:
            return False
        return True


_RUNNING: list[BackgroundSync] = []
_RUNNING_LOCK = threading.Lock()


@atexit.register
def _stop_background_syncs() -> None:
    """Stop every background sync before the interpreter finalizes. A daemon thread still inside
    DuckDB then is unwound by force, which DuckDB's C++ does not let through: the process
    aborted ("terminate called ... FATAL: exception not rethrown", exit code 134), so `serve`
    stopped while a sync ran ended in an abort instead of exit code 0."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    deadline = time.monotonic() + EXIT_WAIT_S
    for job in running:  # all of them at once, then wait for each
        job._stopping.set()
    for job in running:
        job._thread.join(max(deadline - time.monotonic(), 0.0))


_JOBS: dict[tuple[str, str], BackgroundSync] = {}
_JOBS_LOCK = threading.Lock()


async def sync_in_background(db_url: str, warehouse: str | Path | None,
                             wait_s: float) -> BackgroundSync | None:
    """Start a sync of this store into this warehouse, or join the one running, and wait up to
    `wait_s` for it: None once a sync that began during this call has ended well, the job (to ask
    how far it got) while one runs. An ended sync is handed out once (to whoever sees it end
    first), and raises its error there. One that began before this call is not its answer: what
    the store gained meanwhile (a run writing) is not in the warehouse, and the caller's own sync
    of it took as long as it took (18 s past a 1 s wait), so another begins, within the same wait.
    Small backlogs end within the wait, so the caller answers at once, syncing only what arrived
    since. A sync that gave up waiting for a file another process holds is no answer either:
    another begins, so a caller waits (202s) for as long as the file is held. Awaited on the event
    loop: the sync has its own thread, and the waiting request holds none."""
    called = time.monotonic()
    deadline = called + wait_s
    key = (db_url, str(warehouse_path(db_url, warehouse)))
    while True:
        with _JOBS_LOCK:
            job = _JOBS.get(key)
            if job is None or job.stale():
                job = _JOBS[key] = BackgroundSync(db_url, warehouse)
        if not await job.ended_within(max(deadline - time.monotonic(), 0.0)):
            return job
        with _JOBS_LOCK:
            if _JOBS.get(key) is job:
                del _JOBS[key]
        if isinstance(job.error, WarehouseBusy):  # gave up on a file another process still holds:
            continue  # wait on for it, as a new job, rather than answer "busy" for good (a 503)
        if job.error is not None:
            raise job.error
        if job.began >= called:
            return None
