"""Dialect-specific hot paths of the store, on the DBAPI cursor: appends and paged reads.

SQLAlchemy builds the engines, the schema and the migrations; the per-step paths below skip its
statement machinery, which costs more than SQLite itself for a four-event append.

Commit order and positions:
- SQLite allows one writer at a time (BEGIN IMMEDIATE), so positions are dense and commit-ordered.
- PostgreSQL writers run concurrently (group commit). A position is `xid << 20 | index`, and a
  reader only returns positions below the oldest transaction still in progress (the snapshot's
  xmin). Every later commit therefore carries a larger position than anything already read: the
  transaction-id high-water mark. Positions are gap-tolerant; an append holds at most 2**20 events.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa

from eventstore import ids

_COLUMNS = "position, stream_id, version, event_id, type, schema_version, data, meta, digest"

PG_INDEX_BITS = 20
MAX_EVENTS_PER_APPEND = 1 << PG_INDEX_BITS
PG_VISIBLE = ("position < (pg_snapshot_xmin(pg_current_snapshot())::text::bigint "
              f"<< {PG_INDEX_BITS})")
"""The high-water condition every PostgreSQL reader of the global order must add to its WHERE:
only positions of transactions older than the oldest one still running."""
_PG_PARAMS_LIMIT = 65_000


class UniqueViolation(Exception):
    """An insert collided with a stored (stream_id, version) or event_id."""


Row = tuple  # (stream_id, version, event_id, type, schema_version, data, meta, digest)


class Backend:
    mark = "?"

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def head_sql(self) -> str:
        m = self.mark
        return f"SELECT version, digest FROM events WHERE stream_id = {m} ORDER BY version DESC LIMIT 1"

    def stream_sql(self) -> str:
        m = self.mark
        return (f"SELECT {_COLUMNS} FROM events WHERE stream_id = {m} AND version >= {m} "
                "ORDER BY version")

    def page_sql(self) -> str:
        m = self.mark
        return f"SELECT {_COLUMNS} FROM events WHERE position > {m} ORDER BY position LIMIT {m}"

    def close(self) -> None:
        """Release connections the backend holds outside the pool."""

    def fetch(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute(sql, params)
            rows = cur.fetchall()
            cur.close()
            raw.rollback()
            return rows
        finally:
            raw.close()


# A new stream (expected_version None) skips the head query: inserting its version 0 collides
# with the unique (stream_id, version) key when the stream already exists.


class SqliteBackend(Backend):
    """SQLite takes one writer at a time, so each store keeps one write connection behind a lock."""

    mark = "?"

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        self._lock = threading.Lock()
        self._writer = None
        self._writer_generation = -1

    def _write_connection(self):
        # A connection inherited through fork belongs to the parent: open our own.
        if self._writer is None or self._writer_generation != ids.fork_generation:
            self._writer = self.engine.raw_connection()
            self._writer_generation = ids.fork_generation
        return self._writer

    def close(self) -> None:
        with self._lock:
            if self._writer is not None and self._writer_generation == ids.fork_generation:
                self._writer.close()
            self._writer = None

    def append(self, stream_id: str, rows_for, expected_version, cached_head) -> list[tuple]:
        """Insert under the single-writer lock; `rows_for(head, first_position)` builds the rows."""
        with self._lock:
            cur = self._write_connection().cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                head = cached_head
                if expected_version is not None and (head is None or head[0] != expected_version):
                    head = cur.execute(self.head_sql(), (stream_id,)).fetchone()
                last = cur.execute("SELECT max(position) FROM events").fetchone()[0] or 0
                rows = rows_for(head, last + 1)
                cur.executemany(
                    f"INSERT INTO events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
                cur.execute("COMMIT")
            except BaseException as exc:
                cur.execute("ROLLBACK")
                if _is_unique_violation(exc):
                    raise UniqueViolation(str(exc)) from None
                raise
            finally:
                cur.close()
            return rows


class PostgresBackend(Backend):
    mark = "%s"

    def page_sql(self) -> str:
        return (f"SELECT {_COLUMNS} FROM events WHERE position > %s AND {PG_VISIBLE} "
                "ORDER BY position LIMIT %s")

    def append(self, stream_id: str, rows_for, expected_version, cached_head):
        raw = self.engine.raw_connection()
        conn = raw.driver_connection
        try:
            head = cached_head
            if expected_version is not None and (head is None or head[0] != expected_version):
                with conn.cursor() as cur:
                    cur.execute(self.head_sql(), (stream_id,))
                    head = cur.fetchone()
                conn.rollback()
            rows = rows_for(head, None)
            try:
                if len(rows) * 8 <= _PG_PARAMS_LIMIT:
                    conn.autocommit = True  # one statement is its own atomic transaction
                    try:
                        positions = self._insert(conn, rows, 0)
                    finally:
                        conn.autocommit = False
                else:
                    with conn.transaction():
                        positions = []
                        step = _PG_PARAMS_LIMIT // 8
                        for start in range(0, len(rows), step):
                            positions += self._insert(conn, rows[start:start + step], start)
            except Exception as exc:
                if _is_unique_violation(exc):
                    raise UniqueViolation(str(exc)) from None
                raise
            return [(p, *row) for p, row in zip(positions, rows, strict=True)]
        finally:
            raw.close()

    @staticmethod
    def _insert(conn, rows: list[Row], offset: int) -> list[int]:
        params = [value for row in rows for value in row]
        with conn.cursor() as cur:
            cur.execute(_pg_insert_sql(len(rows), offset), params)
            return [r[0] for r in cur.fetchall()]


@cache
def _pg_insert_sql(count: int, offset: int) -> str:
    position = f"(pg_current_xact_id()::text::bigint << {PG_INDEX_BITS}) + "
    values = ", ".join(
        f"({position}{offset + i}, %s, %s, %s, %s, %s, %s, %s, %s)" for i in range(count))
    return (f"INSERT INTO events ({_COLUMNS}) VALUES {values} RETURNING position")


def _is_unique_violation(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc)
    return name in ("IntegrityError", "UniqueViolation") and (
        "UNIQUE" in text or "unique" in text or "duplicate key" in text)


def backend_for(engine: sa.Engine) -> Backend:
    return PostgresBackend(engine) if engine.dialect.name == "postgresql" else SqliteBackend(engine)


__all__ = ["MAX_EVENTS_PER_APPEND", "Backend", "UniqueViolation", "backend_for"]
