"""Page readers of the global log for projections.

They take the store's raw commit rows (one per append, see eventstore.packing;
`EventStore.commit_rows`) and unpack them into `RecordedEvent`s themselves, so a commit damaged
past reading becomes a stand-in event instead of an exception. A page asks for about `limit`
events; a commit is never split in the database, only in memory, so the next page resumes inside
it by position.

The store keeps its ordering guarantee for them: on PostgreSQL a page only reaches below the
oldest transaction still in progress (the transaction-id high-water mark), exactly as `read_all`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import sqlalchemy as sa

from eventstore import CorruptCommit, EventStore, RecordedEvent
from eventstore.packing import unpack

_EVENTS_PER_COMMIT_GUESS = 4
"""A step's events; pages fetch limit/4 commits, so a page of whole episodes only runs long."""


def _commits_for(limit: int) -> int:
    return max(1, limit // _EVENTS_PER_COMMIT_GUESS)


STAND_IN = "<undecodable commit: "
"""How a stand-in event's type begins (no event type of the domain starts with '<')."""
UNREADABLE_VERSION = 2**62
"""A stand-in's version when its row's `first_version` is no integer (edited by hand): past every
real version, so folds never skip it as re-delivered, and a number they can compare."""


def _events_of(row: tuple) -> Iterable[RecordedEvent]:
    """A commit's events; a commit damaged past unpacking becomes one stand-in event whose type
    names the damage, so `verify` reports the stream and the runner folds on past it (leaving
    the stream out of the read models: its state is unknown from there on)."""
    try:
        return unpack(row)
    except CorruptCommit as exc:
        position, stream_id, first_version, _payload = row
        reason = exc.reason
        if type(first_version) is not int:  # folds compared it with numbers: a traceback
            reason = f"its first_version {first_version!r} is no integer"
            first_version = UNREADABLE_VERSION
        return [RecordedEvent(position, stream_id, first_version, "",
                              f"{STAND_IN}{reason}>", 1, "{}", "{}", "")]


def _upcast(store: EventStore, records: list[RecordedEvent]) -> list[RecordedEvent]:
    upcasters = store.upcasters
    if upcasters.types:
        records = [upcasters.apply(r) for r in records]
    return records


def fetch_page(store: EventStore, after: int, limit: int, upto: int | None = None
               ) -> list[RecordedEvent]:
    """Up to `limit` events after position `after` (and at most `upto`), in position order;
    empty only when there are none."""
    rows = store.commit_rows(after, _commits_for(limit), upto)
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
    ids = store.stream_ids(upto)
    cuts = sorted({ids[len(ids) * i // parts] for i in range(1, parts)} - {ids[0]}) if ids else []
    bounds = ["", *cuts]
    return [(lo, bounds[i + 1] if i + 1 < len(bounds) else None) for i, lo in enumerate(bounds)]


def scan_range(store: EventStore, lo: str, hi: str | None, upto: int,
               page: int) -> Iterator[list[RecordedEvent]]:
    """Pages of the events of streams in [lo, hi) at positions <= upto, by (stream, version).

    Uses the (stream_id, first_version) index, so workers given disjoint ranges read disjoint rows.
    """
    key: tuple[str, int] = (lo, -1)
    while rows := store.commit_rows_by_stream(key, hi, upto, _commits_for(page)):
        yield _upcast(store, [r for row in rows for r in _events_of(row)])
        key = (rows[-1][1], rows[-1][2])


def stream_records(store: EventStore, stream_id: str, upto: int, page: int = 256) -> list[RecordedEvent]:
    """One stream's events at positions <= upto, by version, a damaged commit as its stand-in
    event: what a rebuild folds for the stream (`read_stream` would stop at the damage)."""
    records: list[RecordedEvent] = []
    for events in scan_range(store, stream_id, None, upto, page):  # no upper key: ids may hold any text
        records.extend(r for r in events if r.stream_id == stream_id)
        if events[-1].stream_id != stream_id:
            break
    return records


def snapshot(store: EventStore) -> sa.Connection:
    """A connection whose reads all see one snapshot (SQLite: its deferred BEGIN already does; on
    PostgreSQL, READ COMMITTED let a page's rows, total and count each see another catch-up)."""
    conn = store.engine.connect()
    if store.engine.dialect.name == "postgresql":
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
    return conn
