"""The projector runner: folds the global log into read models, checkpointed and crash-safe.

A projection is `(name, evolve, checkpoint)`: `evolve(state | None, record) -> state | None`
folds one stored event of one stream into that stream's state, `row(stream_id, state, last)`
turns the state into the read model's row, and the checkpoint is the last global position
folded in. A projection may name the event `types` it cares about; the runner then skips
the others without calling it (they still count as folded).

The runner reads the log after the checkpoint one page at a time, folds the page in memory
(states of streams still open are kept between pages), then upserts the changed rows and moves
the checkpoint in ONE transaction. So:

- a crash loses at most the page in flight, and the next run resumes at the stored checkpoint;
- a re-delivered event changes nothing: events at or below the checkpoint are never read, and a
  stream's entry also remembers the last version it folded and skips anything at or below it;
- two runners never interleave: a page commits only if the checkpoint, read under its row's
  lock, still has the position and the generation (bumped by every clear) the runner started the
  page from; otherwise the runner throws its page away, forgets its cached states and starts
  again from the winner's checkpoint.

`rebuild` clears the read models and folds the whole log again; on a SQLite file it can split
the streams over worker processes by ranges of stream id (projections/parallel.py). The
checkpoint moves only when every worker has finished, so an interrupted rebuild leaves
checkpoint 0 and the next run simply folds everything again over the rows.
"""

from __future__ import annotations

import gc
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

import sqlalchemy as sa

from eventstore import EventStore, RecordedEvent
from eventstore.engine import sqlite_file
from projections.reader import STAND_IN, fetch_page
from projections.schema import projection_checkpoints

PAGE = 10_000
REBUILD_PAGE = 20_000
MAX_CACHED_STREAMS = 20_000
PARALLEL_MIN_EVENTS = 250_000  # below this a rebuild is not worth starting processes for
_CHUNK = 500  # keys per IN (...) list

Progress = Callable[[int], None]
ErrorHook = Callable[[str, RecordedEvent, Exception], None]


class CheckpointConflict(Exception):
    """Another runner moved the checkpoint first; this runner's page is void."""


class Projection(ABC):
    """One read model: a table of one row per stream, folded from that stream's events."""

    name: str
    version: int  # bump when the fold changes: the runner then rebuilds the read model
    table: sa.Table
    key: str = "episode_id"
    types: frozenset[str] | None = None  # event types `evolve` needs; None: all of them
    on_error: ErrorHook | None = None  # told about events the fold cannot digest

    @abstractmethod
    def evolve(self, state: Any, record: RecordedEvent) -> Any:
        """Fold one event into the stream's state (None before the first event / when unusable)."""

    @abstractmethod
    def row(self, stream_id: str, state: Any, last: RecordedEvent) -> dict[str, Any]:
        """The read model's row for a stream's state after `last` (never called with None)."""

    def finished(self, state: Any) -> bool:
        """True when no more events are expected, so the runner may forget the state."""
        return False

    def load(self, store: EventStore, conn: sa.Connection,
             stream_ids: Sequence[str]) -> dict[str, tuple[int, Any]]:
        """(last folded version, state) of streams the runner has not cached, from the read model."""
        return {}


class Entry:
    """A stream's state in a fold: the last event folded in and whether the row must be written."""

    __slots__ = ("version", "state", "last", "dirty")

    def __init__(self, version: int, state: Any) -> None:
        self.version = version
        self.state = state
        self.last: RecordedEvent | None = None
        self.dirty = False


def fold_records(projection: Projection, records: Iterable[RecordedEvent],
                 entries: dict[str, Entry] | None = None,
                 unfolded: set[str] | None = None) -> dict[str, Entry]:
    """Fold records into per-stream entries with the runner's exact rules (verify uses it too).

    An event the fold cannot digest (damaged data, a type this code does not know) makes that
    stream's state None instead of raising: one bad stream must not wedge every read model. Its
    id goes into `unfolded`, so whoever folds can say which episodes the read model leaves out.
    So does a stream met first past its version 0 with nothing of it folded before (neither in
    `entries` nor in the read model): its head is gone from the log, or it was left out already;
    and one whose versions skip (a commit deleted from its middle), from the gap on.
    """
    entries = {} if entries is None else entries
    evolve = projection.evolve
    types = projection.types
    get = entries.get
    for record in records:
        entry = get(record.stream_id)
        if entry is None:
            entry = entries[record.stream_id] = Entry(-1, None)
        elif record.version <= entry.version:
            continue  # re-delivered
        if record.version != entry.version + 1:  # its head, or events inside it, are gone
            entry.state = None
            if unfolded is not None:
                unfolded.add(record.stream_id)
        if types is None or record.type in types:
            try:
                entry.state = evolve(entry.state, record)
            except Exception as exc:
                entry.state = None
                if unfolded is not None:
                    unfolded.add(record.stream_id)
                if projection.on_error is not None:
                    projection.on_error(projection.name, record, exc)
        elif record.type.startswith(STAND_IN):  # events lost in a damaged commit: state unknown
            entry.state = None
            if unfolded is not None:
                unfolded.add(record.stream_id)
        entry.version = record.version
        entry.last = record
        entry.dirty = True
    return entries


def row_of(projection: Projection, stream_id: str, entry: Entry,
           unfolded: set[str] | None = None) -> dict[str, Any] | None:
    """The stream's row, or None when the work the fold left to the row fails on damaged data (the
    episodes projection sums a running episode's rewards there): that stream then has no row and
    is named in `unfolded`, as for an event the fold cannot digest, instead of failing every row.
    Its state is kept: a later event may settle it (an EpisodeEnded with its return), so the read
    model does not depend on when rows were built (a catch-up of the running episode, or a rebuild
    after it ended)."""
    if entry.state is None:
        return None
    try:
        return projection.row(stream_id, entry.state, entry.last)
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        if unfolded is not None:
            unfolded.add(stream_id)
        if projection.on_error is not None:
            projection.on_error(projection.name, entry.last, exc)
        return None


def _stored_checkpoints(conn: sa.Connection, names: Iterable[str] | None = None,
                        for_update: bool = False) -> dict[str, tuple[int, int, int]]:
    """Each stored checkpoint (or the named ones): projection name -> (position, version of its
    fold, generation); `for_update`: locked, in name order (see `lock_checkpoints`)."""
    table = projection_checkpoints
    query = sa.select(table.c.name, table.c.position, table.c.version, table.c.generation)
    if names is not None:
        query = query.where(table.c.name.in_(sorted(names)))
    if for_update:
        query = query.order_by(table.c.name).with_for_update()
    return {name: (position, version, generation)
            for name, position, version, generation in conn.execute(query)}


def lock_checkpoints(conn: sa.Connection, names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Take the named checkpoints' row locks, in name order, before a transaction writes a read
    model; their stored (position, generation).

    Every transaction that writes a read model takes them first, so on PostgreSQL a rebuild's
    DELETE and another runner's upserts queue whole instead of each locking rows the other
    needs (a deadlock). SQLite's BEGIN IMMEDIATE already serialises writers; it has no FOR UPDATE.
    """
    return {name: (position, generation) for name, (position, _, generation)
            in _stored_checkpoints(conn, names, for_update=True).items()}


def rows_of(projection: Projection, entries: dict[str, Entry], stream_ids: Iterable[str],
            unfolded: set[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows to upsert, keys to delete) for the given streams' entries."""
    rows = []
    gone = []
    for sid in stream_ids:
        row = row_of(projection, sid, entries[sid], unfolded)
        if row is None:
            gone.append(sid)
        else:
            rows.append(row)
    return rows, gone


class ProjectionRunner:
    """Keeps a set of projections caught up with the store; one instance per process is enough."""

    def __init__(self, store: EventStore, projections: Sequence[Projection]) -> None:
        names = [p.name for p in projections]
        if len(set(names)) != len(names):
            raise ValueError(f"projection names must be unique: {names}")
        self.store = store
        self.projections = list(projections)
        self._entries: dict[str, dict[str, Entry]] = {p.name: {} for p in projections}
        self._checkpoints: dict[str, int] | None = None
        self._generations: dict[str, int] = {}  # of the cached checkpoints: see `_one_page`
        self.unfolded: dict[str, set[str]] = {p.name: set() for p in projections}
        """Per read model, the streams it could not fold (a damaged log) since this runner was
        made: they have no row there. `verify` says what is wrong with them."""

    # -- checkpoints ---------------------------------------------------------------------------

    def stored_checkpoints(self) -> dict[str, int]:
        """Each projection's checkpoint as stored, writing nothing (for a read-only store): one
        never started, or folded by another version of its code, counts as 0."""
        with self.store.engine.connect() as conn:
            stored = _stored_checkpoints(conn)
        return {p.name: position if version == p.version else 0
                for p in self.projections
                for position, version, _ in [stored.get(p.name, (0, p.version, 0))]}

    def checkpoints(self) -> dict[str, int]:
        """The stored checkpoint of each projection (creating missing ones, rebuilding stale ones)."""
        table = projection_checkpoints
        with transaction(self.store.engine) as conn:
            stored = _stored_checkpoints(conn, for_update=True)  # it may clear a read model
            result, generations = {}, {}
            for projection in self.projections:
                position, version, generation = stored.get(projection.name, (None, None, 0))
                if position is None:
                    conn.execute(sa.insert(table).values(name=projection.name, position=0,
                                                         version=projection.version))
                    conn.execute(sa.delete(projection.table))
                    position = 0
                elif version != projection.version:  # the fold changed: refold from the start
                    generation = self._clear(conn, projection, generation)
                    position = 0
                result[projection.name], generations[projection.name] = position, generation
            self._generations = generations
        return result

    def _clear(self, conn: sa.Connection, projection: Projection, generation: int) -> int:
        """Empty the read model and reset its checkpoint, whose row the caller holds locked at
        `generation`; the generation it has now."""
        # a read model's table dropped by hand is made again (as the migrations make it: a test
        # keeps their schema equal to the tables'), so a rebuild mends any damage to a read model
        projection.table.create(conn, checkfirst=True)
        conn.execute(sa.delete(projection.table))
        conn.execute(sa.update(projection_checkpoints)
                     .where(projection_checkpoints.c.name == projection.name)
                     .values(position=0, version=projection.version, generation=generation + 1))
        self._entries[projection.name] = {}
        return generation + 1

    # -- running -------------------------------------------------------------------------------

    def rebuild(self, names: Sequence[str] | None = None, progress: Progress | None = None,
                page: int = REBUILD_PAGE, workers: int | None = None) -> int:
        """Drop the named read models (default: all) and fold them again from position 0 to the
        log's last position as the rebuild begins (what writers log meanwhile, a later catch-up
        folds).

        `workers` > 1 splits the streams over that many processes (SQLite files only); None
        picks 2 when there are cores and events enough to gain from it.
        """
        unknown = set(names or ()) - {p.name for p in self.projections}
        if unknown:
            raise ValueError(f"unknown projections: {sorted(unknown)}")
        chosen = [p for p in self.projections if names is None or p.name in names]
        self.checkpoints()  # make sure every checkpoint row exists
        with transaction(self.store.engine) as conn:
            before = lock_checkpoints(conn, [p.name for p in chosen])
            cleared = {p.name: (0, self._clear(conn, p, before[p.name][1])) for p in chosen}
        self._forget()
        upto = self.store.last_position()
        if workers is None:
            workers = _default_workers(self.store, upto)
        if workers > 1 and _parallel_capable(self.store):
            from projections.parallel import rebuild_in_parallel

            read, unfolded = rebuild_in_parallel(self.store, chosen, upto, workers, page, progress,
                                                 cleared)
            for name, streams in unfolded.items():
                self.unfolded[name].update(streams)
            with transaction(self.store.engine) as conn:
                stored = lock_checkpoints(conn, [p.name for p in chosen])
                for projection in chosen:
                    # only over this clear's rows: if another runner moved on meanwhile (its
                    # checkpoint stands: the workers stopped writing once it moved) or cleared the
                    # read model again, the catch-up below folds from the checkpoint it left
                    if stored.get(projection.name) == cleared[projection.name]:
                        conn.execute(sa.update(projection_checkpoints)
                                     .where(projection_checkpoints.c.name == projection.name)
                                     .values(position=upto))
            self._forget()
            return read + self.catch_up(progress=progress, page=page, upto=upto)
        return self.catch_up(progress=progress, page=page, upto=upto)

    def catch_up(self, progress: Progress | None = None, page: int = PAGE,
                 max_pages: int | None = None, upto: int | None = None) -> int:
        """Fold everything after the checkpoints (up to position `upto`, if given); returns how
        many events were read.

        `progress(n)` is called after each committed page with the events it covered. A caller
        that answers a question passes the log's position as it asked (`last_position()`):
        unbounded, a catch-up chased writers that log faster than it folds until they stopped.
        """
        with bulk():
            return self._catch_up(progress, page, max_pages, upto)

    def _catch_up(self, progress: Progress | None, page: int, max_pages: int | None,
                  upto: int | None) -> int:
        total = 0
        pages = 0
        while max_pages is None or pages < max_pages:
            try:
                read = self._one_page(page, upto)
            except CheckpointConflict:
                self._forget()
                continue
            except BaseException:
                self._forget()  # cached states may be ahead of the stored checkpoint
                raise
            if read == 0:
                return total
            total += read
            pages += 1
            if progress is not None:
                progress(read)
        return total

    def _forget(self) -> None:
        self._checkpoints = None
        for name in self._entries:
            self._entries[name] = {}

    def _one_page(self, page: int, upto: int | None = None) -> int:
        if self._checkpoints is None:
            self._checkpoints = self.checkpoints()
        checkpoints = self._checkpoints
        start = min(checkpoints.values(), default=0)
        records = fetch_page(self.store, start, page, upto)
        if not records:
            return 0
        last = records[-1].position
        touched: dict[str, list[str]] = {}
        # what this page could not fold counts only if the page commits: a page thrown away
        # because a rebuild elsewhere cleared the read model found no rows for what it continued
        unfolded: dict[str, set[str]] = {p.name: set() for p in self.projections}
        for projection in self.projections:
            position = checkpoints[projection.name]
            todo = records if position == start else [r for r in records if r.position > position]
            if not todo:
                continue
            entries = self._entries[projection.name]
            load_missing(self.store, projection, entries, todo)
            fold_records(projection, todo, entries, unfolded[projection.name])
            touched[projection.name] = [sid for sid, e in entries.items() if e.dirty]
        with transaction(self.store.engine) as conn:
            stored = lock_checkpoints(conn, touched)
            for name in touched:  # a clear since, even one whose pages came back to this
                # position, voids the page: it may have folded over rows the clear deleted
                if stored.get(name) != (checkpoints[name], self._generations.get(name)):
                    raise CheckpointConflict(name)  # before writing a row
            for projection in self.projections:
                name = projection.name
                if name not in touched:
                    continue
                write_rows(conn, projection, *rows_of(projection, self._entries[name],
                                                      touched[name], unfolded[name]))
                conn.execute(sa.update(projection_checkpoints)
                             .where(projection_checkpoints.c.name == name).values(position=last))
        for projection in self.projections:
            if projection.name in touched:
                self.unfolded[projection.name].update(unfolded[projection.name])
                checkpoints[projection.name] = last
                self._settle(projection)
        return len(records)

    def _settle(self, projection: Projection) -> None:
        """After a commit: nothing is dirty any more; forget finished streams, bound the cache."""
        self._entries[projection.name] = settle(projection, self._entries[projection.name])


def load_missing(store: EventStore, projection: Projection, entries: dict[str, Entry],
                 records: list[RecordedEvent]) -> None:
    """Bring in the states of streams that continue here but are not cached (one query)."""
    missing: dict[str, None] = {}
    for record in records:
        if record.version > 0 and record.stream_id not in entries:
            missing[record.stream_id] = None
    if not missing:
        return
    with store.engine.connect() as conn:
        loaded = projection.load(store, conn, list(missing))
    for stream_id in missing:
        version, state = loaded.get(stream_id, (-1, None))
        entries[stream_id] = Entry(version, state)


def settle(projection: Projection, entries: dict[str, Entry]) -> dict[str, Entry]:
    """Entries still worth caching after their rows were written."""
    finished = projection.finished
    for sid in [sid for sid, e in entries.items() if e.state is None or finished(e.state)]:
        del entries[sid]
    if len(entries) > MAX_CACHED_STREAMS:  # many open streams: reload them on demand
        return {}
    for entry in entries.values():
        entry.dirty = False
    return entries


def write_rows(conn: sa.Connection, projection: Projection, rows: list[dict[str, Any]],
               gone: list[str]) -> None:
    key = projection.table.c[projection.key]
    for i in range(0, len(gone), _CHUNK):
        conn.execute(sa.delete(projection.table).where(key.in_(gone[i:i + _CHUNK])))
    if rows:
        upsert(conn, projection.table, projection.key, rows)


class transaction:  # noqa: N801 - used like a function: `with transaction(engine) as conn`
    """A write transaction (BEGIN IMMEDIATE on SQLite, so writers queue instead of deadlocking);
    commits on success, rolls back on any exception."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def __enter__(self) -> sa.Connection:
        self.conn = self.engine.connect().execution_options(companyos_write=True)
        self.tx = self.conn.begin()
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.tx.commit()
            else:
                self.tx.rollback()
        finally:
            self.conn.close()


def upsert(conn: sa.Connection, table: sa.Table, key: str, rows: list[dict[str, Any]]) -> None:
    """Insert rows, replacing those whose key exists (one executemany, either dialect).

    On SQLite it goes straight to the DBAPI cursor of the transaction's connection: for bulk
    rebuilds SQLAlchemy's per-row parameter processing costs more than SQLite's insert.
    """
    if conn.dialect.name == "sqlite":
        names = [str(c.name) for c in table.c]
        cursor = conn.connection.cursor()
        try:
            cursor.executemany(_sqlite_upsert_sql(table.name, tuple(names), key),
                               [tuple(row[n] for n in names) for row in rows])
        finally:
            cursor.close()
        return
    from sqlalchemy.dialects.postgresql import insert

    stmt = insert(table)
    stmt = stmt.on_conflict_do_update(
        index_elements=[key], set_={c.name: stmt.excluded[c.name] for c in table.c if c.name != key})
    conn.execute(stmt, rows)


@cache
def _sqlite_upsert_sql(table: str, names: tuple[str, ...], key: str) -> str:
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != key)
    return (f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
            f"ON CONFLICT ({key}) DO UPDATE SET {updates}")


def read_rows(conn: sa.Connection, table: sa.Table, key: str, keys: Sequence[str],
              columns: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Rows of `table` by key (only `columns` and the key, when given), in chunks so huge key
    lists stay within the driver's limits."""
    column = table.c[key]
    selected = sa.select(table) if columns is None else sa.select(column, *(table.c[c] for c in columns))
    found: dict[str, dict[str, Any]] = {}
    for i in range(0, len(keys), _CHUNK):
        for row in conn.execute(selected.where(column.in_(keys[i:i + _CHUNK]))).mappings():
            found[row[key]] = dict(row)
    return found


@contextmanager
def bulk() -> Iterator[None]:
    """Pause the cyclic garbage collector during a bulk fold.

    A page is tens of thousands of fresh tuples; every few hundred allocations the collector
    would walk them, which costs a third of a rebuild. Folds build no reference cycles, so
    plain reference counting frees everything anyway.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parallel_capable(store: EventStore) -> bool:
    """Worker processes open the store themselves: only a file-backed SQLite store qualifies."""
    return sqlite_file(store.engine.url) is not None and hasattr(os, "fork")


def _default_workers(store: EventStore, upto: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores < 2 or upto < PARALLEL_MIN_EVENTS or not _parallel_capable(store):
        return 1
    return 2
