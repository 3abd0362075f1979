"""Page readers of the global log for projections, on the raw DBAPI cursor.

They read the store's `commits` rows (one per append, see eventstore.packing) and unpack them
into `RecordedEvent`s. A page asks for about `limit` events; a commit is never split in the
database, only in memory, so the next page resumes inside it by position.

They keep the store's ordering guarantee: on PostgreSQL a page only reaches below the oldest
transaction still in progress (the store's transaction-id high-water mark), exactly as
`read_all` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cache

from eventstore import CorruptCommit, EventStore, RecordedEvent
from eventstore.backends import PG_VISIBLE
from eventstore.packing import READ_COLUMNS, unpack

_EVENTS_PER_COMMIT_GUESS = 4
"""A step's events; pages fetch limit/4 commits, so a page of whole episodes only runs long."""


def _commits_for(limit: int) -> int:
    return max(1, limit // _EVENTS_PER_COMMIT_GUESS)


@cache
def _sql(dialect: str, upto: bool) -> str:
    mark = "%s" if dialect == "postgresql" else "?"
    where = [f"position > {mark}"]
    if upto:
        where.append(f"position <= {mark}")
    if dialect == "postgresql":
        where.append(PG_VISIBLE)
    return (f"SELECT {READ_COLUMNS} FROM commits WHERE {' AND '.join(where)} "
            f"ORDER BY position LIMIT {mark}")


def _events_of(row: tuple) -> Iterable[RecordedEvent]:
    """A commit's events; a commit damaged past unpacking becomes one stand-in event whose type
    names the damage, so `verify` reports the stream and the runner folds on past it."""
    try:
        return unpack(row)
    except CorruptCommit as exc:
        position, stream_id, first_version, _payload = row
        return [RecordedEvent(position, stream_id, first_version, "",
                              f"<undecodable commit: {exc.reason}>", 1, "{}", "{}", "")]


def _upcast(store: EventStore, records: list[RecordedEvent]) -> list[RecordedEvent]:
    upcasters = store.upcasters
    if upcasters.types:
        records = [upcasters.apply(r) for r in records]
    return records


def fetch_page(store: EventStore, after: int, limit: int, upto: int | None = None
               ) -> list[RecordedEvent]:
    """Up to `limit` events after position `after` (and at most `upto`), in position order;
    empty only when there are none."""
    dialect = store.engine.dialect.name
    params: list[int] = [after]
    if upto is not None:
        params.append(upto)
    params.append(_commits_for(limit))
    raw = store.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(_sql(dialect, upto is not None), params)
        rows = cur.fetchall()
        cur.close()
        raw.rollback()
    finally:
        raw.close()
    records: list[RecordedEvent] = []
    for row in rows:  # decode only as many commits as the page needs
        records.extend(_events_of(row))
        if len(records) >= limit:
            break
    if records and records[0].position <= after:  # resuming inside a commit an earlier page split
        records = [r for r in records if r.position > after]
    del records[limit:]
    return _upcast(store, records)


# -- stream order: disjoint key ranges for worker processes ---------------------------------------


def stream_ranges(store: EventStore, parts: int, upto: int) -> list[tuple[str, str | None]]:
    """`parts` ranges [lo, hi) of stream ids holding about equally many streams (hi None: no end)."""
    with store.engine.connect() as conn:
        ids = [row[0] for row in conn.exec_driver_sql(
            "SELECT stream_id FROM commits WHERE first_version = 0 AND position <= "
            + ("%(upto)s" if store.engine.dialect.name == "postgresql" else ":upto")
            + " ORDER BY stream_id", {"upto": upto})]
    cuts = sorted({ids[len(ids) * i // parts] for i in range(1, parts)} - {ids[0]}) if ids else []
    bounds = ["", *cuts]
    return [(lo, bounds[i + 1] if i + 1 < len(bounds) else None) for i, lo in enumerate(bounds)]


@cache
def _range_sql(dialect: str, bounded: bool) -> str:
    mark = "%s" if dialect == "postgresql" else "?"
    hi = f" AND stream_id < {mark}" if bounded else ""
    return (f"SELECT {READ_COLUMNS} FROM commits WHERE (stream_id, first_version) > ({mark}, {mark})"
            f"{hi} AND position <= {mark} ORDER BY stream_id, first_version LIMIT {mark}")


def scan_range(store: EventStore, lo: str, hi: str | None, upto: int,
               page: int) -> Iterator[list[RecordedEvent]]:
    """Pages of the events of streams in [lo, hi) at positions <= upto, by (stream, version).

    Uses the (stream_id, first_version) index, so workers given disjoint ranges read disjoint rows.
    """
    sql = _range_sql(store.engine.dialect.name, hi is not None)
    key: tuple[str, int] = (lo, -1)
    raw = store.engine.raw_connection()
    try:
        while True:
            params = [*key, *([hi] if hi is not None else []), upto, _commits_for(page)]
            cur = raw.cursor()
            cur.execute(sql, params)
            rows = cur.fetchall()
            cur.close()
            raw.rollback()
            if not rows:
                return
            yield _upcast(store, [r for row in rows for r in _events_of(row)])
            key = (rows[-1][1], rows[-1][2])
    finally:
        raw.close()
