"""Dialect-specific hot paths of the store, on the DBAPI cursor: appends and paged reads.

SQLAlchemy builds the engines, the schema and the migrations; the per-step paths below skip its
statement machinery, which costs more than SQLite itself for a four-event append. An append is
one row in `commits` (see eventstore.packing), plus rows in `event_ids` for caller-supplied ids.

Commit order and positions:
- SQLite allows one writer at a time (BEGIN IMMEDIATE), so positions are dense and commit-ordered.
- PostgreSQL writers run concurrently (group commit). A position is `xid << 20 | index`, and a
  reader only returns positions below the oldest transaction still in progress (the snapshot's
  xmin). Every later commit therefore carries a larger position than anything already read: the
  transaction-id high-water mark. Positions are gap-tolerant; an append holds at most 2**20 events.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, NoReturn

import sqlalchemy as sa

from eventstore import engine
from eventstore.engine import sqlite_file
from eventstore.packing import (
    COMMIT_COLUMNS,
    READ_COLUMNS,
    Commit,
    NotUtf8,
    PayloadEncoder,
    as_text,
    compress,
    not_utf8_error,
    text_or_escapes,
)
from eventstore.records import WriterBusy
from eventstore.writerlock import TimedFlock

WAIT_FOR_WRITERS: ContextVar[bool] = ContextVar("companyos_wait_for_writers", default=True)
"""False: an SQLite append that would wait for another writer (a thread or process holding the
file) raises WriterBusy at once instead. The server's event loop tries a step so, and only then
hands it to a thread: waiting on the loop froze every socket of the worker, and /health."""


class writers_waited_for:  # noqa: N801 - used as a `with` statement, like a function
    """Within it, this context's SQLite appends wait for other writers (True) or not (False).
    A class, not a generator: it wraps every WebSocket step on SQLite."""

    __slots__ = ("_wait", "_token")

    def __init__(self, wait: bool) -> None:
        self._wait = wait

    def __enter__(self) -> None:
        self._token = WAIT_FOR_WRITERS.set(self._wait)

    def __exit__(self, *exc: object) -> None:
        WAIT_FOR_WRITERS.reset(self._token)


PG_INDEX_BITS = 20
MAX_EVENTS_PER_APPEND = 1 << PG_INDEX_BITS
PG_VISIBLE = ("position < (pg_snapshot_xmin(pg_current_snapshot())::text::bigint "
              f"<< {PG_INDEX_BITS})")
"""The high-water condition every PostgreSQL reader of the global order must add to its WHERE:
only positions of transactions older than the oldest one still running."""
PG_BEGUN = ("position < (pg_snapshot_xmax(pg_current_snapshot())::text::bigint "
            f"<< {PG_INDEX_BITS})")
"""Positions of transactions PostgreSQL has begun: a visible commit row past this bound was not
written there by any transaction (its position was altered behind the store's back)."""
STREAM_PAGE_COMMITS = 256
"""Commit rows per page of `read_stream`: an episode's whole stream in one, and a long stream of
big events (up to 1 MiB each) in bounded memory rather than all at once."""
READ_PAGE_COMMITS = 1000
"""Commit rows per page of a bulk read: thousands of events of four-event steps, and a bounded
amount of memory (a few hundred MB) even for 1,000-event batches."""


class UniqueViolation(Exception):
    """An insert collided with a stored (stream_id, first_version) or event_id."""


Head = tuple[int, str]  # (last version, last digest) of a stream
BuildCommit = Callable[[Head | None], Commit]


class Backend:
    mark: str
    visible: tuple[str, ...] = ()
    """Conditions a reader of the global order adds to its WHERE (PostgreSQL: PG_VISIBLE)."""
    begun: tuple[str, ...] = ()
    """Conditions every honestly written position meets (PostgreSQL: PG_BEGUN)."""
    encode_payload: PayloadEncoder = staticmethod(as_text)
    """How this backend stores a commit's payload JSON (eventstore.packing)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def head_sql(self) -> str:
        return (f"SELECT last_version, last_digest FROM commits WHERE stream_id = {self.mark} "
                "ORDER BY first_version DESC LIMIT 1")

    def stream_sql(self) -> str:
        """A page of a stream's commit rows from a version on, in version order."""
        m = self.mark
        return (f"SELECT {READ_COLUMNS} FROM commits WHERE stream_id = {m} "
                f"AND last_version >= {m} ORDER BY first_version LIMIT {m}")

    def page_sql(self, upto: bool = False) -> str:
        """Commit rows after a position (and, with `upto`, at most another), in position order."""
        m = self.mark
        where = [f"position > {m}", *([f"position <= {m}"] if upto else []), *self.visible]
        return (f"SELECT {READ_COLUMNS} FROM commits WHERE {' AND '.join(where)} "
                f"ORDER BY position LIMIT {m}")

    def stream_order_sql(self, bounded: bool) -> str:
        """Commit rows after a (stream_id, first_version) key, below a stream id when `bounded`,
        at positions up to a bound, in stream order (the (stream_id, first_version) index)."""
        m = self.mark
        below = f" AND stream_id < {m}" if bounded else ""
        return (f"SELECT {READ_COLUMNS} FROM commits WHERE (stream_id, first_version) > ({m}, {m})"
                f"{below} AND position <= {m} ORDER BY stream_id, first_version LIMIT {m}")

    def stream_starts_sql(self) -> str:
        return (f"SELECT stream_id FROM commits WHERE first_version = 0 AND position <= {self.mark} "
                "ORDER BY stream_id")

    def close(self) -> None:
        """Release connections the backend holds outside the pool."""

    def fetch(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        return self._fetch(sql, params)

    def _fetch(self, sql: str, params: Sequence[Any],
               text_factory: Callable[[bytes], str] | None = None) -> list[tuple]:
        """The rows of a read; with `text_factory`, SQLite's text read by it for this read only."""
        raw = self.engine.raw_connection()
        try:
            if text_factory is not None:
                raw.driver_connection.text_factory = text_factory
            cur = raw.cursor()
            cur.execute(sql, params)
            rows = cur.fetchall()
            cur.close()
            raw.rollback()
            return rows
        except Exception:
            if getattr(raw.driver_connection, "closed", False):  # the server dropped it (PostgreSQL):
                raw.invalidate()  # the pool would log a traceback resetting it, as for a write
            raise
        finally:
            if text_factory is not None:
                raw.driver_connection.text_factory = str
            raw.close()


_INSERT_IDS = "INSERT INTO event_ids (event_id, stream_id, version) VALUES ({m}, {m}, {m})"

# A new stream (expected_version None) skips the head query: inserting its version 0 collides
# with the unique (stream_id, first_version) key when the stream already exists.


_SQLITE_BACKENDS: weakref.WeakSet[SqliteBackend] = weakref.WeakSet()
_INHERITED_WRITERS: list = []
"""Writer connections a forked child inherited: the parent's. Kept here, never used, reset or
checked in (dropping one would roll back on the parent's connection from the child)."""


def _own_writers_after_fork() -> None:
    """In a forked child, each SQLite backend gets its own writer state: a new thread lock (one
    held by another thread at the fork stays held forever in the child), no writer connection and
    no lock-file descriptor; both are opened anew. The inherited descriptors are closed: they
    share the parent's flock, which outlived a parent killed while holding it for as long as its
    children lived."""
    for backend in list(_SQLITE_BACKENDS):
        backend._lock = threading.RLock()
        if backend._writer is not None:
            _INHERITED_WRITERS.append(backend._writer)
            backend._writer = None
        # the parent's lock: its helper thread does not exist here, and its descriptors close
        if backend._file_lock is not None:
            backend._file_lock.close_inherited()
        backend._file_lock = None


os.register_at_fork(after_in_child=_own_writers_after_fork)


class SqliteBackend(Backend):
    """SQLite takes one writer at a time, so each store keeps one write connection behind a lock.

    Writer processes of one file also queue on an `flock` of `<db>-writer.lock` before BEGIN
    IMMEDIATE: SQLite's own busy handler sleeps 1, 2, 5, ... ms between tries, which left a
    second `companyos run` worker idle half the time; the kernel wakes a flock waiter at once.
    That wait ends, as SQLite's own does, after the busy timeout: a writer stopped while it holds
    the lock (Ctrl-Z, SIGSTOP) used to keep every other writer waiting for ever.
    """

    mark = "?"
    encode_payload = staticmethod(compress)

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        # an RLock for its `_is_owned`: a Ctrl-C handled just as an acquire returned must let go
        # of what it took (see _take_thread_lock); no append re-enters it
        self._lock = threading.RLock()
        self._writer = None
        self._writer_waits = True
        database = sqlite_file(engine.url)
        self._lock_path = None if database is None else f"{os.path.abspath(database)}-writer.lock"
        self._file_lock: TimedFlock | None = None
        _SQLITE_BACKENDS.add(self)

    def fetch(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        try:
            return self._fetch(sql, params)
        except sqlite3.OperationalError as error:
            if not not_utf8_error(error):
                raise
            exc = error
        # a payload edited to bytes that are not UTF-8: read the page again with such text as
        # NotUtf8, so readers name the damaged commit instead of failing the whole store. Only in
        # the last column (the payload): a stream id is a key readers page by, and its escapes
        # would not sort as its bytes do (a reader paging by it never got past it)
        rows = self._fetch(sql, params, text_or_escapes)
        if any(type(value) is NotUtf8 for row in rows for value in row[:-1]):
            raise exc
        return rows

    def _process_file_lock(self) -> TimedFlock | None:
        """This process's lock of the lock file (None for an in-memory database)."""
        if self._lock_path is None:
            return None
        if self._file_lock is None:  # a forked child starts without one (_own_writers_after_fork)
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):  # of the moment: this
                    # append fails as the database's own would; the lock stayed off for good
                    raise sqlite3.OperationalError(
                        f"cannot open the writer lock {self._lock_path}: {exc.strerror}") from exc
                self._lock_path = None  # e.g. a read-only directory: SQLite's own locking still holds
                return None
            self._file_lock = TimedFlock(fd)
        return self._file_lock

    def _write_connection(self, wait: bool = True):
        """The writer's connection, its busy timeout set as `wait` says (switched only when it
        changes: a statement per append would cost a step-sized append ~2%)."""
        if self._writer is None:  # a forked child starts without one (_own_writers_after_fork)
            self._writer = self.engine.raw_connection()
            self._writer_waits = True
        if wait is not self._writer_waits:
            self._writer.execute(f"PRAGMA busy_timeout={engine.SQLITE_BUSY_TIMEOUT_MS if wait else 0}")
            self._writer_waits = wait
        return self._writer

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:  # this process's own: a child drops what it inherits
                self._writer.close()
            self._writer = None
            if self._file_lock is not None:
                self._file_lock.close()
            self._file_lock = None

    def append(self, stream_id: str, build: BuildCommit, expected_version: int | None,
               cached_head: Head | None) -> tuple[int, Commit]:
        """Insert under the single-writer lock; returns the commit's (last) position and the commit.

        A new stream's commit is built before the lock is taken: it depends on no stored head.
        """
        commit = build(None) if expected_version is None else None
        wait = WAIT_FOR_WRITERS.get()
        file_lock = self._take_writer_locks(wait)
        try:
            return self._insert(stream_id, build, commit, expected_version, cached_head, wait)
        finally:
            self._release_writer_locks(file_lock)

    def _take_writer_locks(self, wait: bool) -> TimedFlock | None:
        """Both write locks, the thread lock first; the lock file's (None when there is none),
        for `_release_writer_locks`. Nothing is held when it raises."""
        budget = self._take_thread_lock(wait)
        try:
            return self._lock_file(wait, budget)
        except BaseException:
            self._lock.release()
            raise

    def _release_writer_locks(self, file_lock: TimedFlock | None) -> None:
        try:
            if file_lock is not None:
                file_lock.release()
        finally:
            self._lock.release()

    def _take_thread_lock(self, wait: bool) -> float:
        """Queue behind this process's other writer threads; the seconds left to take the lock
        file in. The whole wait ends after the busy timeout: the server's step threads queued
        here without a limit, each behind one waiting for a stopped writer process, so the last
        step was answered only after as many busy timeouts as threads."""
        timeout = engine.SQLITE_BUSY_TIMEOUT_MS / 1000
        try:
            if self._lock.acquire(blocking=False):  # the common case: no clock read, no timed try
                return timeout
            if not wait:
                raise WriterBusy("another thread of this process is writing")
            started = time.monotonic()
            if not self._lock.acquire(timeout=timeout):
                raise _writer_lock_timeout(self._lock_path)
            return max(0.0, timeout - (time.monotonic() - started))
        except BaseException:
            # A Ctrl-C (KeyboardInterrupt) is raised as the call that took the lock returns,
            # before anyone could note it taken: every later append of the process then waited
            # for a lock no one would let go.
            if self._lock._is_owned():
                self._lock.release()
            raise

    def _lock_file(self, wait: bool, timeout: float) -> TimedFlock | None:
        """Queue behind the file's other writer processes (the caller holds the thread lock)
        for up to `timeout` seconds; the lock to release, None when there is no lock file."""
        file_lock = self._process_file_lock()
        if file_lock is not None and not file_lock.acquire(wait, timeout):
            if not wait:
                raise WriterBusy("another process is writing")
            raise _writer_lock_timeout(self._lock_path)
        return file_lock

    def insert_new(self, commits: Sequence[Commit]) -> None:
        """New streams' commits in one transaction (built already: no head to look up)."""
        rows = [(commit.count, *commit[:5]) for commit in commits]
        supplied = [row for commit in commits for row in commit.supplied_ids]
        file_lock = self._take_writer_locks(True)
        try:
            cur = self._write_connection().cursor()
            try:  # BEGIN inside: see _insert
                cur.execute("BEGIN IMMEDIATE")
                cur.executemany(_SQLITE_INSERT, rows)
                if supplied:
                    cur.executemany(_INSERT_IDS.format(m="?"), supplied)
                cur.execute("COMMIT")
            except BaseException as exc:
                _roll_back(cur, exc)
            finally:
                cur.close()
        finally:
            self._release_writer_locks(file_lock)

    def _insert(self, stream_id: str, build: BuildCommit, commit: Commit | None,
                expected_version: int | None, cached_head: Head | None,
                wait: bool = True) -> tuple[int, Commit]:
        """One write transaction; the caller holds both write locks (a writer that does not
        take them, such as the sqlite3 shell, still makes BEGIN IMMEDIATE wait, or fail at once)."""
        cur = self._write_connection(wait).cursor()
        # BEGIN inside the block that rolls back: a Ctrl-C handled as BEGIN returned left the
        # writer connection in its transaction, holding SQLite's lock, and every later append
        # failed "cannot start a transaction within a transaction"
        try:
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not wait and exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:  # BUSY_RECOVERY too
                    raise WriterBusy("another connection holds the database's write lock") from None
                raise
            if commit is None:
                head = cached_head
                if head is None or head[0] != expected_version:
                    head = cur.execute(self.head_sql(), (stream_id,)).fetchone()
                commit = build(head)
            cur.execute(_SQLITE_INSERT, (commit.count, *commit[:5]))
            position = cur.lastrowid  # position is the rowid (INTEGER PRIMARY KEY)
            if commit.supplied_ids:
                cur.executemany(_INSERT_IDS.format(m="?"), commit.supplied_ids)
            cur.execute("COMMIT")
        except BaseException as exc:
            _roll_back(cur, exc)
        finally:
            cur.close()
        return position, commit


def _writer_lock_timeout(lock_path: str | None) -> sqlite3.OperationalError:
    """What SQLite itself raises when another connection keeps its write lock past the busy
    timeout (so every caller that handles a locked store handles this), in words that say why."""
    named = f" ({lock_path})" if lock_path else ""  # an in-memory store has no lock file
    exc = sqlite3.OperationalError(
        f"database is locked: another writer has held the store's writer lock{named} for "
        f"{engine.SQLITE_BUSY_TIMEOUT_MS / 1000:g} s; a writer process stopped with Ctrl-Z or "
        "SIGSTOP keeps it until it is resumed or ends")
    exc.sqlite_errorcode = sqlite3.SQLITE_BUSY
    exc.sqlite_errorname = "SQLITE_BUSY"
    return exc


def _roll_back(cur: Any, exc: BaseException) -> NoReturn:
    """End a failed SQLite write transaction and raise its error (a UniqueViolation for a
    collision)."""
    if cur.connection.in_transaction:  # a failed COMMIT (disk full) has rolled back already,
        cur.execute("ROLLBACK")        # and a second ROLLBACK's error would hide its cause
    if _is_unique_violation(exc):
        raise UniqueViolation(str(exc)) from None
    raise exc


_SQLITE_INSERT = (f"INSERT INTO commits ({COMMIT_COLUMNS}) VALUES "
                  "((SELECT coalesce(max(position), 0) FROM commits) + ?, ?, ?, ?, ?, ?)")
_PG_INSERT = (f"INSERT INTO commits ({COMMIT_COLUMNS}) VALUES "
              f"((pg_current_xact_id()::text::bigint << {PG_INDEX_BITS}) + %s, "
              "%s, %s, %s, %s, %s) RETURNING position")


class PostgresBackend(Backend):
    mark = "%s"
    visible = (PG_VISIBLE,)
    begun = (PG_BEGUN,)

    def append(self, stream_id: str, build: BuildCommit, expected_version: int | None,
               cached_head: Head | None) -> tuple[int, Commit]:
        raw = self.engine.raw_connection()
        conn = raw.driver_connection
        try:
            head = cached_head
            if expected_version is not None and (head is None or head[0] != expected_version):
                with conn.cursor() as cur:
                    cur.execute(self.head_sql(), (stream_id,))
                    head = cur.fetchone()
                conn.rollback()
            commit = build(head)
            params = (commit.count - 1, *commit[:5])
            try:
                if not commit.supplied_ids:
                    conn.autocommit = True  # one statement is its own atomic transaction
                    try:
                        position = conn.execute(_PG_INSERT, params).fetchone()[0]
                    finally:
                        if not conn.closed:  # else this would raise again, hiding why it closed
                            conn.autocommit = False
                else:
                    with conn.transaction():
                        position = conn.execute(_PG_INSERT, params).fetchone()[0]
                        with conn.cursor() as cur:
                            cur.executemany(_INSERT_IDS.format(m="%s"), commit.supplied_ids)
            except Exception as exc:
                _pg_failed(raw, exc)
            return position, commit
        finally:
            raw.close()

    def insert_new(self, commits: Sequence[Commit]) -> None:
        """New streams' commits in one transaction; each row's position counts on from the
        previous one's, so the transaction's events take consecutive indexes under its xid."""
        rows = []
        last_index = -1
        for commit in commits:
            last_index += commit.count
            rows.append((last_index, *commit[:5]))
        supplied = [row for commit in commits for row in commit.supplied_ids]
        raw = self.engine.raw_connection()
        conn = raw.driver_connection
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(_PG_INSERT, rows)
                if supplied:
                    cur.executemany(_INSERT_IDS.format(m="%s"), supplied)
        except Exception as exc:
            _pg_failed(raw, exc)
        finally:
            raw.close()


def _pg_failed(raw: Any, exc: Exception) -> NoReturn:
    """Raise a failed PostgreSQL write's error (a UniqueViolation for a collision), first
    invalidating a connection the server dropped: the pool must not reset it (a logged
    traceback) or reuse it."""
    if _is_unique_violation(exc):
        raise UniqueViolation(str(exc)) from None
    if raw.driver_connection.closed:
        raw.invalidate()
    raise exc


def _is_unique_violation(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc)
    return name in ("IntegrityError", "UniqueViolation") and (
        "UNIQUE" in text or "unique" in text or "duplicate key" in text)


def backend_for(engine: sa.Engine) -> Backend:
    return PostgresBackend(engine) if engine.dialect.name == "postgresql" else SqliteBackend(engine)


__all__ = ["MAX_EVENTS_PER_APPEND", "Backend", "Commit", "UniqueViolation", "backend_for"]
